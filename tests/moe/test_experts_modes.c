/* The dispatch modes of MegaMoeExperts (docs/moe.md "Capacity and dispatch modes"), run by
 * `megamoe launch -n EP` (EP 2 and 4):
 *  - "push" (growing receive capacity) and "pull" (owners fetch rows) give the results of the
 *    seed's fixed lossless capacity bit for bit, on both schedules (so O1 = O0), for the four
 *    routing patterns, also through mm_shmem_put/get; the fixed O0 run is checked against the
 *    reference;
 *  - push growth follows the rule (align128(max(need, ceil(capacity * growth))), at most the
 *    lossless bound, never shrinking), on every rank alike, with saved states across a growth;
 *  - a growth that does not fit the heap is OUT_OF_MEMORY on every rank naming the variable,
 *    the capacity stays and the layer keeps working; it grows once there is room;
 *  - invalid and mismatched settings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe_check.h"
#include "ops/ep_exchange.h"
#include "shmem/shmem.h"

#define T_ 256
#define H_ 64
#define I_ 32
#define E_ 8
#define K_ 2

static megamoe_experts_params_t mm_params(const char *schedule, const char *mode, double initial,
                                          double growth)
{
    megamoe_experts_params_t p = mm_params_shape(T_, H_, I_, E_, K_);
    p.schedule = schedule;
    p.workers = 2;
    p.dispatch_mode = mode;
    p.initial_capacity_factor = initial;
    p.capacity_growth_factor = growth;
    return p;
}

/* Every call passes a new weight version: problems made one after another may reuse the
 * freed addresses of the previous one's weights. */
static uint64_t mm_version = 1;

static megamoe_status_t mm_fwd_bwd(megamoe_experts_t *x, const mm_moe_problem_t *P, mm_run_t *r)
{
    const int me = mm_test_rank();
    megamoe_experts_weights_t w = mm_local_weights(P, me, ++mm_version);
    return mm_run_fwd_bwd(x, P, me, &w, MEGAMOE_DTYPE_BF16, r);
}

static int mm_same_bits(const char *what, const mm_run_t *a, const mm_run_t *b,
                        const mm_moe_problem_t *P)
{
    int ok = mm_run_same_bits(what, a, b, P, 2);
    printf("%s %s: bit-identical to the fixed lossless O0 run\n", ok ? "PASS" : "FAIL", what);
    return ok;
}

static int64_t mm_max_recv(const mm_moe_problem_t *P)
{
    int64_t m = 0;
    for (int64_t d = 0; d < P->ep; d++) {
        int64_t r = mm_moe_problem_recv_rows(P, d);
        if (r > m) m = r;
    }
    return m;
}

static int64_t mm_align128(int64_t r) { return (r + 127) / 128 * 128; }

