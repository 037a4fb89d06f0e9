/* Per-call token counts for `megamoe run --max-tokens` and `megamoe bench layer --tokens-dist`
 * (docs/moe.md "Dynamic tokens"): a distribution spec gives the count of every (call, rank) as
 * a pure function of (spec, seed, call, rank), so every rank knows every peer's count (the
 * reference of a verified call needs them) without communicating. Public headers only.
 *
 * Specs:
 *   N | fixed:N        every rank, every call: N tokens
 *   uniform:A-B        uniform integer in [A, B], drawn per (call, rank)
 *   list:a,b,c         rank r at call c: item (r + c) mod count (rotates over ranks and calls)
 */
#ifndef MM_BENCH_MOE_TOKENS_H
#define MM_BENCH_MOE_TOKENS_H

#include <stdint.h>

#define MM_TOKENS_MAX_LIST 32

typedef struct mm_tokens_dist {
    enum { MM_TOKENS_FIXED, MM_TOKENS_UNIFORM, MM_TOKENS_LIST } kind;
    int64_t lo, hi;                     /* FIXED: lo == hi; UNIFORM: [lo, hi] */
    int n;                              /* LIST: items */
    int64_t item[MM_TOKENS_MAX_LIST];
} mm_tokens_dist_t;

/* Parse spec into *d; 0 on success, -1 with a message on stderr (naming opt). */
int mm_tokens_parse(const char *opt, const char *spec, mm_tokens_dist_t *d);
/* The count of rank r at call c (seed: the problem's). */
int64_t mm_tokens_count(const mm_tokens_dist_t *d, uint64_t seed, int64_t call, int rank);
/* The largest count the distribution can give (the T_cap it needs), and the smallest. */
int64_t mm_tokens_max(const mm_tokens_dist_t *d);
int64_t mm_tokens_min(const mm_tokens_dist_t *d);
/* Its mean count (exact for FIXED/LIST, (lo + hi) / 2 for UNIFORM). */
double mm_tokens_mean(const mm_tokens_dist_t *d);

#endif /* MM_BENCH_MOE_TOKENS_H */
