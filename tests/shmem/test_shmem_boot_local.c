/* The bootstrap object in one process, one thread per rank: duplicate ranks, settings
 * mismatch, control collectives, collectives called in different orders, timeouts, lost
 * peers, a foreign listener that cannot prove the token, a busy port. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "shmem/bootstrap.h"
#include "shmem/shmem_log.h"
#include "shmem_test_util.h"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

typedef struct mm_rank_ctx {
    mm_boot_config_t cfg;
    mm_boot_t *boot;
    megamoe_status_t st;
    char err[1024];
    int script; /* what to run after joining */
    int out[8];
} mm_rank_ctx_t;

static mm_endpoint_t mm_local_ep(void)
{
    char text[64];
    snprintf(text, sizeof text, "tcp://127.0.0.1:%d", mm_t_free_port());
    mm_endpoint_t ep;
    mm_endpoint_parse(text, "test", &ep);
    return ep;
}

static mm_boot_config_t mm_cfg(const mm_endpoint_t *ep, int rank, int world, double timeout_s)
{
    mm_boot_config_t c;
    memset(&c, 0, sizeof c);
    c.rank = rank;
    c.world = world;
    c.endpoint = *ep;
    c.token = "local-token";
    c.settings.heap_size = 1u << 20;
    c.settings.world = (uint32_t)world;
    snprintf(c.settings.version, sizeof c.settings.version, "test");
    c.timeout_ns = (uint64_t)(timeout_s * 1e9);
    return c;
}

enum { MM_SCRIPT_NONE, MM_SCRIPT_COLLECTIVES, MM_SCRIPT_DIVERGE, MM_SCRIPT_LATE_BARRIER };

static void *mm_rank_main(void *arg)
{
    mm_rank_ctx_t *c = arg;
    c->st = mm_boot_create(&c->cfg, &c->boot);
    if (c->st != MEGAMOE_OK || c->script == MM_SCRIPT_NONE) goto out;
    int r = c->cfg.rank, w = c->cfg.world;
    if (c->script == MM_SCRIPT_COLLECTIVES) {
        int mine = 100 + r, all[8] = {0};
        c->st = mm_boot_allgather(c->boot, &mine, sizeof mine, all);
        for (int i = 0; i < w; i++) c->out[i] = all[i];
        int v = r == 2 ? 4242 : 0;
        if (c->st == MEGAMOE_OK) c->st = mm_boot_bcast(c->boot, &v, sizeof v, 2);
        c->out[7] = v;
        if (c->st == MEGAMOE_OK) c->st = mm_boot_barrier(c->boot);
        if (c->st == MEGAMOE_OK) c->st = mm_boot_agree(c->boot, MEGAMOE_OK);
        if (c->st == MEGAMOE_OK) {
            megamoe_status_t local = MEGAMOE_OK;
            if (r == 1) local = mm_error(MEGAMOE_TIMEOUT, "rank one is slow");
            c->st = mm_boot_agree(c->boot, local);
        }
    } else if (c->script == MM_SCRIPT_DIVERGE) {
        int mine = r, all[8];
        c->st = r == 1 ? mm_boot_barrier(c->boot) : mm_boot_allgather(c->boot, &mine, sizeof mine, all);
        snprintf(c->err, sizeof c->err, "%s", megamoe_last_error());
        /* broken from now on: the same error again, at once */
        megamoe_status_t again = mm_boot_barrier(c->boot);
        c->out[0] = again == c->st && strcmp(c->err, megamoe_last_error()) == 0;
        goto out_keep_err;
    } else if (c->script == MM_SCRIPT_LATE_BARRIER) {
        if (r == 1) mm_sleep_ns(1500000000ull);
        c->st = mm_boot_barrier(c->boot);
    }
out:
    snprintf(c->err, sizeof c->err, "%s", megamoe_last_error());
out_keep_err:
    return NULL;
}

static void mm_start(mm_rank_ctx_t *c, pthread_t *th) { pthread_create(th, NULL, mm_rank_main, c); }