/* The fixed lossless O0 run against the reference; every mode on both schedules against it. */
static void mm_modes_case(mm_route_pattern_t route, int force_rma)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, route, 50 + route), 0);
    mm_ep_force_puts = force_rma; /* every rank, between calls */
    mm_run_t ref;
    ASSERT_EQ_INT(mm_run_alloc(&ref, &P), 0);
    {
        megamoe_experts_params_t p = mm_params("O0", NULL, 0, 0);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &p, &x));
        ASSERT_OK(mm_fwd_bwd(x, &P, &ref));
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
        mm_ref_result_t rr;
        ASSERT_EQ_INT(mm_ref_compute(&P, 0, &rr), 0);
        mm_layer_result_t res;
        ASSERT_EQ_INT(mm_layer_result_from(&P, ref.out, ref.gh, ref.gp, 0, ref.g1, ref.g2, &res),
                      0);
        int ok = mm_compare(mm_route_name(route), &P, me, &res, &rr);
        mm_layer_result_free(&res);
        mm_ref_free(&rr);
        ASSERT_TRUE(ok);
    }
    static const struct {
        const char *mode;
        double initial, growth;
    } modes[] = {{NULL, 0, 0}, {"push", 0, 0}, {"push", 1, 1}, {"push", 1, 3}, {"pull", 0, 0}};
    static const char *const scheds[2] = {"O0", "O1"};
    const int64_t need = mm_max_recv(&P);
    int all_ok = 1;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        for (int s = 0; s < 2; s++) {
            if (modes[m].mode == NULL && s == 0) continue; /* the reference run itself */
            megamoe_experts_params_t p = mm_params(scheds[s], modes[m].mode, modes[m].initial,
                                                   modes[m].growth);
            megamoe_experts_t *x = NULL;
            ASSERT_OK(megamoe_experts_create(comm, &p, &x));
            megamoe_experts_info_t before, after;
            ASSERT_OK(megamoe_experts_get_info(x, &before));
            mm_run_t got;
            ASSERT_EQ_INT(mm_run_alloc(&got, &P), 0);
            ASSERT_OK(mm_fwd_bwd(x, &P, &got));
            ASSERT_OK(megamoe_experts_get_info(x, &after));
            char what[128];
            snprintf(what, sizeof what, "%s ep%d %s%s %s initial %g growth %g",
                     mm_route_name(route), ep, scheds[s], force_rma ? " puts/gets" : "",
                     modes[m].mode ? modes[m].mode : "fixed", modes[m].initial, modes[m].growth);
            all_ok &= mm_same_bits(what, &got, &ref, &P);
            /* a growth exactly when the call needed more than the initial capacity */
            const int pull = modes[m].mode && modes[m].mode[1] == 'u' && modes[m].mode[2] == 'l';
            if (pull) {
                ASSERT_EQ_INT(after.capacity, 0);
                ASSERT_EQ_STR(after.dispatch_mode, "pull");
                ASSERT_EQ_STR(after.capacity_policy, "none");
            } else if (modes[m].mode) {
                ASSERT_EQ_STR(after.capacity_policy, "grow");
                ASSERT_EQ_INT(after.growth_events, need > before.capacity ? 1 : 0);
                ASSERT_TRUE(after.capacity >= need);
            } else {
                ASSERT_EQ_STR(after.capacity_policy, "fixed");
            }
            mm_run_free(&got);
            ASSERT_OK(megamoe_experts_close(x));
            megamoe_experts_destroy(x);
        }
    mm_ep_force_puts = 0;
    mm_run_free(&ref);
    mm_moe_problem_free(&P);
    ASSERT_TRUE(all_ok);
}

MM_TEST(modes_balanced) { mm_modes_case(MM_ROUTE_BALANCED, 0); }
MM_TEST(modes_zero_token_experts) { mm_modes_case(MM_ROUTE_ZERO, 0); }
MM_TEST(modes_skewed) { mm_modes_case(MM_ROUTE_SKEW, 0); }
MM_TEST(modes_single_destination) { mm_modes_case(MM_ROUTE_SINGLE, 0); }
/* peers that are not load/store reachable: push rows through puts, pull rows through gets */
MM_TEST(modes_through_shmem_put_and_get) { mm_modes_case(MM_ROUTE_SKEW, 1); }

/* Expected capacity after a call needing `need` rows (an independent statement of the rule). */
static int64_t mm_next_capacity(int64_t cap, int64_t need, double growth, int64_t bound)
{
    if (need <= cap) return cap;
    double g = ceil((double)cap * growth);
    int64_t rows = mm_align128(g > (double)need ? (int64_t)g : need);
    return rows < bound ? rows : bound;
}

