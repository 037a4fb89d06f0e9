/* Collective calls made out of order across ranks, and argument errors of one rank (issue 20,
 * issue 13 item 7), run by `megamoe launch -n 2`, built once per schedule like test_experts.
 *
 * Every case asserts the same error on every rank (CALL_MISMATCH naming what each rank called,
 * or the bad rank's INVALID_ARGUMENT), no output written, and a correct call afterwards whose
 * results match the reference. The SHMEM timeout is raised to 300 s while the launch allows
 * 90 s: a rank that waited for a peer instead of failing at once makes the test fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_check.h"

#define T_ 128
#define H_ 64
#define I_ 32
#define E_ 4
#define K_ 2
#ifndef MM_TEST_SCHEDULE
#define MM_TEST_SCHEDULE "O1"
#endif

__attribute__((constructor)) static void mm_long_shmem_timeout(void)
{
    setenv("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "300", 0);
}

/* The EP group of the running case: the world, or a subgroup (ep_groups_keep_their_own_order). */
static int mm_ep_size = 0, mm_ep_rank = 0;
static int mm_ep(void) { return mm_ep_size ? mm_ep_size : mm_test_world(); }
static int mm_me(void) { return mm_ep_size ? mm_ep_rank : mm_test_rank(); }

static megamoe_experts_params_t mm_params(int64_t H, int64_t E)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = T_;
    p.hidden_size = H;
    p.intermediate_size = I_;
    p.num_experts = E;
    p.top_k = K_;
    p.schedule = MM_TEST_SCHEDULE;
    p.workers = 2;
    return p;
}

/* One problem and this rank's buffers for it. */
typedef struct mm_case {
    mm_moe_problem_t P;
    mm_ref_result_t ref;
    mm_input_buf_t ib;
    megamoe_experts_weights_t w;
    uint16_t *out, *gh, *g1, *g2;
    float *gp;
} mm_case_t;

static int mm_case_make(mm_case_t *c, int64_t H, int64_t E, uint64_t seed)
{
    const int ep = mm_ep(), me = mm_me();
    memset(c, 0, sizeof *c);
    if (mm_moe_problem_create(&c->P, ep, T_, H, I_, E, K_, MM_ROUTE_SKEW, seed) != 0) return -1;
    if (mm_ref_compute(&c->P, 0.0f, &c->ref) != 0) return -1;
    if (mm_input_make(&c->P, me, NULL, &c->ib) != 0) return -1;
    c->w = mm_local_weights(&c->P, me, 1);
    const size_t L = (size_t)(E / ep);
    c->out = malloc((size_t)T_ * H * 2);
    c->gh = malloc((size_t)T_ * H * 2);
    c->gp = malloc((size_t)T_ * K_ * 4);
    c->g1 = malloc(L * (size_t)H * 2 * I_ * 2);
    c->g2 = malloc(L * I_ * (size_t)H * 2);
    return c->out && c->gh && c->gp && c->g1 && c->g2 ? 0 : -1;
}

static void mm_case_free(mm_case_t *c)
{
    free(c->out);
    free(c->gh);
    free(c->gp);
    free(c->g1);
    free(c->g2);
    mm_input_free(&c->ib);
    mm_ref_free(&c->ref);
    mm_moe_problem_free(&c->P);
}

static megamoe_experts_grads_t mm_grads(mm_case_t *c)
{
    megamoe_experts_grads_t g = {c->gh, c->gp, c->g1, c->g2, MEGAMOE_DTYPE_BF16};
    return g;
}

/* Output buffer filled with a marker: a failing call must leave it as it was. */
static void mm_mark(uint16_t *buf, int64_t H) { memset(buf, 0x5a, (size_t)T_ * H * 2); }
static int mm_marked(const uint16_t *buf, int64_t H)
{
    for (size_t i = 0; i < (size_t)T_ * (size_t)H; i++)
        if (buf[i] != 0x5a5a) return 0;
    return 1;
}

