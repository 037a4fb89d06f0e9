/* The extensible-struct rules of include/megamoe/version.h through the shared library's public
 * entries (no ranks needed): a struct_size below the minimum (0, garbage) is a clear
 * INVALID_ARGUMENT; an older caller whose struct ends at the minimum is read no further (the
 * buffer is exactly that long: ASan would see a read past it); a newer caller's unknown bytes
 * are accepted when zero and UNSUPPORTED otherwise; *_init() fills the caller's size; the
 * library fills a caller-sized struct only up to the size passed; the add_rms_norm args find
 * their own fields after an embedded combine of another size (2 ranks: the operators' infer
 * needs a 2-rank EP group). */
#include <stdlib.h>

#include "harness/harness.h"
#include "megamoe/megamoe.h"

static megamoe_experts_params_t shapes(void)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = 128, p.hidden_size = 64, p.intermediate_size = 32;
    p.num_experts = 4, p.top_k = 2;
    return p;
}

MM_TEST(defaults_carry_the_callers_size)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    ASSERT_EQ_INT(p.struct_size, sizeof p);
    ASSERT_EQ_STR(p.schedule, "O1");
    megamoe_experts_input_t in = megamoe_experts_input_default();
    ASSERT_EQ_INT(in.struct_size, sizeof in);
    ASSERT_EQ_INT(in.topk_weights_dtype, MEGAMOE_DTYPE_FP32);
    megamoe_comm_params_t c = megamoe_comm_params_default();
    ASSERT_EQ_INT(c.struct_size, sizeof c);
    ASSERT_EQ_INT(c.rank, -1);
    megamoe_combine_add_rms_norm_args_t r = megamoe_combine_add_rms_norm_args_default();
    ASSERT_EQ_INT(r.struct_size, sizeof r);
    ASSERT_EQ_INT(r.combine.struct_size, sizeof r.combine);
    ASSERT_EQ_INT(r.combine.zero_fill, 1);
    ASSERT_NEAR(r.norm_eps, 1e-6, 1e-12);
    /* a size below the minimum, or no struct, is refused */
    ASSERT_STATUS(megamoe_experts_params_init(&p, 8), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(megamoe_experts_params_init(NULL, sizeof p), MEGAMOE_INVALID_ARGUMENT);
    /* a newer caller's larger struct: the tail the library does not know is zeroed */
    unsigned char big[sizeof(megamoe_experts_params_t) + 16];
    memset(big, 0xab, sizeof big);
    ASSERT_OK(megamoe_experts_params_init((megamoe_experts_params_t *)big, sizeof big));
    for (size_t i = sizeof(megamoe_experts_params_t); i < sizeof big; i++) ASSERT_EQ_INT(big[i], 0);
}

MM_TEST(struct_size_below_the_minimum_names_the_initialiser)
{
    megamoe_experts_params_t p = shapes();
    const size_t good = megamoe_experts_heap_bytes(&p, 2);
    ASSERT_TRUE(good > 0);
    p.struct_size = 0; /* a struct built without megamoe_experts_params_default() */
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), 0);
    ASSERT_CONTAINS(megamoe_last_error(), "megamoe_experts_params_default()");
    p.struct_size = (size_t)0x7ffd12345678ull; /* garbage */
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), 0);
    megamoe_reference_params_t rp = megamoe_reference_params_default();
    megamoe_reference_shape_t sh = {1, 1, 1, 1, 1, 1};
    float x = 0, out = 0, w = 1, gu[2] = {0, 0}, d = 0;
    int32_t id = 0;
    ASSERT_OK(megamoe_reference_forward(&sh, &rp, &x, &id, &w, gu, &d, &out));
    rp.struct_size = 4;
    ASSERT_STATUS(megamoe_reference_forward(&sh, &rp, &x, &id, &w, gu, &d, &out),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "megamoe_reference_params_default()");
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    a.struct_size = 16;
    ASSERT_STATUS(megamoe_dispatch_v2_infer(&a), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "megamoe_dispatch_v2_args_default()");
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(an_older_caller_is_read_no_further_than_its_size)
{
    const int64_t low = megamoe_struct_min_size("megamoe_experts_params_t");
    ASSERT_TRUE(low > 0 && low <= (int64_t)sizeof(megamoe_experts_params_t));
    megamoe_experts_params_t p = shapes();
    const size_t good = megamoe_experts_heap_bytes(&p, 2);
    /* exactly `low` bytes of memory: what an ABI-2 caller's struct holds */
    megamoe_experts_params_t *old = malloc((size_t)low);
    ASSERT_TRUE(old != NULL);
    memcpy(old, &p, (size_t)low);
    old->struct_size = (size_t)low;
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(old, 2), good);
    free(old);
}

