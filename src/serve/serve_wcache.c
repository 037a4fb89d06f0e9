/* The packed-weight cache of the serving MegaMoE: the kernels' packed copies of the callers'
 * expert weights, kept from call to call so a decode step streams each weight once (packing it
 * per call would read it, write the copy and read that again).
 *
 * An entry is keyed by the source address, its kind (bf16 [K, N] for NN products), K, N, the
 * row stride and the caller's version; a sample of the source's bytes (16 words spread over it)
 * guards against a freed weight whose address came back with other values. A hit whose sample
 * or version differs re-packs in place. The cache is process-wide (buffers and layers share it),
 * bounded by MEGAMOE_SERVE_WEIGHT_CACHE bytes (0: no bound): least recently used entries that the
 * current call does not need go first. Serial use (the calls of a buffer are serialised; buffers
 * on different threads lock it). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "kernels/qgemm.h"
#include "serve/serve_impl.h"

typedef struct mm_sv_wentry {
    const void *src;
    int kind;
    int64_t K, N, ld;
    uint64_t version, sample, last_use;
    size_t bytes;
    void *packed;        /* mm_gemm_weight_t (bf16) or mm_qweight_t (int8 / int4) */
    int32_t *colsum;     /* int4: sum over k of V[k][n] (the A8W4 offset's weight part) */
    struct mm_sv_wentry *next; /* hash chain */
} mm_sv_wentry_t;

enum { MM_SV_WK_BF16 = 0, MM_SV_WK_INT8 = 1, MM_SV_WK_INT4 = 2 };

#define MM_SV_WBUCKETS 4096

static pthread_mutex_t mm_sv_wlock = PTHREAD_MUTEX_INITIALIZER;
static mm_sv_wentry_t *mm_sv_wtab[MM_SV_WBUCKETS];
static size_t mm_sv_wbytes;
static uint64_t mm_sv_wclock;
static uint64_t mm_sv_whits, mm_sv_wmisses;
static size_t mm_sv_wbound; /* MEGAMOE_SERVE_WEIGHT_CACHE, read by the calling thread per call */

static size_t mm_sv_src_bytes(int kind, int64_t K, int64_t ld)
{
    return (size_t)K * (size_t)ld * (kind == MM_SV_WK_BF16 ? 2 : 1); /* ld: elements / bytes */
}

