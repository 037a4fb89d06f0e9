/* Fuzz target: argument validation of MoeDistributeDispatchV2 / CombineV2 /
 * CombineAddRmsNorm (src/ops/v2_validate.c, v2_args.c and the operators' local checks, the
 * world agreement and the workspace sizing) through the public entry points, with random
 * descriptor structs and tensors. One process plays one rank of a W-rank group on the fake
 * runtime (fake_runtime.c): peers' agreement records are this rank's, optionally with bytes
 * flipped; the symmetric allocation fails, so no data ever moves. (There is no V1 operator
 * in megamoe.)
 *
 * Properties beyond "no crash, no UB, no read outside a tensor":
 *   - no call returns OK (nothing can be allocated) and every failure has a message;
 *   - no input or output tensor changes (an error loses nothing);
 *   - megamoe_*_infer is deterministic and gives non-negative shapes;
 *   - what infer refuses, the operator refuses with INVALID_ARGUMENT.
 * Tensors are backed by exactly the bytes their descriptor promises (ASan catches a read
 * past them); an input whose tensors would need more than 1 MiB each is skipped.
 */
#include <math.h>
#include <strings.h>

#include "megamoe/log.h"
#include "megamoe/ops.h"

#include "fake_runtime.h"
#include "fuzz.h"
#include "ops/v2_internal.h"

#define MM_FZ_TENSOR_CAP (1u << 20)
#define MM_FZ_MAX_TENSORS 32

static void mm_fz_silent(megamoe_log_level_t level, const char *line, void *user)
{
    (void)level, (void)line, (void)user;
}

typedef struct mm_fz_slot {
    uint8_t *data; /* the tensor's bytes (the descriptor lives in the caller's args) */
    uint8_t *copy; /* snapshot of the bytes before the call */
    size_t bytes;
} mm_fz_slot_t;

typedef struct mm_fz_ctx {
    mm_fz_t in;
    mm_fz_slot_t slots[MM_FZ_MAX_TENSORS];
    int n_slots;
    int skip;    /* a tensor could not be backed: the input is not used */
    int mutated; /* the peers' records differ from this rank's */
} mm_fz_ctx_t;

static size_t mm_fz_esize(megamoe_dtype_t d)
{
    if ((int)d < 0 || d >= MEGAMOE_DTYPE_COUNT_) return 8;
    size_t s = megamoe_dtype_size(d);
    return s ? s : 1;
}

/* Bytes the descriptor promises (the library's numel over at most 4 dims); 0 with a negative
 * dimension, SIZE_MAX when it does not fit. */
static size_t mm_fz_bytes(const megamoe_tensor_t *t)
{
    int nd = t->ndim < 0 ? 0 : t->ndim > MEGAMOE_TENSOR_MAX_DIMS ? MEGAMOE_TENSOR_MAX_DIMS : t->ndim;
    uint64_t n = 1;
    for (int i = 0; i < nd; i++) {
        if (t->shape[i] < 0) return 0;
        if (t->shape[i] != 0 && n > (uint64_t)MM_FZ_TENSOR_CAP / (uint64_t)t->shape[i])
            return SIZE_MAX;
        n *= (uint64_t)t->shape[i];
    }
    n *= mm_fz_esize(t->dtype);
    return n > MM_FZ_TENSOR_CAP ? SIZE_MAX : (size_t)n;
}

static void mm_fz_fill(mm_fz_ctx_t *c, megamoe_tensor_t *t, uint8_t *p, size_t bytes, int mode)
{
    size_t es = mm_fz_esize(t->dtype), n = bytes / es;
    if (mode == 1) { /* raw bytes */
        for (size_t i = 0; i < bytes && c->in.n; i++) p[i] = mm_fz_u8(&c->in);
        return;
    }
    if (mode == 2) { /* small values per element */
        static const float fvals[8] = {0.0f, 1.0f, -1.0f, 0.5f, NAN, INFINITY, 1e30f, -0.0f};
        for (size_t i = 0; i < n && c->in.n; i++) {
            uint8_t v = mm_fz_u8(&c->in);
            if (t->dtype == MEGAMOE_DTYPE_FP32) memcpy(p + i * 4, &fvals[v % 8], 4);
            else if (t->dtype == MEGAMOE_DTYPE_INT32) {
                int32_t x = (int32_t)v - 2;
                memcpy(p + i * 4, &x, 4);
            } else if (t->dtype == MEGAMOE_DTYPE_INT64) {
                int64_t x = (int64_t)v - 2;
                memcpy(p + i * 8, &x, 8);
            } else if (t->dtype == MEGAMOE_DTYPE_BOOL) {
                p[i * es] = v & 1;
            } else {
                p[i * es] = v;
            }
        }
        return;
    }
    if (mode == 3) { /* (base + i * step) mod m: distinct ids, counts, triples */
        int64_t base = mm_fz_int(&c->in), step = mm_fz_int(&c->in), m = mm_fz_int(&c->in);
        for (size_t i = 0; i < n; i++) {
            int64_t x = (int64_t)((uint64_t)base + (uint64_t)i * (uint64_t)step);
            if (m > 0) { /* non-negative remainder without overflowing near INT64_MAX */
                x %= m;
                if (x < 0) x += m;
            }
            if (es == 4 && t->dtype != MEGAMOE_DTYPE_FP32) {
                int32_t y = (int32_t)x;
                memcpy(p + i * 4, &y, 4);
            } else if (t->dtype == MEGAMOE_DTYPE_FP32) {
                float y = (float)(x % 7) / 7.0f;
                memcpy(p + i * 4, &y, 4);
            } else if (es == 8) {
                memcpy(p + i * 8, &x, 8);
            } else {
                p[i * es] = (uint8_t)x;
            }
        }
    }
}