/* The error every rank must see: status, and text containing each needle (NULL ends). */
#define ASSERT_ERROR(expr, status, ...)                                                    \
    do {                                                                                   \
        ASSERT_STATUS(expr, status);                                                       \
        const char *mm_needles_[] = {__VA_ARGS__, NULL};                                   \
        for (int mm_i_ = 0; mm_needles_[mm_i_]; mm_i_++)                                   \
            ASSERT_CONTAINS(megamoe_last_error(), mm_needles_[mm_i_]);                     \
    } while (0)

/* Forward (training) + backward of x on c, checked against the reference. */
static int mm_correct_step(megamoe_experts_t *x, mm_case_t *c, const char *what)
{
    const int me = mm_me();
    megamoe_experts_saved_t *sv = NULL;
    if (megamoe_experts_forward(x, &c->w, &c->ib.in, c->out, &sv) != MEGAMOE_OK) return 0;
    megamoe_experts_grads_t g = mm_grads(c);
    megamoe_status_t st =
        megamoe_experts_backward(x, sv, &c->w, c->P.grad_out + (size_t)me * T_ * c->P.H, &g);
    megamoe_experts_saved_destroy(sv);
    if (st != MEGAMOE_OK) return 0;
    mm_layer_result_t res;
    if (mm_layer_result_from(&c->P, c->out, c->gh, c->gp, 0, c->g1, c->g2, &res) != 0) return 0;
    int ok = mm_compare(what, &c->P, me, &res, &c->ref);
    mm_layer_result_free(&res);
    return ok;
}

static void mm_want(char *buf, size_t n, const char *fmt, unsigned long long a,
                    unsigned long long b)
{
    snprintf(buf, n, fmt, a, b);
}

/* Layer numbers as the descriptors name them ("layer #N"). */
static unsigned long long mm_layer_no(const megamoe_experts_t *x)
{
    return (unsigned long long)megamoe_experts_layer_number(x);
}

/* Issue 20 case 1: two layers sharing execution resources, a then b on rank 0 and b then a on
 * rank 1: both calls fail on both ranks; the same order afterwards works. */
MM_TEST(shared_layers_called_in_swapped_order)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) ASSERT_OK(megamoe_experts_create(comm, &p, &x[i]));
    ASSERT_OK(megamoe_experts_share(x, 2));
    mm_case_t c[2];
    for (int i = 0; i < 2; i++) ASSERT_EQ_INT(mm_case_make(&c[i], H_, E_, 50 + i), 0);
    char a_name[32], b_name[32];
    snprintf(a_name, sizeof a_name, "forward of layer #%llu", mm_layer_no(x[0]));
    snprintf(b_name, sizeof b_name, "forward of layer #%llu", mm_layer_no(x[1]));
    for (int step = 0; step < 2; step++) {
        int i = me == 0 ? step : 1 - step; /* rank 0: a, b; rank 1: b, a */
        mm_mark(c[i].out, H_);
        megamoe_experts_saved_t *sv = NULL;
        ASSERT_ERROR(megamoe_experts_forward(x[i], &c[i].w, &c[i].ib.in, c[i].out, &sv),
                     MEGAMOE_CALL_MISMATCH, "rank 0 called", "rank 1 called", a_name, b_name);
        ASSERT_TRUE(sv == NULL);
        ASSERT_TRUE(mm_marked(c[i].out, H_));
    }
    /* the same order on every rank: right results, the sequence numbers agree again */
    ASSERT_TRUE(mm_correct_step(x[0], &c[0], "a after the swapped calls"));
    ASSERT_TRUE(mm_correct_step(x[1], &c[1], "b after the swapped calls"));
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(megamoe_experts_close(x[i]));
        megamoe_experts_destroy(x[i]);
        mm_case_free(&c[i]);
    }
}

/* Issue 20 case 2: rank 0 closes its only layer while rank 1 calls forward: CALL_MISMATCH on
 * both at once, rank 1 gets no output, rank 0's layer stays open; then both work and close. */
