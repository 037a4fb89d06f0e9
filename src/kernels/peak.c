/* Peak probes (see peak.h). Each loop keeps independent accumulators in registers so the
 * unit's issue rate, not latency, bounds it; the result is stored so nothing is elided. */
#include <string.h>

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
    if (mm_cpu_has_avx512()) {
        peak_p->fp32_fma_gflops = mm_probe_best(mm_probe_fma, 24 * 32, seconds);
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
#else
    (void)seconds;
#endif
    return MEGAMOE_OK;
}