/* Decode one tensor descriptor (and its contents when present). */
static void mm_fz_tensor(mm_fz_ctx_t *c, megamoe_tensor_t *t)
{
    uint8_t flags = mm_fz_u8(&c->in);
    *t = megamoe_tensor_none();
    t->dtype = (megamoe_dtype_t)((int)(mm_fz_u8(&c->in) % 13) - 1);
    t->ndim = (int)(mm_fz_u8(&c->in) % 7) - 1;
    int nd = t->ndim < 0 ? 0 : t->ndim > 4 ? 4 : t->ndim;
    for (int i = 0; i < nd; i++) t->shape[i] = mm_fz_int(&c->in);
    if (!(flags & 1)) return; /* absent: any shape, data NULL */
    size_t bytes = mm_fz_bytes(t);
    if (bytes == SIZE_MAX || c->n_slots >= MM_FZ_MAX_TENSORS) {
        c->skip = 1;
        return;
    }
    uint8_t *p = calloc(bytes ? bytes : 1, 1);
    if (p == NULL) {
        c->skip = 1;
        return;
    }
    mm_fz_fill(c, t, p, bytes, (flags >> 1) & 3);
    t->data = p;
    c->slots[c->n_slots++] = (mm_fz_slot_t){p, NULL, bytes};
}

/* Allocate an output with exactly the shape infer reported (absent when too large). */
static void mm_fz_output(mm_fz_ctx_t *c, megamoe_tensor_t *t, const megamoe_tensor_t *want)
{
    *t = *want;
    t->data = NULL;
    size_t bytes = mm_fz_bytes(want);
    if (bytes == SIZE_MAX || c->n_slots >= MM_FZ_MAX_TENSORS) return;
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (p == NULL) return;
    memset(p, 0xa5, bytes); /* a canary: an error must leave it */
    t->data = p;
    c->slots[c->n_slots++] = (mm_fz_slot_t){p, NULL, bytes};
}

static void mm_fz_snapshot(mm_fz_ctx_t *c)
{
    for (int i = 0; i < c->n_slots; i++) {
        mm_fz_slot_t *s = &c->slots[i];
        s->copy = malloc(s->bytes ? s->bytes : 1);
        FUZZ_CHECK(s->copy != NULL, "out of memory");
        memcpy(s->copy, s->data, s->bytes);
    }
}

static void mm_fz_check_unchanged(const mm_fz_ctx_t *c, const char *op)
{
    for (int i = 0; i < c->n_slots; i++) {
        const mm_fz_slot_t *s = &c->slots[i];
        FUZZ_CHECK(memcmp(s->copy, s->data, s->bytes) == 0,
                   "%s changed tensor %d (%zu bytes) although it failed before moving data", op,
                   i, s->bytes);
    }
}

static void mm_fz_free(mm_fz_ctx_t *c)
{
    for (int i = 0; i < c->n_slots; i++) {
        free(c->slots[i].data);
        free(c->slots[i].copy);
    }
    c->n_slots = 0;
}

static const char *const mm_fz_algs[5] = {"", "fullmesh_v1", "fullmesh_v2", "hierarchy", "Hierarchy"};

static megamoe_comm_t *mm_fz_comm(mm_fz_ctx_t *c, int tp)
{
    static int bogus;
    switch (mm_fz_u8(&c->in) % 8) {
    case 0: return NULL;
    case 1: return (megamoe_comm_t *)&bogus; /* not a communicator */
    case 2: return tp ? mm_fake_comm_ep() : mm_fake_comm_tp();
    default: return tp ? mm_fake_comm_tp() : mm_fake_comm_ep();
    }
}