MM_TEST(close_on_one_rank_forward_on_the_other)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_case_t c;
    ASSERT_EQ_INT(mm_case_make(&c, H_, E_, 60), 0);
    ASSERT_TRUE(mm_correct_step(x, &c, "before the close"));
    char want[160];
    mm_want(want, sizeof want, "rank 0 called close of layer #%llu (call %llu)", mm_layer_no(x),
            3);
    mm_mark(c.out, H_);
    if (me == 0) {
        ASSERT_ERROR(megamoe_experts_close(x), MEGAMOE_CALL_MISMATCH, want, "rank 1 called forward");
        megamoe_experts_info_t info;
        ASSERT_OK(megamoe_experts_get_info(x, &info));
        ASSERT_EQ_INT(info.closed, 0);
    } else {
        megamoe_experts_saved_t *sv = NULL;
        ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, &sv),
                     MEGAMOE_CALL_MISMATCH, want, "rank 1 called forward");
        ASSERT_TRUE(sv == NULL);
        ASSERT_TRUE(mm_marked(c.out, H_));
    }
    ASSERT_TRUE(mm_correct_step(x, &c, "after close/forward"));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_case_free(&c);
}

/* A rank that uses a layer it closed (with every rank) while its peer calls another layer: the
 * closed layer's call still takes part in the exchange, so the peer fails at once instead of
 * waiting for it; both ranks using the closed layer get "used after close" from rank 0. */
MM_TEST(closed_layer_on_one_rank_open_layer_on_the_other)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *a = NULL, *b = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &a));
    ASSERT_OK(megamoe_experts_create(comm, &p, &b));
    mm_case_t c;
    ASSERT_EQ_INT(mm_case_make(&c, H_, E_, 65), 0);
    ASSERT_TRUE(mm_correct_step(a, &c, "a before its close"));
    ASSERT_OK(megamoe_experts_close(a));
    char na[64], nb[64];
    mm_want(na, sizeof na, "rank 0 called forward of layer #%llu (call %llu)", mm_layer_no(a), 4);
    mm_want(nb, sizeof nb, "rank 1 called forward of layer #%llu (call %llu)", mm_layer_no(b), 1);
    mm_mark(c.out, H_);
    ASSERT_ERROR(megamoe_experts_forward(me == 0 ? a : b, &c.w, &c.ib.in, c.out, NULL),
                 MEGAMOE_CALL_MISMATCH, na, nb);
    ASSERT_TRUE(mm_marked(c.out, H_));
    ASSERT_ERROR(megamoe_experts_forward(a, &c.w, &c.ib.in, c.out, NULL), MEGAMOE_INVALID_STATE,
                 "rank 0: INVALID_STATE: forward: MegaMoeExperts used after close()");
    ASSERT_TRUE(mm_correct_step(b, &c, "b after the closed layer's calls"));
    ASSERT_OK(megamoe_experts_close(b));
    megamoe_experts_destroy(a);
    megamoe_experts_destroy(b);
    mm_case_free(&c);
}

/* Issue 20 case 3 and an extra forward: rank 0 runs a second forward while rank 1 runs the
 * first one's backward (both fail at once, not after the timeout); then rank 0 runs one extra
 * inference forward while rank 1 closes. The saved state survives: the backward works next. */
