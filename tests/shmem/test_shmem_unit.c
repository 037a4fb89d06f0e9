/* SHMEM pieces in one process: SHA-256/HMAC vectors, endpoint parsing, the allocator, and the
 * lifecycle of a one-PE runtime (refcount, leaks, use after teardown, waits, debug state). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "shmem/boot_net.h"
#include "shmem/heap_alloc.h"
#include "shmem/sha256.h"
#include "shmem/shmem_internal.h"
#include "shmem_test_util.h"

static void mm_hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

MM_TEST(sha256_vectors)
{
    uint8_t d[32];
    char hex[65];
    mm_sha256("abc", 3, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    mm_sha256("", 0, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    mm_sha256(m, strlen(m), d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a', fed in uneven pieces */
    mm_sha256_t s;
    mm_sha256_init(&s);
    char a[1000];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    for (size_t k = 1; left > 0; k = k % 997 + 1) {
        size_t take = k < left ? k : left;
        mm_sha256_update(&s, a, take);
        left -= take;
    }
    mm_sha256_final(&s, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

MM_TEST(hmac_rfc4231)
{
    uint8_t d[32];
    char hex[65];
    uint8_t key1[20];
    memset(key1, 0x0b, sizeof key1);
    const void *p1[] = {"Hi ", "There"};
    size_t l1[] = {3, 5};
    mm_hmac_sha256(key1, sizeof key1, p1, l1, 2, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    const void *p2[] = {"what do ya want for nothing?"};
    size_t l2[] = {28};
    mm_hmac_sha256("Jefe", 4, p2, l2, 1, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t key6[131];
    memset(key6, 0xaa, sizeof key6);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const void *p6[] = {m6};
    size_t l6[] = {strlen(m6)};
    mm_hmac_sha256(key6, sizeof key6, p6, l6, 1, d);
    mm_hex(d, 32, hex);
    ASSERT_EQ_STR(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    ASSERT_TRUE(mm_ct_equal("abcd", "abcd", 4));
    ASSERT_FALSE(mm_ct_equal("abcd", "abce", 4));
}

MM_TEST(endpoint_parse_accepts_valid)
{
    mm_endpoint_t ep;
    ASSERT_OK(mm_endpoint_parse("tcp://127.0.0.1:8662", "X", &ep));
    ASSERT_EQ_STR(ep.host, "127.0.0.1");
    ASSERT_EQ_INT(ep.port, 8662);
    ASSERT_OK(mm_endpoint_parse("tcp://localhost:1", "X", &ep));
    ASSERT_EQ_INT(ep.port, 1);
    ASSERT_OK(mm_endpoint_parse("tcp://my-host_1.example:65535", "X", &ep));
    ASSERT_EQ_STR(ep.host, "my-host_1.example");
    ASSERT_EQ_INT(ep.port, 65535);
    ASSERT_OK(mm_endpoint_parse("tcp://[::1]:80", "X", &ep));
    ASSERT_EQ_STR(ep.host, "::1");
}

MM_TEST(endpoint_parse_rejects_bad)
{
    static const char *const bad[] = {
        "", "127.0.0.1:8662", "http://h:1", "TCP://h:1", "tcp://:80", "tcp://h", "tcp://h:",
        "tcp://h:0", "tcp://h:65536", "tcp://h:123456", "tcp://h:+80", "tcp://h:-1",
        "tcp://h:80 ", " tcp://h:80", "tcp://h :80", "tcp://h:8 0", "tcp://h:80/",
        "tcp://h:8a", "tcp://h\t:80", "tcp://h:80\n", "tcp://[::1:80", "tcp://[]:80",
        "tcp://[::1]80", "tcp://a:b:80", "tcp://h/x:80", "tcp://h@x:80", "tcp://",
    };
    mm_endpoint_t ep;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        megamoe_status_t st = mm_endpoint_parse(bad[i], "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", &ep);
        if (st != MEGAMOE_INVALID_ARGUMENT) MM_FAIL_("endpoint '%s' was accepted", bad[i]);
        ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    }
    ASSERT_STATUS(mm_endpoint_parse(NULL, "X", &ep), MEGAMOE_INVALID_ARGUMENT);
    char longer[400] = "tcp://";
    memset(longer + 6, 'a', 300);
    strcpy(longer + 306, ":80");
    ASSERT_STATUS(mm_endpoint_parse(longer, "X", &ep), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "at most 255");
    ASSERT_STATUS(mm_endpoint_parse("tcp://h:80 ", "X", &ep), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "whitespace");
    ASSERT_STATUS(mm_endpoint_parse("udp://h:80", "X", &ep), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "tcp://");
    ASSERT_STATUS(mm_endpoint_parse("tcp://h:70000", "X", &ep), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "[1, 65535]");
}

MM_TEST(bad_endpoint_fails_acquire_and_allows_retry)
{
    mm_shmem_params_t p = mm_t_params();
    p.rank = 0;
    p.world_size = 1;
    p.endpoint = "tcp://127.0.0.1:80 80";
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "the endpoint parameter");
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    p.endpoint = NULL;
    setenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "tcp//127.0.0.1:8662", 1);
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    ASSERT_FALSE(mm_shmem_is_running());
    setenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "tcp://127.0.0.1:8662", 1);
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_OK(mm_shmem_release());
    unsetenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
}

