/* A free loopback TCP port for a job's bootstrap (and master) endpoint, taken outside the
 * kernel's ephemeral range (net.ipv4.ip_local_port_range). A port that bind(port 0) hands out
 * lies in that range, so between our release and rank 0's listen() any port-0 bind or outgoing
 * connection of the job (gloo's pair listeners, UCX's sockets) may take it, and rank 0 fails with
 * "Address already in use" (seen in CI). Outside the range only another explicit bind collides.
 * Header-only: `megamoe launch`, the benchmarks and the C tests share it (bench/ sits below
 * tools/; the tests add this folder to their include path). */
#ifndef MEGAMOE_BENCH_FREE_PORT_H
#define MEGAMOE_BENCH_FREE_PORT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int mm_port_bindable(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0; /* no SO_REUSEADDR: TIME_WAIT counts */
    close(fd);
    return ok;
}

/* A random bindable port in the larger span beside the ephemeral range (not under 10000; any
 * port when the range covers nearly everything); -1 with errno EADDRINUSE if 256 tries fail. */
static inline int mm_free_loopback_port(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
        fclose(f);
    }
    int a = 10000, b = lo - 1, outside = 1;
    if (hi + 1 <= 65535 && 65535 - hi > b - a) a = hi + 1, b = 65535;
    if (b - a < 64) a = 1024, b = 65535, outside = 0;
    unsigned x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = (unsigned)getpid() * 2654435761u;
    for (int i = 0; i < 256; i++) {
        x = x * 1103515245u + 12345u;
        int port = a + (int)((x >> 8) % (unsigned)(b - a + 1));
        if ((!outside || port < lo || port > hi) && mm_port_bindable(port)) return port;
    }
    errno = EADDRINUSE;
    return -1;
}

#endif