MM_TEST(extra_forward_on_one_rank)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_case_t c;
    ASSERT_EQ_INT(mm_case_make(&c, H_, E_, 61), 0);
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, &sv));
    megamoe_experts_grads_t g = mm_grads(&c);
    const uint16_t *dout = c.P.grad_out + (size_t)me * T_ * H_;
    char fwd[96], bwd[96];
    mm_want(fwd, sizeof fwd, "rank 0 called forward of layer #%llu (call %llu)", mm_layer_no(x), 2);
    mm_want(bwd, sizeof bwd, "rank 1 called backward of layer #%llu (call %llu)", mm_layer_no(x), 2);
    uint16_t *out2 = malloc((size_t)T_ * H_ * 2);
    ASSERT_TRUE(out2 != NULL);
    mm_mark(out2, H_);
    mm_mark(c.gh, H_);
    if (me == 0) {
        megamoe_experts_saved_t *sv2 = NULL;
        ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, out2, &sv2), MEGAMOE_CALL_MISMATCH,
                     fwd, bwd);
        ASSERT_TRUE(sv2 == NULL);
        ASSERT_TRUE(mm_marked(out2, H_));
    } else {
        ASSERT_ERROR(megamoe_experts_backward(x, sv, &c.w, dout, &g), MEGAMOE_CALL_MISMATCH, fwd,
                     bwd);
        ASSERT_TRUE(mm_marked(c.gh, H_)); /* grad hidden not written */
    }
    /* an extra inference forward on rank 0 while rank 1 closes */
    if (me == 0) {
        ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, out2, NULL), MEGAMOE_CALL_MISMATCH,
                     "rank 0 called forward", "rank 1 called close");
        ASSERT_TRUE(mm_marked(out2, H_));
    } else {
        ASSERT_ERROR(megamoe_experts_close(x), MEGAMOE_CALL_MISMATCH, "rank 0 called forward",
                     "rank 1 called close");
    }
    /* in step again: the first forward's backward gives the reference's gradients */
    ASSERT_OK(megamoe_experts_backward(x, sv, &c.w, dout, &g));
    megamoe_experts_saved_destroy(sv);
    mm_layer_result_t res;
    ASSERT_EQ_INT(mm_layer_result_from(&c.P, c.out, c.gh, c.gp, 0, c.g1, c.g2, &res), 0);
    int ok = mm_compare("backward after the extra forward", &c.P, me, &res, &c.ref);
    mm_layer_result_free(&res);
    ASSERT_TRUE(ok);
    ASSERT_TRUE(mm_correct_step(x, &c, "a step after the extra forward"));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    free(out2);
    mm_case_free(&c);
}

/* Two layers of different shapes (their own groups, different H and E, so different record
 * sizes): rank 0 calls A, rank 1 calls B. Then rank 0 calls A while rank 1 calls B once more
 * and both call A: the sequence numbers of both groups agree again (they re-synchronise from
 * the records of the failed exchange), and both layers give the right results. */
MM_TEST(different_layers_with_different_shapes)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t pa = mm_params(H_, E_), pb = mm_params(2 * H_, 2 * E_);
    megamoe_experts_t *a = NULL, *b = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &pa, &a));
    ASSERT_OK(megamoe_experts_create(comm, &pb, &b));
    mm_case_t ca, cb;
    ASSERT_EQ_INT(mm_case_make(&ca, H_, E_, 70), 0);
    ASSERT_EQ_INT(mm_case_make(&cb, 2 * H_, 2 * E_, 71), 0);
    ASSERT_TRUE(mm_correct_step(a, &ca, "A first"));
    ASSERT_TRUE(mm_correct_step(b, &cb, "B first"));
    char na[64], nb[64];
    mm_want(na, sizeof na, "forward of layer #%llu (call %llu)", mm_layer_no(a), 3);
    mm_want(nb, sizeof nb, "forward of layer #%llu (call %llu)", mm_layer_no(b), 3);
    for (int round = 0; round < 2; round++) {
        mm_case_t *c = me == 0 ? &ca : &cb;
        megamoe_experts_t *x = me == 0 ? a : b;
        mm_mark(c->out, c->P.H);
        ASSERT_ERROR(megamoe_experts_forward(x, &c->w, &c->ib.in, c->out, NULL),
                     MEGAMOE_CALL_MISMATCH, round == 0 ? na : "rank 0 called forward",
                     round == 0 ? nb : "rank 1 called forward");
        ASSERT_TRUE(mm_marked(c->out, c->P.H));
    }
    /* rank 1 called B twice and A never since: A's next call must still match */
    ASSERT_TRUE(mm_correct_step(a, &ca, "A after the mismatches"));
    ASSERT_TRUE(mm_correct_step(b, &cb, "B after the mismatches"));
    ASSERT_OK(megamoe_experts_close(b));
    ASSERT_OK(megamoe_experts_close(a));
    megamoe_experts_destroy(a);
    megamoe_experts_destroy(b);
    mm_case_free(&ca);
    mm_case_free(&cb);
}