/* Reference model: random mallocs/frees never overlap, respect alignment, and two allocators
 * fed the same sequence agree exactly (what makes allocations symmetric). */
MM_TEST(allocator_deterministic_aligned_coalescing)
{
    mm_heap_alloc_t a, b;
    const uint64_t heap = 8u << 20;
    ASSERT_EQ_INT(mm_heap_alloc_init(&a, heap), 0);
    ASSERT_EQ_INT(mm_heap_alloc_init(&b, heap), 0);
    enum { SLOTS = 64 };
    uint64_t off[SLOTS], size[SLOTS];
    int live[SLOTS] = {0};
    uint64_t seed = 42;
    for (int it = 0; it < 20000; it++) {
        int s = (int)(mm_t_rand(&seed) % SLOTS);
        if (live[s]) {
            ASSERT_EQ_INT(mm_heap_alloc_give(&a, off[s]), 0);
            ASSERT_EQ_INT(mm_heap_alloc_give(&b, off[s]), 0);
            live[s] = 0;
            continue;
        }
        uint64_t sz = mm_t_rand(&seed) % 300000, al = 1ull << (mm_t_rand(&seed) % 14);
        uint64_t oa, ob;
        int ra = mm_heap_alloc_take(&a, sz, al, "t", (uint64_t)it, &oa);
        int rb = mm_heap_alloc_take(&b, sz, al, "t", (uint64_t)it, &ob);
        ASSERT_EQ_INT(ra, rb);
        if (ra != 0) continue;
        ASSERT_EQ_U64(oa, ob);
        ASSERT_EQ_U64(oa % (al < 64 ? 64 : al), 0);
        ASSERT_TRUE(oa + sz <= heap);
        for (int j = 0; j < SLOTS; j++)
            if (live[j] && oa < off[j] + (size[j] ? size[j] : 1) && off[j] < oa + (sz ? sz : 1))
                MM_FAIL_("allocation [%llu,+%llu) overlaps [%llu,+%llu)",
                         (unsigned long long)oa, (unsigned long long)sz,
                         (unsigned long long)off[j], (unsigned long long)size[j]);
        off[s] = oa;
        size[s] = sz;
        live[s] = 1;
    }
    for (int s = 0; s < SLOTS; s++)
        if (live[s]) ASSERT_EQ_INT(mm_heap_alloc_give(&a, off[s]), 0);
    ASSERT_EQ_INT(a.live, 0);
    ASSERT_EQ_U64(a.used, 0);
    ASSERT_EQ_INT((int)a.n, 1); /* everything coalesced back into one block */
    ASSERT_EQ_U64(mm_heap_alloc_largest_free(&a), heap);
    ASSERT_TRUE(a.peak > 0);
    uint64_t o;
    ASSERT_EQ_INT(mm_heap_alloc_take(&a, heap + 1, 64, "big", 0, &o), -1);
    ASSERT_EQ_INT(mm_heap_alloc_give(&a, 12345), -1);
    mm_heap_alloc_fini(&a);
    mm_heap_alloc_fini(&b);
}

