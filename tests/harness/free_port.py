"""A free loopback TCP port for a test's endpoints, outside the kernel's ephemeral range.

A port that ``bind(("127.0.0.1", 0))`` hands out lies in net.ipv4.ip_local_port_range, so between
our release and rank 0's listen() the same port can go to any port-0 bind or outgoing connection
of the job — gloo's pair listeners, UCX — and rank 0 fails with "Address already in use" (seen
in CI). Outside the range only another explicit bind collides (bench/free_port.h is the C twin)."""
import random
import socket


def free_port():
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    a, b = 10000, lo - 1  # the larger span beside the range; ports under 10000 left alone
    if 65535 - hi > b - a:
        a, b = hi + 1, 65535
    outside = b - a >= 64
    if not outside:
        a, b = 1024, 65535
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.randint(a, b)
        if outside and lo <= port <= hi:
            continue
        with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError("no free loopback port outside the ephemeral range")
