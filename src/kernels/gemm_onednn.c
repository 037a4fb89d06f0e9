/* The oneDNN backend: oneDNN 2.x (Debian 12: 2.6, op-descriptor C API) or 3.x (Debian 13: 3.7,
 * memory descriptors as handles, primitive descriptors created directly), chosen at build time
 * by DNNL_VERSION_MAJOR; the differences live in the small compatibility layer below.
 *
 * What oneDNN 2.6 does, measured on the machines we run on (docs/kernels.md):
 *  - Packed weights (format `any`, BA16a64b2a) only pay off in the brgemm matmul, and brgemm
 *    takes neither runtime shapes nor strided operands: it wants fixed M and dense A and C
 *    (otherwise oneDNN picks gemm:jit, which ignores the packing, or its reference code).
 *    So a packed product runs fixed-M primitives on row chunks of MM_DNNL_MB rows (as fast
 *    as one big call, often faster); a tail chunk is padded to a multiple of MM_DNNL_ALIGN
 *    rows through per-thread scratch and runs as power-of-two pieces (16 ... 128 rows), so
 *    there are 5 primitives per (K, N, C type) and a long run meets them all in its first
 *    steps (docs/reliability.md, Soak). Strided A, a row list or a column sub-block go through
 *    dense scratch too, and accumulate / bf16-after-scratch through mm_gemm_epilogue().
 *    The packed layout keeps each 64-column block contiguous, so a column sub-block starting
 *    at a multiple of 64 is a pointer offset into the same packed copy.
 *  - Plain operands (no packed weight; TN weight grads) run one primitive with every size and
 *    stride given at run time (gemm:jit), one per (form, C type, accumulate, threads).
 * Primitives live in a process-wide cache (mutex); each thread has its own stream and scratch
 * (user scratchpad mode), so concurrent calls share nothing mutable. Each call sets the
 * calling thread's OpenMP thread count to args->threads around oneDNN and restores it, so
 * oneDNN never starts threads nobody asked for.
 */
#include "gemm_onednn.h"

#ifdef MM_HAVE_ONEDNN
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <oneapi/dnnl/dnnl_version.h>

#include "base/alloc.h"
#include "base/error.h"
#include "gemm_avx512.h" /* the B panel packer (BA16a64b2a is its panel layout) */
#include "gemm_impl.h"

#define MM_DNNL_MB 256       /* rows per fixed-M primitive call on packed weights */
#define MM_DNNL_ALIGN 16     /* tail chunks are padded to a multiple of this many rows */
#define MM_DNNL_BUCKETS 256  /* primitive cache hash buckets */
#define MM_DNNL_CACHE_MAX 4096

/* ---- oneDNN 2.x / 3.x compatibility ------------------------------------------------------- */
/* A memory descriptor (mm_md_t) is a struct in 2.x and a handle in 3.x; MM_MDV(md) is what the
 * oneDNN functions taking a descriptor accept in both (mm_md_view_t), mm_md_free(&md) releases
 * a 3.x handle and is a no-op in 2.x (so the 2.x call paths allocate nothing, as before). */

#if DNNL_VERSION_MAJOR >= 3
#define MM_DNNL3 1
typedef dnnl_memory_desc_t mm_md_t;
typedef const_dnnl_memory_desc_t mm_md_view_t;
#define MM_MDV(md) (md)
#define MM_MD_NONE NULL
#else
#define MM_DNNL3 0
typedef dnnl_memory_desc_t mm_md_t;
typedef const dnnl_memory_desc_t *mm_md_view_t;
#define MM_MDV(md) (&(md))
#define MM_MD_NONE {0}
#endif

static void mm_md_free(mm_md_t *md)
{
#if MM_DNNL3
    if (*md) dnnl_memory_desc_destroy(*md);
    *md = NULL;
#else
    (void)md;
#endif
}

/* 2-D [d0, d1] descriptor with the given strides. */
static dnnl_status_t mm_md_by_strides(mm_md_t *md, int64_t d0, int64_t d1, dnnl_data_type_t t,
                                      int64_t s0, int64_t s1)
{
    dnnl_dims_t dims = {d0, d1}, strides = {s0, s1};
#if MM_DNNL3
    return dnnl_memory_desc_create_with_strides(md, 2, dims, t, strides);
#else
    return dnnl_memory_desc_init_by_strides(md, 2, dims, t, strides);
#endif
}

static dnnl_status_t mm_md_by_tag(mm_md_t *md, int64_t d0, int64_t d1, dnnl_data_type_t t,
                                  dnnl_format_tag_t tag)
{
    dnnl_dims_t dims = {d0, d1};
#if MM_DNNL3
    return dnnl_memory_desc_create_with_tag(md, 2, dims, t, tag);
#else
    return dnnl_memory_desc_init_by_tag(md, 2, dims, t, tag);
#endif
}

static dnnl_status_t mm_md_copy(mm_md_t *md, mm_md_view_t from)
{
#if MM_DNNL3
    return dnnl_memory_desc_clone(md, from);
#else
    *md = *from;
    return dnnl_success;
#endif
}

/* What the backend reads of a 2-D layout. */
typedef struct mm_md_layout {
    int blocked, nblks;
    int64_t blks[DNNL_MAX_NDIMS], idxs[DNNL_MAX_NDIMS], strides[2], padded[2];
} mm_md_layout_t;

static void mm_md_layout(mm_md_view_t md, mm_md_layout_t *l)
{
    memset(l, 0, sizeof *l);
#if MM_DNNL3
    dnnl_format_kind_t kind = dnnl_format_kind_undef;
    const dnnl_dims_t *blks = NULL, *idxs = NULL, *strides = NULL, *padded = NULL;
    dnnl_memory_desc_query(md, dnnl_query_format_kind, &kind);
    l->blocked = kind == dnnl_blocked;
    if (!l->blocked) return;
    dnnl_memory_desc_query(md, dnnl_query_inner_nblks_s32, &l->nblks);
    dnnl_memory_desc_query(md, dnnl_query_inner_blks, &blks);
    dnnl_memory_desc_query(md, dnnl_query_inner_idxs, &idxs);
    dnnl_memory_desc_query(md, dnnl_query_strides, &strides);
    dnnl_memory_desc_query(md, dnnl_query_padded_dims, &padded);
    for (int i = 0; i < l->nblks && i < DNNL_MAX_NDIMS; i++) {
        l->blks[i] = (*blks)[i];
        l->idxs[i] = (*idxs)[i];
    }
    for (int i = 0; i < 2; i++) {
        l->strides[i] = (*strides)[i];
        l->padded[i] = (*padded)[i];
    }
#else
    l->blocked = md->format_kind == dnnl_blocked;
    if (!l->blocked) return;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    l->nblks = b->inner_nblks;
    for (int i = 0; i < l->nblks && i < DNNL_MAX_NDIMS; i++) {
        l->blks[i] = b->inner_blks[i];
        l->idxs[i] = b->inner_idxs[i];
    }
    for (int i = 0; i < 2; i++) {
        l->strides[i] = b->strides[i];
        l->padded[i] = md->padded_dims[i];
    }
#endif
}

