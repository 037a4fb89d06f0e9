/* CombineV2 internals shared by combine_v2.c (fullmesh, expert side, reduction, add+RMSNorm)
 * and combine_hierarchy.c (two hops with a partial sum at each group's leader). */
#ifndef MM_OPS_COMBINE_V2_H
#define MM_OPS_COMBINE_V2_H

#include "v2_internal.h"

/* Segments of the combine workspace. */
enum {
    MM_V2C_SIG,     /* 4 * n_world lines: data | hop-1 | weights | (TP at 3 * n_world) */
    MM_V2C_SLOTS,   /* dense slots t * (K + NS) + k' of this rank's tokens (records) */
    MM_V2C_TPDATA,  /* TP peer's partial rows for our rows */
    MM_V2C_HSLOTS,  /* hierarchy leader: dense slots per source of its group's rows */
    MM_V2C_HW,      /* hierarchy leader: each source's expert_scales, ids and mask */
    MM_V2C_PARTIAL, /* hierarchy source: one fp32 partial row per (group, token) */
    MM_V2C_NSEG
};

typedef struct mm_v2_combine {
    const megamoe_combine_v2_args_t *a;
    const megamoe_combine_add_rms_norm_args_t *arn; /* NULL for plain combine */
    mm_v2_cfg_t c;
    mm_v2_call_t call;
    int n;
    int64_t n_own, n_peer;    /* own rows; TP peer's rows after ours */
    int64_t KS;               /* K + NS slots per token */
    size_t pay;               /* payload bytes of a slot record (row or quantised row) */
    size_t cstride;           /* slot record stride: payload, then a uint64 generation stamp */
    int32_t *selfrow;         /* [bs * KS] own expand_x row for a slot (-1), plain path only */
    uint8_t *y;               /* TP-reduced own rows (n_own x H), NULL without TP */
    int64_t *perf_us;         /* [W] */
    mm_v2_scratch_t scratch;  /* everything else, reserved before the agreement */
} mm_v2_combine_t;

static inline uint8_t *mm_v2c_slot(const mm_v2_combine_t *c, int seg, int64_t slot)
{
    return mm_v2_seg(&c->call, seg) + (size_t)slot * c->cstride;
}
static inline int mm_v2c_pe(const mm_v2_combine_t *c, int64_t compact)
{
    return mm_v2_ep_pe(&c->call, mm_v2_phys(&c->c, compact));
}
/* Expert-side row i after the TP add (a pointer into expand_x or the reduced copy). */
const uint8_t *mm_v2c_row(const mm_v2_combine_t *c, int64_t i);
/* Payload of row i as sent: the row itself or its int8 transport record (into tmp). */
const uint8_t *mm_v2c_payload(const mm_v2_combine_t *c, int64_t i, uint8_t *tmp);
/* Add f32(y') of a payload times w (w < 0: weight 1, no multiply) into acc. */
void mm_v2c_accumulate(const mm_v2_combine_t *c, float *acc, const uint8_t *payload, float w,
                       int weighted, float *scratch);
/* One contribution to a token's sum, applied to chunks of H in the fixed order (the sum of
 * each element is still k ascending: chunking only keeps the accumulator in L1 while all the
 * token's rows stream in together, which doubles the read bandwidth). */
enum { MM_V2C_ROW_W, MM_V2C_ROW, MM_V2C_CQ_W, MM_V2C_CQ, MM_V2C_CONST };
typedef struct {
    const uint8_t *p; /* XType row, transport record, or ori_x row (const) */
    const uint8_t *v; /* const expert: its v row */
    float w, p1, p2;
    int kind;
} mm_v2c_term_t;
#define MM_V2C_CHUNK 1024
/* acc[0, H) = the terms summed in order, chunk by chunk; tmp: 2 * MM_V2C_CHUNK floats. */
void mm_v2c_sum_terms(const mm_v2_combine_t *c, const mm_v2c_term_t *terms, int nterms,
                      float *acc, float *tmp);

/* The source-side special experts and the final rounding of one token (acc already holds the
 * expert contributions); writes the outputs of combine or combine_add_rms_norm. */
void mm_v2c_special(const mm_v2_combine_t *c, int64_t t, int64_t k, float w, float *acc,
                    float *scratch);
void mm_v2c_emit(const mm_v2_combine_t *c, int64_t t, float *acc, float *scratch);

/* Hierarchy. */
uint64_t mm_v2c_hier_seg(const mm_v2_combine_t *c, int seg);
megamoe_status_t mm_v2c_hier_run(mm_v2_combine_t *c, const uint8_t *processed);
/* Scratch bytes of a leader's index of its own rows. */
size_t mm_v2c_hier_own_bytes(const mm_v2_combine_t *c);
/* The hierarchy's own signal lines (weights at the leaders, rows at its leader) set with
 * error st (mm_v2_sigval); a leader's partial lines are the fullmesh ones. */
void mm_v2c_hier_poison(const mm_v2_combine_t *c, megamoe_status_t st);

#endif /* MM_OPS_COMBINE_V2_H */
