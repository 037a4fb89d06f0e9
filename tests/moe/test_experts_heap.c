/* Heap sizing (2 ranks): the rule of megamoe_experts_heap_bytes, and a heap set too small by
 * HYPER_PARALLEL_SHMEM_HEAP_SIZE gives an error naming the variable and the size needed, on
 * every rank, at the first forward. Runs in its own process: the variable must be set before
 * the SHMEM runtime starts. */
#include <stdlib.h>

#include "moe_check.h"

MM_TEST(heap_bytes_rule)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = 1024;
    p.hidden_size = 512;
    p.intermediate_size = 128;
    p.num_experts = 4;
    p.top_k = 2;
    /* lossless: align128(2*1024*2) = 4096 rows + T*K = 2048 rows, 1 KiB each, + 1 page of signals */
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), (4096 + 2048) * 1024 + 4096);
    p.expert_capacity_factor = 1.5; /* align128(3072) = 3072 rows */
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), (3072 + 2048) * 1024 + 4096);
    p.expert_capacity_factor = 0.5;
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), 0);
}

MM_TEST(heap_too_small_names_the_variable_and_the_size)
{
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "4M", 1); /* before the runtime starts */
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = 128;
    p.hidden_size = 4096;
    p.intermediate_size = 16;
    p.num_experts = 2 * ep;
    p.top_k = 2;
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, 128, 4096, 16, 2 * ep, 2, MM_ROUTE_BALANCED, 1), 0);
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    uint16_t *out = calloc((size_t)128 * 4096, 2);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE=64M");
    ASSERT_CONTAINS(megamoe_last_error(), "too small");
    /* a layer that fits still works in the same process */
    megamoe_experts_params_t q = p;
    q.hidden_size = 64;
    megamoe_experts_t *y = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &q, &y));
    mm_moe_problem_t Q;
    ASSERT_EQ_INT(mm_moe_problem_create(&Q, ep, 128, 64, 16, 2 * ep, 2, MM_ROUTE_BALANCED, 1), 0);
    mm_input_buf_t iq;
    ASSERT_EQ_INT(mm_input_make(&Q, me, NULL, &iq), 0);
    megamoe_experts_weights_t wq = mm_local_weights(&Q, me, 1);
    ASSERT_OK(megamoe_experts_forward(y, &wq, &iq.in, out, NULL));
    ASSERT_OK(megamoe_experts_close(y));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    megamoe_experts_destroy(y);
    mm_input_free(&ib);
    mm_input_free(&iq);
    free(out);
    mm_moe_problem_free(&P);
    mm_moe_problem_free(&Q);
}