/* An attribute that is usually the expected value (so deeper rules are reached). */
static int64_t mm_fz_attr(mm_fz_ctx_t *c, int64_t usual)
{
    return mm_fz_u8(&c->in) % 4 ? usual : mm_fz_int(&c->in);
}

static int mm_fz_same_shape(const megamoe_tensor_t *a, const megamoe_tensor_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < MEGAMOE_TENSOR_MAX_DIMS; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

static void mm_fz_check_nonneg(const megamoe_tensor_t *t, const char *name)
{
    for (int i = 0; i < t->ndim && i < MEGAMOE_TENSOR_MAX_DIMS; i++)
        FUZZ_CHECK(t->shape[i] >= 0, "infer gave %s a negative dimension %d", name, i);
}

/* The peers' records are copies of this rank's: give each its own EP rank, TP rank and TP
 * partner (world PE p pairs with p ^ 1, as the fake's TP team does). The operators' records
 * travel inside the call-order exchange (src/ops/call_order.c): a header holding the call
 * magic, then the record, which ends the element. */
static int mm_fz_fixup(void *elems, size_t elem_bytes, int n, int me, size_t *rec_off,
                       size_t *rec_len)
{
    static const uint64_t call_magic = 0xc411de5c0de0beefull; /* call_order.c's MM_CALL_MAGIC */
    size_t rec = (sizeof(mm_v2_record_t) + 8u * (size_t)n + 7) / 8 * 8;
    if (elem_bytes < rec) return 0;
    const uint8_t *e = (const uint8_t *)elems + (size_t)me * elem_bytes;
    int framed = 0;
    for (size_t o = 0; o + 8 <= elem_bytes - rec && !framed; o += 8) framed = !memcmp(e + o, &call_magic, 8);
    if (!framed) return 0; /* not the operators' exchange (failure texts, ...) */
    *rec_off = elem_bytes - rec;
    *rec_len = rec;
    mm_v2_record_t *mine = (mm_v2_record_t *)((char *)elems + (size_t)me * elem_bytes + *rec_off);
    for (int p = 0; p < n; p++) {
        mm_v2_record_t *r = (mm_v2_record_t *)((char *)elems + (size_t)p * elem_bytes + *rec_off);
        if (r->ep_size > 0) r->ep_rank = p;
        if (p == me || r->tp_size != 2) continue;
        int partner = p ^ 1;
        if (partner >= n) continue; /* odd world: the last rank has no partner */
        r->tp_rank = mine->tp_rank ^ ((p ^ me) & 1);
        r->tp_leader = r->tp_rank == 0 ? p : partner;
        r->pad = partner;
    }
    return 1;
}

/* allow_mismatch: the peers' records differ (mutations, or a TP pair the fake cannot form). */
static void mm_fz_check_failure(megamoe_status_t st, megamoe_status_t infer_st,
                                int allow_mismatch, const char *op)
{
    if (getenv("MM_FUZZ_VERBOSE")) /* how far a seed gets: OUT_OF_MEMORY = validation passed */
        fprintf(stderr, "%s: infer %s, call %s: %s\n", op, megamoe_status_name(infer_st),
                megamoe_status_name(st), megamoe_last_error());
    FUZZ_CHECK(st != MEGAMOE_OK, "%s returned OK without a symmetric heap", op);
    FUZZ_CHECK(strcmp(megamoe_status_name(st), "UNKNOWN") != 0, "%s returned status %d", op,
               (int)st);
    FUZZ_CHECK(megamoe_last_error()[0] != '\0', "%s failed (%s) without a message", op,
               megamoe_status_name(st));
    if (infer_st == MEGAMOE_INVALID_ARGUMENT)
        FUZZ_CHECK(st == MEGAMOE_INVALID_ARGUMENT, "%s: infer refused the arguments but the "
                   "operator returned %s (%s)", op, megamoe_status_name(st), megamoe_last_error());
    if (!allow_mismatch)
        FUZZ_CHECK(st == MEGAMOE_INVALID_ARGUMENT || st == MEGAMOE_OUT_OF_MEMORY,
                   "%s: %s (%s) with identical peers", op, megamoe_status_name(st),
                   megamoe_last_error());
}

static void mm_fz_dispatch(mm_fz_ctx_t *c, int W, int me)
{
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    a.group_ep = mm_fz_comm(c, 0);
    a.group_tp = mm_fz_comm(c, 1);
    a.ep_world_size = mm_fz_attr(c, W);
    a.ep_rank_id = mm_fz_attr(c, me);
    a.moe_expert_num = mm_fz_int(&c->in);
    a.tp_world_size = mm_fz_attr(c, 0);
    a.tp_rank_id = mm_fz_attr(c, 0);
    a.expert_shard_type = mm_fz_attr(c, 0);
    a.shared_expert_num = mm_fz_attr(c, 1);
    a.shared_expert_rank_num = mm_fz_attr(c, 0);
    a.quant_mode = mm_fz_attr(c, 0);
    a.global_bs = mm_fz_attr(c, 0);
    a.expert_token_nums_type = mm_fz_attr(c, 1);
    a.comm_alg = mm_fz_algs[mm_fz_u8(&c->in) % 5];
    a.zero_expert_num = mm_fz_attr(c, 0);
    a.copy_expert_num = mm_fz_attr(c, 0);
    a.const_expert_num = mm_fz_attr(c, 0);
    a.zero_fill = mm_fz_u8(&c->in) & 1;
    megamoe_tensor_t *in[] = {&a.x, &a.expert_ids, &a.scales, &a.x_active_mask,
                              &a.expert_scales, &a.elastic_info, &a.performance_info};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) mm_fz_tensor(c, in[i]);
    int fuzzed_outputs = mm_fz_u8(&c->in) & 1;
    megamoe_dispatch_v2_args_t inf = a;
    megamoe_tensor_t *out[] = {&a.expand_x, &a.dynamic_scales, &a.assist_info_for_combine,
                               &a.expert_token_nums, &a.ep_recv_counts, &a.tp_recv_counts,
                               &a.expand_scales};
    megamoe_tensor_t *want[] = {&inf.expand_x, &inf.dynamic_scales, &inf.assist_info_for_combine,
                                &inf.expert_token_nums, &inf.ep_recv_counts, &inf.tp_recv_counts,
                                &inf.expand_scales};
    if (fuzzed_outputs) {
        for (size_t i = 0; i < sizeof out / sizeof *out; i++) mm_fz_tensor(c, out[i]);
        inf = a; /* infer on the same inputs, its own copy */
    }
    if (c->skip) return;
    megamoe_status_t ist = megamoe_dispatch_v2_infer(&inf);
    if (ist == MEGAMOE_OK) {
        megamoe_dispatch_v2_args_t again = a;
        FUZZ_CHECK(megamoe_dispatch_v2_infer(&again) == MEGAMOE_OK, "infer is not deterministic");
        for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
            mm_fz_check_nonneg(want[i], "a dispatch output");
            const megamoe_tensor_t *w2 = (const megamoe_tensor_t *)((const char *)&again +
                                          ((const char *)want[i] - (const char *)&inf));
            FUZZ_CHECK(mm_fz_same_shape(want[i], w2), "infer gave two shapes for output %zu", i);
        }
        if (!fuzzed_outputs)
            for (size_t i = 0; i < sizeof out / sizeof *out; i++) mm_fz_output(c, out[i], want[i]);
    }
    mm_fz_snapshot(c);
    megamoe_status_t st = megamoe_dispatch_v2(&a);
    mm_fz_check_failure(st, ist, c->mutated || (a.tp_world_size == 2 && W % 2), "dispatch_v2");
    mm_fz_check_unchanged(c, "dispatch_v2");
}

