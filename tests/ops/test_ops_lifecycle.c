/* The operators' cached symmetric workspaces across SHMEM lifecycles, including one that ended
 * with a lost peer. Not launched: this process is rank 0 and starts its peers itself (a killed
 * peer must not make a launcher stop the test).
 *
 * Lifecycle 1: rank 0 + a victim run one dispatch (the workspace pool is allocated), the victim
 * dies with SIGKILL, rank 0 notices (PEER_LOST) and destroys its communicator (the runtime
 * tears down locally). Lifecycle 2: rank 0 + a fresh peer, on a new endpoint, run dispatches
 * again. The pool of lifecycle 1 lived in the unmapped heap: it must have been forgotten, else
 * rank 0 works on a dangling pointer (or both ranks see different workspace histories), and
 * its call generations must restart like those of the fresh peer. Lifecycle 3 repeats that
 * after a clean end.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/harness.h"
#include "megamoe/comm.h"
#include "megamoe/ops.h"
#include "shmem/shmem.h"
#include "shmem/shmem_test_util.h"

#define MM_ROLE_ENV "MM_OPS_LIFECYCLE_ROLE"
#define MM_EP_ENV "MM_OPS_LIFECYCLE_EP"

enum { H = 16, BS = 2 };

static megamoe_comm_t *mm_open(int rank, const char *endpoint)
{
    megamoe_comm_params_t p = megamoe_comm_params_default();
    p.rank = rank;
    p.world_size = 2;
    p.endpoint = endpoint;
    p.heap_size = 64u << 20;
    p.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
    megamoe_comm_t *c = NULL;
    return megamoe_comm_create(&p, &c) == MEGAMOE_OK ? c : NULL;
}

static megamoe_tensor_t mm_tens(void *data, megamoe_dtype_t t, int64_t d0, int64_t d1)
{
    megamoe_tensor_t x = megamoe_tensor_none();
    x.data = data;
    x.dtype = t;
    x.ndim = d1 ? 2 : 1;
    x.shape[0] = d0;
    x.shape[1] = d1;
    return x;
}

/* One expert per rank, K = 1: token t of rank r goes to rank (t + r) % 2, so every rank
 * receives one row from each rank. Returns the status; *rows_p = expert_token_nums[0]. */
static megamoe_status_t mm_dispatch(megamoe_comm_t *c, int rank, int64_t *rows_p)
{
    uint16_t x[BS * H], ex[4 * BS * H];
    int32_t ids[BS], assist[4096], counts[8] = {0}, tp[2];
    float dyn[4 * BS];
    int64_t tok[1] = {-1};
    for (int i = 0; i < BS * H; i++) x[i] = megamoe_fp32_to_bf16((float)(rank * 100 + i));
    for (int t = 0; t < BS; t++) ids[t] = (t + rank) % 2;
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    a.x = mm_tens(x, MEGAMOE_DTYPE_BF16, BS, H);
    a.expert_ids = mm_tens(ids, MEGAMOE_DTYPE_INT32, BS, 1);
    a.group_ep = c;
    a.ep_world_size = 2;
    a.ep_rank_id = rank;
    a.moe_expert_num = 2;
    megamoe_status_t st = megamoe_dispatch_v2_infer(&a);
    if (st != MEGAMOE_OK) return st;
    if (a.expand_x.shape[0] * H > 4 * BS * H || a.assist_info_for_combine.shape[0] > 4096 ||
        a.ep_recv_counts.shape[0] > 8)
        return MEGAMOE_INTERNAL;
    a.expand_x.data = ex;
    a.dynamic_scales.data = dyn;
    a.assist_info_for_combine.data = assist;
    a.expert_token_nums.data = tok;
    a.ep_recv_counts.data = counts;
    a.tp_recv_counts.data = tp;
    a.expand_scales.data = dyn;
    st = megamoe_dispatch_v2(&a);
    *rows_p = tok[0];
    return st;
}

