/* One-sided operations across ranks (run under `megamoe launch -n 4`): ring put-with-signal,
 * all-to-all puts with per-source signals (every byte verified), gets, signal operations and
 * every comparison of wait-until, copies above the streaming-store threshold at odd offsets. */
#include <stdio.h>
#include <stdlib.h>

#include "shmem/shmem_internal.h"
#include "shmem_test_util.h"

#define MM_MAXB (2u << 20) /* largest block per source */

MM_TEST(ring_put_with_signal)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    ASSERT_EQ_INT(n, mm_test_world());
    ASSERT_EQ_INT(me, mm_test_rank());
    ASSERT_TRUE(n >= 2);
    uint8_t *buf = NULL, *src = malloc(MM_MAXB);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(MM_MAXB, 64, (void **)&buf));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (uint64_t round = 0; round < 60; round++) {
        size_t size = round == 7 ? MM_MAXB - 3 : 1 + (size_t)(round * 7919) % 65536;
        int op = round % 2 ? MM_SHMEM_SIGNAL_ADD : MM_SHMEM_SIGNAL_SET;
        uint64_t value = op == MM_SHMEM_SIGNAL_ADD ? 1 : round + 1;
        if (me != 0) {
            uint64_t got = 0;
            ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, round + 1, &got));
            ASSERT_EQ_U64(got, round + 1);
            long bad = mm_t_check(buf, size, prev, round);
            if (bad >= 0) MM_FAIL_("round %llu: byte %ld from rank %d wrong",
                                   (unsigned long long)round, bad, prev);
        }
        mm_t_fill(src, size, me, round);
        mm_shmem_put_signal(buf, src, size, sig, value, op, next);
        if (me == 0) {
            uint64_t got = 0;
            ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, round + 1, &got));
            long bad = mm_t_check(buf, size, prev, round);
            if (bad >= 0) MM_FAIL_("round %llu: byte %ld wrong at rank 0", (unsigned long long)round, bad);
        }
    }
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_EQ_U64(mm_shmem_signal_fetch(sig), 60);
    free(src);
    ASSERT_OK(mm_shmem_free(buf));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(all_to_all_puts_with_per_source_signals)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    uint8_t *recv = NULL, *send = malloc(MM_MAXB + 64);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc((size_t)n * MM_MAXB, 4096, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc((size_t)n * 64, 64, (void **)&sig));
    static const size_t sizes[] = {1, 63, 64, 4097, 65536, 300001, (1u << 20), MM_MAXB - 1};
    for (uint64_t round = 0; round < sizeof sizes / sizeof sizes[0]; round++) {
        size_t size = sizes[round];
        /* odd source offsets exercise unaligned loads in the streaming copy */
        uint8_t *s = send + (round % 7);
        mm_t_fill(s, size, me, round);
        for (int j = 0; j < n; j++) {
            int dst = (me + j) % n; /* includes a put to myself */
            mm_shmem_put_signal(recv + (size_t)me * MM_MAXB, s, size, &sig[me * 8], round + 1,
                                MM_SHMEM_SIGNAL_SET, dst);
        }
        for (int src = 0; src < n; src++) {
            ASSERT_OK(mm_shmem_signal_wait_until(&sig[src * 8], MM_SHMEM_CMP_EQ, round + 1, NULL));
            long bad = mm_t_check(recv + (size_t)src * MM_MAXB, size, src, round);
            if (bad >= 0)
                MM_FAIL_("round %llu size %zu: byte %ld from rank %d wrong",
                         (unsigned long long)round, size, bad, src);
        }
        ASSERT_OK(mm_shmem_barrier_all()); /* nobody overwrites before everyone checked */
    }
    free(send);
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(gets_from_every_peer)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    const size_t total = 3u << 20;
    uint8_t *mine = NULL, *local = malloc(total + 64);
    ASSERT_OK(mm_shmem_malloc(total, 0, (void **)&mine));
    mm_t_fill(mine, total, me, 99);
    ASSERT_OK(mm_shmem_barrier_all());
    uint64_t seed = 1234 + (uint64_t)me;
    for (int it = 0; it < 200; it++) {
        int pe = (int)(mm_t_rand(&seed) % (uint64_t)n);
        size_t size = it % 50 == 0 ? (1u << 20) + (size_t)(mm_t_rand(&seed) % 100000)
                                   : (size_t)(mm_t_rand(&seed) % 70000);
        size_t off = (size_t)(mm_t_rand(&seed) % (total - size));
        uint8_t *dst = local + it % 13;
        mm_shmem_get(dst, mine + off, size, pe);
        for (size_t i = 0; i < size; i++)
            if (dst[i] != mm_t_byte(pe, 99, off + i))
                MM_FAIL_("get %d from rank %d: byte %zu of [%zu,+%zu) wrong", it, pe, i, off, size);
        /* direct load through mm_shmem_ptr sees the same bytes */
        const uint8_t *direct = mm_shmem_ptr(mine + off, pe);
        if (mm_shmem_pe_remote(pe)) { /* through the engine: no mapping */
            ASSERT_TRUE(direct == NULL);
            continue;
        }
        ASSERT_TRUE(direct != NULL);
        if (size) ASSERT_EQ_INT(direct[size - 1], mm_t_byte(pe, 99, off + size - 1));
    }
    ASSERT_OK(mm_shmem_barrier_all());
    free(local);
    ASSERT_OK(mm_shmem_free(mine));
    ASSERT_OK(mm_shmem_release());
}

