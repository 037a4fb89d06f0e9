/* A plain TCP stream between two ranks (bench_tcp.h). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "bench_tcp.h"

#define MM_BTCP_BUF (4 << 20) /* kernel socket buffers (forced past wmem_max/rmem_max as root) */

static void mm_btcp_tune(int fd)
{
    int one = 1, buf = MM_BTCP_BUF;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int mm_btcp_listen(int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    mm_btcp_tune(fd); /* inherited by the accepted socket (buffers must be set before listen) */
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port_p = ntohs(a.sin_port);
    return fd;
}

int mm_btcp_accept(int lfd, double timeout_s)
{
    struct pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, (int)(timeout_s * 1000)) != 1) return -1;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) mm_btcp_tune(fd);
    return fd;
}

int mm_btcp_connect(const char *host, int port, double timeout_s)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, ps, &hints, &res) != 0 || res == NULL) return -1;
    double end = mm_now_s() + timeout_s;
    int fd = -1;
    while (fd < 0 && mm_now_s() < end) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        mm_btcp_tune(fd); /* before connect: the window scale is agreed in the handshake */
        if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
            mm_sleep_ns(10000000ull);
        }
    }
    freeaddrinfo(res);
    return fd;
}

int mm_btcp_rank0_host(char *buf, size_t len)
{
    const char *ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    if (ep == NULL || strncmp(ep, "tcp://", 6) != 0) return -1;
    ep += 6;
    const char *colon = strrchr(ep, ':');
    size_t n = colon ? (size_t)(colon - ep) : strlen(ep);
    if (n >= 2 && ep[0] == '[') ep++, n -= 2; /* [IPv6] */
    if (n == 0 || n >= len) return -1;
    memcpy(buf, ep, n);
    buf[n] = '\0';
    return 0;
}

int mm_btcp_stream(int fd, const void *src, void *dst, size_t chunk, size_t total)
{
    size_t sent = 0, got = 0;
    while (sent < total || got < total) {
        struct pollfd p = {fd, (short)((got < total ? POLLIN : 0) | (sent < total ? POLLOUT : 0)), 0};
        if (poll(&p, 1, 120000) != 1) return -1;
        if (p.revents & (POLLERR | POLLHUP)) return -1;
        if ((p.revents & POLLOUT) && sent < total) {
            size_t at = sent % chunk, n = chunk - at;
            if (n > total - sent) n = total - sent;
            ssize_t k = send(fd, (const char *)src + at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) sent += (size_t)k;
            else if (k < 0 && errno != EAGAIN && errno != EINTR) return -1;
        }
        if ((p.revents & POLLIN) && got < total) {
            size_t at = got % chunk, n = chunk - at;
            if (n > total - got) n = total - got;
            ssize_t k = recv(fd, (char *)dst + at, n, MSG_DONTWAIT);
            if (k > 0) got += (size_t)k;
            else if (k == 0 || (errno != EAGAIN && errno != EINTR)) return -1;
        }
    }
    return 0;
}

static int mm_btcp_full(int fd, void *buf, size_t n, int out)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = out ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, n - done, 0);
        if (k <= 0 && !(k < 0 && errno == EINTR)) return -1;
        if (k > 0) done += (size_t)k;
    }
    return 0;
}

int mm_btcp_pingpong(int fd, int initiator, long iters)
{
    uint64_t v = 0;
    for (long i = 0; i < iters; i++) {
        if (initiator && mm_btcp_full(fd, &v, 8, 1) != 0) return -1;
        if (mm_btcp_full(fd, &v, 8, 0) != 0) return -1;
        if (!initiator && mm_btcp_full(fd, &v, 8, 1) != 0) return -1;
    }
    return 0;
}