static void mm_fz_combine(mm_fz_ctx_t *c, int W, int me, int with_norm)
{
    megamoe_combine_add_rms_norm_args_t r = megamoe_combine_add_rms_norm_args_default();
    megamoe_combine_v2_args_t *a = &r.combine;
    a->group_ep = mm_fz_comm(c, 0);
    a->group_tp = mm_fz_comm(c, 1);
    a->ep_world_size = mm_fz_attr(c, W);
    a->ep_rank_id = mm_fz_attr(c, me);
    a->moe_expert_num = mm_fz_int(&c->in);
    a->tp_world_size = mm_fz_attr(c, 0);
    a->tp_rank_id = mm_fz_attr(c, 0);
    a->expert_shard_type = mm_fz_attr(c, 0);
    a->shared_expert_num = mm_fz_attr(c, 1);
    a->shared_expert_rank_num = mm_fz_attr(c, 0);
    a->global_bs = mm_fz_attr(c, 0);
    a->out_dtype = mm_fz_attr(c, 0);
    a->comm_quant_mode = mm_fz_attr(c, 0);
    a->group_list_type = mm_fz_attr(c, 0);
    a->comm_alg = mm_fz_algs[mm_fz_u8(&c->in) % 5];
    a->zero_expert_num = mm_fz_attr(c, 0);
    a->copy_expert_num = mm_fz_attr(c, 0);
    a->const_expert_num = mm_fz_attr(c, 0);
    a->zero_fill = mm_fz_u8(&c->in) & 1;
    megamoe_tensor_t *in[] = {&a->expand_x, &a->expert_ids, &a->assist_info_for_combine,
                              &a->ep_send_counts, &a->expert_scales, &a->tp_send_counts,
                              &a->x_active_mask, &a->expand_scales, &a->shared_expert_x,
                              &a->elastic_info, &a->ori_x, &a->const_expert_alpha_1,
                              &a->const_expert_alpha_2, &a->const_expert_v,
                              &a->performance_info, &a->activation_scale, &a->weight_scale,
                              &a->group_list};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) mm_fz_tensor(c, in[i]);
    if (with_norm) {
        mm_fz_tensor(c, &r.residual_x);
        mm_fz_tensor(c, &r.gamma);
        uint64_t bits = mm_fz_bytes_le(&c->in, 8);
        if (mm_fz_u8(&c->in) & 1) memcpy(&r.norm_eps, &bits, 8);
    }
    int fuzzed_outputs = mm_fz_u8(&c->in) & 1;
    if (fuzzed_outputs) {
        mm_fz_tensor(c, &a->x);
        if (with_norm) {
            mm_fz_tensor(c, &r.y);
            mm_fz_tensor(c, &r.rstd);
        }
    }
    if (c->skip) return;
    megamoe_combine_add_rms_norm_args_t inf = r;
    megamoe_status_t ist = with_norm ? megamoe_combine_add_rms_norm_infer(&inf)
                                     : megamoe_combine_v2_infer(&inf.combine);
    if (ist == MEGAMOE_OK) {
        megamoe_combine_add_rms_norm_args_t again = r;
        megamoe_status_t ist2 = with_norm ? megamoe_combine_add_rms_norm_infer(&again)
                                          : megamoe_combine_v2_infer(&again.combine);
        FUZZ_CHECK(ist2 == MEGAMOE_OK && mm_fz_same_shape(&inf.combine.x, &again.combine.x),
                   "combine infer is not deterministic");
        mm_fz_check_nonneg(&inf.combine.x, "combine x");
        if (!fuzzed_outputs) {
            mm_fz_output(c, &a->x, &inf.combine.x);
            if (with_norm) {
                mm_fz_output(c, &r.y, &inf.y);
                mm_fz_output(c, &r.rstd, &inf.rstd);
            }
        }
    }
    mm_fz_snapshot(c);
    megamoe_status_t st = with_norm ? megamoe_combine_add_rms_norm(&r) : megamoe_combine_v2(a);
    mm_fz_check_failure(st, ist, c->mutated || (a->tp_world_size == 2 && W % 2),
                        with_norm ? "combine_add_rms_norm" : "combine_v2");
    mm_fz_check_unchanged(c, with_norm ? "combine_add_rms_norm" : "combine_v2");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        init = 1;
        megamoe_log_set_callback(mm_fz_silent, NULL);
        mm_fake_set_fixup(mm_fz_fixup);
    }
    mm_fz_ctx_t c;
    memset(&c, 0, sizeof c);
    c.in = (mm_fz_t){data, size};
    int op = mm_fz_u8(&c.in) % 3;
    int W = 2 + mm_fz_u8(&c.in) % 15;
    int me = mm_fz_u8(&c.in) % W, tp_me = mm_fz_u8(&c.in) & 1;
    /* MEGAMOE_RANKS_PER_NODE (hierarchy groups) */
    uint8_t rpn = mm_fz_u8(&c.in);
    char rpn_text[32];
    snprintf(rpn_text, sizeof rpn_text, "%d", (int)(rpn % 20) - 2);
    if (rpn >= 20) unsetenv("MEGAMOE_RANKS_PER_NODE");
    else setenv("MEGAMOE_RANKS_PER_NODE", rpn_text, 1);
    /* the host map (hierarchy groups by host when the variable is 0 or unset) */
    mm_fake_set_hosts(rpn >= 20 ? 1 + (rpn - 20) % W : 0);
    /* peers' records: bytes flipped by the trailing part of the input (read last) */
    static mm_fake_mutation_t mut[8];
    mm_fake_runtime_set(W, me, tp_me, mut, 0);
    if (op == 0) mm_fz_dispatch(&c, W, me);
    else mm_fz_combine(&c, W, me, op == 2);
    mm_fz_free(&c);
    /* Second round with the same arguments and mutated peers, when the input has bytes left:
     * the agreement must refuse or accept, never crash. */
    size_t args_len = size - c.in.n;
    if (c.in.n >= 4) {
        int n_mut = 0;
        while (n_mut < 8 && c.in.n >= 4) {
            mut[n_mut].peer = mm_fz_u8(&c.in);
            mut[n_mut].offset = (unsigned)mm_fz_bytes_le(&c.in, 2);
            mut[n_mut].xor_mask = mm_fz_u8(&c.in);
            if (mut[n_mut].xor_mask) n_mut++;
        }
        mm_fake_runtime_set(W, me, tp_me, mut, n_mut);
        mm_fz_ctx_t again;
        memset(&again, 0, sizeof again);
        again.in = (mm_fz_t){data, args_len};
        again.mutated = n_mut > 0;
        (void)mm_fz_u8(&again.in), (void)mm_fz_u8(&again.in), (void)mm_fz_u8(&again.in);
        (void)mm_fz_u8(&again.in), (void)mm_fz_u8(&again.in);
        if (op == 0) mm_fz_dispatch(&again, W, me);
        else mm_fz_combine(&again, W, me, op == 2);
        mm_fz_free(&again);
    }
    unsetenv("MEGAMOE_RANKS_PER_NODE");
    return 0;
}