/* mm_shmem_get_many: blocks from every peer (several per peer, sizes 0 to ~1 MiB, more than
 * one engine batch of 64) in one call, each landing whole at its own dest; then an argument
 * error in the middle of a list comes back (the gets before it are complete: no engine write
 * lands after the call). */
MM_TEST(many_gets_in_one_call)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    const size_t total = 2u << 20;
    enum { NOPS = 150 };
    uint8_t *mine = NULL;
    ASSERT_OK(mm_shmem_malloc(total, 0, (void **)&mine));
    mm_t_fill(mine, total, me, 77);
    mm_shmem_get_op_t ops[NOPS];
    size_t offs[NOPS];
    uint8_t *bufs[NOPS];
    uint64_t seed = 991 + (uint64_t)me;
    for (int i = 0; i < NOPS; i++) {
        size_t size = i % 40 == 0 ? (1u << 20) : i % 7 == 0 ? 0 : (size_t)(mm_t_rand(&seed) % 9000);
        offs[i] = (size_t)(mm_t_rand(&seed) % (total - size));
        bufs[i] = malloc(size + 1);
        ASSERT_TRUE(bufs[i] != NULL);
        ops[i] = (mm_shmem_get_op_t){bufs[i], mine + offs[i], size, (me + 1 + i) % n};
    }
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_get_many(ops, NOPS));
    for (int i = 0; i < NOPS; i++)
        for (size_t k = 0; k < ops[i].nbytes; k++)
            if (bufs[i][k] != mm_t_byte(ops[i].pe, 77, offs[i] + k))
                MM_FAIL_("get %d of %zu bytes from rank %d: byte %zu wrong", i, ops[i].nbytes,
                         ops[i].pe, k);
    ASSERT_OK(mm_shmem_get_many(ops, 0));
    ops[5].src = &seed; /* not in the symmetric heap */
    ops[5].nbytes = sizeof seed;
    ASSERT_STATUS(mm_shmem_get_many(ops, 10), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "is not inside the symmetric heap");
    ASSERT_OK(mm_shmem_barrier_all());
    for (int i = 0; i < NOPS; i++) free(bufs[i]);
    ASSERT_OK(mm_shmem_free(mine));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(signal_ops_and_every_comparison)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(4 * 64, 64, (void **)&sig));
    for (int pe = 0; pe < n; pe++) mm_shmem_signal_op(&sig[0], (uint64_t)me + 1, MM_SHMEM_SIGNAL_ADD, pe);
    uint64_t sum = (uint64_t)n * (uint64_t)(n + 1) / 2, got = 0;
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_EQ, sum, &got));
    ASSERT_EQ_U64(got, sum);
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_GE, sum, NULL));
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_GT, sum - 1, NULL));
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_LE, sum, NULL));
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_LT, sum + 1, NULL));
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[0], MM_SHMEM_CMP_NE, 0, NULL));
    ASSERT_EQ_U64(mm_shmem_signal_fetch(&sig[0]), sum);
    /* SET from rank 0: others wait for "not zero" and see exactly the value */
    if (me == 0)
        for (int pe = 0; pe < n; pe++) mm_shmem_signal_op(&sig[8], 1000 + (uint64_t)pe, MM_SHMEM_SIGNAL_SET, pe);
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[8], MM_SHMEM_CMP_NE, 0, &got));
    ASSERT_EQ_U64(got, 1000 + (uint64_t)me);
    /* put, fence, signal to the right neighbour: the data is there when the signal is seen
     * (rank 0's counter starts at 50 to tell SET and ADD apart) */
    if (me == 0) mm_shmem_signal_op(&sig[16], 50, MM_SHMEM_SIGNAL_SET, me);
    ASSERT_OK(mm_shmem_barrier_all());
    uint64_t *data = &sig[24];
    uint64_t v = 0xabcdef00ull + (uint64_t)me;
    int next = (me + 1) % n;
    mm_shmem_put(data, &v, sizeof v, next);
    mm_shmem_fence();
    mm_shmem_signal_op(&sig[16], 1, MM_SHMEM_SIGNAL_ADD, next);
    mm_shmem_quiet();
    ASSERT_OK(mm_shmem_signal_wait_until(&sig[16], MM_SHMEM_CMP_GE, me == 0 ? 51 : 1, NULL));
    ASSERT_EQ_U64(__atomic_load_n(data, __ATOMIC_ACQUIRE), 0xabcdef00ull + (uint64_t)((me + n - 1) % n));
    ASSERT_OK(mm_shmem_barrier_all());
    /* bad arguments are reported, not executed */
    megamoe_clear_last_error();
    mm_shmem_signal_op(&sig[0], 1, 7, 0);
    ASSERT_CONTAINS(megamoe_last_error(), "sig_op");
    megamoe_clear_last_error();
    mm_shmem_put(&v, &v, 8, 0);
    ASSERT_CONTAINS(megamoe_last_error(), "not inside the symmetric heap");
    megamoe_clear_last_error();
    mm_shmem_put(sig, &v, 8, n);
    ASSERT_CONTAINS(megamoe_last_error(), "PE");
    ASSERT_EQ_U64(mm_shmem_signal_fetch(&sig[0]), sum);
    for (int pe = 0; pe < n; pe++) ASSERT_TRUE(mm_shmem_pe_alive(pe));
    ASSERT_FALSE(mm_shmem_pe_alive(n));
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