/* The peers: a victim (lifecycle 1) and a clean peer (lifecycle 2), both rank 1. */
__attribute__((constructor)) static void mm_peer(void)
{
    const char *role = getenv(MM_ROLE_ENV), *ep = getenv(MM_EP_ENV);
    if (role == NULL || ep == NULL) return;
    megamoe_comm_t *c = mm_open(1, ep);
    if (c == NULL) _exit(3);
    int64_t rows = 0;
    if (mm_dispatch(c, 1, &rows) != MEGAMOE_OK || rows != 2) _exit(4);
    if (strcmp(role, "victim") == 0) {
        raise(SIGKILL);
        _exit(5);
    }
    if (mm_dispatch(c, 1, &rows) != MEGAMOE_OK || rows != 2) _exit(6);
    if (megamoe_comm_destroy(c) != MEGAMOE_OK) _exit(7);
    _exit(0);
}

static pid_t mm_spawn(const char *role, const char *endpoint)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv(MM_ROLE_ENV, role, 1);
        setenv(MM_EP_ENV, endpoint, 1);
        execl("/proc/self/exe", "test_ops_lifecycle_peer", (char *)NULL);
        _exit(127);
    }
    return pid;
}

MM_TEST(workspaces_survive_a_lifecycle_that_lost_a_peer)
{
    char ep1[64], ep2[64];
    snprintf(ep1, sizeof ep1, "tcp://127.0.0.1:%d", mm_t_free_port());
    pid_t victim = mm_spawn("victim", ep1);
    ASSERT_TRUE(victim > 0);
    megamoe_comm_t *c = mm_open(0, ep1);
    ASSERT_TRUE(c != NULL);
    int64_t rows = 0;
    ASSERT_OK(mm_dispatch(c, 0, &rows));
    ASSERT_EQ_INT(rows, 2);
    ASSERT_STATUS(megamoe_comm_barrier(c), MEGAMOE_PEER_LOST); /* the victim never arrives */
    /* the survivor (alone) acknowledged the loss: its release tears down */
    ASSERT_OK(megamoe_comm_destroy(c));
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    int ws = 0;
    ASSERT_EQ_INT(waitpid(victim, &ws, 0), victim);
    ASSERT_TRUE(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);

    snprintf(ep2, sizeof ep2, "tcp://127.0.0.1:%d", mm_t_free_port());
    pid_t peer = mm_spawn("peer", ep2);
    ASSERT_TRUE(peer > 0);
    c = mm_open(0, ep2);
    ASSERT_TRUE(c != NULL);
    for (int i = 0; i < 2; i++) {
        rows = 0;
        ASSERT_OK(mm_dispatch(c, 0, &rows));
        ASSERT_EQ_INT(rows, 2);
    }
    ASSERT_OK(megamoe_comm_destroy(c));
    ASSERT_EQ_INT(waitpid(peer, &ws, 0), peer);
    ASSERT_TRUE(WIFEXITED(ws));
    ASSERT_EQ_INT(WEXITSTATUS(ws), 0);

    /* Lifecycle 3 after a clean one, again with a new peer process: the call generations of
     * this process must restart with the new pool like the peer's do (they used to continue,
     * and every wait then hung until the timeout). */
    snprintf(ep2, sizeof ep2, "tcp://127.0.0.1:%d", mm_t_free_port());
    peer = mm_spawn("peer", ep2);
    ASSERT_TRUE(peer > 0);
    c = mm_open(0, ep2);
    ASSERT_TRUE(c != NULL);
    for (int i = 0; i < 2; i++) {
        rows = 0;
        ASSERT_OK(mm_dispatch(c, 0, &rows));
        ASSERT_EQ_INT(rows, 2);
    }
    ASSERT_OK(megamoe_comm_destroy(c));
    ASSERT_EQ_INT(waitpid(peer, &ws, 0), peer);
    ASSERT_TRUE(WIFEXITED(ws));
    ASSERT_EQ_INT(WEXITSTATUS(ws), 0);
}
