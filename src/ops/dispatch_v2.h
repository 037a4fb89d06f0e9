/* DispatchV2 internals shared by dispatch_v2.c (fullmesh, receive side, TP) and
 * dispatch_hierarchy.c (the two-hop send). */
#ifndef MM_OPS_DISPATCH_V2_H
#define MM_OPS_DISPATCH_V2_H

#include "v2_internal.h"

/* Segments of the dispatch workspace. */
enum {
    MM_V2D_SIG,     /* 4 * n_world signal lines: counts | data | hop-1 | (TP at 3 * n_world) */
    MM_V2D_MAILBOX, /* n_world * Lmax int32: per-local-expert row counts from each source */
    MM_V2D_RECV,    /* rows from remote sources, one region per source (world PE order) */
    MM_V2D_TPDATA,  /* TP peer's rows (TP only) */
    MM_V2D_TPMETA,  /* TP peer's row count and cumulative counts */
    MM_V2D_STAGE,   /* hierarchy: hop-1 units from the sources of this leader's group */
    MM_V2D_NSEG
};

/* A fullmesh unit: one payload (a token row, quantised once) for every row it becomes at one
 * destination; the head (t, n) and n targets follow the payload at meta_off. */
typedef struct mm_v2_unit_head {
    int32_t t, n, pad0, pad1;
} mm_v2_unit_head_t;
typedef struct mm_v2_unit_target {
    int32_t k, le, pos; /* slot, local expert at the destination, row in the source's region */
    float w;
} mm_v2_unit_target_t;

/* Per-row metadata stored after the row and its scales. */
typedef struct mm_v2_meta {
    int32_t t, k;  /* source token, slot (k < K: MoE pair; K + j: shared expert j) */
    float w;       /* expert_scales[t][k] (1 for shared rows, 0 without expert_scales) */
    int32_t pad;
} mm_v2_meta_t;

typedef struct mm_v2_dispatch {
    const megamoe_dispatch_v2_args_t *a;
    mm_v2_cfg_t c;
    mm_v2_call_t call;
    int n;                      /* world size */
    /* plan (compact ids) */
    int64_t Lmax, n_active;
    uint8_t *active;            /* [bs] */
    int32_t *pdst, *ppos;       /* [bs*K] destination and row inside its region (-1: not sent) */
    int32_t *sdst, *spos;       /* [bs*NS] the same for shared-expert rows */
    int32_t *cnt, *blk;         /* [eW*Lmax] rows per (destination, local expert), block starts */
    int64_t *rows_to;           /* [eW] rows per destination */
    int64_t *units_to;          /* [eW] fullmesh units per destination (a token once per rank) */
    /* record layout */
    size_t scale_off, meta_off, stride;
    size_t ustride;             /* fullmesh unit: payload, head, K + NS targets */
    int stream;                 /* large call: non-temporal copies into expand_x and peers */
    /* receive side */
    int32_t *rcnt;              /* [eW*Lmax] rows per (source, my local expert) */
    int64_t *src_region;        /* [eW] first record of source s's region in my RECV segment */
    int64_t n_own;              /* rows received (own block) */
    int64_t *perf_us;           /* [W] wait per physical source, us */
    int rows_zeroed;            /* zero_fill's rows past n_own done early (mm_v2d_zero_rows_early) */
    mm_v2_scratch_t scratch;    /* the rest, reserved before the agreement */
} mm_v2_dispatch_t;

/* Record slot i of a region starting at `region` (records) in segment s. */
static inline uint8_t *mm_v2d_rec(const mm_v2_dispatch_t *d, int s, int64_t region, int64_t i)
{
    return mm_v2_seg(&d->call, s) + (size_t)(region + i) * d->stride;
}
/* Region start of source s (compact) in the RECV segment of destination dst (compact). */
int64_t mm_v2d_region(const mm_v2_dispatch_t *d, int64_t s, int64_t dst);
/* World PE of a compact rank. */
static inline int mm_v2d_pe(const mm_v2_dispatch_t *d, int64_t compact)
{
    return mm_v2_ep_pe(&d->call, mm_v2_phys(&d->c, compact));
}
/* Quantise (or copy) the row of token t for expert row `srow` of scales (-1: none) into a
 * record buffer (row + scales). */
void mm_v2d_make_row(const mm_v2_dispatch_t *d, int64_t t, int64_t srow, uint8_t *rec);
/* 1 when every slot of a token gets the same payload (no per-expert smoothing scales). */
int mm_v2d_payload_per_token(const mm_v2_dispatch_t *d);
int64_t mm_v2d_scale_row(const mm_v2_dispatch_t *d, int64_t k_slot, int64_t t);

/* Where the received rows go: the outputs, and each (local expert, source) block's first row. */
typedef struct mm_v2d_out {
    uint8_t *xo;      /* expand_x */
    uint8_t *so;      /* dynamic_scales (NULL when no per-row scales) */
    int32_t *assist;
    float *escales;   /* expand_scales (NULL without expert_scales) */
    int64_t *off;     /* [L * eW] final first row of block (le, s) */
} mm_v2d_out_t;
/* Write one row (payload, scales, assist triple, expand_scales) at final row `row`. */
void mm_v2d_place(const mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t row,
                  const uint8_t *payload, const uint8_t *scales, int64_t s, const mm_v2_meta_t *meta);
/* Rows of token t for this rank itself, straight into their final rows. The payload is made
 * once per token (per row with smoothing scales) and cached in rec (payload + scales) for the
 * token's other units; *cached says whether rec holds it. */
void mm_v2d_self_token(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t t, uint8_t *rec,
                       int *cached);

/* zero_fill's bulk (expand_x and dynamic_scales rows past the n_own received) at once, while a
 * wait would idle; finish does the rest (no-op with TP 2, whose row count comes later). */
void mm_v2d_zero_rows_early(mm_v2_dispatch_t *d);

/* Hierarchy: hop-1 sizes for the agreement record and the two-hop send. */
void mm_v2d_hier_units(mm_v2_dispatch_t *d, int32_t *units_to_pe);
uint64_t mm_v2d_hier_stride(const mm_v2_dispatch_t *d);
/* The whole hierarchy data phase after the layout (mm_v2d_layout): own rows and hop 1 in one
 * pass over the tokens, then at a leader hop 2 in arrival order, its own rows placed straight
 * into the outputs. A member that does not lead its group collects afterwards (its leader
 * forwards into its RECV segment). t0: start of the data phase (performance_info). */
megamoe_status_t mm_v2d_hier_send(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, uint64_t t0);
/* 1 when this rank leads its hierarchy group (no collect: hop 2 placed every row). */
static inline int mm_v2d_hier_leads(const mm_v2_dispatch_t *d)
{
    return d->c.erank % d->c.hier_group == 0;
}
/* The hierarchy's own signal lines (hop 1 at the leaders; a leader's hop-2 lines at its group)
 * set with error st (mm_v2_sigval). */
void mm_v2d_hier_poison(const mm_v2_dispatch_t *d, megamoe_status_t st);

#endif /* MM_OPS_DISPATCH_V2_H */
