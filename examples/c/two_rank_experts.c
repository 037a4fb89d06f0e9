/* Two-rank MegaMoeExperts in C: forward and backward of one layer, checked against the fp32
 * reference model. Run it with:   megamoe launch -n 2 -- build/release/examples/two_rank_experts
 *
 * Every rank builds the same global problem from a fixed seed, keeps its own T tokens and its
 * E/EP experts, runs the layer, and compares its slice of every result with the reference
 * computed on the global problem. Exit status 0 when everything matches. */
#include <stdio.h>
#include <stdlib.h>

#include "megamoe/megamoe.h"

enum { EP = 2, T = 128, H = 256, I = 64, E = 4, K = 2, N = EP * T, L = E / EP };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void fill_bf16(uint16_t *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = megamoe_fp32_to_bf16(scale * uniform());
}

/* square root without libm (the example links libmegamoe only) */
static double root(double x)
{
    double r = x > 1 ? x : 1;
    for (int i = 0; i < 60 && x > 0; i++) r = 0.5 * (r + x / r);
    return x > 0 ? r : 0;
}

/* bf16 layer vs fp32 oracle: relative L2 error and max |err| / max |ref| (docs/moe.md
 * "Accuracy": pass when <= 1% and <= 2%). */
static void errors(const void *got, megamoe_dtype_t type, const float *want, size_t n,
                   double *rel_l2, double *rel_max)
{
    double se = 0, sr = 0, me = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double g = type == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(((const uint16_t *)got)[i])
                                              : ((const float *)got)[i];
        double e = g > want[i] ? g - want[i] : want[i] - g, a = want[i] < 0 ? -want[i] : want[i];
        if (!(e <= me)) me = e; /* NaN propagates */
        if (a > mr) mr = a;
        se += e * e;
        sr += (double)want[i] * want[i];
    }
    *rel_l2 = root(se / (sr > 0 ? sr : 1));
    *rel_max = me / (mr > 0 ? mr : 1);
}

#define CHECK(call)                                                                        \
    do {                                                                                   \
        megamoe_status_t st_ = (call);                                                     \
        if (st_ != MEGAMOE_OK) {                                                           \
            fprintf(stderr, "%s failed: %s\n", #call, megamoe_last_error());               \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(void)
{
    /* the global problem, identical on every rank */
    static uint16_t hidden[N * H], grad_out[N * H], gate_up[E * H * 2 * I], down[E * I * H];
    static int32_t ids[N * K];
    static float probs[N * K];
    fill_bf16(hidden, N * H, 1.0f);
    fill_bf16(grad_out, N * H, 1.0f);
    fill_bf16(gate_up, E * H * 2 * I, (float)root(6.0 / (H + 2 * I)));
    fill_bf16(down, E * I * H, (float)root(6.0 / (I + H)));
    for (int n = 0; n < N; n++) {
        ids[n * K] = (n * 7) % E;
        ids[n * K + 1] = (n * 7 + 1 + n % (E - 1)) % E; /* a different expert */
        probs[n * K] = 0.5f + 0.4f * uniform();
        probs[n * K + 1] = 1.0f - probs[n * K];
    }

    megamoe_comm_t *comm = NULL; /* rank, world and endpoint from megamoe launch */
    CHECK(megamoe_comm_create(NULL, &comm));
    const int me = megamoe_comm_rank(comm);
    if (megamoe_comm_size(comm) != EP) {
        fprintf(stderr, "run me with 'megamoe launch -n %d'\n", EP);
        return 2;
    }

    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = T;
    p.hidden_size = H;
    p.intermediate_size = I;
    p.num_experts = E;
    p.top_k = K;
    megamoe_experts_t *experts = NULL;
    CHECK(megamoe_experts_create(comm, &p, &experts));

    /* this rank's tokens and experts */
    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = hidden + me * T * H;
    in.topk_ids = ids + me * T * K;
    in.topk_weights = probs + me * T * K;
    megamoe_experts_weights_t w = {gate_up + me * L * H * 2 * I, down + me * L * I * H, 1};

    static uint16_t out[T * H], g_hidden[T * H], g_gate_up[L * H * 2 * I], g_down[L * I * H];
    static float g_probs[T * K];
    megamoe_experts_saved_t *saved = NULL;
    CHECK(megamoe_experts_forward(experts, &w, &in, out, &saved));
    megamoe_experts_grads_t g = {g_hidden, g_probs, g_gate_up, g_down, MEGAMOE_DTYPE_BF16};
    CHECK(megamoe_experts_backward(experts, saved, &w, grad_out + me * T * H, &g));
    megamoe_experts_saved_destroy(saved);

    /* the reference on the global problem */
    static float r_out[N * H], r_gh[N * H], r_gp[N * K], r_g1[E * H * 2 * I], r_g2[E * I * H];
    megamoe_reference_shape_t shape = {EP, T, H, I, E, K};
    megamoe_reference_params_t rp = megamoe_reference_params_default();
    rp.hidden_dtype = rp.weight_dtype = rp.grad_dtype = MEGAMOE_DTYPE_BF16;
    CHECK(megamoe_reference_forward(&shape, &rp, hidden, ids, probs, gate_up, down, r_out));
    CHECK(megamoe_reference_backward(&shape, &rp, grad_out, hidden, ids, probs, gate_up, down,
                                     r_gh, r_gp, r_g1, r_g2));
    const void *got[5] = {out, g_hidden, g_probs, g_gate_up, g_down};
    const megamoe_dtype_t type[5] = {MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_FP32,
                                     MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_BF16};
    const float *want[5] = {r_out + me * T * H, r_gh + me * T * H, r_gp + me * T * K,
                            r_g1 + me * L * H * 2 * I, r_g2 + me * L * I * H};
    const size_t n[5] = {T * H, T * H, T * K, L * H * 2 * I, L * I * H};
    const char *names[5] = {"output", "grad hidden", "grad topk_weights", "grad gate_up",
                            "grad down"};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        double l2, mx;
        errors(got[i], type[i], want[i], n[i], &l2, &mx);
        int pass = l2 <= 0.01 && mx <= 0.02;
        printf("rank %d %-18s relative L2 error %.3f%%, max error %.3f%% of max |ref| %s\n", me,
               names[i], 100 * l2, 100 * mx, pass ? "ok" : "MISMATCH");
        ok &= pass;
    }
    CHECK(megamoe_experts_close(experts)); /* every rank, same order, after all backwards */
    megamoe_experts_destroy(experts);
    CHECK(megamoe_comm_destroy(comm));
    return ok ? 0 : 1;
}