static mm_shmem_params_t mm_single(void)
{
    mm_shmem_params_t p = mm_t_params();
    p.rank = 0;
    p.world_size = 1;
    p.endpoint = "tcp://127.0.0.1:1";
    p.heap_size = 16u << 20;
    return p;
}

MM_TEST(lifecycle_refcount_and_misuse)
{
    ASSERT_STATUS(mm_shmem_release(), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "without a matching");
    mm_shmem_params_t p = mm_single();
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_EQ_INT(mm_shmem_refcount(), 1);
    ASSERT_TRUE(mm_shmem_is_running());
    ASSERT_EQ_INT(mm_shmem_my_pe(), 0);
    ASSERT_EQ_INT(mm_shmem_n_pes(), 1);
    ASSERT_OK(mm_shmem_acquire(NULL)); /* defaults always fit */
    ASSERT_OK(mm_shmem_acquire(&p));   /* the same values fit */
    mm_shmem_params_t other = p;
    other.heap_size = 32u << 20;
    ASSERT_STATUS(mm_shmem_acquire(&other), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "heap_size");
    ASSERT_EQ_INT(mm_shmem_refcount(), 3);
    ASSERT_OK(mm_shmem_release());
    ASSERT_OK(mm_shmem_release());
    ASSERT_EQ_INT(mm_shmem_refcount(), 1);
    ASSERT_TRUE(mm_shmem_is_running());
    ASSERT_OK(mm_shmem_release());
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    ASSERT_FALSE(mm_shmem_is_running());
    /* use after teardown */
    void *x = NULL;
    ASSERT_STATUS(mm_shmem_malloc(64, 0, &x), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "not running");
    ASSERT_STATUS(mm_shmem_barrier_all(), MEGAMOE_INVALID_STATE);
    ASSERT_TRUE(mm_shmem_team_world() == NULL);
    ASSERT_EQ_INT(mm_shmem_my_pe(), -1);
    ASSERT_STATUS(mm_shmem_team_barrier(NULL), MEGAMOE_INVALID_STATE);
    ASSERT_STATUS(mm_shmem_check_liveness(), MEGAMOE_INVALID_STATE);
    megamoe_clear_last_error();
    char local[8];
    mm_shmem_put(local, local, 8, 0);
    ASSERT_CONTAINS(megamoe_last_error(), "INVALID_STATE");
    ASSERT_TRUE(mm_shmem_ptr(local, 0) == NULL);
    ASSERT_OK(mm_shmem_free(NULL));
    ASSERT_STATUS(mm_shmem_release(), MEGAMOE_INVALID_STATE);
}

