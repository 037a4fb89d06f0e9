/* A rank killed (SIGKILL) in the middle of an O1 launch (run under `megamoe launch -n 2`).
 *
 * The two launched ranks and a third process form a 3-rank job; the victim (rank 2) is started
 * by launched rank 1, so its death does not make the launcher stop the test. After one good
 * forward + backward, the victim kills itself from inside the next forward launch (the
 * executor's test hook, after a few tasks), having stamped its death time into the survivors'
 * heaps. The survivors must get PEER_LOST within 2 s of the death, with two workers each (both
 * stop), then INVALID_STATE on the broken layer, and close/destroy must return promptly. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "moe_check.h"
#include "multicore/mc_exec.h"
#include "shmem/shmem.h"

#define MM_VICTIM_ENV "MM_O1_TEST_VICTIM"
#define MM_WORLD 3
#define T_ 256
#define H_ 64
#define I_ 32
#define E_ 6
#define K_ 2

static uint64_t *mm_death; /* symmetric: the victim's time of death */

static void mm_die(int64_t tasks_run)
{
    if (tasks_run < 5) return;
    uint64_t now = mm_now_ns();
    for (int q = 0; q < MM_WORLD - 1; q++) mm_shmem_put(mm_death, &now, sizeof now, q);
    mm_shmem_quiet();
    raise(SIGKILL);
}

typedef struct {
    megamoe_comm_t *comm;
    megamoe_experts_t *x;
    mm_moe_problem_t P;
    mm_input_buf_t ib;
    uint16_t *out, *gh, *g1, *g2;
    float *gp;
} mm_job_t;

static megamoe_status_t mm_job_setup(int me, mm_job_t *j)
{
    memset(j, 0, sizeof *j);
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    cp.rank = me;
    cp.world_size = MM_WORLD;
    cp.heap_size = 64u << 20;
    cp.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
    megamoe_status_t st = megamoe_comm_create(&cp, &j->comm);
    if (st == MEGAMOE_OK) st = mm_shmem_calloc(64, 64, (void **)&mm_death);
    megamoe_experts_params_t p = mm_params_shape(T_, H_, I_, E_, K_);
    p.schedule = "O1";
    p.cube_workers = 1;
    p.vector_workers = 1;
    if (st == MEGAMOE_OK) st = megamoe_experts_create(j->comm, &p, &j->x);
    if (st == MEGAMOE_OK &&
        mm_moe_problem_create(&j->P, MM_WORLD, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 4) != 0)
        st = MEGAMOE_OUT_OF_MEMORY;
    if (st == MEGAMOE_OK && mm_input_make(&j->P, me, NULL, &j->ib) != 0) st = MEGAMOE_OUT_OF_MEMORY;
    j->out = malloc((size_t)T_ * H_ * 2);
    j->gh = malloc((size_t)T_ * H_ * 2);
    j->gp = malloc((size_t)T_ * K_ * 4);
    j->g1 = malloc((size_t)(E_ / MM_WORLD * H_ * 2 * I_) * 2);
    j->g2 = malloc((size_t)(E_ / MM_WORLD * I_ * H_) * 2);
    return st;
}

static megamoe_status_t mm_job_step(int me, mm_job_t *j)
{
    megamoe_experts_weights_t w = mm_local_weights(&j->P, me, 1);
    megamoe_experts_saved_t *sv = NULL;
    megamoe_status_t st = megamoe_experts_forward(j->x, &w, &j->ib.in, j->out, &sv);
    if (st == MEGAMOE_OK) {
        megamoe_experts_grads_t g = {j->gh, j->gp, j->g1, j->g2, MEGAMOE_DTYPE_BF16};
        st = megamoe_experts_backward(j->x, sv, &w, j->P.grad_out + (size_t)me * T_ * H_, &g);
    }
    megamoe_experts_saved_destroy(sv);
    return st;
}

/* The victim: one good step, then die inside the next forward launch. */
__attribute__((constructor)) static void mm_victim(void)
{
    if (getenv(MM_VICTIM_ENV) == NULL) return;
    mm_job_t j;
    if (mm_job_setup(MM_WORLD - 1, &j) != MEGAMOE_OK) _exit(3);
    if (mm_job_step(MM_WORLD - 1, &j) != MEGAMOE_OK) _exit(4);
    mm_sleep_ns(200000000ull); /* the survivors are inside the next forward by now */
    mm_mc_test_task_hook = mm_die;
    mm_job_step(MM_WORLD - 1, &j);
    _exit(5); /* not reached */
}

MM_TEST(peer_killed_mid_launch)
{
    const int me = mm_test_rank();
    pid_t child = -1;
    if (me == 1) {
        child = fork();
        ASSERT_TRUE(child >= 0);
        if (child == 0) {
            setenv(MM_VICTIM_ENV, "1", 1);
            execl("/proc/self/exe", "test_o1_kill_victim", (char *)NULL);
            _exit(127);
        }
    }
    mm_job_t j;
    ASSERT_OK(mm_job_setup(me, &j));
    ASSERT_OK(mm_job_step(me, &j));
    double t0 = mm_now_s();
    ASSERT_STATUS(mm_job_step(me, &j), MEGAMOE_PEER_LOST);
    uint64_t seen = mm_now_ns(), death = __atomic_load_n(mm_death, __ATOMIC_ACQUIRE);
    ASSERT_CONTAINS(megamoe_last_error(), "rank 2");
    ASSERT_TRUE(death != 0);
    double latency = (double)(seen - death) * 1e-9;
    fprintf(stderr, "rank %d: PEER_LOST %.3f s after rank 2 died inside a launch (waited %.3f s)\n",
            me, latency, mm_now_s() - t0);
    ASSERT_TRUE(latency < 2.0);
    /* the layer is broken: a clear error, then close and teardown return promptly */
    megamoe_experts_weights_t w = mm_local_weights(&j.P, me, 1);
    ASSERT_STATUS(megamoe_experts_forward(j.x, &w, &j.ib.in, j.out, NULL), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "can only be closed");
    double t1 = mm_now_s();
    megamoe_status_t st = megamoe_experts_close(j.x);
    ASSERT_TRUE(st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST);
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(j.x, &info));
    ASSERT_EQ_INT(info.closed, 1);
    megamoe_experts_destroy(j.x);
    st = megamoe_comm_destroy(j.comm);
    ASSERT_TRUE(st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST);
    ASSERT_TRUE(mm_now_s() - t1 < 2.0);
    mm_input_free(&j.ib);
    mm_moe_problem_free(&j.P);
    free(j.out);
    free(j.gh);
    free(j.gp);
    free(j.g1);
    free(j.g2);
    if (child > 0) {
        int status = 0;
        ASSERT_EQ_INT(waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
}