MM_TEST(a_newer_callers_unknown_bytes_must_be_zero)
{
    struct {
        megamoe_experts_params_t p;
        int64_t future[2]; /* fields a newer header appended */
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.p = shapes();
    newer.p.struct_size = sizeof newer;
    const size_t good = megamoe_experts_heap_bytes(&newer.p, 2);
    ASSERT_TRUE(good > 0); /* zero: what the library did before those fields existed */
    newer.future[1] = 7;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&newer.p, 2), 0);
    ASSERT_CONTAINS(megamoe_last_error(), "newer megamoe");
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(caller_sized_structs_are_filled_up_to_the_callers_size)
{
    megamoe_host_info_t full;
    ASSERT_OK(megamoe_host_info(&full));
    ASSERT_TRUE(full.cores >= 1);
    /* an older caller's shorter struct: nothing written past its size */
    const int64_t low = megamoe_struct_min_size("megamoe_host_info_t");
    ASSERT_TRUE(low > 0);
    unsigned char buf[sizeof(megamoe_host_info_t) + 32];
    memset(buf, 0xcd, sizeof buf);
    ASSERT_OK(megamoe_host_info_sized((megamoe_host_info_t *)buf, (size_t)low));
    for (size_t i = (size_t)low; i < sizeof buf; i++) ASSERT_EQ_INT(buf[i], 0xcd);
    ASSERT_EQ_INT(((megamoe_host_info_t *)buf)->cores, full.cores);
    /* a newer caller's longer one: its unknown fields read zero */
    memset(buf, 0xcd, sizeof buf);
    ASSERT_OK(megamoe_host_info_sized((megamoe_host_info_t *)buf, sizeof buf));
    for (size_t i = sizeof(megamoe_host_info_t); i < sizeof buf; i++) ASSERT_EQ_INT(buf[i], 0);
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(megamoe_host_info_sized((megamoe_host_info_t *)buf, 4),
                  MEGAMOE_INVALID_ARGUMENT);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

/* add_rms_norm args laid out by a newer header whose combine args are 16 bytes longer: the
 * own fields sit 16 bytes further; infer must read and write them there. */
MM_TEST(add_rms_norm_finds_its_fields_after_a_grown_combine)
{
    typedef megamoe_combine_add_rms_norm_args_t arn_t;
    const size_t grow = 16;
    const size_t own = offsetof(arn_t, residual_x);
    unsigned char *buf = calloc(1, sizeof(arn_t) + grow);
    ASSERT_TRUE(buf != NULL);
    arn_t *n = (arn_t *)buf;
    ASSERT_OK(megamoe_combine_add_rms_norm_args_init(n, sizeof(arn_t) + grow,
                                                     sizeof(megamoe_combine_v2_args_t) + grow));
    ASSERT_EQ_INT(n->combine.struct_size, sizeof(megamoe_combine_v2_args_t) + grow);
    double eps;
    memcpy(&eps, buf + grow + offsetof(arn_t, norm_eps), sizeof eps);
    ASSERT_NEAR(eps, 1e-6, 1e-12); /* the default, at the shifted place */
    /* inputs with the shapes dispatch's infer gives (data are never read by infer) */
    megamoe_comm_t *comm = NULL;
    ASSERT_OK(megamoe_comm_create(NULL, &comm)); /* the launcher's 2 ranks */
    static uint8_t dummy[1 << 16];
    megamoe_dispatch_v2_args_t d = megamoe_dispatch_v2_args_default();
    d.x = (megamoe_tensor_t){dummy, MEGAMOE_DTYPE_BF16, 2, {4, 8}};
    d.expert_ids = (megamoe_tensor_t){dummy, MEGAMOE_DTYPE_INT32, 2, {4, 2}};
    d.group_ep = comm, d.ep_world_size = 2, d.ep_rank_id = megamoe_comm_rank(comm);
    d.moe_expert_num = 4;
    ASSERT_OK(megamoe_dispatch_v2_infer(&d));
    arn_t plain = megamoe_combine_add_rms_norm_args_default();
    megamoe_combine_v2_args_t *c = &plain.combine;
    c->expand_x = d.expand_x, c->expert_ids = d.expert_ids;
    c->assist_info_for_combine = d.assist_info_for_combine;
    c->ep_send_counts = d.ep_recv_counts;
    c->expert_scales = (megamoe_tensor_t){dummy, MEGAMOE_DTYPE_FP32, 2, {4, 2}};
    c->expand_x.data = c->assist_info_for_combine.data = c->ep_send_counts.data = dummy;
    c->group_ep = comm, c->ep_world_size = 2, c->ep_rank_id = d.ep_rank_id;
    c->moe_expert_num = 4;
    plain.residual_x = (megamoe_tensor_t){dummy, MEGAMOE_DTYPE_BF16, 3, {4, 1, 8}};
    plain.gamma = (megamoe_tensor_t){dummy, MEGAMOE_DTYPE_BF16, 1, {8}};
    plain.norm_eps = 1e-5;
    ASSERT_OK(megamoe_combine_add_rms_norm_infer(&plain));
    ASSERT_EQ_INT(plain.y.ndim, 3);
    /* the same inputs in the newer layout */
    memcpy((unsigned char *)&n->combine + sizeof(size_t), (unsigned char *)c + sizeof(size_t),
           sizeof *c - sizeof(size_t));
    memcpy(buf + grow + own, (unsigned char *)&plain + own, sizeof plain - own);
    ASSERT_OK(megamoe_combine_add_rms_norm_infer(n));
    {
        megamoe_tensor_t y, rstd;
        memcpy(&y, buf + grow + offsetof(arn_t, y), sizeof y);
        memcpy(&rstd, buf + grow + offsetof(arn_t, rstd), sizeof rstd);
        ASSERT_EQ_INT(y.ndim, plain.y.ndim);
        ASSERT_EQ_INT(y.shape[0], plain.y.shape[0]);
        ASSERT_EQ_INT(y.shape[2], plain.y.shape[2]);
        ASSERT_EQ_INT(rstd.dtype, MEGAMOE_DTYPE_FP32);
        ASSERT_EQ_INT(rstd.shape[0], 4);
        ASSERT_EQ_INT(n->combine.x.shape[0], plain.combine.x.shape[0]);
        ASSERT_EQ_INT(n->combine.struct_size, sizeof(megamoe_combine_v2_args_t) + grow);
    }
    /* a non-zero byte in the combine's unknown tail: refused */
    buf[offsetof(arn_t, combine) + sizeof(megamoe_combine_v2_args_t) + 3] = 1;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(megamoe_combine_add_rms_norm_infer(n), MEGAMOE_UNSUPPORTED);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    free(buf);
    ASSERT_OK(megamoe_comm_destroy(comm));
}

/* A bad struct_size is an argument error like any other: on one rank it is every rank's
 * error (collective create), and the next create works. */
MM_TEST(a_bad_struct_size_on_one_rank_fails_create_on_every_rank)
{
    megamoe_comm_t *comm = NULL;
    ASSERT_OK(megamoe_comm_create(NULL, &comm));
    megamoe_experts_params_t p = shapes();
    p.workers = 1;
    if (megamoe_comm_rank(comm) == 1) p.struct_size = 0;
    megamoe_experts_t *x = NULL;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    ASSERT_TRUE(x == NULL);
    if (megamoe_comm_rank(comm) == 1)
        ASSERT_CONTAINS(megamoe_last_error(), "megamoe_experts_params_default()");
    p.struct_size = sizeof p;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    ASSERT_OK(megamoe_comm_destroy(comm));
}