MM_TEST(heap_allocations_debug_state_and_leaks)
{
    mm_shmem_params_t p = mm_single();
    ASSERT_OK(mm_shmem_acquire(&p));
    void *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(mm_shmem_malloc(1000, 0, &a));
    ASSERT_OK(mm_shmem_malloc(4096, 4096, &b));
    ASSERT_EQ_U64((uintptr_t)b % 4096, 0);
    ASSERT_TRUE(mm_shmem_is_symmetric(a, 1000));
    ASSERT_FALSE(mm_shmem_is_symmetric(&p, 1));
    ASSERT_TRUE(mm_shmem_ptr(a, 0) == a);
    ASSERT_TRUE(mm_shmem_ptr(a, 1) == NULL);
    mm_shmem_debug_state_t ds;
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_INT(ds.refcount, 1);
    ASSERT_EQ_U64(ds.heap_size, 16u << 20);
    ASSERT_EQ_INT(ds.live_allocations, 2);
    ASSERT_EQ_U64(ds.bytes_used, 1024 + 4096);
    ASSERT_CONTAINS(ds.live_table, "test_shmem_unit.c:");
    ASSERT_CONTAINS(ds.live_table, "asked 1000");
    /* last release refuses while allocations live, names them, keeps the reference */
    ASSERT_STATUS(mm_shmem_release(), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "2 symmetric allocation(s)");
    ASSERT_CONTAINS(megamoe_last_error(), "test_shmem_unit.c:");
    ASSERT_EQ_INT(mm_shmem_refcount(), 1);
    ASSERT_TRUE(mm_shmem_is_running());
    ASSERT_OK(mm_shmem_free(a));
    ASSERT_STATUS(mm_shmem_free(a), MEGAMOE_INVALID_ARGUMENT); /* double free */
    ASSERT_CONTAINS(megamoe_last_error(), "not a live symmetric allocation");
    ASSERT_STATUS(mm_shmem_free(&p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_shmem_malloc(64, 48, &c), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "power of two");
    /* exhaustion names the variable and the size needed */
    ASSERT_STATUS(mm_shmem_malloc(20u << 20, 0, &c), MEGAMOE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE to at least 21M");
    ASSERT_OK(mm_shmem_calloc(3u << 20, 0, &c)); /* large, zeroed */
    for (size_t i = 0; i < (3u << 20); i += 4093) ASSERT_EQ_INT(((uint8_t *)c)[i], 0);
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_U64(ds.bytes_peak, (3u << 20) + 4096); /* a was freed before */
    ASSERT_OK(mm_shmem_free(b));
    ASSERT_OK(mm_shmem_free(c));
    ASSERT_OK(mm_shmem_free(NULL));
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_INT(ds.live_allocations, 0);
    ASSERT_EQ_U64(ds.bytes_used, 0);
    ASSERT_OK(mm_shmem_release());
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_INT(ds.refcount, 0);
}

MM_TEST(new_lifecycle_rereads_heap_size)
{
    mm_shmem_params_t p = mm_single();
    p.heap_size = 0;
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "16M", 1);
    ASSERT_OK(mm_shmem_acquire(&p));
    mm_shmem_debug_state_t ds;
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_U64(ds.heap_size, 16u << 20);
    ASSERT_OK(mm_shmem_release());
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "24M", 1);
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_U64(ds.heap_size, 24u << 20);
    ASSERT_OK(mm_shmem_release());
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "lots", 1);
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE");
    unsetenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE");
}

static double mm_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

MM_TEST(wait_times_out_without_burning_a_core)
{
    mm_shmem_params_t p = mm_single();
    p.timeout_sec = 1;
    ASSERT_OK(mm_shmem_acquire(&p));
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    double t0 = mm_now_s(), c0 = mm_cpu_s();
    ASSERT_STATUS(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, 1, NULL), MEGAMOE_TIMEOUT);
    double wall = mm_now_s() - t0, cpu = mm_cpu_s() - c0;
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC");
    ASSERT_TRUE(wall >= 0.99 && wall < 1.0 + 0.5 * mm_test_timeout_multiplier());
    fprintf(stderr, "idle wait: %.3f s wall, %.3f s cpu\n", wall, cpu);
    ASSERT_TRUE(cpu < 0.25 * wall);
    uint64_t local = 5, got = 0;
    ASSERT_STATUS(mm_shmem_wait_u64(&local, MM_SHMEM_CMP_LT, 5, NULL), MEGAMOE_TIMEOUT);
    ASSERT_OK(mm_shmem_wait_u64(&local, MM_SHMEM_CMP_LE, 5, &got));
    ASSERT_EQ_U64(got, 5);
    ASSERT_STATUS(mm_shmem_wait_u64(&local, 17, 5, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_TRUE(mm_shmem_test_u64(&local, MM_SHMEM_CMP_NE, 4));
    ASSERT_FALSE(mm_shmem_test_u64(&local, MM_SHMEM_CMP_GT, 5));
    ASSERT_OK(mm_shmem_check_liveness());
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

typedef struct {
    uint64_t *word;
    double delay_s;
    double stored_at; /* when the store happened (the setter's own sleep may run long) */
} mm_setter_t;

static void *mm_setter(void *arg)
{
    mm_setter_t *s = arg;
    mm_sleep_ns((uint64_t)(s->delay_s * 1e9));
    s->stored_at = mm_now_s();
    __atomic_store_n(s->word, 7, __ATOMIC_RELEASE);
    return NULL;
}

/* A waiter deep in its sleep phase still wakes within about a millisecond of the store. The
 * lateness is measured from the store itself, and each delay gets three tries (the best
 * counts): on a loaded machine either thread can go unscheduled for tens of milliseconds, which
 * says nothing about the wait's sleep phase, while a waiter that slept too long is late every
 * time. */
MM_TEST(wait_wakes_from_sleep_phase)
{
    for (int i = 0; i < 3; i++) {
        double best = 1e9;
        for (int attempt = 0; attempt < 3 && best >= 0.02 * mm_test_timeout_multiplier(); attempt++) {
            uint64_t word = 0;
            mm_setter_t s = {&word, 0.05 * (i + 1), 0.0};
            pthread_t th;
            ASSERT_EQ_INT(pthread_create(&th, NULL, mm_setter, &s), 0);
            uint64_t got = 0;
            ASSERT_OK(mm_shmem_wait_u64(&word, MM_SHMEM_CMP_EQ, 7, &got));
            const double woke = mm_now_s();
            pthread_join(th, NULL);
            ASSERT_EQ_U64(got, 7);
            const double late = woke - s.stored_at;
            fprintf(stderr, "woke %.3f ms after the store\n", late * 1e3);
            if (late < best) best = late;
        }
        ASSERT_TRUE(best < 0.02 * mm_test_timeout_multiplier());
    }
}

MM_TEST(log_level_shows_allocation_sites)
{
    static mm_t_log_t log = {.lock = PTHREAD_MUTEX_INITIALIZER};
    megamoe_log_set_callback(mm_t_log_sink, &log);
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "2", 1);
    mm_shmem_params_t p = mm_single();
    ASSERT_OK(mm_shmem_acquire(&p));
    void *a = NULL;
    ASSERT_OK(mm_shmem_malloc(128, 0, &a));
    ASSERT_OK(mm_shmem_free(a));
    ASSERT_OK(mm_shmem_release());
    ASSERT_FALSE(mm_t_log_has(&log, "malloc #0"));
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "0", 1);
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_OK(mm_shmem_malloc(128, 0, &a));
    ASSERT_OK(mm_shmem_free(a));
    ASSERT_OK(mm_shmem_release());
    megamoe_log_set_callback(NULL, NULL);
    unsetenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL");
    ASSERT_TRUE(mm_t_log_has(&log, "malloc #0: 128 bytes"));
    ASSERT_TRUE(mm_t_log_has(&log, "test_shmem_unit.c:"));
    ASSERT_TRUE(mm_t_log_has(&log, "started: rank 0 of 1"));
}