/* The matmul primitive descriptor src x wei -> dst (no bias). */
static dnnl_status_t mm_matmul_pd(dnnl_primitive_desc_t *pd, dnnl_engine_t engine,
                                  mm_md_view_t src, mm_md_view_t wei, mm_md_view_t dst,
                                  const_dnnl_primitive_attr_t attr)
{
#if MM_DNNL3
    return dnnl_matmul_primitive_desc_create(pd, engine, src, wei, NULL, dst, attr);
#else
    dnnl_matmul_desc_t md;
    dnnl_status_t s = dnnl_matmul_desc_init(&md, src, wei, NULL, dst);
    return s == dnnl_success ? dnnl_primitive_desc_create(pd, &md, attr, engine, NULL) : s;
#endif
}

/* C += A x B: a sum post-op of scale 1 (3.x adds a zero point and a data type: none here). */
static dnnl_status_t mm_append_sum(dnnl_post_ops_t ops)
{
#if MM_DNNL3
    return dnnl_post_ops_append_sum(ops, 1.0f, 0, dnnl_data_type_undef);
#else
    return dnnl_post_ops_append_sum(ops, 1.0f);
#endif
}

/* ---- engine, streams, threads ------------------------------------------------------------ */

static dnnl_engine_t mm_engine;
static dnnl_status_t mm_engine_status = dnnl_runtime_error;
static pthread_once_t mm_engine_once = PTHREAD_ONCE_INIT;

static void mm_engine_init(void) { mm_engine_status = dnnl_engine_create(&mm_engine, dnnl_cpu, 0); }

static megamoe_status_t mm_dnnl_fail(dnnl_status_t s, const char *what)
{
    return mm_error(MEGAMOE_INTERNAL, "oneDNN %s failed: %s (status %d)", what,
                    dnnl_status2str(s), (int)s);
}

/* Whether this oneDNN has a bf16 matmul for this CPU at all: oneDNN 2.x implements bf16 (even
 * its reference code) only from AVX-512 on, so on an AVX2-only CPU (Zen 2/3) every descriptor
 * is "unimplemented". Asked once with a small plain matmul. */
static dnnl_status_t mm_bf16_status = dnnl_unimplemented;
static pthread_once_t mm_bf16_once = PTHREAD_ONCE_INIT;

