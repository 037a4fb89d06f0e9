/* A plain TCP stream between two ranks: the "tcp_stream" baseline of `bench shmem` and
 * `bench engines` (what the network gives an application that just writes to a socket).
 * Blocking sockets with large kernel buffers, TCP_NODELAY; one connection carries both
 * directions. */
#ifndef MM_BENCH_TCP_H
#define MM_BENCH_TCP_H

#include <stddef.h>

/* A listening socket on every address, port chosen by the kernel (*port_p). -1 on failure. */
int mm_btcp_listen(int *port_p);
/* Accept one connection within timeout_s. -1 on failure. */
int mm_btcp_accept(int lfd, double timeout_s);
/* Connect to host:port, retrying until timeout_s. -1 on failure. */
int mm_btcp_connect(const char *host, int port, double timeout_s);
/* The host of the bootstrap endpoint tcp://HOST:PORT in the environment (where rank 0 of the
 * job listens, so reachable from every rank) into buf. 0 on success. */
int mm_btcp_rank0_host(char *buf, size_t len);
/* Full duplex: send total bytes (src repeated in chunks of chunk bytes) while receiving the
 * peer's total bytes into dst (chunk bytes, reused). One thread, poll(). 0 on success. */
int mm_btcp_stream(int fd, const void *src, void *dst, size_t chunk, size_t total);
/* iters 8-byte ping-pongs (initiator sends first); 0 on success. */
int mm_btcp_pingpong(int fd, int initiator, long iters);

#endif