/* A layer call on one rank and an operator on the other, and a layer call against another
 * collective of the communicator (creating a layer): every rank fails at once with a message
 * that names the peer's call (never an empty "rank 0: "), and the next calls work. */
MM_TEST(layer_call_against_operator_or_other_collective)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_case_t c;
    ASSERT_EQ_INT(mm_case_make(&c, H_, E_, 80), 0);
    ASSERT_TRUE(mm_correct_step(x, &c, "before"));
    mm_mark(c.out, H_);
    if (me == 0)
        ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, NULL),
                     MEGAMOE_CALL_MISMATCH, "rank 0 called forward", "rank 1 called dispatch_v2");
    else
        ASSERT_ERROR(megamoe_dispatch_v2(NULL), MEGAMOE_CALL_MISMATCH, "rank 0 called forward",
                     "rank 1 called dispatch_v2");
    ASSERT_TRUE(mm_marked(c.out, H_));
    /* the operators' call numbers agree again, also on rank 0 that made no operator call: both
     * ranks calling the operator (with NULL args) get the argument error, not CALL_MISMATCH */
    ASSERT_ERROR(megamoe_dispatch_v2(NULL), MEGAMOE_INVALID_ARGUMENT, "dispatch_v2: args is NULL");
    /* rank 0 creates a layer (its first collective is a plain agree) while rank 1 forwards */
    megamoe_experts_t *y = NULL;
    if (me == 0) {
        ASSERT_ERROR(megamoe_experts_create(comm, &p, &y), MEGAMOE_CALL_MISMATCH,
                     "rank 1: CALL_MISMATCH: it called forward of layer #");
        ASSERT_TRUE(y == NULL);
    } else {
        ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, NULL),
                     MEGAMOE_CALL_MISMATCH, "rank 0 is in another collective");
        ASSERT_TRUE(mm_marked(c.out, H_));
    }
    ASSERT_TRUE(mm_correct_step(x, &c, "after"));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_case_free(&c);
}

/* Issue 13 item 7 in C: a NULL or ill-typed argument on one rank is that rank's error on every
 * rank ("rank 1: ..."), before data moves, and the next call works: forward (NULL
 * hidden_states, a wrong ids dtype), backward (NULL saved state, NULL grads), and an operator
 * called with NULL args on one rank. */
MM_TEST(bad_argument_on_one_rank_is_every_ranks_error)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_case_t c;
    ASSERT_EQ_INT(mm_case_make(&c, H_, E_, 90), 0);
    megamoe_experts_input_t in = c.ib.in;
    if (me == 1) in.hidden_states = NULL;
    mm_mark(c.out, H_);
    ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &in, c.out, NULL), MEGAMOE_INVALID_ARGUMENT,
                 "rank 1: INVALID_ARGUMENT: forward needs hidden_states");
    ASSERT_TRUE(mm_marked(c.out, H_));
    in = c.ib.in;
    if (me == 0) in.topk_ids_dtype = MEGAMOE_DTYPE_FP32;
    ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &in, c.out, NULL), MEGAMOE_INVALID_ARGUMENT,
                 "rank 0: INVALID_ARGUMENT: topk_ids must be int32 or int64");
    ASSERT_TRUE(mm_marked(c.out, H_));
    /* backward: the saved state missing on rank 0, grads missing on rank 1 */
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, &sv));
    megamoe_experts_grads_t g = mm_grads(&c);
    const uint16_t *dout = c.P.grad_out + (size_t)me * T_ * H_;
    mm_mark(c.gh, H_);
    ASSERT_ERROR(megamoe_experts_backward(x, me == 0 ? NULL : sv, &c.w, dout, &g),
                 MEGAMOE_INVALID_ARGUMENT, "rank 0: INVALID_ARGUMENT: backward needs the saved");
    ASSERT_ERROR(megamoe_experts_backward(x, sv, &c.w, dout, me == 1 ? NULL : &g),
                 MEGAMOE_INVALID_ARGUMENT, "rank 1: INVALID_ARGUMENT: backward needs grad_output");
    ASSERT_TRUE(mm_marked(c.gh, H_));
    ASSERT_OK(megamoe_experts_backward(x, sv, &c.w, dout, &g));
    megamoe_experts_saved_destroy(sv);
    mm_layer_result_t res;
    ASSERT_EQ_INT(mm_layer_result_from(&c.P, c.out, c.gh, c.gp, 0, c.g1, c.g2, &res), 0);
    int ok = mm_compare("after the bad arguments", &c.P, me, &res, &c.ref);
    mm_layer_result_free(&res);
    ASSERT_TRUE(ok);
    /* a binding's own check failing on one rank: the error of megamoe_fail_next_call */
    if (me == 1)
        ASSERT_OK(megamoe_fail_next_call(MEGAMOE_INVALID_ARGUMENT, "hidden_states must be "
                                         "contiguous"));
    mm_mark(c.out, H_);
    ASSERT_ERROR(megamoe_experts_forward(x, &c.w, &c.ib.in, c.out, NULL),
                 MEGAMOE_INVALID_ARGUMENT, "rank 1: INVALID_ARGUMENT: hidden_states must be "
                 "contiguous");
    ASSERT_TRUE(mm_marked(c.out, H_));
    ASSERT_TRUE(mm_correct_step(x, &c, "after the binding's error"));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_case_free(&c);
}

