/* Deterministic MoE problems for `megamoe run`, `megamoe bench layer` and the layer tests:
 * the GLOBAL tensors of an EP-rank job (rank-major tokens, all experts' weights) generated from
 * a seed, with the seed's four routing patterns. Every element depends only on (seed, tensor,
 * index), so every rank builds the same problem. Public headers only. */
#ifndef MM_BENCH_MOE_DATA_H
#define MM_BENCH_MOE_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum mm_route_pattern {
    MM_ROUTE_BALANCED = 0, /* every expert gets N*K/E slots, every rank T*K rows */
    MM_ROUTE_ZERO,         /* odd experts and the last rank's experts get no tokens */
    MM_ROUTE_SKEW,         /* 3/4 of the first choices go to expert 0 */
    MM_ROUTE_SINGLE,       /* every token goes to rank 0's experts */
    MM_ROUTE_FLOOD,        /* balanced, but the last rank sends all its tokens to rank 0 */
    MM_ROUTE_COUNT
} mm_route_pattern_t;

/* "balanced", "zero", "skew", "single", "flood". */
const char *mm_route_name(mm_route_pattern_t p);
/* -1 when unknown. */
int mm_route_parse(const char *name);

typedef struct mm_moe_problem {
    int64_t ep, T, H, I, E, K;
    uint16_t *hidden;   /* bf16 [ep*T, H], U(-1, 1) */
    int32_t *ids;       /* [ep*T, K] */
    float *probs;       /* [ep*T, K], positive, each row sums to 1 */
    uint16_t *gate_up;  /* bf16 [E, H, 2I], Xavier-uniform per expert */
    uint16_t *down;     /* bf16 [E, I, H], Xavier-uniform per expert */
    uint16_t *grad_out; /* bf16 [ep*T, H], U(-1, 1) */
} mm_moe_problem_t;

/* Allocate and fill; 0 on success, -1 when out of memory or the shapes are invalid. */
int mm_moe_problem_create(mm_moe_problem_t *p, int64_t ep, int64_t T, int64_t H, int64_t I,
                          int64_t E, int64_t K, mm_route_pattern_t route, uint64_t seed);
/* Refill only the routing (ids, probs) with another pattern/seed. */
void mm_moe_problem_route(mm_moe_problem_t *p, mm_route_pattern_t route, uint64_t seed);
void mm_moe_problem_free(mm_moe_problem_t *p);

/* Rows rank d receives: slots routed to experts d*E/ep .. (d+1)*E/ep - 1. */
int64_t mm_moe_problem_recv_rows(const mm_moe_problem_t *p, int64_t d);

/* Forward + backward FLOPs of the whole job (6 + 12 multiply-adds * 2 per slot and H*I). */
double mm_moe_flops(int64_t ep, int64_t T, int64_t H, int64_t I, int64_t K);

#endif /* MM_BENCH_MOE_DATA_H */