static void mm_bf16_init(void)
{
    mm_md_t src = MM_MD_NONE, wei = MM_MD_NONE, dst = MM_MD_NONE;
    dnnl_status_t s = mm_md_by_tag(&src, 16, 64, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = mm_md_by_tag(&wei, 64, 64, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = mm_md_by_tag(&dst, 16, 64, dnnl_f32, dnnl_ab);
    dnnl_primitive_desc_t pd = NULL;
    if (s == dnnl_success)
        s = mm_matmul_pd(&pd, mm_engine, MM_MDV(src), MM_MDV(wei), MM_MDV(dst), NULL);
    if (pd) dnnl_primitive_desc_destroy(pd);
    mm_md_free(&src);
    mm_md_free(&wei);
    mm_md_free(&dst);
    mm_bf16_status = s;
}

static megamoe_status_t mm_onednn_probe(void)
{
    pthread_once(&mm_engine_once, mm_engine_init);
    if (mm_engine_status != dnnl_success)
        return mm_error_quiet(MEGAMOE_UNSUPPORTED, "oneDNN CPU engine unavailable: %s",
                              dnnl_status2str(mm_engine_status));
    pthread_once(&mm_bf16_once, mm_bf16_init);
    if (mm_bf16_status != dnnl_success)
        return mm_error_quiet(MEGAMOE_UNSUPPORTED,
                              "this oneDNN has no bf16 matmul for this CPU (%s; oneDNN 2.x needs "
                              "AVX-512 for bf16)",
                              dnnl_status2str(mm_bf16_status));
    return MEGAMOE_OK;
}

static pthread_key_t mm_stream_key;
static pthread_once_t mm_stream_key_once = PTHREAD_ONCE_INIT;
static _Thread_local dnnl_stream_t mm_stream_tls;

static void mm_stream_free(void *s) { dnnl_stream_destroy(s); }
static void mm_stream_key_init(void) { pthread_key_create(&mm_stream_key, mm_stream_free); }

static megamoe_status_t mm_stream(dnnl_stream_t *stream_p)
{
    if (mm_stream_tls == NULL) {
        MM_CHECK(mm_onednn_probe());
        pthread_once(&mm_stream_key_once, mm_stream_key_init);
        dnnl_status_t s = dnnl_stream_create(&mm_stream_tls, mm_engine, dnnl_stream_default_flags);
        if (s != dnnl_success) return mm_dnnl_fail(s, "stream creation");
        pthread_setspecific(mm_stream_key, mm_stream_tls);
    }
    *stream_p = mm_stream_tls;
    return MEGAMOE_OK;
}

/* The calling thread's OpenMP team size is what oneDNN uses; set it for the call only. */
static int mm_omp_enter(int threads)
{
    int prev = omp_get_max_threads();
    if (prev != threads) omp_set_num_threads(threads);
    return prev;
}

static void mm_omp_leave(int prev, int threads)
{
    if (prev != threads) omp_set_num_threads(prev);
}

/* ---- primitive cache --------------------------------------------------------------------- */

enum { MM_DNNL_PLAIN = 0, MM_DNNL_PACKED = 1 };

typedef struct mm_dnnl_key {
    int kind, form, c_type, accumulate, threads;
    int64_t rows, K, N;       /* PACKED only */
    mm_md_view_t wmd;         /* PACKED only: weights layout (compared with dnnl_memory_desc_equal) */
} mm_dnnl_key_t;

typedef struct mm_dnnl_prim {
    struct mm_dnnl_prim *next;
    mm_dnnl_key_t key;        /* key.wmd is wmd_own once cached */
    mm_md_t wmd_own;          /* PACKED: the cached key's weights layout */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    size_t scratch_bytes;
    int usable; /* 0: oneDNN would run its reference code here; compute unpacked instead */
} mm_dnnl_prim_t;

static pthread_mutex_t mm_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_dnnl_prim_t *mm_cache[MM_DNNL_BUCKETS];
static int mm_cache_count;
static int mm_cache_full_warned;

static unsigned mm_key_hash(const mm_dnnl_key_t *k)
{
    uint64_t h = 1469598103934665603ull;
    int64_t v[8] = {k->kind, k->form, k->c_type, k->accumulate, k->threads, k->rows, k->K, k->N};
    for (int i = 0; i < 8; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return (unsigned)(h ^ (h >> 32)) % MM_DNNL_BUCKETS;
}

static int mm_key_equal(const mm_dnnl_key_t *a, const mm_dnnl_key_t *b)
{
    if (a->kind != b->kind || a->form != b->form || a->c_type != b->c_type ||
        a->accumulate != b->accumulate || a->threads != b->threads || a->rows != b->rows ||
        a->K != b->K || a->N != b->N)
        return 0;
    return a->kind == MM_DNNL_PLAIN || dnnl_memory_desc_equal(a->wmd, b->wmd);
}

static dnnl_data_type_t mm_dnnl_type(int c_type)
{
    return c_type == MEGAMOE_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
}

static void mm_prim_destroy(mm_dnnl_prim_t *p)
{
    if (p == NULL) return;
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->pd) dnnl_primitive_desc_destroy(p->pd);
    mm_md_free(&p->wmd_own);
    free(p);
}

/* Build the primitive for a key (called with the cache lock held, inside the OpenMP scope of
 * key->threads, which oneDNN reads at creation). */
static megamoe_status_t mm_prim_create(const mm_dnnl_key_t *key, mm_dnnl_prim_t **prim_p)
{
    MM_CHECK(mm_onednn_probe());
    const dnnl_dim_t R = DNNL_RUNTIME_DIM_VAL;
    mm_md_t src = MM_MD_NONE, wei = MM_MD_NONE, dst = MM_MD_NONE;
    dnnl_status_t s;
    if (key->kind == MM_DNNL_PLAIN) {
        s = mm_md_by_strides(&src, R, R, dnnl_bf16, key->form == MM_GEMM_TN ? 1 : R,
                             key->form == MM_GEMM_TN ? R : 1);
        if (s == dnnl_success)
            s = mm_md_by_strides(&wei, R, R, dnnl_bf16, key->form == MM_GEMM_NT ? 1 : R,
                                 key->form == MM_GEMM_NT ? R : 1);
        if (s == dnnl_success) s = mm_md_by_strides(&dst, R, R, mm_dnnl_type(key->c_type), R, 1);
    } else {
        s = mm_md_by_tag(&src, key->rows, key->K, dnnl_bf16, dnnl_ab);
        if (s == dnnl_success)
            s = mm_md_by_tag(&dst, key->rows, key->N, mm_dnnl_type(key->c_type), dnnl_ab);
        if (s == dnnl_success) s = mm_md_copy(&wei, key->wmd);
    }
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && key->accumulate) {
        s = dnnl_post_ops_create(&ops);
        if (s == dnnl_success) s = mm_append_sum(ops);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, ops);
    }
    mm_dnnl_prim_t *p = s == dnnl_success ? calloc(1, sizeof *p) : NULL;
    if (s == dnnl_success && p == NULL) s = dnnl_out_of_memory;
    if (s == dnnl_success)
        s = mm_matmul_pd(&p->pd, mm_engine, MM_MDV(src), MM_MDV(wei), MM_MDV(dst), attr);
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    mm_md_free(&src);
    mm_md_free(&dst);
    if (s != dnnl_success) {
        mm_md_free(&wei);
        mm_prim_destroy(p);
        return mm_dnnl_fail(s, "matmul primitive descriptor");
    }
    p->key = *key;
    p->wmd_own = wei; /* owned by the primitive from here */
    p->key.wmd = MM_MDV(p->wmd_own);
    const char *impl = "";
    dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0, &impl);
    /* Packed: only worth it (and only then used) in a real kernel on exactly our layout. Plain
     * primitives are always used: oneDNN's choice, even its reference code, is correct. */
    p->usable = key->kind == MM_DNNL_PLAIN ||
                (strncmp(impl, "ref", 3) != 0 &&
                 dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(p->pd, dnnl_query_weights_md, 0),
                                        MM_MDV(p->wmd_own)));
    if (!p->usable) {
        MM_DEBUG("oneDNN picks '%s' for packed %lldx%lldx%lld; computing unpacked instead", impl,
                 (long long)key->rows, (long long)key->K, (long long)key->N);
        *prim_p = p;
        return MEGAMOE_OK;
    }
    p->scratch_bytes = dnnl_memory_desc_get_size(
        dnnl_primitive_desc_query_md(p->pd, dnnl_query_scratchpad_md, 0));
    s = dnnl_primitive_create(&p->prim, p->pd);
    if (s != dnnl_success) {
        mm_prim_destroy(p);
        return mm_dnnl_fail(s, "matmul primitive creation");
    }
    MM_DEBUG("oneDNN matmul %s form %d rows %lld K %lld N %lld: %s", key->kind ? "packed" : "plain",
             key->form, (long long)key->rows, (long long)key->K, (long long)key->N, impl);
    *prim_p = p;
    return MEGAMOE_OK;
}

/* Each thread remembers the primitives it used last, so the chunks of one product (and the
 * workers of a split product) do not meet on the cache lock; cached primitives live as long
 * as the process, so the pointers stay valid. */
#define MM_DNNL_TLS_WAYS 16
static _Thread_local mm_dnnl_prim_t *mm_tls_prims[MM_DNNL_TLS_WAYS];
static _Thread_local unsigned mm_tls_next;

