/* Raw UCX UCP between two ranks, written against the UCX API directly (not through megamoe's
 * engine): the "engine" baseline of `bench shmem` and the UCX candidate of `bench engines`.
 *
 * One context and worker per rank, one registered region that the peer writes into, the
 * address and remote key exchanged by the caller (any allgather), then puts (ucp_put_nbx,
 * pipelined: every put is posted before any completes), a flush per endpoint, and 8-byte flag
 * puts for signals. The configuration is megamoe's engine default: no shared-memory
 * transports (UCX_TLS, when set, is used as given), the network device named by the caller
 * (UCX_NET_DEVICES, when set, wins) and its TCP segment sizes (UCX_TCP_TX/RX_SEG_SIZE win). On TCP a put lands only while the target
 * progresses its worker: a waiting rank progresses (mm_bucx_wait_word), or a progress thread
 * does (mm_bucx_thread_start .. mm_bucx_thread_stop: the worker is SERIALIZED, so the caller
 * makes no other mm_bucx call in between). */
#ifndef MM_BENCH_UCX_H
#define MM_BENCH_UCX_H

#include <stddef.h>
#include <stdint.h>

typedef struct mm_bucx mm_bucx_t;

/* Start UCP with region [base, base + len) registered for the peer. NULL on failure (the
 * reason on stderr). */
mm_bucx_t *mm_bucx_create(const char *net_device, void *base, size_t len);
/* What the peer needs (address, remote key, region base): into buf (cap bytes); 0 when it does
 * not fit. */
size_t mm_bucx_blob(mm_bucx_t *u, void *buf, size_t cap);
/* Connect to the peer from its blob and wire the connection up (a get). 0 on success. */
int mm_bucx_connect(mm_bucx_t *u, const void *blob, size_t len);
/* Non-blocking put of n bytes from src to offset off of the peer's region (src must stay
 * valid until the next flush). 0 on success. */
int mm_bucx_put(mm_bucx_t *u, const void *src, size_t n, uint64_t off);
/* Every put before is complete at the peer (ucp_ep_flush_nbx, progressing). 0 on success. */
int mm_bucx_flush(mm_bucx_t *u);
/* Progress the worker until the local 64-bit word reaches at least value. 0 on success, -1
 * after timeout_s. */
int mm_bucx_wait_word(mm_bucx_t *u, const volatile uint64_t *word, uint64_t value,
                      double timeout_s);
/* Store value into the peer's word at offset off: an 8-byte put, not flushed; with fence, after
 * ucp_worker_fence (ordered after the puts before it: UCX 1.13 may implement the fence as a
 * flush of the lanes in use). */
int mm_bucx_put_flag(mm_bucx_t *u, uint64_t off, uint64_t value, int fence);
void mm_bucx_progress(mm_bucx_t *u);
/* A thread that progresses the worker, sleeping on its event fd (as megamoe's engine does),
 * until mm_bucx_thread_stop. 0 on success. */
int mm_bucx_thread_start(mm_bucx_t *u);
void mm_bucx_thread_stop(mm_bucx_t *u);
/* "UCX 1.13.1 ucp_put_nbx, device eth0, transports ^sm" */
const char *mm_bucx_describe(const mm_bucx_t *u);
void mm_bucx_destroy(mm_bucx_t *u);

#endif
