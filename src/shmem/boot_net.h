/* Bootstrap networking: strict endpoint parsing, sockets with deadlines, length-prefixed frames.
 *
 * Every call that can block takes an absolute deadline (mm_now_ns() clock) and polls, so no
 * peer can stall the caller past it. Sends use MSG_NOSIGNAL: a closed peer is an error
 * (PEER_LOST), never SIGPIPE. Functions here return a status without logging; the caller
 * decides the message (it knows which rank and which phase), errno is kept for it.
 */
#ifndef MM_SHMEM_BOOT_NET_H
#define MM_SHMEM_BOOT_NET_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#define MM_ENDPOINT_MAX_LEN 255

typedef struct mm_endpoint {
    char text[MM_ENDPOINT_MAX_LEN + 1]; /* as given */
    char host[MM_ENDPOINT_MAX_LEN + 1]; /* without brackets */
    int port;
} mm_endpoint_t;

/* Parse "tcp://host:port" strictly: the tcp:// prefix, a host of letters, digits, '.', '-',
 * '_' (or a bracketed IPv6 literal), a decimal port in [1, 65535], nothing else, no
 * whitespace, at most MM_ENDPOINT_MAX_LEN characters. On failure: INVALID_ARGUMENT logged
 * with a message naming `what` (the variable or parameter) and the accepted form. */
megamoe_status_t mm_endpoint_parse(const char *text, const char *what, mm_endpoint_t *ep_p);

/* Listen on the endpoint (SO_REUSEADDR, non-blocking, close-on-exec). */
megamoe_status_t mm_net_listen(const mm_endpoint_t *ep, int *fd_p);
/* One connection attempt, bounded by the deadline. OK with a non-blocking socket; NOT_FOUND
 * when nobody listens yet (refused/unreachable: retry later); TIMEOUT; IO otherwise. A TCP
 * self-connection (possible when the port is in the ephemeral range) counts as NOT_FOUND. */
megamoe_status_t mm_net_connect(const mm_endpoint_t *ep, uint64_t deadline_ns, int *fd_p);
/* TCP_NODELAY and keepalive probes (a vanished peer host becomes a socket error within a
 * few seconds). Applied to every connection the bootstrap makes or accepts. */
void mm_net_tune(int fd);
/* Name of the network interface carrying a connected socket's local address (e.g. "eth0");
 * 0 on success, -1 (buf "") when unknown. */
int mm_net_local_ifname(int fd, char *buf, size_t len);
/* 1 when the endpoint's host is a loopback address (127.0.0.0/8, ::1) or "localhost". */
int mm_endpoint_is_loopback(const mm_endpoint_t *ep);
/* Peer address "ip:port" of a connected socket (for log lines). */
void mm_net_peer_name(int fd, char *buf, size_t len);

/* Blocking-with-deadline I/O on non-blocking sockets: OK, TIMEOUT, PEER_LOST (closed by the
 * peer, or reset) or IO. */
megamoe_status_t mm_net_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
megamoe_status_t mm_net_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns);

/* ---- frames: 12-byte header (magic, type, flags, length; little endian) + body ---- */

#define MM_FRAME_MAGIC 0x424d4d6du /* "mMMB" */
#define MM_FRAME_HEADER 12

enum {
    MM_FRAME_CHALLENGE = 1, /* server -> client: nonce, protocol */
    MM_FRAME_HELLO = 2,     /* client -> server: who I am, my settings, MAC */
    MM_FRAME_ACCEPT = 3,    /* server -> client: server proof */
    MM_FRAME_REJECT = 4,    /* server -> client: reason text */
    MM_FRAME_VERDICT = 5,   /* server -> client: job start status + text */
    MM_FRAME_CONTRIB = 6,   /* client -> server: a collective contribution */
    MM_FRAME_RESULT = 7     /* server -> client: a collective result (or error text) */
};

void mm_frame_encode_header(uint8_t out[MM_FRAME_HEADER], int type, uint32_t len);
/* Decode; returns 0 when the magic is wrong. */
int mm_frame_decode_header(const uint8_t in[MM_FRAME_HEADER], int *type_p, uint32_t *len_p);

/* Send header + body (body may be split in two parts to avoid copies). */
megamoe_status_t mm_frame_send(int fd, int type, const void *a, size_t a_len, const void *b,
                               size_t b_len, uint64_t deadline_ns);
/* Receive one frame of an expected type with a body of at most max_len bytes into *body_p
 * (malloc'd, caller frees; NULL when empty). Wrong magic/type/length is INTERNAL (a broken
 * or foreign peer). */
megamoe_status_t mm_frame_recv(int fd, int type, size_t max_len, void **body_p, size_t *len_p,
                               uint64_t deadline_ns);
/* Same for any type (returned in *type_p). */
megamoe_status_t mm_frame_recv_any(int fd, size_t max_len, int *type_p, void **body_p,
                                   size_t *len_p, uint64_t deadline_ns);

/* Little-endian field helpers. */
static inline void mm_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mm_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t mm_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t mm_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif /* MM_SHMEM_BOOT_NET_H */