/* Cached primitive for key; *owned_p = 1 when the cache is full and the caller must destroy. */
static megamoe_status_t mm_prim_get(const mm_dnnl_key_t *key, mm_dnnl_prim_t **prim_p, int *owned_p)
{
    *owned_p = 0;
    for (int i = 0; i < MM_DNNL_TLS_WAYS; i++)
        if (mm_tls_prims[i] && mm_key_equal(&mm_tls_prims[i]->key, key)) {
            *prim_p = mm_tls_prims[i];
            return MEGAMOE_OK;
        }
    unsigned h = mm_key_hash(key);
    pthread_mutex_lock(&mm_cache_lock);
    for (mm_dnnl_prim_t *p = mm_cache[h]; p; p = p->next)
        if (mm_key_equal(&p->key, key)) {
            pthread_mutex_unlock(&mm_cache_lock);
            mm_tls_prims[mm_tls_next++ % MM_DNNL_TLS_WAYS] = p;
            *prim_p = p;
            return MEGAMOE_OK;
        }
    mm_dnnl_prim_t *p = NULL;
    megamoe_status_t st = mm_prim_create(key, &p);
    if (st == MEGAMOE_OK) {
        if (mm_cache_count < MM_DNNL_CACHE_MAX) {
            p->next = mm_cache[h];
            mm_cache[h] = p;
            mm_cache_count++;
            mm_tls_prims[mm_tls_next++ % MM_DNNL_TLS_WAYS] = p;
        } else {
            *owned_p = 1;
            if (!mm_cache_full_warned) {
                mm_cache_full_warned = 1;
                MM_WARN("oneDNN primitive cache holds %d primitives; new shapes are now built "
                        "per call (slow): too many distinct (K, N, threads) combinations",
                        MM_DNNL_CACHE_MAX);
            }
        }
        *prim_p = p;
    }
    pthread_mutex_unlock(&mm_cache_lock);
    return st;
}

/* Run a primitive on three buffers described by the given descriptors. */
static megamoe_status_t mm_prim_run(const mm_dnnl_prim_t *p, mm_md_view_t src_md,
                                    const void *src, mm_md_view_t wei_md, const void *wei,
                                    mm_md_view_t dst_md, void *dst)
{
    dnnl_stream_t stream;
    MM_CHECK(mm_stream(&stream));
    void *pad = NULL;
    if (p->scratch_bytes > 0 && (pad = mm_gemm_scratch(3, p->scratch_bytes)) == NULL)
        return MEGAMOE_OUT_OF_MEMORY;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    dnnl_status_t s = dnnl_memory_create(&mem[0], src_md, mm_engine, (void *)src);
    if (s == dnnl_success) s = dnnl_memory_create(&mem[1], wei_md, mm_engine, (void *)wei);
    if (s == dnnl_success) s = dnnl_memory_create(&mem[2], dst_md, mm_engine, dst);
    int nargs = 3;
    if (s == dnnl_success && pad != NULL) {
        s = dnnl_memory_create(&mem[3], dnnl_primitive_desc_query_md(p->pd, dnnl_query_scratchpad_md, 0),
                               mm_engine, pad);
        nargs = 4;
    }
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]},
                                   {DNNL_ARG_DST, mem[2]}, {DNNL_ARG_SCRATCHPAD, mem[3]}};
        s = dnnl_primitive_execute(p->prim, stream, nargs, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return s == dnnl_success ? MEGAMOE_OK : mm_dnnl_fail(s, "matmul execution");
}

static megamoe_status_t mm_md_strided(mm_md_t *md, int64_t d0, int64_t d1, int64_t s0,
                                      int64_t s1, dnnl_data_type_t t)
{
    dnnl_status_t s = mm_md_by_strides(md, d0, d1, t, s0, s1);
    return s == dnnl_success ? MEGAMOE_OK : mm_dnnl_fail(s, "memory descriptor");
}

/* ---- plain operands: one runtime-shape primitive ----------------------------------------- */

/* Gather rows [m, m+rows) of A (NN/NT), or columns [m, m+rows) of A (TN, as [K, rows]), from
 * the row list into dense scratch slot 1. */
static const uint16_t *mm_gather_a(const mm_gemm_args_t *a, int64_t m, int64_t rows, int64_t *ld_p)
{
    int tn = a->form == MM_GEMM_TN;
    int64_t n_rows = tn ? a->K : rows, n_cols = tn ? rows : a->K;
    uint16_t *buf = mm_gemm_scratch(1, (size_t)(n_rows * n_cols) * sizeof(uint16_t));
    if (buf == NULL) return NULL;
    for (int64_t r = 0; r < n_rows; r++)
        memcpy(buf + r * n_cols, mm_gemm_a_row(a, tn ? r : m + r) + (tn ? m : 0),
               (size_t)n_cols * sizeof(uint16_t));
    *ld_p = n_cols;
    return buf;
}

static megamoe_status_t mm_plain_rows(const mm_gemm_args_t *a, mm_dnnl_prim_t *p, int64_t m,
                                      int64_t rows, const uint16_t *A, int64_t lda)
{
    int64_t cols = a->n1 - a->n0;
    mm_md_t src = MM_MD_NONE, wei = MM_MD_NONE, dst = MM_MD_NONE;
    const uint16_t *B = a->form == MM_GEMM_NT ? a->B + a->n0 * a->ldb : a->B + a->n0;
    megamoe_status_t st = a->form == MM_GEMM_TN ? mm_md_strided(&src, rows, a->K, 1, lda, dnnl_bf16)
                                                : mm_md_strided(&src, rows, a->K, lda, 1, dnnl_bf16);
    if (st == MEGAMOE_OK)
        st = a->form == MM_GEMM_NT ? mm_md_strided(&wei, a->K, cols, 1, a->ldb, dnnl_bf16)
                                   : mm_md_strided(&wei, a->K, cols, a->ldb, 1, dnnl_bf16);
    if (st == MEGAMOE_OK) st = mm_md_strided(&dst, rows, cols, a->ldc, 1, mm_dnnl_type(a->c_type));
    if (st == MEGAMOE_OK)
        st = mm_prim_run(p, MM_MDV(src), A, MM_MDV(wei), B, MM_MDV(dst),
                         mm_gemm_c_at(a->C, a->ldc, a->c_type, m, a->n0));
    mm_md_free(&src);
    mm_md_free(&wei);
    mm_md_free(&dst);
    return st;
}

