/* Peak probes (see peak.h). Each loop keeps independent accumulators in registers so the
 * unit's issue rate, not latency, bounds it; the result is stored so nothing is elided. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "base/error.h"
#include "peak.h"
#include "simd.h"

#if MM_X86
#include <immintrin.h>

static volatile float mm_peak_sink;

MM_TARGET_AVX512 static double mm_probe_fma(long iters)
{
    __m512 acc[24];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i);
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
    uint64_t t1 = mm_now_ns();
    __m512 s = acc[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
    mm_peak_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 24 * 32 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

/* The same with ymm registers (AVX2 CPUs: what the own GEMM's AVX2 form runs on); 12
 * accumulators cover 2 FMA pipes x 4-5 cycles of latency (Zen 2/3, Haswell on). */
MM_TARGET_AVX2 static double mm_probe_fma_avx2(long iters)
{
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    }
    uint64_t t1 = mm_now_ns();
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    mm_peak_sink = v[0] + v[7];
    return (double)iters * 12 * 16 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

MM_TARGET_AVX512BF16 static double mm_probe_dpbf16(long iters)
{
    __m512 acc[24];
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int i = 0; i < 24; i++) acc[i] = _mm512_setzero_ps();
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    }
    uint64_t t1 = mm_now_ns();
    __m512 s = acc[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
    mm_peak_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 24 * 64 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

/* vpdpbusd zmm on 24 independent accumulators (zmm0-23), sources zmm24/25. */
#define MM_PK_DP(i) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define MM_PK_24(M)                                                                          \
    M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)    \
    M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
MM_TARGET_AVX512VNNI static double mm_probe_vnni(long iters)
{
    __asm__ volatile("vpternlogd $0xff, %%zmm24, %%zmm24, %%zmm24\n\t"
                     "vpternlogd $0xff, %%zmm25, %%zmm25, %%zmm25" ::: "xmm24", "xmm25");
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++)
        __asm__ volatile(MM_PK_24(MM_PK_DP)::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",
                         "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
                         "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21",
                         "xmm22", "xmm23");
    uint64_t t1 = mm_now_ns();
    return (double)iters * 24 * 128 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

/* AMX-INT8: only ever called after mm_cpu_request_amx() returned 1 on a CPU with AMX-INT8. */
__attribute__((target("amx-tile,amx-int8"))) static double mm_probe_amx_int8(long iters)
{
    static int8_t a[16 * 64] __attribute__((aligned(64))), b[16 * 64] __attribute__((aligned(64)));
    static int32_t c[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 64; i++) a[i] = 1, b[i] = 1;
    mm_tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    uint64_t t1 = mm_now_ns();
    _tile_stored(0, c, 64);
    _tile_release();
    mm_peak_sink = (float)c[0];
    return (double)iters * 4 * 32768 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

/* AMX: only ever called after mm_cpu_request_amx() returned 1. */
__attribute__((target("amx-tile,amx-bf16"))) static double mm_probe_amx(long iters)
{
    static uint16_t a[16 * 32] __attribute__((aligned(64))), b[16 * 32] __attribute__((aligned(64)));
    static float c[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) a[i] = 0x3f80, b[i] = 0x3400;
    mm_tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    uint64_t t0 = mm_now_ns();
    for (long n = 0; n < iters; n++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    uint64_t t1 = mm_now_ns();
    _tile_stored(0, c, 64);
    _tile_release();
    mm_peak_sink = c[0];
    return (double)iters * 4 * 16384 / ((double)(t1 - t0) * 1e-9) * 1e-9;
}

/* Calibrate to about `seconds` in total, then the best of 3 runs. */
static double mm_probe_best(double (*fn)(long), double flop_per_iter, double seconds)
{
    double g = fn(1000); /* warm-up */
    long iters = (long)(0.01 * g * 1e9 / flop_per_iter);
    g = fn(iters > 1000 ? iters : 1000); /* ~10 ms: calibrates, lets the clock settle */
    long n = (long)(seconds / 3 * g * 1e9 / flop_per_iter);
    if (n < 1000) n = 1000;
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double r = fn(n);
        if (r > best) best = r;
    }
    return best;
}
#endif

megamoe_status_t mm_kernels_peak_probe(double seconds, mm_peak_t *peak_p)
{
    if (peak_p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_kernels_peak_probe: NULL peak_p");
    if (!(seconds >= 0.01)) seconds = 0.01;
    memset(peak_p, 0, sizeof *peak_p);
    peak_p->unit = "none";
#if MM_X86
    if (mm_cpu_has_avx512() || mm_cpu_has_avx2_fma()) {
        peak_p->fp32_fma_gflops = mm_cpu_has_avx512()
                                      ? mm_probe_best(mm_probe_fma, 24 * 32, seconds)
                                      : mm_probe_best(mm_probe_fma_avx2, 12 * 16, seconds);
        peak_p->unit = "fp32_fma";
        peak_p->gflops = peak_p->fp32_fma_gflops;
    }
    if (mm_cpu_has_avx512_bf16()) {
        peak_p->avx512_bf16_gflops = mm_probe_best(mm_probe_dpbf16, 24 * 64, seconds);
        peak_p->unit = "avx512_bf16";
        peak_p->gflops = peak_p->avx512_bf16_gflops;
    }
    if (mm_cpu_has_amx_bf16() && mm_cpu_request_amx()) {
        peak_p->amx_gflops = mm_probe_best(mm_probe_amx, 4 * 16384, seconds);
        peak_p->unit = "amx_bf16";
        peak_p->gflops = peak_p->amx_gflops;
    }
    peak_p->int8_unit = "none";
    if (mm_cpu_has_avx512_vnni()) {
        peak_p->avx512_vnni_gops = mm_probe_best(mm_probe_vnni, 24 * 128, seconds);
        peak_p->int8_unit = "avx512_vnni";
        peak_p->int8_gops = peak_p->avx512_vnni_gops;
    }
    if (mm_cpu_has_amx_int8() && mm_cpu_request_amx()) {
        peak_p->amx_int8_gops = mm_probe_best(mm_probe_amx_int8, 4 * 32768, seconds);
        peak_p->int8_unit = "amx_int8";
        peak_p->int8_gops = peak_p->amx_int8_gops;
    }
#else
    (void)seconds;
    peak_p->int8_unit = "none";
#endif
    return MEGAMOE_OK;
}

/* ---- read bandwidth ---------------------------------------------------------------------- */

typedef struct mm_bw_job {
    const char *p;
    size_t bytes;
    atomic_int *go;
    uint64_t sink;
} mm_bw_job_t;

#if MM_X86
MM_TARGET_AVX512 static uint64_t mm_bw_read_avx512(const char *p, size_t bytes)
{
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < bytes; i += 256) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 64));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 128));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 192));
    }
    return (uint64_t)_mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}
