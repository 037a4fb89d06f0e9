/* Survivors of killed PEs agree on who is gone and go on (run under `megamoe launch -n 3`).
 *
 * The three launched ranks and one or two processes that launched rank 0 forks (the victims:
 * their death does not make the launcher stop the test) form one job; every PE runs a loop of
 * collectives (an allgather whose values depend on the PE and the iteration, checked) on a team
 * of the PEs it believes alive. A victim raises SIGKILL at its iteration (after stamping the
 * time into every survivor's heap). Every survivor must get PEER_LOST on the collective in
 * flight within 2 s of the death, then acknowledge the loss (the world team is broken, its
 * allocations are freed locally), make a team of the survivors and go on with correct values;
 * each loss costs each survivor exactly one failed collective. The same process runs several
 * lifecycles (new endpoint, new victims, the root among them): descriptors and the resident
 * set stay flat over the losses.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "base/alloc.h"
#include "shmem_test_util.h"

#define MM_VICTIM_ENV "MM_SURVIVE_TEST_VICTIM"
#define MM_LAUNCHED 3
#define MM_MAX_WORLD 8
#define MM_ITERS 90

typedef struct {
    int world, n_victims;
    int victim[2], kill_at[2]; /* PE and the iteration at which it dies */
    char endpoint[64];
} mm_job_t;

static int mm_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ".", "..", the directory's own descriptor */
}

static void mm_job_encode(const mm_job_t *j, int pe, char *out, size_t len)
{
    snprintf(out, len, "%d:%d:%d:%d:%d:%d:%d:%s", pe, j->world, j->n_victims, j->victim[0],
             j->kill_at[0], j->victim[1], j->kill_at[1], j->endpoint);
}

static int mm_job_decode(const char *s, mm_job_t *j, int *pe)
{
    return sscanf(s, "%d:%d:%d:%d:%d:%d:%d:%63s", pe, &j->world, &j->n_victims, &j->victim[0],
                  &j->kill_at[0], &j->victim[1], &j->kill_at[1], j->endpoint) == 8;
}

static int mm_kill_iter(const mm_job_t *j, int pe)
{
    for (int v = 0; v < j->n_victims; v++)
        if (j->victim[v] == pe) return j->kill_at[v];
    return -1;
}

/* A team of the PEs not lost (collective over them). */
static megamoe_status_t mm_survivors_team(int world, mm_shmem_team_t **team)
{
    int pes[MM_MAX_WORLD], n = 0;
    for (int q = 0; q < world; q++)
        if (!mm_shmem_pe_lost(q)) pes[n++] = q;
    return mm_shmem_team_create(pes, n, team);
}

typedef struct {
    int failures, failed_at[2];
    double latency[2];
    int fds_before, fds_after;
} mm_run_t;

/* The loop of one PE; returns only on survivors (victims die inside). */
static void mm_run(const mm_job_t *j, int pe, mm_run_t *r)
{
    memset(r, 0, sizeof *r);
    mm_shmem_params_t p = mm_t_params();
    p.rank = pe;
    p.world_size = j->world;
    p.endpoint = j->endpoint;
    ASSERT_OK(mm_shmem_acquire(&p));
    uint64_t *death = NULL; /* [2] lines: the victims' death times */
    ASSERT_OK(mm_shmem_calloc(2 * 64, 64, (void **)&death));
    ASSERT_OK(mm_shmem_barrier_all());
    r->fds_before = mm_count_fds();
    mm_shmem_team_t *team = NULL; /* NULL: the world */
    const int die_at = mm_kill_iter(j, pe);
    int it = 0, losses = 0;
    while (it < MM_ITERS) {
        if (it == die_at) {
            uint64_t now = mm_now_ns();
            int v = j->victim[0] == pe ? 0 : 1;
            for (int q = 0; q < j->world; q++)
                if (q != pe && !mm_shmem_pe_lost(q)) mm_shmem_put(death + 8 * v, &now, 8, q);
            mm_shmem_quiet();
            raise(SIGKILL);
        }
        mm_shmem_team_t *t = team ? team : mm_shmem_team_world();
        int n = mm_shmem_team_n_pes(t);
        int v = pe * 1000 + it, got[MM_MAX_WORLD];
        megamoe_status_t st = mm_shmem_team_allgather(t, got, &v, sizeof v);
        if (st == MEGAMOE_OK) {
            for (int i = 0; i < n; i++)
                ASSERT_EQ_INT(got[i], mm_shmem_team_world_pe(t, i) * 1000 + it);
            it++;
            continue;
        }
        /* the collective in flight at a loss */
        ASSERT_STATUS(st, MEGAMOE_PEER_LOST);
        uint64_t seen = mm_now_ns();
        ASSERT_TRUE(losses < 2);
        r->failed_at[losses] = it;
        r->failures++;
        ASSERT_OK(mm_shmem_recover());
        uint64_t when = __atomic_load_n(death + 8 * losses, __ATOMIC_ACQUIRE);
        ASSERT_TRUE(when != 0); /* stamped before the death */
        r->latency[losses] = (double)(seen - when) * 1e-9;
        ASSERT_TRUE(r->latency[losses] < 2.0);
        losses++;
        ASSERT_TRUE(mm_shmem_team_lost_member(t) >= 0);
        ASSERT_STATUS(mm_shmem_team_barrier(t), MEGAMOE_PEER_LOST); /* broken for good */
        if (team) ASSERT_OK(mm_shmem_team_destroy(team));
        team = NULL;
        ASSERT_OK(mm_survivors_team(j->world, &team));
        /* the survivors resume at the same iteration (they may have failed different ones) */
        int all[MM_MAX_WORLD];
        ASSERT_OK(mm_shmem_team_allgather(team, all, &it, sizeof it));
        for (int i = 0; i < mm_shmem_team_n_pes(team); i++)
            if (all[i] > it) it = all[i];
    }
    ASSERT_EQ_INT(losses, j->n_victims);
    /* every survivor failed exactly one collective per loss: the same number everywhere */
    int all[MM_MAX_WORLD];
    ASSERT_OK(mm_shmem_team_allgather(team, all, &r->failures, sizeof r->failures));
    for (int i = 0; i < mm_shmem_team_n_pes(team); i++) ASSERT_EQ_INT(all[i], j->n_victims);
    mm_sleep_ns(50000000ull); /* the monitor drops the lost PEs' descriptors */
    r->fds_after = mm_count_fds();
    ASSERT_TRUE(r->fds_after <= r->fds_before);
    ASSERT_OK(mm_shmem_team_destroy(team));
    ASSERT_STATUS(mm_shmem_barrier_all(), MEGAMOE_PEER_LOST);
    ASSERT_OK(mm_shmem_free(death)); /* on the broken world: local */
    ASSERT_OK(mm_shmem_release());
    ASSERT_FALSE(mm_shmem_is_running());
}