MM_TEST(duplicate_rank_is_rejected_and_collectives_work)
{
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "1", 1);
    mm_shmem_log_reload();
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    mm_endpoint_t ep = mm_local_ep();
    mm_rank_ctx_t c[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        memset(&c[r], 0, sizeof c[r]);
        c[r].cfg = mm_cfg(&ep, r, 3, 20);
        c[r].script = MM_SCRIPT_COLLECTIVES;
    }
    mm_start(&c[0], &th[0]);
    mm_start(&c[1], &th[1]);
    double end = mm_now_s() + 10;
    while (!mm_t_log_has(&mm_log, "bootstrap: rank 1 joined") && mm_now_s() < end) mm_sleep_ns(5000000);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "bootstrap: rank 1 joined"));
    /* a second rank 1 with the right token is refused; the job goes on */
    mm_rank_ctx_t dup;
    memset(&dup, 0, sizeof dup);
    dup.cfg = mm_cfg(&ep, 1, 3, 20);
    mm_rank_main(&dup);
    ASSERT_STATUS(dup.st, MEGAMOE_IO);
    ASSERT_CONTAINS(dup.err, "duplicate rank 1");
    mm_start(&c[2], &th[2]);
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    megamoe_log_set_callback(NULL, NULL);
    unsetenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL");
    mm_shmem_log_reload();
    for (int r = 0; r < 3; r++) {
        ASSERT_STATUS(c[r].st, MEGAMOE_TIMEOUT); /* the agree with rank 1 failing */
        ASSERT_EQ_STR(c[r].err, "rank 1: TIMEOUT: rank one is slow");
        for (int i = 0; i < 3; i++) ASSERT_EQ_INT(c[r].out[i], 100 + i);
        ASSERT_EQ_INT(c[r].out[7], 4242);
        ASSERT_EQ_INT(mm_boot_rank(c[r].boot), r);
        ASSERT_EQ_INT(mm_boot_world(c[r].boot), 3);
    }
    ASSERT_TRUE(mm_boot_fd(c[0].boot, 2) >= 0);
    ASSERT_TRUE(mm_boot_fd(c[1].boot, 0) >= 0);
    ASSERT_EQ_INT(mm_boot_fd(c[1].boot, 2), -1);
    for (int r = 0; r < 3; r++) mm_boot_destroy(c[r].boot);
}