static megamoe_status_t mm_plain(const mm_gemm_args_t *a)
{
    mm_dnnl_key_t key;
    memset(&key, 0, sizeof key);
    key.kind = MM_DNNL_PLAIN;
    key.form = a->form;
    key.c_type = a->c_type;
    key.accumulate = a->accumulate;
    key.threads = a->threads;
    mm_dnnl_prim_t *p;
    int owned;
    MM_CHECK(mm_prim_get(&key, &p, &owned));
    megamoe_status_t st = MEGAMOE_OK;
    if (a->a_rows == NULL) {
        const uint16_t *A = a->form == MM_GEMM_TN ? a->A + a->m0 : a->A + a->m0 * a->lda;
        st = mm_plain_rows(a, p, a->m0, a->m1 - a->m0, A, a->lda);
    } else {
        for (int64_t m = a->m0; m < a->m1 && st == MEGAMOE_OK; m += MM_DNNL_MB) {
            int64_t rows = a->m1 - m < MM_DNNL_MB ? a->m1 - m : MM_DNNL_MB, ld;
            const uint16_t *A = mm_gather_a(a, m, rows, &ld);
            st = A ? mm_plain_rows(a, p, m, rows, A, ld) : MEGAMOE_OUT_OF_MEMORY;
        }
    }
    if (owned) mm_prim_destroy(p);
    return st;
}

/* ---- packed weights ---------------------------------------------------------------------- */

typedef struct mm_dnnl_weight {
    mm_md_t md;            /* layout of the packed copy, dims [K, N] */
    mm_md_layout_t layout; /* what the backend reads of it */
    int64_t nb;            /* columns per contiguous block (0: not splittable by columns) */
    int64_t block_stride;  /* elements between consecutive column blocks */
    int own_pack;          /* 1: BA16a64b2a, filled by the AVX-512 panel packer */
    dnnl_format_tag_t tag; /* 3.x: the named layout a column block is described by */
} mm_dnnl_weight_t;

/* Fixed-M brgemm primitives on row chunks over weights of layout wmd at wptr (the block's
 * cols columns). `plain` is the same product on plain operands, for chunks oneDNN would only
 * run in its reference code. */