/* 16 words spread over the source (8-byte aligned reads inside it). */
static uint64_t mm_sv_sample(const void *src, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    if (bytes < 8) return h;
    const size_t words = bytes / 8;
    for (int i = 0; i < 16; i++) {
        uint64_t w;
        memcpy(&w, (const char *)src + (words - 1) * (size_t)i / 15 * 8, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    return h;
}

static unsigned mm_sv_bucket(const void *src) { return (unsigned)(((uintptr_t)src >> 6) * 2654435761u) % MM_SV_WBUCKETS; }

static void mm_sv_wfree(mm_sv_wentry_t *e)
{
    if (e->kind == MM_SV_WK_BF16) mm_gemm_weight_destroy(e->packed);
    else mm_qweight_destroy(e->packed);
    free(e->colsum);
    free(e);
}

/* Drop least recently used entries older than `keep_from` until the cache fits its bound. */
static void mm_sv_wtrim(size_t bound, uint64_t keep_from)
{
    while (bound && mm_sv_wbytes > bound) {
        mm_sv_wentry_t **victim = NULL;
        for (int b = 0; b < MM_SV_WBUCKETS; b++)
            for (mm_sv_wentry_t **p = &mm_sv_wtab[b]; *p; p = &(*p)->next)
                if ((*p)->last_use < keep_from && (!victim || (*p)->last_use < (*victim)->last_use))
                    victim = p;
        if (!victim) return; /* everything left is used by the current call */
        mm_sv_wentry_t *e = *victim;
        *victim = e->next;
        mm_sv_wbytes -= e->bytes;
        mm_sv_wfree(e);
    }
}

uint64_t mm_sv_wcache_begin(void)
{
    uint64_t bound = 0;
    if (mm_env_size(MM_ENV_SERVE_WEIGHT_CACHE, &bound) != MEGAMOE_OK) bound = 0;
    pthread_mutex_lock(&mm_sv_wlock);
    mm_sv_wbound = (size_t)bound;
    uint64_t stamp = ++mm_sv_wclock;
    pthread_mutex_unlock(&mm_sv_wlock);
    return stamp;
}

megamoe_status_t mm_sv_wcache_bf16(const mm_gemm_backend_ops_t *backend, const uint16_t *src,
                                   int64_t K, int64_t N, int64_t ld, uint64_t version,
                                   uint64_t stamp, const mm_gemm_weight_t **weight_p)
{
    const int kind = 0; /* bf16 [K, N], NN */
    const size_t sbytes = mm_sv_src_bytes(kind, K, ld);
    const uint64_t sample = mm_sv_sample(src, sbytes);
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&mm_sv_wlock);
    mm_sv_wentry_t *e = mm_sv_wtab[mm_sv_bucket(src)];
    while (e && !(e->src == src && e->kind == kind && e->K == K && e->N == N && e->ld == ld))
        e = e->next;
    if (e && (e->version != version || e->sample != sample)) { /* new values: re-pack in place */
        st = mm_gemm_weight_update(e->packed, src, ld, version ^ sample, NULL);
        e->version = version;
        e->sample = sample;
        mm_sv_wmisses++;
    } else if (e) {
        mm_sv_whits++;
    }
    if (e == NULL) {
        mm_gemm_weight_t *w = NULL;
        /* NULL: the backend MEGAMOE_GEMM gives weights of this size (read on the calling thread) */
        (void)backend;
        st = mm_gemm_weight_create(NULL, MM_GEMM_NN, K, N, src, ld, version ^ sample, &w);
        if (st == MEGAMOE_OK) {
            e = calloc(1, sizeof *e);
            if (e == NULL) {
                mm_gemm_weight_destroy(w);
                st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mega_moe: packed-weight cache entry");
            } else {
                *e = (mm_sv_wentry_t){.src = src, .kind = kind, .K = K, .N = N, .ld = ld,
                                      .version = version, .sample = sample, .packed = w};
                e->bytes = mm_gemm_weight_packed_bytes(w);
                unsigned b = mm_sv_bucket(src);
                e->next = mm_sv_wtab[b];
                mm_sv_wtab[b] = e;
                mm_sv_wbytes += e->bytes;
                mm_sv_wmisses++;
            }
        }
    }
    if (st == MEGAMOE_OK) {
        e->last_use = stamp;
        mm_sv_wtrim(mm_sv_wbound, stamp);
        *weight_p = e->packed;
    }
    pthread_mutex_unlock(&mm_sv_wlock);
    return st;
}

void mm_sv_wcache_stats(size_t *bytes, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&mm_sv_wlock);
    *bytes = mm_sv_wbytes;
    *hits = mm_sv_whits;
    *misses = mm_sv_wmisses;
    pthread_mutex_unlock(&mm_sv_wlock);
}

void mm_sv_wcache_clear(void)
{
    pthread_mutex_lock(&mm_sv_wlock);
    for (int b = 0; b < MM_SV_WBUCKETS; b++) {
        while (mm_sv_wtab[b]) {
            mm_sv_wentry_t *e = mm_sv_wtab[b];
            mm_sv_wtab[b] = e->next;
            mm_sv_wfree(e);
        }
    }
    mm_sv_wbytes = 0;
    pthread_mutex_unlock(&mm_sv_wlock);
}