static void mm_growth_sequence(const char *schedule, double growth)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(schedule, "push", 1.0, growth);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    const int64_t bound = mm_align128((int64_t)ep * T_ * K_);
    ASSERT_EQ_INT(info.capacity, mm_align128(T_ * K_)); /* min(initial, EP) * T*K */
    ASSERT_EQ_INT(info.max_capacity, bound);
    ASSERT_NEAR(info.capacity_growth_factor, growth, 0);
    ASSERT_EQ_INT(info.growth_events, 0);
    static const mm_route_pattern_t seq[] = {MM_ROUTE_BALANCED, MM_ROUTE_SKEW, MM_ROUTE_FLOOD,
                                             MM_ROUTE_BALANCED, MM_ROUTE_SINGLE, MM_ROUTE_ZERO};
    int64_t cap = info.capacity;
    int events = 0;
    size_t heap = info.heap_bytes;
    mm_moe_problem_t keep; /* a forward whose backward runs after a later growth */
    ASSERT_EQ_INT(mm_moe_problem_create(&keep, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 7), 0);
    mm_input_buf_t kin;
    ASSERT_EQ_INT(mm_input_make(&keep, me, NULL, &kin), 0);
    mm_run_t kr;
    ASSERT_EQ_INT(mm_run_alloc(&kr, &keep), 0);
    megamoe_experts_weights_t kw = mm_local_weights(&keep, me, ++mm_version);
    megamoe_experts_saved_t *ksv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &kw, &kin.in, kr.out, &ksv));
    int all_ok = 1;
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        mm_moe_problem_t P;
        ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, seq[i], 60 + i), 0);
        const int64_t need = mm_max_recv(&P), want = mm_next_capacity(cap, need, growth, bound);
        mm_run_t r;
        ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
        ASSERT_OK(mm_fwd_bwd(x, &P, &r));
        mm_ref_result_t rr;
        ASSERT_EQ_INT(mm_ref_compute(&P, 0, &rr), 0);
        mm_layer_result_t res;
        ASSERT_EQ_INT(mm_layer_result_from(&P, r.out, r.gh, r.gp, 0, r.g1, r.g2, &res), 0);
        char what[96];
        snprintf(what, sizeof what, "%s growth %g call %zu (%s)", schedule, growth, i,
                 mm_route_name(seq[i]));
        all_ok &= mm_compare(what, &P, me, &res, &rr);
        mm_layer_result_free(&res);
        mm_ref_free(&rr);
        mm_run_free(&r);
        ASSERT_OK(megamoe_experts_get_info(x, &info));
        ASSERT_EQ_INT(info.capacity, want);
        if (want != cap) {
            events++;
            ASSERT_EQ_INT(info.growth_events, events);
            megamoe_experts_growth_t ev;
            ASSERT_OK(megamoe_experts_get_growth(x, events - 1, &ev));
            ASSERT_EQ_INT(ev.rows_before, cap);
            ASSERT_EQ_INT(ev.rows_after, want);
            ASSERT_EQ_INT(ev.demand, need);
            ASSERT_EQ_U64(ev.forward, (uint64_t)i + 2); /* the kept forward was the first */
            ASSERT_EQ_INT(ev.heap_bytes_before, heap);
            /* the receive buffer is the part that grew, page-rounded */
            ASSERT_EQ_INT(ev.heap_bytes_after - ev.heap_bytes_before,
                          ((want * H_ * 2 + 4095) / 4096 - (cap * H_ * 2 + 4095) / 4096) * 4096);
            ASSERT_EQ_INT(info.heap_bytes, ev.heap_bytes_after);
            ASSERT_TRUE(ev.heap_used_after > ev.heap_used_before);
            heap = ev.heap_bytes_after;
            if (growth == 1.0) ASSERT_EQ_INT(want, mm_align128(need)); /* exactly the demand */
        } else {
            ASSERT_EQ_INT(info.growth_events, events);
        }
        cap = want;
        mm_moe_problem_free(&P);
    }
    ASSERT_TRUE(events >= 1);
    megamoe_experts_growth_t ev;
    ASSERT_STATUS(megamoe_experts_get_growth(x, events, &ev), MEGAMOE_INVALID_ARGUMENT);
    /* the forward from before the growths: its backward still runs (rows never shrink) */
    kw.version = ++mm_version; /* its weights again (the packed copies hold the last call's) */
    megamoe_experts_grads_t g = {kr.gh, kr.gp, kr.g1, kr.g2, MEGAMOE_DTYPE_BF16};
    ASSERT_OK(megamoe_experts_backward(x, ksv, &kw, keep.grad_out + (size_t)me * T_ * H_, &g));
    megamoe_experts_saved_destroy(ksv);
    {
        mm_ref_result_t rr;
        ASSERT_EQ_INT(mm_ref_compute(&keep, 0, &rr), 0);
        mm_layer_result_t res;
        ASSERT_EQ_INT(mm_layer_result_from(&keep, kr.out, kr.gh, kr.gp, 0, kr.g1, kr.g2, &res),
                      0);
        all_ok &= mm_compare("backward of a forward from before the growth", &keep, me, &res, &rr);
        mm_layer_result_free(&res);
        mm_ref_free(&rr);
    }
    mm_run_free(&kr);
    mm_input_free(&kin);
    mm_moe_problem_free(&keep);
    ASSERT_OK(megamoe_experts_close(x));
    ASSERT_OK(megamoe_experts_get_info(x, &info)); /* the events outlive the close */
    ASSERT_EQ_INT(info.growth_events, events);
    megamoe_experts_destroy(x);
    ASSERT_TRUE(all_ok);
}

