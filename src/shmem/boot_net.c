/* Bootstrap networking: endpoint parsing, sockets with deadlines, frames. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "boot_net.h"

#define MM_ENDPOINT_FORM "tcp://host:port (e.g. tcp://127.0.0.1:8662)"

megamoe_status_t mm_endpoint_parse(const char *text, const char *what, mm_endpoint_t *ep_p)
{
    if (text == NULL || *text == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s is empty; expected %s", what,
                        MM_ENDPOINT_FORM);
    size_t len = strlen(text);
    if (len > MM_ENDPOINT_MAX_LEN)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s is %zu characters long; at most %d are accepted (%s)", what, len,
                        MM_ENDPOINT_MAX_LEN, MM_ENDPOINT_FORM);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c <= 0x20 || c >= 0x7f)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s '%s' contains whitespace or a control character at offset %zu; "
                            "expected %s",
                            what, text, i, MM_ENDPOINT_FORM);
    }
    if (strncmp(text, "tcp://", 6) != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s '%s' must start with tcp://; expected %s",
                        what, text, MM_ENDPOINT_FORM);
    const char *host = text + 6, *host_end, *colon;
    mm_endpoint_t ep;
    memset(&ep, 0, sizeof ep);
    if (*host == '[') {
        host_end = strchr(host, ']');
        if (host_end == NULL || host_end == host + 1)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s '%s' has an unterminated or empty [IPv6] host; expected %s", what,
                            text, MM_ENDPOINT_FORM);
        for (const char *p = host + 1; p < host_end; p++)
            if (!(strchr("0123456789abcdefABCDEF:.", *p)))
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s '%s' has a bad character '%c' in its IPv6 host", what, text,
                                *p);
        memcpy(ep.host, host + 1, (size_t)(host_end - host - 1));
        colon = host_end + 1;
        if (*colon != ':')
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s '%s' has no ':port' after the host; "
                            "expected %s", what, text, MM_ENDPOINT_FORM);
    } else {
        colon = strchr(host, ':');
        if (colon == NULL)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s '%s' has no ':port'; expected %s",
                            what, text, MM_ENDPOINT_FORM);
        if (colon == host)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s '%s' has an empty host; expected %s",
                            what, text, MM_ENDPOINT_FORM);
        for (const char *p = host; p < colon; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s '%s' has a bad character '%c' in its host (letters, digits, "
                                "'.', '-', '_' or a [IPv6] literal)",
                                what, text, *p);
        memcpy(ep.host, host, (size_t)(colon - host));
    }
    const char *port = colon + 1;
    size_t digits = strlen(port);
    if (digits == 0 || digits > 5 || strspn(port, "0123456789") != digits)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s '%s' has a bad port '%s'; expected a decimal number in [1, 65535] "
                        "and nothing after it",
                        what, text, port);
    long value = strtol(port, NULL, 10);
    if (value < 1 || value > 65535)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s '%s' has port %ld out of range; expected [1, 65535]", what, text,
                        value);
    ep.port = (int)value;
    memcpy(ep.text, text, len + 1);
    *ep_p = ep;
    return MEGAMOE_OK;
}

static int mm_net_resolve(const mm_endpoint_t *ep, int passive, struct addrinfo **res_p)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    char port[16];
    snprintf(port, sizeof port, "%d", ep->port);
    return getaddrinfo(ep->host, port, &hints, res_p);
}

/* Keepalive probes make a peer whose host went away (cut off, powered down: no FIN ever
 * comes) an error on the socket within about MM_NET_KEEPALIVE_S seconds, which the liveness
 * monitor polls for; TCP_USER_TIMEOUT does the same for data that is never acknowledged. */
#define MM_NET_KEEPALIVE_IDLE_S 1
#define MM_NET_KEEPALIVE_INTVL_S 1
#define MM_NET_KEEPALIVE_CNT 3

