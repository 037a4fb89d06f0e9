/* Two-rank MegaMoeExperts in C: forward and backward of one layer, checked against the fp32
 * reference model. Run it with:   megamoe launch -n 2 -- build/release/examples/two_rank_experts
 *
 * Every rank builds the same global problem from a fixed seed, keeps its own T tokens and its
 * E/EP experts, runs the layer, and compares its slice of every result with the reference
 * computed on the global problem. Exit status 0 when everything matches. */
#include <math.h>
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

/* max |got - want| / (atol + rtol |want|); <= 1 means close */
static double worst(const void *got, megamoe_dtype_t type, const float *want, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        float g = type == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(((const uint16_t *)got)[i])
                                             : ((const float *)got)[i];
        double r = fabs((double)g - want[i]) / (2e-3 + 2e-2 * fabs(want[i]));
        if (!(r <= w)) w = r; /* NaN propagates */
    }
    return w;
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
    fill_bf16(gate_up, E * H * 2 * I, sqrtf(6.0f / (H + 2 * I)));
    fill_bf16(down, E * I * H, sqrtf(6.0f / (I + H)));
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
    double e[5] = {
        worst(out, MEGAMOE_DTYPE_BF16, r_out + me * T * H, T * H),
        worst(g_hidden, MEGAMOE_DTYPE_BF16, r_gh + me * T * H, T * H),
        worst(g_probs, MEGAMOE_DTYPE_FP32, r_gp + me * T * K, T * K),
        worst(g_gate_up, MEGAMOE_DTYPE_BF16, r_g1 + me * L * H * 2 * I, L * H * 2 * I),
        worst(g_down, MEGAMOE_DTYPE_BF16, r_g2 + me * L * I * H, L * I * H),
    };
    const char *names[5] = {"output", "grad hidden", "grad topk_weights", "grad gate_up",
                            "grad down"};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        printf("rank %d %-18s worst |err|/(atol+rtol|ref|) = %.3f %s\n", me, names[i], e[i],
               e[i] <= 1 ? "ok" : "MISMATCH");
        ok &= e[i] <= 1;
    }
    CHECK(megamoe_experts_close(experts)); /* every rank, same order, after all backwards */
    megamoe_experts_destroy(experts);
    CHECK(megamoe_comm_destroy(comm));
    return ok ? 0 : 1;
}
