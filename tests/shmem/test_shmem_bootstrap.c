/* Hostile connections to the bootstrap port (run under `megamoe launch -n 2`).
 *
 * Before joining, rank 1 attacks rank 0's endpoint: random bytes, an oversized frame, a
 * malformed hello, a wrong frame type, a full handshake with a wrong job token, an
 * unexpected rank, and two connections that stay silent (one after half a header). Each
 * bad connection must be closed by rank 0 with a logged reason, and the silent ones must not
 * delay the legitimate join: rank 1 then acquires well before the handshake timeout while
 * they are still open. Rank 0 must come out working (data is exchanged afterwards).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

#include "shmem/bootstrap.h"
#include "shmem_test_util.h"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int mm_connect_retry(const mm_endpoint_t *ep)
{
    for (int i = 0; i < 400; i++) {
        int fd = -1;
        if (mm_net_connect(ep, mm_now_ns() + 1000000000ull, &fd) == MEGAMOE_OK) return fd;
        mm_sleep_ns(25000000ull);
    }
    return -1;
}

/* 1 when the peer closes the connection within timeout_s (EOF or reset). */
static int mm_closed_by_peer(int fd, double timeout_s)
{
    double end = mm_now_s() + timeout_s;
    char buf[256];
    while (mm_now_s() < end) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
    }
    return 0;
}

static int mm_send_raw(int fd, const void *buf, size_t len)
{
    return mm_net_write_all(fd, buf, len, mm_now_ns() + 2000000000ull) == MEGAMOE_OK;
}

static mm_boot_config_t mm_cfg(const mm_endpoint_t *ep, const char *token, int rank, int world)
{
    mm_boot_config_t c;
    memset(&c, 0, sizeof c);
    c.rank = rank;
    c.world = world;
    c.endpoint = *ep;
    c.token = token;
    c.settings.heap_size = 64u << 20;
    c.settings.world = (uint32_t)world;
    c.timeout_ns = 10000000000ull;
    return c;
}

static void mm_attack(const mm_endpoint_t *ep, const char *token, int *silent)
{
    int fd = mm_connect_retry(ep);
    ASSERT_TRUE(fd >= 0);
    uint8_t junk[4096];
    ASSERT_EQ_INT(getrandom(junk, sizeof junk, 0), (long)sizeof junk);
    junk[0] ^= 0x5a; /* never the magic by accident */
    ASSERT_TRUE(mm_send_raw(fd, junk, sizeof junk));
    ASSERT_TRUE(mm_closed_by_peer(fd, 5.0));
    close(fd);

    uint8_t hdr[MM_FRAME_HEADER];
    const struct {
        int type;
        uint32_t len;
    } frames[] = {{MM_FRAME_HELLO, 1u << 30}, {MM_FRAME_HELLO, 8}, {MM_FRAME_CONTRIB, 16}};
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        fd = mm_connect_retry(ep);
        ASSERT_TRUE(fd >= 0);
        mm_frame_encode_header(hdr, frames[i].type, frames[i].len);
        ASSERT_TRUE(mm_send_raw(fd, hdr, sizeof hdr));
        ASSERT_TRUE(mm_closed_by_peer(fd, 5.0));
        close(fd);
    }

    /* a real handshake with the wrong token, then with a rank outside the job */
    mm_boot_t *b = NULL;
    mm_boot_config_t c = mm_cfg(ep, "not-the-job-token", 1, 2);
    ASSERT_STATUS(mm_boot_create(&c, &b), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "authentication failed");
    c = mm_cfg(ep, token, 7, 8);
    ASSERT_STATUS(mm_boot_create(&c, &b), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "unexpected rank 7");

    /* two connections that never complete a handshake stay open during the real join */
    silent[0] = mm_connect_retry(ep);
    silent[1] = mm_connect_retry(ep);
    ASSERT_TRUE(silent[0] >= 0 && silent[1] >= 0);
    mm_frame_encode_header(hdr, MM_FRAME_HELLO, 100);
    ASSERT_TRUE(mm_send_raw(silent[1], hdr, 5));
}

MM_TEST(hostile_connections_do_not_hurt_rank_0)
{
    mm_shmem_params_t p = mm_t_params();
    int me = mm_test_rank();
    if (me == 0) {
        megamoe_log_set_callback(mm_t_log_sink, &mm_log);
        ASSERT_OK(mm_shmem_acquire(&p));
        megamoe_log_set_callback(NULL, NULL);
        static const char *const reasons[] = {
            "malformed frame: bad magic", "oversized frame: 1073741824 bytes",
            "malformed hello: 8 bytes", "malformed frame: type 6",
            "authentication failed", "unexpected rank 7",
            "bootstrap finished before its handshake completed"};
        for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
            if (!mm_t_log_has(&mm_log, reasons[i])) MM_FAIL_("rank 0 did not log '%s'", reasons[i]);
    } else {
        const char *text = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
        const char *token = getenv("MEGAMOE_JOB_TOKEN");
        ASSERT_TRUE(text && token);
        mm_endpoint_t ep;
        ASSERT_OK(mm_endpoint_parse(text, "endpoint", &ep));
        int silent[2] = {-1, -1};
        mm_attack(&ep, token, silent);
        if (mm_test_failed()) return;
        double t0 = mm_now_s();
        ASSERT_OK(mm_shmem_acquire(&p));
        double join = mm_now_s() - t0, bound = 2.5 * mm_test_timeout_multiplier();
        fprintf(stderr, "joined in %.3f s with 2 silent connections open\n", join);
        ASSERT_TRUE(join < (bound < 8.0 ? bound : 8.0)); /* handshake timeout is 10 s */
        /* rank 0 dropped them when the job was complete */
        ASSERT_TRUE(mm_closed_by_peer(silent[0], 2.0));
        ASSERT_TRUE(mm_closed_by_peer(silent[1], 2.0));
        close(silent[0]);
        close(silent[1]);
    }
    /* the job works */
    int n = mm_shmem_n_pes();
    uint8_t *buf = NULL, src[10000];
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(sizeof src, 64, (void **)&buf));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    mm_t_fill(src, sizeof src, me, 11);
    mm_shmem_put_signal(buf, src, sizeof src, sig, 1, MM_SHMEM_SIGNAL_SET, (me + 1) % n);
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 1, NULL));
    ASSERT_EQ_INT(mm_t_check(buf, sizeof src, (me + n - 1) % n, 11), -1);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(buf));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}
