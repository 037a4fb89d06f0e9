/* A free loopback TCP port for a test's bootstrap endpoint, taken outside the kernel's ephemeral
 * range (net.ipv4.ip_local_port_range). A port that bind(port 0) hands out is in that range, so
 * between our release and the ranks' listen() the same port can go to anyone else's port-0 bind
 * or outgoing connection — gloo's pair listeners, UCX's sockets — and rank 0 then fails with
 * "Address already in use" (seen in CI). Outside the range only another explicit bind collides. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static int mm_port_bindable(int port)
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

int mm_test_free_port(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
        fclose(f);
    }
    /* the larger of the spans below and above the ephemeral range, ports under 10000 left alone */
    int a = 10000, b = lo - 1;
    if (hi + 1 <= 65535 && 65535 - hi > b - a) a = hi + 1, b = 65535;
    int outside = 1;
    if (b - a < 64) a = 1024, b = 65535, outside = 0; /* the range covers nearly all: take any */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned x = (unsigned)ts.tv_nsec ^ ((unsigned)getpid() << 16) ^ (unsigned)ts.tv_sec;
    for (int i = 0; i < 256; i++) {
        x = x * 1103515245u + 12345u;
        int port = a + (int)((x >> 8) % (unsigned)(b - a + 1));
        if ((!outside || port < lo || port > hi) && mm_port_bindable(port)) return port;
    }
    return -1;
}
