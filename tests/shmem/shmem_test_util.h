/* Helpers shared by the SHMEM tests. */
#ifndef MM_TESTS_SHMEM_TEST_UTIL_H
#define MM_TESTS_SHMEM_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "free_port.h"
#include "harness/harness.h"
#include "megamoe/log.h"
#include "shmem/shmem.h"

/* Small heaps keep the tests light; the timeout scales with sanitizers. */
static inline mm_shmem_params_t mm_t_params(void)
{
    mm_shmem_params_t p = mm_shmem_params_default();
    p.heap_size = 64u << 20;
    p.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
    return p;
}

/* A free loopback port outside the ephemeral range (bench/free_port.h says why). */
static inline int mm_t_free_port(void) { return mm_free_loopback_port(); }

/* Deterministic byte pattern of (source, tag, index). */
static inline uint8_t mm_t_byte(int src, uint64_t tag, size_t i)
{
    uint64_t x = (uint64_t)src * 0x9e3779b97f4a7c15ull ^ tag * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    return (uint8_t)(x >> 56);
}

static inline void mm_t_fill(void *buf, size_t n, int src, uint64_t tag)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = mm_t_byte(src, tag, i);
}

/* Index of the first wrong byte, or -1. */
static inline long mm_t_check(const void *buf, size_t n, int src, uint64_t tag)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < n; i++)
        if (p[i] != mm_t_byte(src, tag, i)) return (long)i;
    return -1;
}

static inline uint64_t mm_t_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 29);
}

/* 1 when /dev/shm holds a file of that segment name ("/megamoe-..."). */
static inline int mm_t_shm_exists(const char *name)
{
    char path[320];
    snprintf(path, sizeof path, "/dev/shm%.256s", name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Log capture: collects lines in a buffer (thread-safe). */
typedef struct mm_t_log {
    pthread_mutex_t lock;
    char text[65536];
    size_t len;
} mm_t_log_t;

static inline void mm_t_log_sink(megamoe_log_level_t level, const char *line, void *user)
{
    (void)level;
    mm_t_log_t *l = user;
    pthread_mutex_lock(&l->lock);
    size_t n = strlen(line);
    if (l->len + n + 2 < sizeof l->text) {
        memcpy(l->text + l->len, line, n);
        l->len += n;
        l->text[l->len++] = '\n';
        l->text[l->len] = '\0';
    }
    pthread_mutex_unlock(&l->lock);
    fprintf(stderr, "%s\n", line);
}

static inline int mm_t_log_has(mm_t_log_t *l, const char *needle)
{
    pthread_mutex_lock(&l->lock);
    int found = strstr(l->text, needle) != NULL;
    pthread_mutex_unlock(&l->lock);
    return found;
}

/* Two ranks on two hosts: one put to the next rank and a barrier (the job really runs across
 * the hosts). */
static inline void mm_t_two_host_job(void)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    ASSERT_EQ_INT(n, 2);
    ASSERT_EQ_INT(mm_shmem_n_hosts(), 2);
    ASSERT_TRUE(mm_shmem_pe_remote(1 - me));
    uint64_t *box = NULL;
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&box));
    uint64_t v = 0x1000 + (uint64_t)me;
    ASSERT_OK(mm_shmem_put_signal(box, &v, 8, box + 1, 1, MM_SHMEM_SIGNAL_SET, (me + 1) % n));
    ASSERT_OK(mm_shmem_signal_wait_until(box + 1, MM_SHMEM_CMP_EQ, 1, NULL));
    ASSERT_EQ_U64(box[0], 0x1000 + (uint64_t)((me + n - 1) % n));
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(box));
    ASSERT_OK(mm_shmem_release());
}

#endif /* MM_TESTS_SHMEM_TEST_UTIL_H */