void mm_net_tune(int fd)
{
    int one = 1, idle = MM_NET_KEEPALIVE_IDLE_S, intvl = MM_NET_KEEPALIVE_INTVL_S,
        cnt = MM_NET_KEEPALIVE_CNT;
    unsigned user_ms = (unsigned)(idle + intvl * cnt) * 1000u;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

int mm_net_local_ifname(int fd, char *buf, size_t len)
{
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    if (len) buf[0] = '\0';
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0) return -1;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return -1;
    int found = -1;
    for (struct ifaddrs *i = ifs; i && found < 0; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != a.ss_family) continue;
        int same = 0;
        if (a.ss_family == AF_INET)
            same = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                   ((struct sockaddr_in *)&a)->sin_addr.s_addr;
        else if (a.ss_family == AF_INET6)
            same = memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                          &((struct sockaddr_in6 *)&a)->sin6_addr, sizeof(struct in6_addr)) == 0;
        if (same) {
            snprintf(buf, len, "%s", i->ifa_name);
            found = 0;
        }
    }
    freeifaddrs(ifs);
    return found;
}

int mm_endpoint_is_loopback(const mm_endpoint_t *ep)
{
    if (strcmp(ep->host, "localhost") == 0) return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, ep->host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, ep->host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0; /* a name that is not "localhost" may resolve anywhere */
}

megamoe_status_t mm_net_listen(const mm_endpoint_t *ep, int *fd_p)
{
    struct addrinfo *res = NULL;
    int rc = mm_net_resolve(ep, 1, &res);
    if (rc != 0) {
        errno = EINVAL;
        return MEGAMOE_NOT_FOUND;
    }
    int saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            freeaddrinfo(res);
            *fd_p = fd;
            return MEGAMOE_OK;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(res);
    errno = saved;
    return MEGAMOE_IO;
}

static int mm_poll_ms(uint64_t deadline_ns)
{
    uint64_t now = mm_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000 ? 1000 : (int)ms; /* wake at least every second (deadline re-checked) */
}

static int mm_net_is_self_connection(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 ||
        getpeername(fd, (struct sockaddr *)&b, &lb) != 0)
        return 0;
    return la == lb && memcmp(&a, &b, la) == 0;
}

megamoe_status_t mm_net_connect(const mm_endpoint_t *ep, uint64_t deadline_ns, int *fd_p)
{
    struct addrinfo *res = NULL;
    if (mm_net_resolve(ep, 0, &res) != 0) {
        errno = EHOSTUNREACH;
        return MEGAMOE_NOT_FOUND;
    }
    megamoe_status_t st = MEGAMOE_NOT_FOUND;
    int saved = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            st = MEGAMOE_IO;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            for (;;) {
                struct pollfd p = {fd, POLLOUT, 0};
                int ms = mm_poll_ms(deadline_ns);
                if (ms == 0) {
                    rc = -1;
                    errno = ETIMEDOUT;
                    break;
                }
                int n = poll(&p, 1, ms);
                if (n < 0 && errno == EINTR) continue;
                if (n == 0) continue;
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                rc = err ? -1 : 0;
                errno = err;
                break;
            }
        }
        if (rc == 0 && mm_net_is_self_connection(fd)) {
            rc = -1;
            errno = ECONNREFUSED;
        }
        if (rc == 0) {
            freeaddrinfo(res);
            mm_net_tune(fd);
            *fd_p = fd;
            return MEGAMOE_OK;
        }
        saved = errno;
        st = (errno == ETIMEDOUT) ? MEGAMOE_TIMEOUT
             : (errno == ECONNREFUSED || errno == ENETUNREACH || errno == EHOSTUNREACH ||
                errno == ECONNRESET || errno == EAGAIN)
                 ? MEGAMOE_NOT_FOUND
                 : MEGAMOE_IO;
        close(fd);
    }
    freeaddrinfo(res);
    errno = saved;
    return st;
}

void mm_net_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    char host[64] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&a, &al) == 0) {
        if (a.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&a;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
            port = ntohs(in->sin_port);
        } else if (a.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
            port = ntohs(in6->sin6_port);
        }
    }
    snprintf(buf, len, "%s:%d", host, port);
}