MM_TEST(different_collectives_are_a_mismatch_on_every_rank)
{
    mm_endpoint_t ep = mm_local_ep();
    mm_rank_ctx_t c[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        memset(&c[r], 0, sizeof c[r]);
        c[r].cfg = mm_cfg(&ep, r, 3, 20);
        c[r].script = MM_SCRIPT_DIVERGE;
        mm_start(&c[r], &th[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        ASSERT_STATUS(c[r].st, MEGAMOE_CONFIG_MISMATCH);
        ASSERT_EQ_STR(c[r].err, c[0].err);
        ASSERT_EQ_INT(c[r].out[0], 1);
        mm_boot_destroy(c[r].boot);
    }
    ASSERT_CONTAINS(c[0].err, "rank 1 called barrier #1 with 0 bytes while rank 0 called allgather");
}

MM_TEST(settings_mismatch_is_the_same_error_everywhere)
{
    mm_endpoint_t ep = mm_local_ep();
    mm_rank_ctx_t c[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&c[r], 0, sizeof c[r]);
        c[r].cfg = mm_cfg(&ep, r, 2, 20);
    }
    snprintf(c[1].cfg.settings.version, sizeof c[1].cfg.settings.version, "other");
    for (int r = 0; r < 2; r++) mm_start(&c[r], &th[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(c[r].st, MEGAMOE_CONFIG_MISMATCH);
        ASSERT_EQ_STR(c[r].err, c[0].err);
    }
    ASSERT_CONTAINS(c[0].err, "rank 1 runs megamoe other");
    /* world size differs */
    ep = mm_local_ep();
    for (int r = 0; r < 2; r++) {
        memset(&c[r], 0, sizeof c[r]);
        c[r].cfg = mm_cfg(&ep, r, 2, 20);
    }
    c[1].cfg.world = 3;
    c[1].cfg.settings.world = 3;
    for (int r = 0; r < 2; r++) mm_start(&c[r], &th[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) ASSERT_STATUS(c[r].st, MEGAMOE_CONFIG_MISMATCH);
    ASSERT_EQ_STR(c[1].err, c[0].err);
    ASSERT_CONTAINS(c[0].err, "rank 1 has world size 3, rank 0 has 2");
}

MM_TEST(timeouts_and_lost_peers)
{
    /* nobody listens */
    mm_endpoint_t ep = mm_local_ep();
    mm_rank_ctx_t c[2];
    pthread_t th[2];
    memset(&c[1], 0, sizeof c[1]);
    c[1].cfg = mm_cfg(&ep, 1, 2, 1);
    mm_rank_main(&c[1]);
    ASSERT_STATUS(c[1].st, MEGAMOE_TIMEOUT);
    ASSERT_CONTAINS(c[1].err, "cannot reach rank 0");
    /* nobody joins */
    memset(&c[0], 0, sizeof c[0]);
    c[0].cfg = mm_cfg(&ep, 0, 2, 1);
    mm_rank_main(&c[0]);
    ASSERT_STATUS(c[0].st, MEGAMOE_TIMEOUT);
    ASSERT_CONTAINS(c[0].err, "rank(s) 1 did not join");
    /* a rank that reaches a collective too late: both get the same TIMEOUT */
    ep = mm_local_ep();
    for (int r = 0; r < 2; r++) {
        memset(&c[r], 0, sizeof c[r]);
        c[r].cfg = mm_cfg(&ep, r, 2, 1);
        c[r].script = MM_SCRIPT_LATE_BARRIER;
        mm_start(&c[r], &th[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(c[r].st, MEGAMOE_TIMEOUT);
        ASSERT_EQ_STR(c[r].err, c[0].err);
        mm_boot_destroy(c[r].boot);
    }
    ASSERT_CONTAINS(c[0].err, "did not reach bootstrap barrier");
    /* a peer that goes away: its connection closing is PEER_LOST, on either side */
    for (int lost = 0; lost < 2; lost++) {
        ep = mm_local_ep();
        for (int r = 0; r < 2; r++) {
            memset(&c[r], 0, sizeof c[r]);
            c[r].cfg = mm_cfg(&ep, r, 2, 20);
            mm_start(&c[r], &th[r]);
        }
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        ASSERT_OK(c[0].st);
        ASSERT_OK(c[1].st);
        mm_boot_destroy(c[lost].boot);
        int other = 1 - lost;
        ASSERT_STATUS(mm_boot_barrier(c[other].boot), MEGAMOE_PEER_LOST);
        char want[32];
        snprintf(want, sizeof want, "rank %d lost", lost);
        ASSERT_CONTAINS(megamoe_last_error(), want);
        mm_boot_destroy(c[other].boot);
    }
}

typedef struct {
    int lfd;
} mm_fake_t;

/* A listener that speaks the protocol but does not know the token. */
static void *mm_fake_server(void *arg)
{
    mm_fake_t *f = arg;
    struct pollfd p = {f->lfd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) return NULL;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t ch[36] = {0};
    mm_put_u32(ch + 32, MM_BOOT_PROTO);
    mm_frame_send(fd, MM_FRAME_CHALLENGE, ch, sizeof ch, NULL, 0, mm_now_ns() + 2000000000ull);
    void *body = NULL;
    size_t len = 0;
    int type = 0;
    mm_frame_recv_any(fd, 4096, &type, &body, &len, mm_now_ns() + 2000000000ull);
    free(body);
    uint8_t proof[32];
    memset(proof, 0x42, sizeof proof);
    mm_frame_send(fd, MM_FRAME_ACCEPT, proof, sizeof proof, NULL, 0, mm_now_ns() + 2000000000ull);
    mm_sleep_ns(200000000ull);
    close(fd);
    return NULL;
}

MM_TEST(foreign_listener_and_busy_port)
{
    mm_endpoint_t ep = mm_local_ep();
    mm_fake_t f;
    ASSERT_OK(mm_net_listen(&ep, &f.lfd));
    pthread_t th;
    pthread_create(&th, NULL, mm_fake_server, &f);
    mm_rank_ctx_t c;
    memset(&c, 0, sizeof c);
    c.cfg = mm_cfg(&ep, 1, 2, 5);
    mm_rank_main(&c);
    pthread_join(th, NULL);
    ASSERT_STATUS(c.st, MEGAMOE_IO);
    ASSERT_CONTAINS(c.err, "could not prove it holds this job's MEGAMOE_JOB_TOKEN");
    /* rank 0 cannot listen on a port that is taken */
    memset(&c, 0, sizeof c);
    c.cfg = mm_cfg(&ep, 0, 2, 5);
    mm_rank_main(&c);
    ASSERT_STATUS(c.st, MEGAMOE_IO);
    ASSERT_CONTAINS(c.err, "cannot listen on");
    close(f.lfd);
}