/* The streaming copy at every alignment and tail length, and the threshold's bounds. */
MM_TEST(streaming_copy_is_exact)
{
    enum { N = (3u << 20) + 300 };
    uint8_t *src = malloc(N + 128), *dst = malloc(N + 128);
    mm_t_fill(src, N + 128, 5, 5);
    for (size_t so = 0; so < 64; so += 7)
        for (size_t doff = 0; doff < 64; doff += 5)
            for (size_t n = 0; n < 600; n += 37) {
                memset(dst, 0xee, 700);
                mm_shmem_copy_streaming(dst + doff, src + so, n);
                if (memcmp(dst + doff, src + so, n) != 0) MM_FAIL_("copy %zu at %zu->%zu wrong", n, so, doff);
                if (dst[doff + n] != 0xee) MM_FAIL_("copy %zu at %zu->%zu wrote past the end", n, so, doff);
            }
    memset(dst, 0, N + 128);
    mm_shmem_copy_streaming(dst + 3, src + 17, N);
    ASSERT_EQ_INT(memcmp(dst + 3, src + 17, N), 0);
    ASSERT_EQ_INT(dst[N + 3], 0);
    memset(dst, 0, N + 128);
    mm_shmem_copy(dst + 1, src + 2, N); /* whichever path the threshold picks */
    ASSERT_EQ_INT(memcmp(dst + 1, src + 2, N), 0);
    size_t t = mm_shmem_nt_threshold();
    fprintf(stderr, "streaming-store threshold: %zu bytes\n", t);
    ASSERT_TRUE(t >= MM_SHMEM_NT_MIN);
    free(src);
    free(dst);
}

/* Argument errors of the waits are returned, never a crash: a NULL word used to be loaded
 * before it was checked (SIGSEGV). */