megamoe_status_t mm_net_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            int ms = mm_poll_ms(deadline_ns);
            if (ms == 0) return MEGAMOE_TIMEOUT;
            if (poll(&pf, 1, ms) < 0 && errno != EINTR) return MEGAMOE_IO;
            continue;
        }
        return (errno == EPIPE || errno == ECONNRESET) ? MEGAMOE_PEER_LOST : MEGAMOE_IO;
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_net_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return MEGAMOE_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pf = {fd, POLLIN, 0};
            int ms = mm_poll_ms(deadline_ns);
            if (ms == 0) return MEGAMOE_TIMEOUT;
            if (poll(&pf, 1, ms) < 0 && errno != EINTR) return MEGAMOE_IO;
            continue;
        }
        return errno == ECONNRESET ? MEGAMOE_PEER_LOST : MEGAMOE_IO;
    }
    return MEGAMOE_OK;
}

void mm_frame_encode_header(uint8_t out[MM_FRAME_HEADER], int type, uint32_t len)
{
    mm_put_u32(out, MM_FRAME_MAGIC);
    out[4] = (uint8_t)type;
    out[5] = (uint8_t)(type >> 8);
    out[6] = out[7] = 0;
    mm_put_u32(out + 8, len);
}

int mm_frame_decode_header(const uint8_t in[MM_FRAME_HEADER], int *type_p, uint32_t *len_p)
{
    if (mm_get_u32(in) != MM_FRAME_MAGIC) return 0;
    *type_p = in[4] | in[5] << 8;
    *len_p = mm_get_u32(in + 8);
    return 1;
}

megamoe_status_t mm_frame_send(int fd, int type, const void *a, size_t a_len, const void *b,
                               size_t b_len, uint64_t deadline_ns)
{
    if (a_len + b_len > UINT32_MAX) return MEGAMOE_INVALID_ARGUMENT;
    uint8_t hdr[MM_FRAME_HEADER];
    mm_frame_encode_header(hdr, type, (uint32_t)(a_len + b_len));
    /* Small frames go out in one send (one TCP segment, no Nagle interplay). */
    if (a_len + b_len <= 4096) {
        uint8_t buf[MM_FRAME_HEADER + 4096];
        memcpy(buf, hdr, sizeof hdr);
        if (a_len) memcpy(buf + MM_FRAME_HEADER, a, a_len);
        if (b_len) memcpy(buf + MM_FRAME_HEADER + a_len, b, b_len);
        return mm_net_write_all(fd, buf, MM_FRAME_HEADER + a_len + b_len, deadline_ns);
    }
    MM_CHECK(mm_net_write_all(fd, hdr, sizeof hdr, deadline_ns));
    if (a_len) MM_CHECK(mm_net_write_all(fd, a, a_len, deadline_ns));
    if (b_len) MM_CHECK(mm_net_write_all(fd, b, b_len, deadline_ns));
    return MEGAMOE_OK;
}

megamoe_status_t mm_frame_recv_any(int fd, size_t max_len, int *type_p, void **body_p,
                                   size_t *len_p, uint64_t deadline_ns)
{
    uint8_t hdr[MM_FRAME_HEADER];
    MM_CHECK(mm_net_read_all(fd, hdr, sizeof hdr, deadline_ns));
    int got_type;
    uint32_t len;
    if (!mm_frame_decode_header(hdr, &got_type, &len) || len > max_len) {
        errno = EPROTO;
        return MEGAMOE_INTERNAL;
    }
    void *body = NULL;
    if (len > 0) {
        body = malloc(len);
        if (body == NULL) return MEGAMOE_OUT_OF_MEMORY;
        megamoe_status_t st = mm_net_read_all(fd, body, len, deadline_ns);
        if (st != MEGAMOE_OK) {
            free(body);
            return st;
        }
    }
    *type_p = got_type;
    *body_p = body;
    *len_p = len;
    return MEGAMOE_OK;
}

megamoe_status_t mm_frame_recv(int fd, int type, size_t max_len, void **body_p, size_t *len_p,
                               uint64_t deadline_ns)
{
    int got;
    MM_CHECK(mm_frame_recv_any(fd, max_len, &got, body_p, len_p, deadline_ns));
    if (got != type) {
        free(*body_p);
        *body_p = NULL;
        errno = EPROTO;
        return MEGAMOE_INTERNAL;
    }
    return MEGAMOE_OK;
}