/* ---- seeds: valid calls of each operator (the encoder mirrors the decoder above) ---- */

typedef struct mm_fz_seed_tensor {
    int present, mode;
    megamoe_dtype_t dtype;
    int ndim;
    int64_t shape[4];
    int64_t base, step, mod; /* mode 3 */
    const void *raw;         /* mode 1: the bytes */
    size_t raw_len;
} mm_fz_st_t;

static void mm_put_tensor(mm_fz_buf_t *b, mm_fz_st_t t)
{
    mm_fz_put_u8(b, (uint8_t)(t.present | t.mode << 1));
    mm_fz_put_u8(b, (uint8_t)((int)t.dtype + 1));
    mm_fz_put_u8(b, (uint8_t)(t.ndim + 1));
    for (int i = 0; i < t.ndim; i++) mm_fz_put_int(b, t.shape[i]);
    if (t.present && t.mode == 3) {
        mm_fz_put_int(b, t.base);
        mm_fz_put_int(b, t.step);
        mm_fz_put_int(b, t.mod);
    }
    if (t.present && t.mode == 1) mm_fz_put_bytes(b, t.raw, t.raw_len);
}

static const mm_fz_st_t mm_absent = {0, 0, MEGAMOE_DTYPE_FP32, -1, {0}, 0, 0, 0, NULL, 0};