MM_TEST(wait_rejects_null_word)
{
    ASSERT_STATUS(mm_shmem_wait_u64(NULL, MM_SHMEM_CMP_EQ, 0, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "NULL address");
    ASSERT_STATUS(mm_shmem_signal_wait_until(NULL, MM_SHMEM_CMP_GE, 1, NULL),
                  MEGAMOE_INVALID_ARGUMENT);
    uint64_t w = 3;
    ASSERT_STATUS(mm_shmem_wait_u64(&w, -1, 3, NULL), MEGAMOE_INVALID_ARGUMENT);
}

/* A request larger than any heap names a size to raise to that is at least the request
 * (the sum used to wrap around and name a few MiB). */
MM_TEST(exhaustion_message_for_huge_request)
{
    mm_shmem_params_t p = mm_single();
    ASSERT_OK(mm_shmem_acquire(&p));
    void *c = NULL;
    ASSERT_STATUS(mm_shmem_malloc(SIZE_MAX, 0, &c), MEGAMOE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE");
    const char *at = strstr(megamoe_last_error(), "to at least ");
    ASSERT_TRUE(at != NULL);
    unsigned long long mib = strtoull(at + strlen("to at least "), NULL, 10);
    ASSERT_TRUE(mib >= (SIZE_MAX >> 20));
    ASSERT_STATUS(mm_shmem_malloc(SIZE_MAX - 32, 4096, &c), MEGAMOE_OUT_OF_MEMORY);
    ASSERT_OK(mm_shmem_release());
}

/* An alignment the heap honours is an alignment of the address, not only of the offset. */
MM_TEST(large_alignment_is_an_address_alignment)
{
    mm_shmem_params_t p = mm_single();
    ASSERT_OK(mm_shmem_acquire(&p));
    void *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(mm_shmem_malloc(100, 0, &a));
    ASSERT_OK(mm_shmem_malloc(100, 1u << 21, &b));
    ASSERT_EQ_U64((uintptr_t)b % (1u << 21), 0);
    ASSERT_OK(mm_shmem_malloc(100, 1u << 20, &c));
    ASSERT_EQ_U64((uintptr_t)c % (1u << 20), 0);
    void *d = NULL;
    ASSERT_STATUS(mm_shmem_malloc(100, 4u << 20, &d), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "at most");
    ASSERT_OK(mm_shmem_free(c));
    ASSERT_OK(mm_shmem_free(b));
    ASSERT_OK(mm_shmem_free(a));
    ASSERT_OK(mm_shmem_release());
}

/* A failed frame receive leaves nothing to free (found by the bootstrap fuzzer: rank 1 freed
 * the ACCEPT body twice when rank 0 closed the connection before sending its verdict). */
MM_TEST(frame_recv_failure_leaves_no_body)
{
    int sv[2];
    ASSERT_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    uint8_t hdr[MM_FRAME_HEADER];
    mm_frame_encode_header(hdr, MM_FRAME_ACCEPT, 4);
    ASSERT_EQ_INT(write(sv[1], hdr, sizeof hdr), (long)sizeof hdr);
    ASSERT_EQ_INT(write(sv[1], "abcd", 4), 4);
    void *body = (void *)&sv; /* a stale pointer, as after a free */
    size_t len = 99;
    int type = 0;
    /* the wrong type: the body that came is freed and NULL */
    ASSERT_STATUS(mm_frame_recv(sv[0], MM_FRAME_VERDICT, 64, &body, &len, mm_now_ns() + 1000000000ull),
                  MEGAMOE_INTERNAL);
    ASSERT_TRUE(body == NULL);
    /* bad magic, then a peer that closes: nothing allocated, body NULL each time */
    body = (void *)&sv;
    ASSERT_EQ_INT(write(sv[1], "not a frame!", 12), 12);
    ASSERT_STATUS(mm_frame_recv_any(sv[0], 64, &type, &body, &len, mm_now_ns() + 1000000000ull),
                  MEGAMOE_INTERNAL);
    ASSERT_TRUE(body == NULL && len == 0);
    body = (void *)&sv;
    close(sv[1]);
    ASSERT_STATUS(mm_frame_recv(sv[0], MM_FRAME_VERDICT, 64, &body, &len, mm_now_ns() + 1000000000ull),
                  MEGAMOE_PEER_LOST);
    ASSERT_TRUE(body == NULL);
    close(sv[0]);
}