MM_TEST(push_growth_follows_the_rule_o0) { mm_growth_sequence("O0", 1.5); }
MM_TEST(push_growth_follows_the_rule_o1) { mm_growth_sequence("O1", 1.5); }
MM_TEST(push_growth_factor_one_fits_the_demand) { mm_growth_sequence("O1", 1.0); }

/* A growth the heap has no room for: OUT_OF_MEMORY on every rank before data moves, the
 * capacity stays, a fitting call works; once there is room the same call grows and runs. */
MM_TEST(push_growth_without_heap_room)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params("O1", "push", 1.0, 2.0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 3), 0);
    mm_run_t r;
    ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
    ASSERT_OK(mm_fwd_bwd(x, &P, &r)); /* prepares the group at its initial capacity */
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    const int64_t cap = info.capacity;
    /* fill the heap so that only a little more than the current receive buffer fits */
    mm_shmem_debug_state_t *ds = malloc(sizeof *ds);
    ASSERT_TRUE(ds != NULL);
    ASSERT_OK(mm_shmem_debug_state(ds));
    const uint64_t room = ds->heap_size - ds->bytes_used;
    free(ds);
    void *filler = NULL;
    ASSERT_TRUE(room > (uint64_t)(64 << 10));
    ASSERT_OK(mm_shmem_malloc(room - (64 << 10), 4096, &filler));
    mm_moe_problem_route(&P, MM_ROUTE_SINGLE, 4);
    uint16_t keep = r.out[0];
    ASSERT_STATUS(mm_fwd_bwd(x, &P, &r), MEGAMOE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE");
    ASSERT_CONTAINS(megamoe_last_error(), "grow its receive capacity");
    ASSERT_EQ_INT(r.out[0], keep); /* nothing written */
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    ASSERT_EQ_INT(info.capacity, cap);
    ASSERT_EQ_INT(info.growth_events, 0);
    mm_moe_problem_route(&P, MM_ROUTE_BALANCED, 5);
    ASSERT_OK(mm_fwd_bwd(x, &P, &r)); /* still usable */
    ASSERT_OK(mm_shmem_free(filler));
    mm_moe_problem_route(&P, MM_ROUTE_SINGLE, 4);
    ASSERT_OK(mm_fwd_bwd(x, &P, &r));
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    ASSERT_EQ_INT(info.growth_events, 1);
    ASSERT_EQ_INT(info.capacity, mm_next_capacity(cap, mm_max_recv(&P), 2.0,
                                                  mm_align128((int64_t)ep * T_ * K_)));
    mm_ref_result_t rr;
    ASSERT_EQ_INT(mm_ref_compute(&P, 0, &rr), 0);
    mm_layer_result_t res;
    ASSERT_EQ_INT(mm_layer_result_from(&P, r.out, r.gh, r.gp, 0, r.g1, r.g2, &res), 0);
    int ok = mm_compare("grown once the heap had room", &P, me, &res, &rr);
    mm_layer_result_free(&res);
    mm_ref_free(&rr);
    mm_run_free(&r);
    mm_moe_problem_free(&P);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    ASSERT_TRUE(ok);
}

