/* MegaMoeExperts against the reference at a real shape, for every GEMM backend this machine
 * runs, through the whole layer: forward + backward, O0 and O1 (run by `megamoe launch -n 2`).
 *
 * H = 2048, I = 1024: every expert weight product is K*N >= 2M with N >= 512, the shapes where
 * `auto` puts packed weights on the own AVX-512 kernel on CPUs with AVX512-BF16 and no AMX
 * (MM_GEMM_AUTO_OWN_MIN_KN; the smaller layer tests never reach it). One case per backend
 * (MEGAMOE_GEMM = auto, avx512, onednn, ref, amx); a backend this machine cannot run is
 * skipped, with the reason. The reference (fp32 oracle and bf16 intermediates) is computed once
 * per process; T = 128 tokens per rank, E = 4, K = 2 keep the file within a minute. */
#include <stdio.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "kernels/gemm.h"
#include "moe_check.h"

#define T_ 128
#define H_ 2048
#define I_ 1024
#define E_ 4
#define K_ 2

static mm_moe_problem_t mm_P;
static mm_ref_result_t mm_ref;
static int mm_ready = -1; /* -1: not built, 0: failed, 1: ready */

static int mm_oracle_problem(void)
{
    if (mm_ready < 0) {
        mm_ready = mm_moe_problem_create(&mm_P, mm_test_world(), T_, H_, I_, E_, K_,
                                         MM_ROUTE_SKEW, 2030) == 0 &&
                   mm_ref_compute(&mm_P, 0.0f, &mm_ref) == 0;
    }
    return mm_ready;
}

/* Forward + backward on schedule, compared with the reference. */
static int mm_oracle_run(const char *backend, const char *schedule)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    if (comm == NULL) return 0;
    megamoe_experts_params_t prm = mm_params_shape(T_, H_, I_, E_, K_);
    prm.schedule = schedule;
    prm.workers = 2;
    megamoe_experts_t *x = NULL;
    if (megamoe_experts_create(comm, &prm, &x) != MEGAMOE_OK) return 0;
    mm_run_t r;
    int ok = mm_run_alloc(&r, &mm_P) == 0 &&
             mm_run_fwd_bwd(x, &mm_P, me, NULL, MEGAMOE_DTYPE_BF16, &r) == MEGAMOE_OK;
    if (ok) {
        mm_layer_result_t res;
        char what[96];
        snprintf(what, sizeof what, "H=%d I=%d MEGAMOE_GEMM=%s %s", H_, I_, backend, schedule);
        ok = mm_layer_result_from(&mm_P, r.out, r.gh, r.gp, 0, r.g1, r.g2, &res) == 0 &&
             mm_compare(what, &mm_P, me, &res, &mm_ref);
        mm_layer_result_free(&res);
    } else {
        fprintf(stderr, "%s %s: %s\n", backend, schedule, megamoe_last_error());
    }
    mm_run_free(&r);
    ok = megamoe_experts_close(x) == MEGAMOE_OK && ok;
    megamoe_experts_destroy(x);
    return ok;
}

static void mm_backend_case(const char *backend)
{
    const mm_gemm_backend_ops_t *b = NULL;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    megamoe_status_t st = mm_gemm_backend_get(backend, &b);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    /* the same answer on every rank (one machine), so every rank skips together */
    if (st != MEGAMOE_OK) MM_SKIP("MEGAMOE_GEMM=%s cannot run here: %s", backend, megamoe_last_error());
    ASSERT_TRUE(mm_oracle_problem());
    setenv("MEGAMOE_GEMM", backend, 1); /* read when a layer's resource group is made */
    ASSERT_TRUE(mm_oracle_run(backend, "O0"));
    ASSERT_TRUE(mm_oracle_run(backend, "O1"));
    unsetenv("MEGAMOE_GEMM");
}

/* The shape is the one where auto puts every weight product on the own kernel (where the CPU
 * has AVX-512 and no AMX): gate_up / down forward (NN) and their transposes (NT). */
MM_TEST(auto_reaches_the_own_kernel_at_this_shape)
{
    setenv("MEGAMOE_GEMM", "auto", 1);
    const int own = mm_cpu_has_avx512() && !mm_cpu_has_amx_bf16(); /* BF16 or FMA form */
    const struct {
        mm_gemm_form_t form;
        int64_t K, N;
    } w[4] = {{MM_GEMM_NN, H_, 2 * I_}, {MM_GEMM_NN, I_, H_}, {MM_GEMM_NT, H_, I_},
              {MM_GEMM_NT, 2 * I_, H_}};
    for (int i = 0; i < 4; i++) {
        const mm_gemm_backend_ops_t *b = NULL;
        ASSERT_OK(mm_gemm_backend_for_weight(w[i].form, w[i].K, w[i].N, &b));
        if (own) ASSERT_EQ_STR(b->name, "avx512");
    }
    unsetenv("MEGAMOE_GEMM");
    if (!own) MM_SKIP("auto picks %s on this CPU at any shape", mm_cpu_has_amx_bf16() ? "amx" : "its default");
}

MM_TEST(auto_against_the_reference) { mm_backend_case("auto"); }
MM_TEST(avx512_against_the_reference) { mm_backend_case("avx512"); }
MM_TEST(onednn_against_the_reference) { mm_backend_case("onednn"); }
MM_TEST(amx_against_the_reference) { mm_backend_case("amx"); }
MM_TEST(ref_against_the_reference) { mm_backend_case("ref"); }