/* Many barriers in a row: generations keep growing, nothing is reset between them. */
MM_TEST(barrier_generations)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    uint64_t *count = NULL;
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&count));
    for (uint64_t i = 1; i <= 2000; i++) {
        /* everyone bumps rank 0's counter, then a barrier: rank 0 must see exactly i*n */
        mm_shmem_signal_op(count, 1, MM_SHMEM_SIGNAL_ADD, 0);
        ASSERT_OK(mm_shmem_barrier_all());
        if (me == 0 && mm_shmem_signal_fetch(count) != i * (uint64_t)n)
            MM_FAIL_("barrier %llu passed with %llu arrivals", (unsigned long long)i,
                     (unsigned long long)mm_shmem_signal_fetch(count));
        ASSERT_OK(mm_shmem_barrier_all());
    }
    ASSERT_OK(mm_shmem_free(count));
    ASSERT_OK(mm_shmem_release());
}

/* Puts and gets above the streaming-store threshold, at odd offsets, ring-wise. */
MM_TEST(large_puts_and_gets_use_streaming_stores)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    size_t t = mm_shmem_nt_threshold();
    size_t size = (t < (20u << 20) ? t : (20u << 20)) + 4097;
    uint8_t *buf = NULL, *local = malloc(size + 64);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(size + 64, 64, (void **)&buf));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    mm_t_fill(local + 5, size, me, 77);
    mm_shmem_put_signal(buf + 3, local + 5, size, sig, 1, MM_SHMEM_SIGNAL_ADD, next);
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 1, NULL));
    ASSERT_EQ_INT(mm_t_check(buf + 3, size, prev, 77), -1);
    ASSERT_OK(mm_shmem_barrier_all());
    memset(local, 0, size + 64);
    mm_shmem_get(local + 9, buf + 3, size, next); /* next holds my data */
    ASSERT_EQ_INT(mm_t_check(local + 9, size, me, 77), -1);
    ASSERT_OK(mm_shmem_barrier_all());
    free(local);
    ASSERT_OK(mm_shmem_free(buf));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}
