/* Row quantisers of dispatch (MoeDistributeDispatchV2 quantMode 1..4) and combine's int8
 * transport (commQuantMode 2), bit-exact to docs/v2_spec.md §4, §5.2.
 *
 * Notation: f32(x) exact widening of a bf16/fp16 element; fl32(e) one IEEE fp32 operation
 * rounded to nearest even; RNE round half to even. Inputs are one row of h elements, bf16 or
 * fp16 (x_type). The dispatch operator calls these once per token row.
 *
 *  int8(w)    = RNE to an integer, saturated to [-128, 127]; NaN gives 0 (the spec's "emit q = 0").
 *  fp8(w)     = megamoe_fp32_to_fp8_e4m3fn / _e5m2 (src/base: RNE; "sat" = clamp to +-448 /
 *               +-57344, else overflow gives NaN (e4m3fn) / Inf (e5m2)).
 *  max|v|     = the largest |v|, or the canonical NaN 0x7fc00000 when any v is NaN (the
 *               hardware's NaN behaviour is unverified; this makes every NaN row well defined).
 *  qmax       = 127 (int8), 448 (e4m3fn), 57344 (e5m2).
 *
 * quantMode 1, static (§4.2):   q[i] = int8(fl32(f32(x[i]) * s_i)), s_i = scales[0] when
 *     scales_len == 1, else scales[i] (scales_len == h: a (H,) table or one expert's row of
 *     the [E', H] table). Saturation is our choice where the spec says "hardware-defined".
 * quantMode 2, per-token dynamic (§4.1), also its fp8 per-token variant:
 *     v[i] = f32(x[i]), or fl32(f32(x[i]) * smooth[i]) with smooth scales;
 *     m = max|v|;  d = fl32(qmax / m);  q[i] = int8(fl32(v[i] * d)) or fp8(fl32(v[i] * d)) (no
 *     saturation);  scale = fl32(1 / d)  (not m / qmax: they can differ in the last ulp).
 * quantMode 3, per-group dynamic fp8 (§4.3): the same per group of 128 consecutive elements
 *     (the last group may be short: zero padding never changes a max), fp8 only, one fp32
 *     scale per group, ceil(h / 128) of them.
 *   Zero rows / groups (m == 0): d = +inf, scale = 0 and every q = 0 (+0 for fp8; the
 *   arithmetic would give NaN). Otherwise the arithmetic decides: m = inf gives d = 0,
 *   scale = inf, q = 0 (int8) for every element and fp8 NaN for the infinite ones; a NaN row
 *   gives scale NaN and q = 0 (int8) / fp8 NaN. A NaN product always encodes as the positive
 *   canonical fp8 NaN (0x7F e4m3fn, 0x7E e5m2); the sign of a NaN is the FPU's, not data.
 * quantMode 4, MX (§4.4), fp8 outputs, blocks of 32, mm_quant_mx_scale_count(h) =
 *     align_up(ceil(h/32), 2) E8M0 scale bytes (the pad block gets 0):
 *     e_i = the 8-bit exponent field of bf16(x[i]) (fp16 is widened and truncated to bf16, so
 *     fp16 Inf/NaN count as 255); E = max e_i over the block;
 *     E == 255: scale 0xFF and every q = the positive canonical NaN (0x7F e4m3fn, 0x7E e5m2);
 *     E == 0:   scale 0 and every q = 0 (+0);
 *     else      s = max(E, emax) - emax (emax 8 for e4m3fn, 15 for e5m2), scale byte s,
 *               q[i] = fp8_sat(f32(x[i]) * 2^(127 - s)) (exact product; saturating cast).
 * Combine int8 transport (§5.2), blocks of 8 (the last may be short), y_type bf16 or fp16:
 *     m_b = max|f32(y)|;  s_b = fl32(m_b * fl32(1/127));  sx_b = y_type_RNE(s_b) (the stored
 *     scale, ceil(h/8) of them, y_type);  q = int8(f16_RNE(fl32(f32(y) / s_b)))  (division by
 *     the fp32 s_b, not by sx_b; double rounding through fp16).  All-zero block: 0/0 = NaN,
 *     q = 0, sx_b = 0.
 *   Dequantise: y'[i] = y_type_RNE(fl32(f32(q[i]) * f32(sx_b))).
 * Combine MX transport (commQuantMode 3: fp8_e5m2, 4: fp8_e4m3fn; the Ascend 950 combine kernel):
 *     quantised exactly as quantMode 4 (mm_quant_mx); the source dequantises to fp32 and does NOT
 *     round to y_type: y'[i] = fl32(fp8(q[i]) * scale_b) with scale_b the fp32 whose bits are
 *     the scale byte shifted into the exponent field (byte << 23): 2^(s-127) for s >= 1, +0 for
 *     s = 0 (so a block whose largest exponent field is <= emax dequantises to 0), +Inf for 0xFF
 *     (whose q are NaN: the block stays NaN).
 * Vectorised (AVX-512) for bf16/fp16 rows in modes 1 and 2 (int8) and the transport; the
 * scalar code is the definition and the vector code gives the same bits.
 */