static mm_fz_st_t mm_t2(megamoe_dtype_t d, int64_t a, int64_t b)
{
    return (mm_fz_st_t){1, 0, d, 2, {a, b}, 0, 0, 0, NULL, 0};
}

static mm_fz_st_t mm_iota(megamoe_dtype_t d, int ndim, int64_t a, int64_t b, int64_t step,
                          int64_t mod)
{
    return (mm_fz_st_t){1, 3, d, ndim, {a, b}, 0, step, mod, NULL, 0};
}

static void mm_put_attr(mm_fz_buf_t *b, int usual, int64_t v)
{
    if (usual) {
        mm_fz_put_u8(b, 1);
    } else {
        mm_fz_put_u8(b, 0);
        mm_fz_put_int(b, v);
    }
}

typedef struct mm_fz_seed {
    const char *name;
    int op, W, me, hier;
    int64_t E, quant, tp, S, NS, Z, Cp, Cn, comm_quant;
    int mask, expert_scales, scales, elastic, perf, mutate;
    int64_t gbs; /* global_bs (0: BS * W) */
} mm_fz_seed_t;

/* elastic_info [4 + 2W] for W = 4, E = 8: isScaled, 2 ranks left (0 and 2), no shared ranks,
 * 4 experts (2 per rank, unchanged), table 1 (physical -> compact), table 2 (inverse). */
static const int32_t mm_elastic_w4[12] = {1, 2, 0, 4, 0, -1, 1, -1, 0, 2, 0, 0};

static void mm_seed_header(mm_fz_buf_t *b, const mm_fz_seed_t *s)
{
    mm_fz_put_u8(b, (uint8_t)s->op);
    mm_fz_put_u8(b, (uint8_t)(s->W - 2));
    mm_fz_put_u8(b, (uint8_t)s->me);
    mm_fz_put_u8(b, 0);                       /* tp_me */
    mm_fz_put_u8(b, s->hier ? 3 : 20);        /* RANKS_PER_NODE 1 / unset */
    mm_fz_put_u8(b, 3);                       /* group_ep */
    mm_fz_put_u8(b, s->tp == 2 ? 3 : 0);      /* group_tp */
    mm_put_attr(b, 1, 0);                     /* ep_world_size */
    mm_put_attr(b, 1, 0);                     /* ep_rank_id */
    mm_fz_put_int(b, s->E);                   /* moe_expert_num */
    mm_put_attr(b, s->tp == 0, s->tp);        /* tp_world_size */
    mm_put_attr(b, 1, 0);                     /* tp_rank_id */
    mm_put_attr(b, 1, 0);                     /* expert_shard_type */
    mm_put_attr(b, s->NS == 1, s->NS);        /* shared_expert_num */
    mm_put_attr(b, s->S == 0, s->S);          /* shared_expert_rank_num */
}