static megamoe_status_t mm_chunked(const mm_gemm_args_t *a, mm_md_view_t wmd,
                                   const uint16_t *wptr, const mm_gemm_args_t *plain)
{
    int64_t cols = a->n1 - a->n0;
    mm_dnnl_key_t key;
    memset(&key, 0, sizeof key);
    key.kind = MM_DNNL_PACKED;
    key.form = MM_GEMM_NN; /* the weights descriptor carries NN / NT / packed */
    key.threads = a->threads;
    key.K = a->K;
    key.N = cols;
    key.wmd = wmd;
    for (int64_t m = a->m0; m < a->m1; m += MM_DNNL_MB) {
        int64_t rows = a->m1 - m < MM_DNNL_MB ? a->m1 - m : MM_DNNL_MB;
        int64_t padded = (rows + MM_DNNL_ALIGN - 1) / MM_DNNL_ALIGN * MM_DNNL_ALIGN;
        int direct_a = a->a_rows == NULL && a->lda == a->K && padded == rows;
        int direct_c = padded == rows && a->ldc == cols && !a->accumulate;
        key.c_type = direct_c ? a->c_type : MEGAMOE_DTYPE_FP32;
        /* The chunk runs as power-of-two pieces (e.g. 80 = 64 + 16 rows): every row is
         * computed by the same kernel over the same K order whatever the piece, and only
         * 1 + log2(MM_DNNL_MB / MM_DNNL_ALIGN) primitives per (K, N) exist, all met within
         * the first steps. One primitive per multiple of 16 made rare tails build new
         * primitives (JIT code, ~0.2 MB each) thousands of steps into a run. */
        int64_t piece_rows[8];
        int pieces = 0;
        for (int64_t left = padded, b = MM_DNNL_MB; left > 0; b /= 2)
            if (left >= b) piece_rows[pieces++] = b, left -= b;
        mm_dnnl_prim_t *prims[8];
        int owned[8] = {0}, usable = 1;
        megamoe_status_t st = MEGAMOE_OK;
        for (int i = 0; i < pieces && st == MEGAMOE_OK; i++) {
            key.rows = piece_rows[i];
            st = mm_prim_get(&key, &prims[i], &owned[i]);
            if (st == MEGAMOE_OK) usable &= prims[i]->usable;
            else pieces = i;
        }
        if (st == MEGAMOE_OK && !usable) {
            mm_gemm_args_t u = *plain;
            u.m0 = m;
            u.m1 = m + rows;
            st = mm_plain(&u);
        } else if (st == MEGAMOE_OK) {
            const uint16_t *A = a->A + m * a->lda;
            if (!direct_a) {
                uint16_t *buf = mm_gemm_scratch(1, (size_t)(padded * a->K) * sizeof(uint16_t));
                if (buf == NULL) st = MEGAMOE_OUT_OF_MEMORY;
                for (int64_t r = 0; buf && r < padded; r++) {
                    if (r < rows)
                        memcpy(buf + r * a->K, mm_gemm_a_row(a, m + r), (size_t)a->K * sizeof(uint16_t));
                    else
                        memset(buf + r * a->K, 0, (size_t)a->K * sizeof(uint16_t));
                }
                A = buf;
            }
            void *C = mm_gemm_c_at(a->C, a->ldc, a->c_type, m, a->n0);
            float *acc = NULL;
            if (st == MEGAMOE_OK && !direct_c) {
                acc = mm_gemm_scratch(2, (size_t)(padded * cols) * sizeof(float));
                if (acc == NULL) st = MEGAMOE_OUT_OF_MEMORY;
            }
            /* A (direct: lda == K) and the destination (direct: ldc == cols) are dense here. */
            size_t c_es = direct_c ? megamoe_dtype_size(a->c_type) : sizeof(float);
            int64_t off = 0;
            for (int i = 0; i < pieces && st == MEGAMOE_OK; off += piece_rows[i], i++) {
                const mm_dnnl_prim_t *p = prims[i];
                char *dst = (char *)(direct_c ? C : (void *)acc) + (size_t)(off * cols) * c_es;
                st = mm_prim_run(p, dnnl_primitive_desc_query_md(p->pd, dnnl_query_src_md, 0),
                                 A + off * a->K,
                                 dnnl_primitive_desc_query_md(p->pd, dnnl_query_weights_md, 0), wptr,
                                 dnnl_primitive_desc_query_md(p->pd, dnnl_query_dst_md, 0), dst);
            }
            if (st == MEGAMOE_OK && !direct_c)
                mm_gemm_epilogue(acc, cols, rows, cols, C, a->ldc, a->c_type, a->accumulate);
        }
        for (int i = 0; i < pieces; i++)
            if (owned[i]) mm_prim_destroy(prims[i]);
        if (st != MEGAMOE_OK) return st;
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_packed(const mm_gemm_args_t *a)
{
    const mm_gemm_weight_t *w = a->weight;
    const mm_dnnl_weight_t *lw = w->impl;
    mm_gemm_args_t plain = *a;
    plain.weight = NULL;
    plain.B = w->src;
    plain.ldb = w->ld;
    int64_t cols = a->n1 - a->n0;
    if (lw->nb == 0 && cols != a->N) return mm_plain(&plain);
    const uint16_t *wptr = w->data;
    if (lw->nb) wptr += (a->n0 / lw->nb) * lw->block_stride;
    if (cols == a->N) return mm_chunked(a, MM_MDV(lw->md), wptr, &plain);
    /* a column block: the same layout over `cols` columns */
#if MM_DNNL3
    mm_md_t wmd = MM_MD_NONE;
    dnnl_status_t s = mm_md_by_tag(&wmd, a->K, cols, dnnl_bf16, lw->tag);
    if (s != dnnl_success) return mm_dnnl_fail(s, "memory descriptor");
    megamoe_status_t st = mm_chunked(a, wmd, wptr, &plain);
    mm_md_free(&wmd);
    return st;
#else
    dnnl_memory_desc_t wmd = lw->md;
    wmd.dims[1] = cols;
    wmd.padded_dims[1] = (cols + lw->nb - 1) / lw->nb * lw->nb;
    return mm_chunked(a, &wmd, wptr, &plain);
#endif
}

/* Plain dense weights up to this many elements (2 MiB of bf16) also run as fixed-M brgemm
 * chunks: measured faster than the runtime-shape gemm:jit for small K x N (512x512x256: 517
 * vs 497 GFLOP/s), slower for the big MoE shapes (437 vs 470 at 256x4096x2816). */
#define MM_DNNL_SMALL_WEIGHTS (1 << 20)

static megamoe_status_t mm_plain_or_chunked(const mm_gemm_args_t *a)
{
    int dense = (a->form == MM_GEMM_NN && a->ldb == a->N) || (a->form == MM_GEMM_NT && a->ldb == a->K);
    if (!dense || a->n0 != 0 || a->n1 != a->N || a->K * a->N > MM_DNNL_SMALL_WEIGHTS)
        return mm_plain(a);
    mm_md_t wmd = MM_MD_NONE;
    dnnl_status_t s = mm_md_by_tag(&wmd, a->K, a->N, dnnl_bf16,
                                   a->form == MM_GEMM_NT ? dnnl_ba : dnnl_ab);
    if (s != dnnl_success) {
        mm_md_free(&wmd);
        return mm_dnnl_fail(s, "memory descriptor");
    }
    megamoe_status_t st = mm_chunked(a, MM_MDV(wmd), a->B, a);
    mm_md_free(&wmd);
    return st;
}

static megamoe_status_t mm_onednn_gemm(const mm_gemm_args_t *a)
{
    int prev = mm_omp_enter(a->threads);
    megamoe_status_t st = a->weight ? mm_packed(a) : a->form == MM_GEMM_TN ? mm_plain(a) : mm_plain_or_chunked(a);
    mm_omp_leave(prev, a->threads);
    return st;
}

/* dst (layout `to`) = src (layout `from`), on the calling thread's stream. */
static megamoe_status_t mm_dnnl_reorder(mm_md_view_t from, const void *src, mm_md_view_t to,
                                        void *dst)
{
    dnnl_stream_t stream;
    MM_CHECK(mm_stream(&stream));
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_memory_t mfrom = NULL, mto = NULL;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&rpd, from, mm_engine, to, mm_engine, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&reorder, rpd);
    if (s == dnnl_success) s = dnnl_memory_create(&mfrom, from, mm_engine, (void *)src);
    if (s == dnnl_success) s = dnnl_memory_create(&mto, to, mm_engine, dst);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mfrom}, {DNNL_ARG_TO, mto}};
        s = dnnl_primitive_execute(reorder, stream, 2, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    if (mfrom) dnnl_memory_destroy(mfrom);
    if (mto) dnnl_memory_destroy(mto);
    if (reorder) dnnl_primitive_destroy(reorder);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    return s == dnnl_success ? MEGAMOE_OK : mm_dnnl_fail(s, "weight reorder");
}

/* Is the packed layout BA16a64b2a: column blocks of 64 outermost, inside [K_pad/2][64][2]
 * (pairs along k)? That is the own AVX-512 backend's B panel, K padded to a multiple of 32. */
static int mm_dnnl_is_ba16a64b2a(const mm_md_layout_t *b)
{
    return b->blocked && b->nblks == 3 && b->idxs[0] == 0 && b->blks[0] == 16 &&
           b->idxs[1] == 1 && b->blks[1] == 64 && b->idxs[2] == 0 && b->blks[2] == 2 &&
           b->padded[0] % 32 == 0 && b->padded[1] % 64 == 0 && b->strides[0] == 32 * 64 &&
           b->strides[1] == b->padded[0] * 64;
}

/* Fill the packed copy from w->src: BA16a64b2a panel by panel with the AVX-512 packer (the
 * same bytes as oneDNN 2.6's jit:uni reorder, which training pays after every optimizer step
 * for every weight: 1024x1024 from memory NN 0.32 vs 0.65 ms, NT 0.48 vs 0.60 ms), any other
 * layout with a oneDNN reorder. */