#endif

#if MM_X86
MM_TARGET_AVX2 static uint64_t mm_bw_read_avx2(const char *p, size_t bytes)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < bytes; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v,
                        _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return v[0] + v[1] + v[2] + v[3];
}
#endif

static uint64_t mm_bw_read(const char *p, size_t bytes)
{
#if MM_X86
    if (mm_cpu_has_avx512()) return mm_bw_read_avx512(p, bytes);
    if (mm_cpu_has_avx2_fma()) return mm_bw_read_avx2(p, bytes);
#endif
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s = 0;
    for (size_t i = 0; i < bytes / 8; i++) s += q[i];
    return s;
}

static void *mm_bw_thread(void *arg)
{
    mm_bw_job_t *j = arg;
    while (!atomic_load_explicit(j->go, memory_order_acquire)) mm_cpu_pause();
    j->sink = mm_bw_read(j->p, j->bytes);
    return NULL;
}

megamoe_status_t mm_kernels_read_bw_probe(int threads, double seconds, double *gbps_p)
{
    if (gbps_p == NULL || threads < 1 || threads > 256)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "mm_kernels_read_bw_probe: threads %d (1..256) or NULL gbps_p", threads);
    *gbps_p = 0;
    /* 8x the last-level cache (at least 256 MiB), so no pass finds its data in a cache. */
    size_t bytes = mm_cpu_llc_bytes() * 8;
    if (bytes < ((size_t)256 << 20)) bytes = (size_t)256 << 20;
    if (bytes > ((size_t)1 << 30)) bytes = (size_t)1 << 30;
    const size_t slice = bytes / (size_t)threads / 256 * 256;
    void *mem = NULL;
    MM_CHECK(mm_aligned_alloc(bytes, 4096, "read bandwidth probe buffer", &mem));
    char *buf = mem;
    memset(buf, 1, bytes);
    mm_bw_job_t jobs[256];
    pthread_t tids[256];
    double best = 0;
    uint64_t sink = 0, begin = mm_now_ns();
    megamoe_status_t st = MEGAMOE_OK;
    for (int pass = 0; pass < 20 && st == MEGAMOE_OK; pass++) {
        atomic_int go = 0;
        int started = 1;
        for (int t = 0; t < threads; t++) {
            jobs[t].p = buf + (size_t)t * slice;
            jobs[t].bytes = slice;
            jobs[t].go = &go;
            jobs[t].sink = 0;
        }
        for (int t = 1; t < threads; t++, started++)
            if (pthread_create(&tids[t], NULL, mm_bw_thread, &jobs[t]) != 0) break;
        const uint64_t t0 = mm_now_ns();
        atomic_store_explicit(&go, 1, memory_order_release);
        if (started == threads) jobs[0].sink = mm_bw_read(jobs[0].p, jobs[0].bytes);
        for (int t = 1; t < started; t++) pthread_join(tids[t], NULL);
        const uint64_t t1 = mm_now_ns();
        if (started != threads) {
            st = mm_error(MEGAMOE_INTERNAL, "mm_kernels_read_bw_probe: could not start %d threads",
                          threads);
            break;
        }
        for (int t = 0; t < threads; t++) sink += jobs[t].sink;
        const double g = (double)slice * threads / ((double)(t1 - t0) * 1e-9) * 1e-9;
        if (g > best) best = g;
        if (pass >= 2 && (double)(mm_now_ns() - begin) * 1e-9 > seconds) break;
    }
    mm_peak_sink = (float)(sink & 1);
    mm_aligned_free(buf);
    *gbps_p = best;
    return st;
}