#ifndef MM_KERNELS_QUANT_H
#define MM_KERNELS_QUANT_H

#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/status.h"

#define MM_QUANT_GROUP 128  /* quantMode 3 group */
#define MM_QUANT_MX_BLOCK 32 /* quantMode 4 block */
#define MM_COMM_QUANT_BLOCK 8 /* combine int8 transport block */

static inline int64_t mm_quant_group_count(int64_t h) { return (h + MM_QUANT_GROUP - 1) / MM_QUANT_GROUP; }
static inline int64_t mm_quant_mx_scale_count(int64_t h)
{
    return ((h + MM_QUANT_MX_BLOCK - 1) / MM_QUANT_MX_BLOCK + 1) / 2 * 2;
}
static inline int64_t mm_comm_quant_block_count(int64_t h)
{
    return (h + MM_COMM_QUANT_BLOCK - 1) / MM_COMM_QUANT_BLOCK;
}

/* quantMode 1: int8 q[h]. */
megamoe_status_t mm_quant_static_int8(const void *x, megamoe_dtype_t x_type, int64_t h,
                                      const float *scales, int64_t scales_len, int8_t *q);
/* quantMode 2 (q_type INT8) and the per-token fp8 variant (FP8_E4M3FN, FP8_E5M2): q[h]
 * (int8_t or fp8 bytes), *scale_p; smooth may be NULL. */
megamoe_status_t mm_quant_dynamic_token(const void *x, megamoe_dtype_t x_type, int64_t h,
                                        const float *smooth, megamoe_dtype_t q_type, void *q,
                                        float *scale_p);
/* quantMode 3: fp8 q[h], scales[mm_quant_group_count(h)]; smooth may be NULL. */
megamoe_status_t mm_quant_dynamic_group(const void *x, megamoe_dtype_t x_type, int64_t h,
                                        const float *smooth, megamoe_dtype_t q_type, uint8_t *q,
                                        float *scales);
/* quantMode 4: fp8 q[h], E8M0 scales[mm_quant_mx_scale_count(h)]. */
megamoe_status_t mm_quant_mx(const void *x, megamoe_dtype_t x_type, int64_t h,
                             megamoe_dtype_t q_type, uint8_t *q, uint8_t *scales);
/* Combine transport: int8 q[h], y_type scales[mm_comm_quant_block_count(h)], and back. */
megamoe_status_t mm_comm_quant_int8(const void *y, megamoe_dtype_t y_type, int64_t h, int8_t *q,
                                    void *scales);
megamoe_status_t mm_comm_dequant_int8(const int8_t *q, const void *scales, megamoe_dtype_t y_type,
                                      int64_t h, void *y);
/* MX transport, dequantise n elements of a row starting at a block boundary: q[n] fp8 bytes of
 * q_type, scales[ceil(n/32)] E8M0 bytes of their blocks -> fp32 out[n]. */
megamoe_status_t mm_comm_dequant_mx_f32(const uint8_t *q, const uint8_t *scales,
                                        megamoe_dtype_t q_type, int64_t n, float *out);

/* Per-token int8 quantisation of activation rows for the quantised GEMMs (qgemm.h): row r of
 * h elements at x + r * ldx -> q + r * ldq and scales[r] (x ~ q * scale). Two rules, each
 * operator uses its own spec's (docs/kernels.md, "Activation quantisers"):
 *   MM_QROW_DISPATCH  MoeDistributeDispatchV2 quantMode 2, bit-exact (mm_quant_dynamic_token:
 *                     d = fl32(127/m), q = int8(fl32(v*d)) RNE in [-128, 127], scale =
 *                     fl32(1/d)); bf16 / fp16 rows. Rows dispatched as int8 feed the GEMM with
 *                     their scales unchanged.
 *   MM_QROW_SYM127    mega_moe §6.3 and npu_dynamic_quant: s = fl32(m/127),
 *                     q = round half away from zero of fl32(v/s), clamped to [-127, 127];
 *                     fp32 / bf16 / fp16 rows.
 * m = max|v|, v = f32(x) or fl32(f32(x) * smooth[i]) (smooth may be NULL). An all-zero row gives
 * scale 0 and q = 0; a row holding a NaN gives scale NaN and q = 0; an Inf row scale Inf, q = 0
 * (NaN quotients quantise to 0). AVX-512 and scalar paths give the same bits. */
typedef enum mm_qrow_rule {
    MM_QROW_DISPATCH = 0,
    MM_QROW_SYM127 = 1,
} mm_qrow_rule_t;
megamoe_status_t mm_quant_rows_int8(mm_qrow_rule_t rule, const void *x, megamoe_dtype_t x_type,
                                    int64_t rows, int64_t h, int64_t ldx, const float *smooth,
                                    int8_t *q, int64_t ldq, float *scales);

#endif /* MM_KERNELS_QUANT_H */