static void mm_seed_tail(mm_fz_buf_t *b, const mm_fz_seed_t *s)
{
    if (s->mutate) /* a second round with a peer's record changed */
        for (int i = 0; i < 4; i++) {
            mm_fz_put_u8(b, 1);
            mm_fz_put_le(b, (uint64_t)(8 * i + 1), 2);
            mm_fz_put_u8(b, 0x40);
        }
}

static void mm_seed_dispatch(mm_fz_buf_t *b, const mm_fz_seed_t *s)
{
    const int64_t BS = 8, H = 64, K = 2, total = s->E + s->Z + s->Cp + s->Cn;
    mm_seed_header(b, s);
    mm_put_attr(b, s->quant == 0, s->quant);  /* quant_mode */
    mm_put_attr(b, s->gbs == 0, s->gbs);      /* global_bs */
    mm_put_attr(b, 1, 0);                     /* expert_token_nums_type */
    mm_fz_put_u8(b, s->hier ? 3 : 0);         /* comm_alg */
    mm_put_attr(b, s->Z == 0, s->Z);
    mm_put_attr(b, s->Cp == 0, s->Cp);
    mm_put_attr(b, s->Cn == 0, s->Cn);
    mm_fz_put_u8(b, 1);                       /* zero_fill */
    mm_put_tensor(b, mm_t2(MEGAMOE_DTYPE_BF16, BS, H));
    mm_put_tensor(b, mm_iota(MEGAMOE_DTYPE_INT32, 2, BS, K, 1, s->elastic == 2 ? 4 : total));
    mm_put_tensor(b, s->scales ? mm_t2(MEGAMOE_DTYPE_FP32, (s->S ? s->NS : 0) + s->E, H) : mm_absent);
    mm_fz_st_t mask = {1, 0, MEGAMOE_DTYPE_BOOL, 1, {BS}, 0, 0, 0, NULL, 0};
    mm_fz_st_t mask2 = {1, 3, MEGAMOE_DTYPE_BOOL, 2, {BS, K}, 0, 1, 2, NULL, 0};
    mm_put_tensor(b, s->mask == 2 ? mask2 : s->mask ? mask : mm_absent);
    mm_put_tensor(b, s->expert_scales ? mm_iota(MEGAMOE_DTYPE_FP32, 2, BS, K, 1, 0) : mm_absent);
    mm_fz_st_t el = {1, 0, MEGAMOE_DTYPE_INT32, 1, {4 + 2 * s->W}, 0, 0, 0, NULL, 0};
    if (s->elastic == 2) el = (mm_fz_st_t){1, 1, MEGAMOE_DTYPE_INT32, 1, {12}, 0, 0, 0,
                                           mm_elastic_w4, sizeof mm_elastic_w4};
    mm_put_tensor(b, s->elastic ? el : mm_absent);
    mm_fz_st_t perf = {1, 0, MEGAMOE_DTYPE_INT64, 1, {s->W}, 0, 0, 0, NULL, 0};
    mm_put_tensor(b, s->perf ? perf : mm_absent);
    mm_fz_put_u8(b, 0); /* outputs from infer */
    mm_seed_tail(b, s);
}