void megamoe_serve_weight_cache_info(size_t *bytes_p, uint64_t *hits_p, uint64_t *misses_p)
{
    size_t b;
    uint64_t h, m;
    mm_sv_wcache_stats(&b, &h, &m);
    if (bytes_p) *bytes_p = b;
    if (hits_p) *hits_p = h;
    if (misses_p) *misses_p = m;
}

void megamoe_serve_weight_cache_clear(void) { mm_sv_wcache_clear(); }

/* int4 column sums of packed [K][N/2] (two's complement, even index low) */
static void mm_sv_colsum_int4(const uint8_t *w, int64_t K, int64_t N, int64_t ld, int32_t *out)
{
    for (int64_t n = 0; n < N; n++) out[n] = 0;
    for (int64_t k = 0; k < K; k++) {
        const uint8_t *row = w + k * ld;
        for (int64_t n = 0; n < N; n++) {
            unsigned nib = (n & 1) ? row[n / 2] >> 4 : row[n / 2] & 15u;
            out[n] += nib >= 8 ? (int)nib - 16 : (int)nib;
        }
    }
}

megamoe_status_t mm_sv_wcache_q(int int4, const void *src, int64_t K, int64_t N, int64_t ld_bytes,
                                uint64_t version, uint64_t stamp, const mm_qweight_t **weight_p,
                                const int32_t **colsum_p)
{
    const int kind = int4 ? MM_SV_WK_INT4 : MM_SV_WK_INT8;
    const size_t sbytes = mm_sv_src_bytes(kind, K, ld_bytes);
    const uint64_t sample = mm_sv_sample(src, sbytes);
    mm_qweight_src_t qs = {int4 ? MM_QW_INT4 : MM_QW_INT8, MM_QW_KN, K, N, src, ld_bytes, 0};
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&mm_sv_wlock);
    mm_sv_wentry_t *e = mm_sv_wtab[mm_sv_bucket(src)];
    while (e && !(e->src == src && e->kind == kind && e->K == K && e->N == N && e->ld == ld_bytes))
        e = e->next;
    if (e && (e->version != version || e->sample != sample)) {
        st = mm_qweight_update(e->packed, &qs, version ^ sample, NULL);
        if (st == MEGAMOE_OK && e->colsum) mm_sv_colsum_int4(src, K, N, ld_bytes, e->colsum);
        e->version = version;
        e->sample = sample;
        mm_sv_wmisses++;
    } else if (e) {
        mm_sv_whits++;
    }
    if (e == NULL) {
        mm_qweight_t *w = NULL;
        st = mm_qweight_create(&qs, version ^ sample, &w);
        int32_t *cs = NULL;
        if (st == MEGAMOE_OK && int4 && (cs = malloc(sizeof *cs * (size_t)N)) == NULL)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mega_moe: int4 column sums");
        if (st == MEGAMOE_OK && (e = calloc(1, sizeof *e)) == NULL)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mega_moe: packed-weight cache entry");
        if (st != MEGAMOE_OK) {
            mm_qweight_destroy(w);
            free(cs);
        } else {
            if (cs) mm_sv_colsum_int4(src, K, N, ld_bytes, cs);
            *e = (mm_sv_wentry_t){.src = src, .kind = kind, .K = K, .N = N, .ld = ld_bytes,
                                  .version = version, .sample = sample, .packed = w,
                                  .colsum = cs};
            e->bytes = mm_qweight_packed_bytes(w) + (cs ? sizeof *cs * (size_t)N : 0);
            unsigned b = mm_sv_bucket(src);
            e->next = mm_sv_wtab[b];
            mm_sv_wtab[b] = e;
            mm_sv_wbytes += e->bytes;
            mm_sv_wmisses++;
        }
    }
    if (st == MEGAMOE_OK) {
        e->last_use = stamp;
        mm_sv_wtrim(mm_sv_wbound, stamp);
        *weight_p = e->packed;
        *colsum_p = e->colsum;
    }
    pthread_mutex_unlock(&mm_sv_wlock);
    return st;
}