MM_TEST(heap_bytes_of_the_modes)
{
    const int ep = mm_test_world();
    megamoe_experts_params_t p = mm_params("O0", NULL, 0, 0);
    const size_t rb = H_ * 2, tk = (size_t)T_ * K_;
    const size_t sig = 4096, ret = (tk * rb + 4095) / 4096 * 4096;
    const size_t bound = (size_t)mm_align128((int64_t)ep * T_ * K_);
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, ep), (bound * rb + 4095) / 4096 * 4096 + ret + sig);
    p = mm_params("O0", "push", 1.0, 0); /* reserves what growth may reach */
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, ep), (bound * rb + 4095) / 4096 * 4096 + ret + sig);
    p = mm_params("O0", "pull", 0, 0); /* staged source rows instead of a receive buffer */
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, ep), 2 * ret + sig);
    p = mm_params("O0", "sideways", 0, 0);
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, ep), 0);
    /* a pull group holds T*K staged rows, not the lossless receive bound */
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    p = mm_params("O0", "pull", 0, 0);
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    ASSERT_EQ_INT(info.heap_bytes, 2 * ret + sig);
    ASSERT_EQ_INT(info.capacity, 0);
    ASSERT_EQ_INT(info.max_capacity, 0);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
}

MM_TEST(invalid_and_mismatched_mode_settings)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    megamoe_experts_params_t p = mm_params("O1", "sideways", 0, 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "dispatch_mode \"sideways\" is unknown");
    p = mm_params("O1", NULL, 1.5, 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "initial_capacity_factor = 1.5 applies to "
                                          "dispatch_mode \"push\" only");
    p = mm_params("O1", "pull", 0, 2);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "capacity_growth_factor");
    p = mm_params("O1", "push", 0.5, 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "finite number >= 1");
    p = mm_params("O1", "push", 0, INFINITY);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    p = mm_params("O1", "push", 0, 0);
    p.expert_capacity_factor = 2;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "expert_capacity_factor = 2 sets a fixed receive");
    ASSERT_TRUE(x == NULL);
    /* settings that differ between ranks */
    p = mm_params("O1", me == 1 ? "pull" : "push", 0, 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "dispatch_mode");
    p = mm_params("O1", "push", 0, me == 1 ? 2.0 : 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "capacity_growth_factor is 1.25 on rank 0 but 2 on");
    /* layers of different modes cannot share */
    megamoe_experts_t *y[2] = {NULL, NULL};
    p = mm_params("O1", "push", 0, 0);
    ASSERT_OK(megamoe_experts_create(comm, &p, &y[0]));
    p = mm_params("O1", "pull", 0, 0);
    ASSERT_OK(megamoe_experts_create(comm, &p, &y[1]));
    ASSERT_STATUS(megamoe_experts_share(y, 2), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "dispatch_mode");
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(megamoe_experts_close(y[i]));
        megamoe_experts_destroy(y[i]);
    }
    /* defaults resolved and reported */
    p = mm_params("O1", "push", 0, 0);
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    ASSERT_EQ_STR(info.dispatch_mode, "push");
    ASSERT_NEAR(info.initial_capacity_factor, 1.25, 0);
    ASSERT_NEAR(info.capacity_growth_factor, 1.25, 0);
    ASSERT_EQ_INT(info.capacity, mm_align128((int64_t)ceil(1.25 * T_ * K_)));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    ASSERT_OK(megamoe_comm_barrier(comm));
}