/* EP subgroups (4 ranks: EP groups {0, 1} and {2, 3}, run by test_call_order_ep_groups): in
 * group {0, 1} two shared layers are called in swapped order (CALL_MISMATCH on both of its
 * ranks, naming world ranks 0 and 1), while group {2, 3} runs the same layers in order at the
 * same time, unaffected; then both groups run in order. */
MM_TEST(ep_groups_keep_their_own_order)
{
    if (mm_test_world() != 4) { /* a 4-rank case: CTest test_call_order_ep_groups runs it */
        printf("ep_groups_keep_their_own_order: needs 4 ranks, run by test_call_order_ep_groups\n");
        return;
    }
    const int rank = mm_test_rank(), first = rank < 2 ? 0 : 2;
    const int members[2] = {first, first + 1};
    megamoe_comm_t *ep = NULL;
    ASSERT_OK(megamoe_comm_create_group(mm_test_comm(), members, 2, &ep));
    mm_ep_size = 2;
    mm_ep_rank = rank - first;
    megamoe_experts_params_t p = mm_params(H_, E_);
    megamoe_experts_t *x[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) ASSERT_OK(megamoe_experts_create(ep, &p, &x[i]));
    ASSERT_OK(megamoe_experts_share(x, 2));
    mm_case_t c[2];
    for (int i = 0; i < 2; i++) ASSERT_EQ_INT(mm_case_make(&c[i], H_, E_, 95 + i), 0);
    if (first == 0) {
        for (int step = 0; step < 2; step++) {
            int i = mm_ep_rank == 0 ? step : 1 - step;
            mm_mark(c[i].out, H_);
            ASSERT_ERROR(megamoe_experts_forward(x[i], &c[i].w, &c[i].ib.in, c[i].out, NULL),
                         MEGAMOE_CALL_MISMATCH, "rank 0 called forward", "rank 1 called forward");
            ASSERT_TRUE(mm_marked(c[i].out, H_));
        }
    } else {
        ASSERT_TRUE(mm_correct_step(x[0], &c[0], "group {2, 3}: a"));
        ASSERT_TRUE(mm_correct_step(x[1], &c[1], "group {2, 3}: b"));
    }
    ASSERT_TRUE(mm_correct_step(x[0], &c[0], "a in order"));
    ASSERT_TRUE(mm_correct_step(x[1], &c[1], "b in order"));
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(megamoe_experts_close(x[i]));
        megamoe_experts_destroy(x[i]);
        mm_case_free(&c[i]);
    }
    mm_ep_size = 0;
    ASSERT_OK(megamoe_comm_destroy(ep));
}
