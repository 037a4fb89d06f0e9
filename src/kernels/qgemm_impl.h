/* Shared between the quantised GEMM driver (qgemm.c), its portable C twins (qgemm_c.c) and its
 * AVX-512 kernels (qgemm_avx512.c). Not for callers of qgemm.h.
 *
 * Packed weight: panels of MM_QK_NR = 64 output columns, one after the other, each holding all
 * of K in k-quads (4 consecutive k), the operand layout of vpdpbusd:
 *   int8  panel = [KQ = ceil(K/4)][64 columns][4 k] bytes, byte u = w + 128 (w ^ 0x80);
 *   int4  panel = [KQ/2 = ceil(K/8)][64 columns][4 k] bytes; the low nibble holds u(k) of quad
 *         2o and the high nibble u(k) of quad 2o+1 (k = 8o + j and 8o + 4 + j), u = v + 8;
 *   padding (k >= K, columns >= N) is w = 0. A panel is 64-byte aligned; panels are
 *   contiguous, so a product's B is one linear stream.
 * The weights are stored with an offset (unsigned: vpdpbusd multiplies unsigned bytes of its
 * first source by signed bytes of the second), so for int8 A
 *     sum_k u[k] * a[k] = sum_k w[k] * a[k] + off * sum_k a[k],   off = 128 (int8) / 8 (int4),
 * and the driver subtracts off * (the row's sum of A over the K group), exactly, in 32-bit
 * wrap-around arithmetic: the true sum fits int32 (K <= MM_QGEMM_MAX_K), so the wrapped
 * difference is it. The A rows stay signed, so a token's int8 values are used as dispatched.
 *
 * Micro-kernel: an mr x 64 tile (mr <= 6) over quads [q0, q0 + nq) of one panel, accumulators
 * in registers, started from 0 or from the tile buffer (cont), stored back to the tile buffer.
 * A is packed per row block into micro-panels of MM_QK_MR rows: int8 A as int32 [KQ][6] (the 4
 * bytes of a quad; zero past K and past the tile's rows), bf16 A as fp32 [4 KQ][6] (exact).
 * For bf16 A the micro-kernel converts each weight vector in registers, w' = (float)w + offset
 * with the K group's 64 offsets (skipped when absent), and runs one fp32 FMA chain per element
 * and K group over k ascending; the group's scale multiplies the chain's sum afterwards (flush
 * / epilogue, as for int8 A). The last quad of K may be partial (kv valid k), so padded k are
 * never touched. */
#ifndef MM_KERNELS_QGEMM_IMPL_H
#define MM_KERNELS_QGEMM_IMPL_H

#include <stdint.h>

#include "base/cpu.h"
#include "qgemm.h"

#define MM_QK_NR 64 /* columns of a panel and of a tile */
#define MM_QK_MR 6  /* rows of a tile */

struct mm_qweight {
    mm_qw_type_t type;
    int64_t K, N, group_size, groups;
    int64_t kq;          /* quads per panel: ceil(K/4) (int8), 2 ceil(K/8) (int4) */
    int64_t panels;      /* ceil(N / 64) */
    size_t panel_bytes;  /* kq * 256 (int8), kq * 128 (int4) */
    uint8_t *data;       /* panels * panel_bytes */
    size_t bytes;        /* allocated */
    uint64_t version;
    const void *src_data; /* the data pointer last packed from */
};

/* Bytes of panel p from quad q (q even for int4). */
static inline const uint8_t *mm_qw_quad(const mm_qweight_t *w, int64_t p, int64_t q)
{
    return w->data + (size_t)p * w->panel_bytes +
           (size_t)(w->type == MM_QW_INT8 ? q * 256 : (q / 2) * 256);
}

/* One micro-kernel call. */
typedef struct mm_qk_ukr_args {
    int64_t nq;        /* quads (int4: even) */
    int kv;            /* bf16 A: valid k in the last quad (1..4); int8 A: 4 */
    const uint8_t *b;  /* the panel at the first quad (mm_qw_quad) */
    const void *a;     /* the A micro-panel at the first quad: int32 [.][6] or fp32 [.][6] (per k) */
    void *acc;         /* tile buffer [6][64]: int32 (int8 A) or fp32 (bf16 A) */
    int cont;          /* start from acc (else from 0) */
    const float *wo;   /* bf16 A: the group's 64 offsets (never NULL: zeros when absent) */
    int no_offset;     /* bf16 A: wo is all zeros (adding them is skipped: x + 0 = x exactly
                        * for the integer weights, so the bits do not change) */
    const char *pf;    /* prefetch npf 64-byte lines from pf, spread over the call */
    int64_t npf;
    int pf_l2;         /* ... into L2 (hint T1) instead of L1 (T0) */
} mm_qk_ukr_args_t;

/* Per-tile epilogue and group flush (int8 A with G > 1). */
typedef struct mm_qk_epi_args {
    int mr;              /* rows of the tile */
    int64_t nr;          /* columns (<= 64) */
    const int32_t *i32;  /* int32 tile [6][64] (int8 A) */
    float *f32;          /* fp32 tile [6][64] (G > 1 or bf16 A) */
    int fp_acc;          /* the group sums in i32 are fp32 (bf16 A), not int32 */
    int groups_mode;     /* 0 = one group (read i32 and scale), 1 = read the f32 group sums */
    const int32_t *corr; /* [mr] off * row sums of this group (int8 A) */
    /* flush (G > 1): f32 = (first ? 0 : f32 +) v * ws, v = (float)(i32 - corr) (int8 A) or
     * the fp32 sum (bf16 A) */
    const float *ws;     /* 64 scales of the group / one group (NULL: 1) */
    int first;
    /* final */
    const int32_t *bias_i32; /* at column 0 of the tile, or NULL */
    const float *bias_pre, *bias_post;
    const float *xs;     /* [mr] per-row token scales, or NULL */
    void *c;             /* C at the tile's first element */
    int64_t ldc;
    megamoe_dtype_t c_type;
} mm_qk_epi_args_t;

/* Kernel table: C twins always, AVX-512 where the CPU has it. */
typedef struct mm_qk_kernels {
    void (*ukr_i8)(int mr, const mm_qk_ukr_args_t *a);   /* int8 A x int8 W */
    void (*ukr_i4)(int mr, const mm_qk_ukr_args_t *a);   /* int8 A x int4 W */
    void (*ukr_w8)(int mr, const mm_qk_ukr_args_t *a);   /* bf16 A x int8 W */
    void (*ukr_w4)(int mr, const mm_qk_ukr_args_t *a);   /* bf16 A x int4 W */
    void (*flush)(const mm_qk_epi_args_t *e);
    void (*epilogue)(const mm_qk_epi_args_t *e);
    int32_t (*rowsum)(const int8_t *x, int64_t n); /* sum of n int8 (wraps in 32 bits) */
} mm_qk_kernels_t;

extern const mm_qk_kernels_t mm_qk_kernels_c;
#if MM_X86
extern const mm_qk_kernels_t mm_qk_kernels_avx512; /* needs AVX512-VNNI for ukr_i8/i4 */
#endif

/* Packing (C; the AVX-512 versions are used where present, same bytes). */
void mm_qk_pack_panel_c(const mm_qweight_t *w, const mm_qweight_src_t *src, int64_t p, uint8_t *dst);

/* The kernel table the next products use (mm_kernels_set_vector / CPU features). */
const mm_qk_kernels_t *mm_qk_kernels_for(megamoe_dtype_t a_type);

#endif /* MM_KERNELS_QGEMM_IMPL_H */