static megamoe_status_t mm_onednn_fill(mm_gemm_weight_t *w, const mm_dnnl_weight_t *lw)
{
#if MM_X86
    if (lw->own_pack) {
        const int64_t k_pairs = lw->layout.padded[0] / 2, K2 = (w->K + 1) / 2;
        for (int64_t j = 0; j * 64 < w->N; j++) {
            uint16_t *panel = (uint16_t *)w->data + j * lw->block_stride;
            mm_avx512_pack_b_panel(panel, w->src, w->ld, w->form == MM_GEMM_NT, w->K, j * 64,
                                   w->N - j * 64 < 64 ? w->N - j * 64 : 64);
            memset(panel + K2 * 128, 0, (size_t)(k_pairs - K2) * 128 * sizeof(uint16_t));
        }
        return MEGAMOE_OK;
    }
#endif
    mm_md_t from = MM_MD_NONE;
    dnnl_status_t s = w->form == MM_GEMM_NT ? mm_md_by_strides(&from, w->K, w->N, dnnl_bf16, 1, w->ld)
                                            : mm_md_by_strides(&from, w->K, w->N, dnnl_bf16, w->ld, 1);
    megamoe_status_t st = s == dnnl_success
                              ? mm_dnnl_reorder(MM_MDV(from), w->src, MM_MDV(lw->md), w->data)
                              : mm_dnnl_fail(s, "memory descriptor");
    mm_md_free(&from);
    return st;
}

/* Choose oneDNN's preferred layout for [K,N] (as a brgemm matmul of MM_DNNL_MB rows sees it)
 * and pack the source into it. */
static megamoe_status_t mm_onednn_pack_impl(mm_gemm_weight_t *w, mm_dnnl_weight_t *lw)
{
    mm_md_t src = MM_MD_NONE, wei = MM_MD_NONE, dst = MM_MD_NONE;
    dnnl_status_t s = mm_md_by_tag(&src, MM_DNNL_MB, w->K, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = mm_md_by_tag(&wei, w->K, w->N, dnnl_bf16, dnnl_format_tag_any);
    if (s == dnnl_success) s = mm_md_by_tag(&dst, MM_DNNL_MB, w->N, dnnl_f32, dnnl_ab);
    dnnl_primitive_desc_t pd = NULL;
    if (s == dnnl_success) s = mm_matmul_pd(&pd, mm_engine, MM_MDV(src), MM_MDV(wei), MM_MDV(dst), NULL);
    mm_md_free(&src);
    mm_md_free(&wei);
    mm_md_free(&dst);
    if (s == dnnl_success) s = mm_md_copy(&lw->md, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0));
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) return mm_dnnl_fail(s, "matmul descriptor for packing");

    mm_md_layout_t *b = &lw->layout;
    mm_md_layout(MM_MDV(lw->md), b);
    if (!b->blocked || b->nblks == 0) return MEGAMOE_OK; /* plain */
    int64_t kb = 1, nb = 1;
    for (int i = 0; i < b->nblks; i++) {
        if (b->idxs[i] == 0) kb *= b->blks[i];
        else nb *= b->blks[i];
    }
    /* Column blocks outermost and contiguous (BA16a64b2a): sub-blocks are pointer offsets. */
    int col_outer = b->strides[0] == kb * nb && b->strides[1] == b->strides[0] * (b->padded[0] / kb);
#if MM_DNNL3
    /* 3.x descriptors are opaque: a column block is described by the layout's name, so only
     * the named layouts oneDNN's bf16 matmul picks are split by columns (others: whole) */
    static const dnnl_format_tag_t named[] = {dnnl_BA16a64b2a, dnnl_BA16a48b2a, dnnl_BA16a32b2a,
                                              dnnl_BA16a16b2a, dnnl_BA16a64b4a, dnnl_BA16a48b4a,
                                              dnnl_BA16a32b4a, dnnl_BA16a16b4a};
    lw->tag = dnnl_format_tag_undef;
    for (size_t i = 0; col_outer && i < sizeof named / sizeof named[0]; i++) {
        mm_md_t t = MM_MD_NONE;
        if (mm_md_by_tag(&t, w->K, w->N, dnnl_bf16, named[i]) == dnnl_success &&
            dnnl_memory_desc_equal(t, lw->md))
            lw->tag = named[i];
        mm_md_free(&t);
        if (lw->tag != dnnl_format_tag_undef) break;
    }
    col_outer = col_outer && lw->tag != dnnl_format_tag_undef;
#endif
    lw->nb = col_outer ? nb : 0;
    lw->block_stride = col_outer ? b->strides[1] : 0;
    lw->own_pack = MM_X86 && mm_cpu_has_avx512() && mm_dnnl_is_ba16a64b2a(b);

    size_t bytes = dnnl_memory_desc_get_size(MM_MDV(lw->md));
    void *data = NULL;
    MM_CHECK(mm_aligned_alloc(bytes, MM_CACHE_LINE, "oneDNN packed weight", &data));
    w->data = data;
    megamoe_status_t st = mm_onednn_fill(w, lw);
    if (st != MEGAMOE_OK) {
        mm_aligned_free(data);
        w->data = NULL;
        return st;
    }
    w->bytes = bytes;
    w->packed = 1;
    w->n_align = lw->nb ? lw->nb : w->N;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_onednn_weight_pack(mm_gemm_weight_t *w)
{
    MM_CHECK(mm_onednn_probe());
    mm_dnnl_weight_t *lw = calloc(1, sizeof *lw);
    if (lw == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "oneDNN packed weight: out of memory");
    w->impl = lw;
    int prev = mm_omp_enter(1);
    megamoe_status_t st = mm_onednn_pack_impl(w, lw);
    mm_omp_leave(prev, 1);
    return st; /* on failure the framework calls weight_release */
}

/* Same layout and buffer, new contents (training: after every optimizer step). */
static megamoe_status_t mm_onednn_weight_refresh(mm_gemm_weight_t *w)
{
    int prev = mm_omp_enter(1);
    megamoe_status_t st = mm_onednn_fill(w, w->impl);
    mm_omp_leave(prev, 1);
    return st;
}

static void mm_onednn_weight_release(mm_gemm_weight_t *w)
{
    if (w->packed) mm_aligned_free(w->data);
    mm_dnnl_weight_t *lw = w->impl;
    if (lw) mm_md_free(&lw->md);
    free(lw);
}

