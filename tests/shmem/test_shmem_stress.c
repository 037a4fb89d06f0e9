/* 10,000 iterations of random one-sided traffic (run under `megamoe launch -n 3`).
 *
 * In iteration i every PE sends to (me + 1 + i mod (n-1)) mod n, so every PE also receives
 * from exactly one source. Size, source offset, destination offset, signal kind and whether
 * the receiver pulls (get) instead of the sender pushing (put-with-signal) are drawn from a
 * generator seeded by (iteration, source), so both sides know the plan without talking.
 * Every received byte is checked, then the receiver acks; the sender waits for the ack before
 * its next iteration. A PE may get the next message from another source while still checking
 * the current one, so each source has its own receive area and signal line, whose value
 * counts the messages from that source.
 */
#include <stdio.h>
#include <stdlib.h>

#include "shmem_test_util.h"

#define MM_AREA ((2u << 20) + 4096)
#define MM_ITERS 10000

typedef struct {
    size_t size, src_off, dst_off;
    int use_get, sig_add;
} mm_plan_t;

static mm_plan_t mm_plan(uint64_t iter, int src)
{
    uint64_t s = iter * 0x9e3779b97f4a7c15ull + (uint64_t)src * 0x632be59bd9b4e019ull + 1;
    mm_plan_t p;
    uint64_t kind = mm_t_rand(&s) % 1000;
    if (kind < 5) p.size = (1u << 20) + (size_t)(mm_t_rand(&s) % (1u << 20));
    else if (kind < 100) p.size = (size_t)(mm_t_rand(&s) % (256u << 10));
    else if (kind < 120) p.size = 0;
    else p.size = (size_t)(mm_t_rand(&s) % 8192);
    p.src_off = (size_t)(mm_t_rand(&s) % (MM_AREA - p.size));
    p.dst_off = (size_t)(mm_t_rand(&s) % (MM_AREA - p.size));
    p.use_get = mm_t_rand(&s) % 4 == 0;
    p.sig_add = mm_t_rand(&s) % 2;
    return p;
}

MM_TEST(random_traffic_10000_iterations)
{
    mm_shmem_params_t prm = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&prm));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    ASSERT_TRUE(n >= 2);
    uint8_t *recv = NULL, *out = NULL;
    uint64_t *lines = NULL; /* [8 * src] data/ready signal per source, [8 * n] ack */
    ASSERT_OK(mm_shmem_calloc((size_t)n * MM_AREA, 64, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc(MM_AREA, 64, (void **)&out));
    ASSERT_OK(mm_shmem_calloc((size_t)(n + 1) * 64, 64, (void **)&lines));
    uint64_t *ack = &lines[8 * n];
    uint64_t *sent = calloc((size_t)n, sizeof *sent), *got = calloc((size_t)n, sizeof *got);
    uint64_t checked = 0, gets = 0, big = 0;
    double t0 = mm_now_s();
    for (uint64_t i = 0; i < MM_ITERS; i++) {
        int hop = 1 + (int)(i % (uint64_t)(n - 1));
        int to = (me + hop) % n, from = (me + n - hop) % n;
        mm_plan_t send = mm_plan(i, me), rcv = mm_plan(i, from);
        uint64_t *sig_out = &lines[8 * me], *sig_in = &lines[8 * from];
        uint8_t *dst_area = recv + (size_t)me * MM_AREA, *my_area = recv + (size_t)from * MM_AREA;
        uint64_t nth_out = ++sent[to], nth_in = ++got[from];
        /* Sender: stage the data in its outbox, then push it or just announce it. */
        mm_t_fill(out + send.src_off, send.size, me, i);
        if (send.use_get) {
            mm_shmem_quiet();
            mm_shmem_signal_op(sig_out, send.sig_add ? 1 : nth_out,
                               send.sig_add ? MM_SHMEM_SIGNAL_ADD : MM_SHMEM_SIGNAL_SET, to);
        } else {
            mm_shmem_put_signal(dst_area + send.dst_off, out + send.src_off, send.size, sig_out,
                                send.sig_add ? 1 : nth_out,
                                send.sig_add ? MM_SHMEM_SIGNAL_ADD : MM_SHMEM_SIGNAL_SET, to);
        }
        /* Receiver: wait, pull if asked to, verify every byte, ack. */
        ASSERT_OK(mm_shmem_signal_wait_until(sig_in, MM_SHMEM_CMP_EQ, nth_in, NULL));
        if (rcv.use_get) {
            mm_shmem_get(my_area + rcv.dst_off, out + rcv.src_off, rcv.size, from);
            gets++;
        }
        long bad = mm_t_check(my_area + rcv.dst_off, rcv.size, from, i);
        if (bad >= 0)
            MM_FAIL_("iteration %llu: byte %ld of %zu from rank %d wrong (%s, src off %zu, dst "
                     "off %zu)", (unsigned long long)i, bad, rcv.size, from,
                     rcv.use_get ? "get" : "put", rcv.src_off, rcv.dst_off);
        checked += rcv.size;
        big += rcv.size >= (1u << 20);
        mm_shmem_signal_op(ack, 1, MM_SHMEM_SIGNAL_ADD, from);
        /* my destination has checked my data (and finished reading my outbox) */
        ASSERT_OK(mm_shmem_signal_wait_until(ack, MM_SHMEM_CMP_EQ, i + 1, NULL));
    }
    double dt = mm_now_s() - t0;
    fprintf(stderr, "rank %d: %d iterations in %.2f s, %llu bytes checked, %llu gets, %llu "
            "large\n", me, MM_ITERS, dt, (unsigned long long)checked, (unsigned long long)gets,
            (unsigned long long)big);
    ASSERT_TRUE(gets > 0 && big > 0);
    free(sent);
    free(got);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(out));
    ASSERT_OK(mm_shmem_free(lines));
    ASSERT_OK(mm_shmem_release());
}