static void mm_seed_combine(mm_fz_buf_t *b, const mm_fz_seed_t *s)
{
    const int64_t BS = 8, H = 64, K = 2, W = s->W, L = s->E / (W - s->S);
    const int64_t A = BS * W * (L < K ? L : K), ncounts = W * L * (s->tp == 2 ? 2 : 1);
    mm_seed_header(b, s);
    mm_put_attr(b, 1, 0);                     /* global_bs */
    mm_put_attr(b, 1, 0);                     /* out_dtype */
    mm_put_attr(b, s->comm_quant == 0, s->comm_quant);
    mm_put_attr(b, 1, 0);                     /* group_list_type */
    mm_fz_put_u8(b, s->hier ? 3 : 0);         /* comm_alg */
    mm_put_attr(b, s->Z == 0, s->Z);
    mm_put_attr(b, s->Cp == 0, s->Cp);
    mm_put_attr(b, s->Cn == 0, s->Cn);
    mm_fz_put_u8(b, 1);                       /* zero_fill */
    mm_put_tensor(b, mm_t2(MEGAMOE_DTYPE_BF16, A, H));                          /* expand_x */
    mm_put_tensor(b, mm_iota(MEGAMOE_DTYPE_INT32, 2, BS, K, 1,
                             s->elastic == 2 ? 4 : s->E + s->Z + s->Cp + s->Cn));
    mm_put_tensor(b, mm_iota(MEGAMOE_DTYPE_INT32, 1, 128 * A, 0, 1, 2));       /* assist */
    mm_put_tensor(b, mm_iota(MEGAMOE_DTYPE_INT32, 1, ncounts, 0, 1, 0));       /* send counts */
    mm_put_tensor(b, mm_iota(MEGAMOE_DTYPE_FP32, 2, BS, K, 1, 0));             /* expert_scales */
    mm_fz_st_t tpc = {1, 0, MEGAMOE_DTYPE_INT32, 1, {2}, 0, 0, 0, NULL, 0};
    mm_put_tensor(b, s->tp == 2 ? tpc : mm_absent);                            /* tp_send_counts */
    mm_fz_st_t mask = {1, 0, MEGAMOE_DTYPE_BOOL, 1, {BS}, 0, 0, 0, NULL, 0};
    mm_fz_st_t mask2 = {1, 3, MEGAMOE_DTYPE_BOOL, 2, {BS, K}, 0, 1, 2, NULL, 0};
    mm_put_tensor(b, s->mask == 2 ? mask2 : s->mask ? mask : mm_absent);
    mm_put_tensor(b, mm_absent);                                               /* expand_scales */
    mm_put_tensor(b, mm_absent);                                               /* shared_expert_x */
    mm_fz_st_t el = {1, 1, MEGAMOE_DTYPE_INT32, 1, {12}, 0, 0, 0, mm_elastic_w4,
                     sizeof mm_elastic_w4};
    mm_put_tensor(b, s->elastic == 2 ? el : mm_absent);                        /* elastic_info */
    mm_put_tensor(b, s->Cp + s->Cn ? mm_t2(MEGAMOE_DTYPE_BF16, BS, H) : mm_absent); /* ori_x */
    for (int i = 0; i < 3; i++)
        mm_put_tensor(b, s->Cn ? mm_t2(MEGAMOE_DTYPE_BF16, s->Cn, H) : mm_absent);
    mm_fz_st_t perf = {1, 0, MEGAMOE_DTYPE_INT64, 1, {W}, 0, 0, 0, NULL, 0};
    mm_put_tensor(b, s->perf ? perf : mm_absent);
    for (int i = 0; i < 3; i++) mm_put_tensor(b, mm_absent);                  /* reserved */
    if (s->op == 2) {
        mm_fz_st_t res = {1, 0, MEGAMOE_DTYPE_BF16, 3, {BS, 1, H}, 0, 0, 0, NULL, 0};
        mm_put_tensor(b, res);
        mm_fz_st_t gamma = {1, 0, MEGAMOE_DTYPE_BF16, 1, {H}, 0, 0, 0, NULL, 0};
        mm_put_tensor(b, gamma);
        mm_fz_put_le(b, 0, 8);
        mm_fz_put_u8(b, 0); /* keep the default eps */
    }
    mm_fz_put_u8(b, 0); /* outputs from infer */
    mm_seed_tail(b, s);
}

int mm_fuzz_write_seeds(const char *dir)
{
    static const mm_fz_seed_t seeds[] = {
        {"dispatch_plain", 0, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_rank1_w4", 0, 4, 1, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_int8", 0, 2, 0, 0, 4, 2, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0},
        {"dispatch_mx", 0, 2, 0, 0, 4, 4, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
        {"dispatch_group", 0, 2, 1, 0, 4, 3, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
        {"dispatch_static", 0, 2, 0, 0, 4, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
        {"dispatch_shared", 0, 4, 0, 0, 3, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_special", 0, 2, 0, 0, 4, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_hier", 0, 4, 2, 1, 8, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_tp2", 0, 4, 0, 0, 4, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_elastic_off", 0, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
        {"dispatch_mutated_peer", 0, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
        {"combine_plain", 1, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"combine_cq", 1, 2, 1, 0, 4, 0, 0, 0, 1, 0, 0, 0, 2, 1, 0, 0, 0, 1, 0, 0},
        {"combine_special", 1, 2, 0, 0, 4, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"combine_hier", 1, 4, 1, 1, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"combine_tp2", 1, 4, 0, 0, 4, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"combine_mutated_peer", 1, 2, 1, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
        {"add_rms_norm", 2, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dispatch_elastic_scaled", 0, 4, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0},
        {"dispatch_mask_2d", 0, 2, 1, 0, 4, 2, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0},
        {"dispatch_uneven_bs", 0, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32},
        {"combine_elastic_scaled", 1, 4, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0},
        {"combine_mask_2d", 1, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0},
        {"combine_cq_mx_e5m2", 1, 2, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0},
        {"combine_cq_mx_e4m3", 1, 2, 1, 0, 4, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        static mm_fz_buf_t buf;
        buf.n = 0;
        if (seeds[i].op == 0) mm_seed_dispatch(&buf, &seeds[i]);
        else mm_seed_combine(&buf, &seeds[i]);
        if (mm_fz_save(dir, seeds[i].name, buf.data, buf.n) != 0) return -1;
        count++;
    }
    return count;
}
