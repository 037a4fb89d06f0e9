/* Deterministic MoE problems (see moe_data.h). */
#include "moe_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/dtype.h"

static const char *const mm_route_names[MM_ROUTE_COUNT] = {"balanced", "zero", "skew", "single",
                                                           "flood"};

const char *mm_route_name(mm_route_pattern_t p)
{
    return (int)p >= 0 && p < MM_ROUTE_COUNT ? mm_route_names[p] : "unknown";
}

int mm_route_parse(const char *name)
{
    for (int i = 0; i < MM_ROUTE_COUNT; i++)
        if (strcmp(name, mm_route_names[i]) == 0) return i;
    return -1;
}

/* splitmix64 of (seed, stream, index): order-independent random numbers. */
static uint64_t mm_mix(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + i + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float mm_unif(uint64_t seed, uint64_t stream, uint64_t i)
{
    return (float)((double)(mm_mix(seed, stream, i) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void mm_fill_bf16(uint16_t *dst, size_t n, float scale, uint64_t seed, uint64_t stream)
{
    for (size_t i = 0; i < n; i++) dst[i] = megamoe_fp32_to_bf16(scale * mm_unif(seed, stream, i));
}

/* Pick K distinct experts of the allowed list for token n (repeats only when fewer than K). */
static void mm_pick(int32_t *out, int64_t K, const int32_t *allowed, int64_t na, uint64_t seed,
                    int64_t n, int first)
{
    for (int64_t k = 0; k < K; k++) {
        uint64_t r = mm_mix(seed, 100 + (uint64_t)k, (uint64_t)n);
        int32_t e = allowed[r % (uint64_t)na];
        if (k == 0 && first >= 0) e = first;
        for (int tries = 0; tries < 64 && na >= K; tries++) {
            int dup = 0;
            for (int64_t j = 0; j < k; j++) dup |= out[j] == e;
            if (!dup) break;
            e = allowed[(r + (uint64_t)tries + 1) % (uint64_t)na];
        }
        out[k] = e;
    }
}

void mm_moe_problem_route(mm_moe_problem_t *p, mm_route_pattern_t route, uint64_t seed)
{
    const int64_t N = p->ep * p->T, E = p->E, K = p->K, L = p->E / p->ep;
    int32_t *allowed = malloc((size_t)E * sizeof *allowed);
    int64_t na = 0;
    if (allowed == NULL) return;
    if (route == MM_ROUTE_ZERO) {
        for (int64_t e = 0; e < E; e++)
            if (e % 2 == 0 && (e / L != p->ep - 1 || p->ep == 1)) allowed[na++] = (int32_t)e;
        if (na < K) { /* too few: keep only the odd experts idle */
            na = 0;
            for (int64_t e = 0; e < E; e += 2) allowed[na++] = (int32_t)e;
        }
        if (na < K) { /* still too few: only the last expert idles */
            na = 0;
            for (int64_t e = 0; e < (E > 1 ? E - 1 : 1); e++) allowed[na++] = (int32_t)e;
        }
    } else {
        for (int64_t e = 0; e < E; e++) allowed[na++] = (int32_t)e;
    }
    for (int64_t n = 0; n < N; n++) {
        int32_t *row = p->ids + n * K;
        int64_t rank = n / p->T;
        switch (route) {
        case MM_ROUTE_FLOOD:
        case MM_ROUTE_BALANCED: {
            /* flood: the last rank sends everything to rank 0, the others stay balanced */
            if (route == MM_ROUTE_FLOOD && rank == p->ep - 1 && p->ep > 1) {
                for (int64_t k = 0; k < K; k++) row[k] = (int32_t)((n + k) % L);
                break;
            }
            int64_t stride = E / K > 0 ? E / K : 1;
            for (int64_t k = 0; k < K; k++) row[k] = (int32_t)((n + k * stride) % E);
            break;
        }
        case MM_ROUTE_SINGLE:
            for (int64_t k = 0; k < K; k++) row[k] = (int32_t)((n + k) % L);
            break;
        case MM_ROUTE_SKEW: {
            int first = mm_mix(seed, 7, (uint64_t)n) % 4 != 0 ? 0 : -1;
            mm_pick(row, K, allowed, na, seed, n, first);
            break;
        }
        case MM_ROUTE_ZERO:
        default:
            mm_pick(row, K, allowed, na, seed, n, -1);
            break;
        }
        /* router weights: a softmax of random logits */
        double sum = 0;
        for (int64_t k = 0; k < K; k++) sum += exp(mm_unif(seed, 200 + (uint64_t)k, (uint64_t)n));
        for (int64_t k = 0; k < K; k++)
            p->probs[n * K + k] = (float)(exp(mm_unif(seed, 200 + (uint64_t)k, (uint64_t)n)) / sum);
    }
    free(allowed);
}

int mm_moe_problem_create(mm_moe_problem_t *p, int64_t ep, int64_t T, int64_t H, int64_t I,
                          int64_t E, int64_t K, mm_route_pattern_t route, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    if (ep < 1 || T < 1 || H < 1 || I < 1 || E < 1 || K < 1 || E % ep) return -1;
    p->ep = ep;
    p->T = T;
    p->H = H;
    p->I = I;
    p->E = E;
    p->K = K;
    size_t N = (size_t)(ep * T);
    p->hidden = malloc(N * (size_t)H * 2);
    p->ids = malloc(N * (size_t)K * sizeof *p->ids);
    p->probs = malloc(N * (size_t)K * sizeof *p->probs);
    p->gate_up = malloc((size_t)E * (size_t)H * (size_t)(2 * I) * 2);
    p->down = malloc((size_t)E * (size_t)I * (size_t)H * 2);
    p->grad_out = malloc(N * (size_t)H * 2);
    if (!p->hidden || !p->ids || !p->probs || !p->gate_up || !p->down || !p->grad_out) {
        mm_moe_problem_free(p);
        return -1;
    }
    mm_fill_bf16(p->hidden, N * (size_t)H, 1.0f, seed, 1);
    mm_fill_bf16(p->grad_out, N * (size_t)H, 1.0f, seed, 2);
    /* Xavier-uniform per expert: bound sqrt(6 / (fan_in + fan_out)) of each [rows, cols] */
    mm_fill_bf16(p->gate_up, (size_t)E * (size_t)H * (size_t)(2 * I),
                 (float)sqrt(6.0 / (double)(H + 2 * I)), seed, 3);
    mm_fill_bf16(p->down, (size_t)E * (size_t)I * (size_t)H, (float)sqrt(6.0 / (double)(I + H)),
                 seed, 4);
    mm_moe_problem_route(p, route, seed);
    return 0;
}

void mm_moe_problem_free(mm_moe_problem_t *p)
{
    free(p->hidden);
    free(p->ids);
    free(p->probs);
    free(p->gate_up);
    free(p->down);
    free(p->grad_out);
    memset(p, 0, sizeof *p);
}

int64_t mm_moe_problem_recv_rows(const mm_moe_problem_t *p, int64_t d)
{
    const int64_t L = p->E / p->ep, n = p->ep * p->T * p->K;
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) rows += p->ids[i] / L == d;
    return rows;
}

double mm_moe_flops(int64_t ep, int64_t T, int64_t H, int64_t I, int64_t K)
{
    /* per slot: forward 2*H*2I + 2*I*H = 6HI; backward dA 2IH, dW2 2IH, dX 4IH, dW1 4IH = 12HI */
    return 18.0 * (double)ep * (double)T * (double)K * (double)H * (double)I;
}
