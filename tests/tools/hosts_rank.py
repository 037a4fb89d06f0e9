"""One rank of the simulated-host tests of `megamoe launch --hosts` (hosts_launch_cases.py).

    hosts_rank.py MODE [--pidfile PATH]   (appends this process's pid to PATH first)

    probe       print one JSON line: hostname, netns, address, the launcher's env
    exchange    rank r on host 0 and rank r + N/2 on host 1 swap 4 MiB over TCP
    heartbeat   a star of TCP heartbeats around rank 0 (every 0.1 s); a peer that
                closes is PEER_LOST (exit 3), one silent for 2 s is TIMEOUT (exit 4); exits 0
                after 60 s without a fault
Standard library only, so the tests need no torch.
"""
import hashlib
import json
import os
import select
import socket
import sys
import time

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES",
       "MASTER_ADDR", "MASTER_PORT", "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "MEGAMOE_JOB_TOKEN",
       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")


def my_ip():
    return socket.gethostbyname(socket.gethostname())  # the job's /etc/hosts names every host


def connect(addr, port, deadline=15.0):
    end = time.monotonic() + deadline
    while True:
        try:
            return socket.create_connection((addr, port), timeout=2)
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def listen(port, backlog):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((my_ip(), port))
    s.listen(backlog)
    s.settimeout(15)
    return s


def probe():
    info = {k: os.environ.get(k) for k in ENV}
    info["hostname"] = socket.gethostname()
    info["netns"] = os.readlink("/proc/self/ns/net")
    info["utsns"] = os.readlink("/proc/self/ns/uts")
    info["ip"] = my_ip()
    info["cwd"] = os.getcwd()
    print("probe " + json.dumps(info), flush=True)


def exchange():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    half = world // 2
    data = hashlib.sha256(str(rank).encode()).digest() * (4 << 20 >> 5)
    if rank < half:
        srv = listen(29700 + rank, 1)
        conn, peer_addr = srv.accept()
        partner = rank + half
    else:
        partner = rank - half
        conn = connect(os.environ["MASTER_ADDR"], 29700 + partner)
        peer_addr = conn.getpeername()
    conn.settimeout(30)
    conn.sendall(data) if rank < half else None
    got = bytearray()
    while len(got) < len(data):
        chunk = conn.recv(1 << 20)
        if not chunk:
            sys.exit(f"rank {rank}: the partner closed early")
        got += chunk
    if rank >= half:
        conn.sendall(data)
    expect = hashlib.sha256(str(partner).encode()).digest() * (4 << 20 >> 5)
    ok = bytes(got) == expect
    print(f"exchange rank {rank} on {socket.gethostname()} ({my_ip()}) with rank {partner} at "
          f"{peer_addr[0]}: {len(got)} bytes {'ok' if ok else 'MISMATCH'}", flush=True)
    sys.exit(0 if ok else 1)


def heartbeat():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        srv = listen(29600, world)
        peers = {}
        while len(peers) < world - 1:
            c, _ = srv.accept()
            who = int(c.recv(16).split(b"\n")[0])
            peers[c] = who
    else:
        c = connect(os.environ["MASTER_ADDR"], 29600)
        c.sendall(f"{rank}\n".encode())
        peers = {c: 0}
    print(f"heartbeat rank {rank} on {socket.gethostname()}: connected", flush=True)
    last = {c: time.monotonic() for c in peers}
    for c in peers:
        c.setblocking(False)  # a send to a cut-off peer must not block the detection
    end = time.monotonic() + 60
    while time.monotonic() < end:
        for c in peers:
            try:
                c.send(b".")
            except BlockingIOError:
                pass  # the peer does not take data: its silence is detected below
            except OSError as e:
                sys.stderr.write(f"PEER_LOST: rank {peers[c]} ({e.strerror})\n")
                sys.exit(3)
        ready, _, _ = select.select(list(peers), [], [], 0.1)
        for c in ready:
            try:
                chunk = c.recv(4096)
            except OSError as e:
                chunk, err = b"", e.strerror
            else:
                err = "connection closed"
            if not chunk:
                sys.stderr.write(f"PEER_LOST: rank {peers[c]} ({err})\n")
                sys.exit(3)
            last[c] = time.monotonic()
        for c, t in last.items():
            if time.monotonic() - t > 2.0:
                sys.stderr.write(f"TIMEOUT: rank {peers[c]} silent for 2 s\n")
                sys.exit(4)
    return 0


if __name__ == "__main__":
    if "--pidfile" in sys.argv:
        with open(sys.argv[sys.argv.index("--pidfile") + 1], "a") as f:
            f.write(f"{os.getpid()}\n")
    {"probe": probe, "exchange": exchange, "heartbeat": heartbeat}[sys.argv[1]]()