/* A victim process: its job from the environment, then the loop until it dies. */
__attribute__((constructor)) static void mm_victim_main(void)
{
    const char *v = getenv(MM_VICTIM_ENV);
    if (v == NULL) return;
    mm_job_t j;
    int pe = -1;
    memset(&j, 0, sizeof j);
    if (!mm_job_decode(v, &j, &pe)) _exit(3);
    mm_run_t r;
    mm_run(&j, pe, &r);
    _exit(4); /* never: it dies in the loop */
}

/* One lifecycle: launched rank 0 forks the victims; the launched ranks take the other PEs. */
static void mm_lifecycle(mm_job_t *j, pid_t *kids, mm_run_t *r)
{
    int me = mm_test_rank(), pe = -1, k = 0;
    for (int q = 0; q < j->world && pe < 0; q++) {
        if (mm_kill_iter(j, q) >= 0) continue;
        if (k++ == me) pe = q;
    }
    ASSERT_TRUE(pe >= 0);
    for (int v = 0; v < j->n_victims; v++) {
        kids[v] = -1;
        if (me != 0) continue;
        kids[v] = fork();
        ASSERT_TRUE(kids[v] >= 0);
        if (kids[v] == 0) {
            char env[160];
            mm_job_encode(j, j->victim[v], env, sizeof env);
            setenv(MM_VICTIM_ENV, env, 1);
            execl("/proc/self/exe", "test_shmem_survive_victim", (char *)NULL);
            _exit(127);
        }
    }
    mm_run(j, pe, r);
    fprintf(stderr, "PE %d: %d loss(es), failed at iteration %d/%d, PEER_LOST %.3f/%.3f s after "
            "the deaths; descriptors %d -> %d\n", pe, r->failures, r->failed_at[0],
            r->failed_at[1], r->latency[0], r->latency[1], r->fds_before, r->fds_after);
    for (int v = 0; v < j->n_victims; v++) {
        if (kids[v] <= 0) continue;
        int status = 0;
        ASSERT_EQ_INT(waitpid(kids[v], &status, 0), kids[v]);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
}

/* Every launched rank learns the same fresh endpoint (chosen by launched rank 0). */
static void mm_next_endpoint(mm_job_t *j, int first)
{
    int port = 0;
    if (first) {
        snprintf(j->endpoint, sizeof j->endpoint, "%s",
                 getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"));
        return;
    }
    /* the launched ranks are 0..2 of a short helper job on the launcher's endpoint */
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    if (mm_shmem_my_pe() == 0) port = mm_t_free_port();
    ASSERT_OK(mm_shmem_team_broadcast(mm_shmem_team_world(), &port, sizeof port, 0));
    ASSERT_OK(mm_shmem_release());
    ASSERT_TRUE(port > 0);
    snprintf(j->endpoint, sizeof j->endpoint, "tcp://127.0.0.1:%d", port);
}

MM_TEST(losses_survived_over_lifecycles)
{
    ASSERT_EQ_INT(mm_test_world(), MM_LAUNCHED);
    /* lifecycles: the root dies; a non-root dies; two die one after the other (the root
     * second, after the first recovery) */
    const mm_job_t jobs[] = {
        {.world = 4, .n_victims = 1, .victim = {0, -1}, .kill_at = {20, -1}},
        {.world = 4, .n_victims = 1, .victim = {3, -1}, .kill_at = {25, -1}},
        {.world = 5, .n_victims = 2, .victim = {2, 0}, .kill_at = {15, 45}},
        {.world = 4, .n_victims = 1, .victim = {1, -1}, .kill_at = {30, -1}},
    };
    const int n_jobs = (int)(sizeof jobs / sizeof jobs[0]);
    int fds[8];
    double rss[8];
    for (int l = 0; l < n_jobs; l++) {
        mm_job_t j = jobs[l];
        mm_next_endpoint(&j, l == 0);
        pid_t kids[2];
        mm_run_t r;
        mm_lifecycle(&j, kids, &r);
        fds[l] = mm_count_fds();
        rss[l] = mm_resident_mb();
        fprintf(stderr, "lifecycle %d: %d descriptors, %.1f MB resident after release\n", l,
                fds[l], rss[l]);
    }
    /* flat over the losses: the first lifecycle may load what later ones reuse */
    for (int l = 2; l < n_jobs; l++) {
        ASSERT_EQ_INT(fds[l], fds[1]);
#if !defined(__SANITIZE_ADDRESS__) /* ASan's quarantine keeps freed memory resident */
        ASSERT_TRUE(rss[l] - rss[1] < 4.0);
#endif
    }
}