const mm_gemm_backend_ops_t mm_gemm_onednn_ops = {
    .name = MM_GEMM_NAME_ONEDNN,
    .probe = mm_onednn_probe,
    .gemm = mm_onednn_gemm,
    .weight_pack = mm_onednn_weight_pack,
    .weight_release = mm_onednn_weight_release,
    .gemm_grouped = NULL,
    .weight_refresh = mm_onednn_weight_refresh,
};

/* ---- the plain baseline (gemm_onednn.h) -------------------------------------------------- */

struct mm_onednn_plain {
    int64_t M, K, N;
    int packed, threads;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    mm_md_t wmd;
};

megamoe_status_t mm_onednn_plain_create(int64_t M, int64_t K, int64_t N, int packed_weights,
                                        int threads, mm_onednn_plain_t **plain_p)
{
    MM_CHECK(mm_onednn_probe());
    if (M <= 0 || K <= 0 || N <= 0 || plain_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_onednn_plain_create: bad arguments");
    if (threads < 1) threads = 1;
    mm_onednn_plain_t *p = calloc(1, sizeof *p);
    if (p == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_onednn_plain_create: out of memory");
    p->M = M, p->K = K, p->N = N, p->packed = packed_weights, p->threads = threads;
    mm_md_t src = MM_MD_NONE, wei = MM_MD_NONE, dst = MM_MD_NONE;
    int prev = mm_omp_enter(threads);
    dnnl_status_t s = mm_md_by_tag(&src, M, K, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = mm_md_by_tag(&wei, K, N, dnnl_bf16, packed_weights ? dnnl_format_tag_any : dnnl_ab);
    if (s == dnnl_success) s = mm_md_by_tag(&dst, M, N, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = mm_matmul_pd(&p->pd, mm_engine, MM_MDV(src), MM_MDV(wei), MM_MDV(dst), NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&p->prim, p->pd);
    mm_omp_leave(prev, threads);
    mm_md_free(&src);
    mm_md_free(&wei);
    mm_md_free(&dst);
    if (s == dnnl_success) s = mm_md_copy(&p->wmd, dnnl_primitive_desc_query_md(p->pd, dnnl_query_weights_md, 0));
    if (s != dnnl_success) {
        mm_onednn_plain_destroy(p);
        return mm_dnnl_fail(s, "plain matmul primitive");
    }
    *plain_p = p;
    return MEGAMOE_OK;
}

size_t mm_onednn_plain_weight_bytes(const mm_onednn_plain_t *p) { return dnnl_memory_desc_get_size(MM_MDV(p->wmd)); }

const char *mm_onednn_plain_impl(const mm_onednn_plain_t *p)
{
    const char *impl = "?";
    dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0, &impl);
    return impl;
}

megamoe_status_t mm_onednn_plain_pack(const mm_onednn_plain_t *p, const uint16_t *B, void *dst)
{
    if (!p->packed) {
        memcpy(dst, B, (size_t)(p->K * p->N) * sizeof(uint16_t));
        return MEGAMOE_OK;
    }
    mm_md_t from = MM_MD_NONE;
    dnnl_status_t s = mm_md_by_tag(&from, p->K, p->N, dnnl_bf16, dnnl_ab);
    if (s != dnnl_success) {
        mm_md_free(&from);
        return mm_dnnl_fail(s, "memory descriptor");
    }
    int prev = mm_omp_enter(1);
    megamoe_status_t st = mm_dnnl_reorder(MM_MDV(from), B, MM_MDV(p->wmd), dst);
    mm_omp_leave(prev, 1);
    mm_md_free(&from);
    return st;
}

megamoe_status_t mm_onednn_plain_run(const mm_onednn_plain_t *p, const uint16_t *A, const void *W,
                                     float *C)
{
    dnnl_stream_t stream;
    MM_CHECK(mm_stream(&stream));
    int prev = mm_omp_enter(p->threads);
    dnnl_memory_t m[3] = {NULL, NULL, NULL};
    dnnl_status_t s = dnnl_memory_create(&m[0], dnnl_primitive_desc_query_md(p->pd, dnnl_query_src_md, 0), mm_engine, (void *)A);
    if (s == dnnl_success) s = dnnl_memory_create(&m[1], MM_MDV(p->wmd), mm_engine, (void *)W);
    if (s == dnnl_success) s = dnnl_memory_create(&m[2], dnnl_primitive_desc_query_md(p->pd, dnnl_query_dst_md, 0), mm_engine, C);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
        s = dnnl_primitive_execute(p->prim, stream, 3, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    for (int i = 0; i < 3; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    mm_omp_leave(prev, p->threads);
    return s == dnnl_success ? MEGAMOE_OK : mm_dnnl_fail(s, "plain matmul execution");
}

void mm_onednn_plain_destroy(mm_onednn_plain_t *p)
{
    if (p == NULL) return;
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->pd) dnnl_primitive_desc_destroy(p->pd);
    mm_md_free(&p->wmd);
    free(p);
}

#else /* no oneDNN in this build */

#include "base/error.h"

megamoe_status_t mm_onednn_plain_create(int64_t M, int64_t K, int64_t N, int packed_weights,
                                        int threads, mm_onednn_plain_t **plain_p)
{
    (void)M, (void)K, (void)N, (void)packed_weights, (void)threads, (void)plain_p;
    return mm_error_quiet(MEGAMOE_UNSUPPORTED, "this build has no oneDNN (MEGAMOE_WITH_ONEDNN=OFF)");
}
size_t mm_onednn_plain_weight_bytes(const mm_onednn_plain_t *plain) { (void)plain; return 0; }
megamoe_status_t mm_onednn_plain_pack(const mm_onednn_plain_t *plain, const uint16_t *B, void *dst)
{
    (void)plain, (void)B, (void)dst;
    return MEGAMOE_UNSUPPORTED;
}
megamoe_status_t mm_onednn_plain_run(const mm_onednn_plain_t *plain, const uint16_t *A,
                                     const void *W, float *C)
{
    (void)plain, (void)A, (void)W, (void)C;
    return MEGAMOE_UNSUPPORTED;
}
const char *mm_onednn_plain_impl(const mm_onednn_plain_t *plain) { (void)plain; return "none"; }
void mm_onednn_plain_destroy(mm_onednn_plain_t *plain) { (void)plain; }
#endif /* MM_HAVE_ONEDNN */
