/* A PE killed with SIGKILL while the others wait (run under `megamoe launch -n 2`).
 *
 * The two launched ranks and a third process form a 3-PE job; the third one (the victim) is
 * started by a launched rank, so its death does not make the launcher stop the test. Case
 * kill_child: the victim is PE 2. Case kill_root: the victim is PE 0, the one that listens
 * and whose heap header holds the job-lost word. The survivors wait on a signal nobody sends
 * and must get PEER_LOST within 2 s of the death (the victim writes its death time into their
 * heaps just before raising SIGKILL), no heap segment name may remain in /dev/shm; the world
 * team is broken, a team of the survivors works, and the runtime tears down (survive.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "shmem_test_util.h"

#define MM_VICTIM_ENV "MM_SHMEM_TEST_VICTIM"
#define MM_WORLD 3

typedef struct {
    uint64_t *death, *sig;
} mm_kill_objs_t;

/* Collective set-up shared by the victim and the survivors. */
static megamoe_status_t mm_kill_setup(int pe, mm_kill_objs_t *o)
{
    mm_shmem_params_t p = mm_t_params();
    p.rank = pe;
    p.world_size = MM_WORLD;
    megamoe_status_t st = mm_shmem_acquire(&p);
    if (st == MEGAMOE_OK) st = mm_shmem_calloc(64, 64, (void **)&o->death);
    if (st == MEGAMOE_OK) st = mm_shmem_calloc(64, 64, (void **)&o->sig);
    if (st == MEGAMOE_OK) st = mm_shmem_barrier_all();
    return st;
}

/* The victim: join, stamp the time into every survivor's heap, die. */
__attribute__((constructor)) static void mm_victim(void)
{
    const char *v = getenv(MM_VICTIM_ENV);
    if (v == NULL) return;
    int pe = atoi(v);
    mm_kill_objs_t o;
    if (mm_kill_setup(pe, &o) != MEGAMOE_OK) _exit(3);
    mm_sleep_ns(300000000ull); /* the survivors are deep in their waits by now */
    uint64_t now = mm_now_ns();
    for (int q = 0; q < MM_WORLD; q++)
        if (q != pe) mm_shmem_put(o.death, &now, sizeof now, q);
    mm_shmem_quiet();
    raise(SIGKILL);
    _exit(4);
}

static void mm_survive(int victim, int spawner)
{
    int me = victim == 0 ? mm_test_rank() + 1 : mm_test_rank();
    pid_t child = -1;
    if (mm_test_rank() == spawner) {
        child = fork();
        ASSERT_TRUE(child >= 0);
        if (child == 0) {
            char pe[16];
            snprintf(pe, sizeof pe, "%d", victim);
            setenv(MM_VICTIM_ENV, pe, 1);
            execl("/proc/self/exe", "test_shmem_kill_victim", (char *)NULL);
            _exit(127);
        }
    }
    mm_kill_objs_t o;
    ASSERT_OK(mm_kill_setup(me, &o));
    char names[MM_WORLD][64];
    for (int q = 0; q < MM_WORLD; q++) {
        ASSERT_OK(mm_shmem_segment_name(q, names[q], sizeof names[q]));
        ASSERT_FALSE(mm_t_shm_exists(names[q])); /* removed right after start-up */
    }
    double t0 = mm_now_s();
    ASSERT_STATUS(mm_shmem_signal_wait_until(o.sig, MM_SHMEM_CMP_GE, 1, NULL), MEGAMOE_PEER_LOST);
    uint64_t seen = mm_now_ns(), death = __atomic_load_n(o.death, __ATOMIC_ACQUIRE);
    /* Usually the victim's own loss ends the wait; a survivor that is slower to notice (e.g.
     * under TSan) may instead see the other survivor's teardown after it noticed. Either way
     * the wait ended with a loss, and the victim must be known dead within 2 s. */
    ASSERT_CONTAINS(megamoe_last_error(), "was lost");
    while (mm_shmem_pe_alive(victim) && mm_now_ns() - seen < 2000000000ull) mm_sleep_ns(1000000);
    ASSERT_TRUE(death != 0);
    double latency = (double)(seen - death) * 1e-9; /* the loss (of either kind) was seen */
    fprintf(stderr, "PE %d: PEER_LOST %.3f s after PE %d died (waited %.3f s)\n", me, latency,
            victim, mm_now_s() - t0);
    ASSERT_TRUE(latency < 2.0);
    ASSERT_TRUE(mm_now_s() - t0 > 0.2); /* it died while we waited */
    ASSERT_FALSE(mm_shmem_pe_alive(victim));
    ASSERT_TRUE(mm_shmem_pe_alive(me));
    /* the world team holds the lost PE: its collectives fail fast instead of hanging (after
     * the survivors agreed on who is gone), and what it allocated is freed locally */
    double t1 = mm_now_s();
    ASSERT_STATUS(mm_shmem_barrier_all(), MEGAMOE_PEER_LOST);
    ASSERT_CONTAINS(megamoe_last_error(), "of this team was lost");
    ASSERT_TRUE(mm_shmem_pe_lost(victim));
    ASSERT_OK(mm_shmem_free(o.sig));
    ASSERT_OK(mm_shmem_free(o.death));
    ASSERT_TRUE(mm_now_s() - t1 < 1.0);
    /* the survivors go on: a team of them works */
    int pes[MM_WORLD - 1], k = 0, mine = -1;
    for (int q = 0; q < MM_WORLD; q++)
        if (q != victim) {
            if (q == me) mine = k;
            pes[k++] = q;
        }
    mm_shmem_team_t *team = NULL;
    ASSERT_OK(mm_shmem_team_create(pes, k, &team));
    int v = me * 10, got[MM_WORLD - 1];
    ASSERT_OK(mm_shmem_team_allgather(team, got, &v, sizeof v));
    for (int i = 0; i < k; i++) ASSERT_EQ_INT(got[i], pes[i] * 10);
    ASSERT_EQ_INT(mm_shmem_team_my_pe(team), mine);
    ASSERT_OK(mm_shmem_team_destroy(team));
    /* the last release synchronises the survivors and tears down */
    ASSERT_OK(mm_shmem_release());
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    ASSERT_FALSE(mm_shmem_is_running());
    for (int q = 0; q < MM_WORLD; q++) ASSERT_FALSE(mm_t_shm_exists(names[q]));
    if (child > 0) {
        int status = 0;
        ASSERT_EQ_INT(waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
}

MM_TEST(kill_child) { mm_survive(2, 1); }

MM_TEST(kill_root) { mm_survive(0, 0); }
