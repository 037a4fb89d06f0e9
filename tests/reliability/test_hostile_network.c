/* A hostile network against a live job (docs/reliability.md).
 *
 * CTest runs it with MEGAMOE_CLI set to the megamoe binary; the ranks are this binary again
 * under `megamoe launch`, with MM_HOSTILE_RANK_DIR set (a constructor runs the rank and exits
 * before the test harness's main).
 *
 * The test runs `megamoe launch -n 2` of a real workload (MegaMoeExperts forward+backward,
 * verified against the fp32 reference, bench/moe_job.c). Rank 0 tells the test its bootstrap
 * endpoint and starts listening; rank 1 waits for the test's go. During that bootstrap
 * window the test attacks rank 0's port on loopback: random bytes, partial frames, huge and
 * wrong lengths and types, HELLOs with a wrong MAC, slow senders, silent connections and a
 * burst of 100 connections at once. Then rank 1 joins while silent and slow connections are
 * still open, and while the job runs the test keeps trying to connect: rank 0 closed its
 * listener once every rank joined, so the kernel refuses those (nothing reaches the job).
 *
 * Checked: the job finishes with verified results; rank 0 logged exactly one refusal per
 * hostile connection it accepted, with the expected reason per kind; every connection after
 * the join was refused. The counts are printed (docs/reliability.md quotes them).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "harness/harness.h"
#include "moe_job.h"
#include "shmem/boot_net.h"
#include "shmem/bootstrap_test.h"

#define MM_MS 1000000ull

static char mm_dir[256];
static const char *mm_cli;

/* ---- the rank side ---- */

static int mm_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int mm_rank_main(const char *dir)
{
    const char *rank_s = getenv("RANK"), *ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    if (rank_s == NULL || ep == NULL) return 2;
    int rank = atoi(rank_s);
    char path[512], tmp[512];
    if (rank == 0) { /* tell the test where to attack (written whole, then renamed) */
        snprintf(tmp, sizeof tmp, "%s/endpoint.tmp", dir);
        snprintf(path, sizeof path, "%s/endpoint", dir);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%s\n", ep) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
            return 3;
    } else { /* the bootstrap window stays open until the test says go */
        snprintf(path, sizeof path, "%s/go", dir);
        for (int i = 0; i < 1200 && !mm_exists(path); i++) mm_sleep_ns(50 * MM_MS);
    }
    mm_moe_job_opts_t o;
    mm_moe_job_defaults(&o);
    o.T = 256;
    o.H = 256;
    o.I = 128;
    o.iters = 10;
    o.verify = 1;
    mm_moe_job_result_t r;
    int rc = mm_moe_job_rank(&o, &r);
    snprintf(path, sizeof path, "%s/rank%d.txt", dir, r.rank);
    if (mm_moe_job_write(path, &r) != 0) return 4;
    return rc;
}

/* ---- the attacker's tools ---- */

static struct sockaddr_in mm_target;

static int mm_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&mm_target, sizeof mm_target) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static void mm_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* closed by rank 0 already: fine */
        c += w;
        n -= (size_t)w;
    }
}

/* 1 when rank 0 closes the connection within timeout_ms (EOF or reset). */
static int mm_closed_by_peer(int fd, int timeout_ms)
{
    uint64_t end = mm_now_ns() + (uint64_t)timeout_ms * MM_MS;
    char buf[512];
    while (mm_now_ns() < end) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
    }
    return 0;
}

static void mm_header(uint8_t *h, int type, uint32_t len) { mm_frame_encode_header(h, type, len); }

/* Counters of the attack (by the reason rank 0 is expected to log). */
enum {
    MM_R_MAGIC,     /* "bad magic" */
    MM_R_OVERSIZED, /* "oversized frame" */
    MM_R_TYPE,      /* "malformed frame: type" */
    MM_R_SHORT,     /* "malformed hello" */
    MM_R_PEERCLOSE, /* "closed by the peer during the handshake" */
    MM_R_MAC,       /* "authentication failed" */
    MM_R_TOOMANY,   /* "too many unauthenticated connections" */
    MM_R_FINISHED,  /* "bootstrap finished before its handshake completed" */
    MM_R_COUNT
};
static const char *const mm_reason_text[MM_R_COUNT] = {
    "bad magic", "oversized frame", "malformed frame: type", "malformed hello",
    "closed by the peer during the handshake", "authentication failed",
    "too many unauthenticated connections", "bootstrap finished before its handshake completed"};
static const char *const mm_reason_name[MM_R_COUNT] = {
    "random bytes", "huge length", "wrong type", "short hello", "partial frame, then gone",
    "wrong MAC", "burst beyond 64 pending", "silent/slow at join"};
static int mm_expected[MM_R_COUNT];

static void mm_random_junk(uint8_t *buf, size_t n)
{
    if (getrandom(buf, n, 0) != (ssize_t)n) memset(buf, 0xa7, n);
    buf[0] = 'x'; /* never the frame magic by chance */
}

/* A HELLO from the real encoder, signed with the wrong token, after reading the challenge. */
static void mm_wrong_mac(int fd)
{
    void *body = NULL;
    size_t len = 0;
    mm_boot_wire_t w;
    mm_boot_test_wire(&w);
    if (mm_frame_recv(fd, MM_FRAME_CHALLENGE, w.challenge, &body, &len, mm_now_ns() + 2000 * MM_MS) !=
        MEGAMOE_OK) {
        free(body);
        return;
    }
    mm_boot_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = 1;
    cfg.world = 2;
    cfg.token = "not-this-job's-token";
    cfg.settings.world = 2;
    uint8_t hello[512], frame[MM_FRAME_HEADER + 512];
    mm_boot_test_hello(&cfg, body, hello);
    free(body);
    mm_header(frame, MM_FRAME_HELLO, (uint32_t)w.hello);
    memcpy(frame + MM_FRAME_HEADER, hello, w.hello);
    mm_send_all(fd, frame, MM_FRAME_HEADER + w.hello);
}

/* Slow senders: bytes trickle out, one every step_ms, on every connection at once. */
typedef struct mm_slow {
    int fd;
    uint8_t data[MM_FRAME_HEADER + 256];
    size_t n, sent;
} mm_slow_t;

static void mm_trickle(mm_slow_t *s, int count, int step_ms, size_t upto)
{
    for (;;) {
        int busy = 0;
        for (int i = 0; i < count; i++) {
            size_t stop = s[i].n < upto ? s[i].n : upto;
            if (s[i].sent >= stop) continue;
            busy = 1;
            mm_send_all(s[i].fd, s[i].data + s[i].sent, 1);
            s[i].sent++;
        }
        if (!busy) return;
        mm_sleep_ns((uint64_t)step_ms * MM_MS);
    }
}

/* ---- the test ---- */

/* The test and its job in a network namespace of their own (loopback only) when the process
 * may create one: no other process on the host can take the freed port or be hit by the
 * burst. Returns 1 when isolated. */
static int mm_isolate(void)
{
    if (unshare(CLONE_NEWNET) != 0) return 0;
    int s = socket(AF_INET, SOCK_DGRAM, 0), ok = 0;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        ok = ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    }
    if (s >= 0) close(s);
    return ok;
}

static pid_t mm_start_job(void)
{
    char log[512], self[4096];
    snprintf(log, sizeof log, "%s/launch.log", mm_dir);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        setenv("MM_HOSTILE_RANK_DIR", mm_dir, 1);
        execl(mm_cli, mm_cli, "launch", "-n", "2", "--timeout", "300", "--", self, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Refusals in rank 0's log with this reason; a peer that leaves shows as a close or, when it
 * left unread data (the challenge) behind, as a reset. */
static int mm_count_log(int k, int *total)
{
    const char *reason = mm_reason_text[k];
    const char *alt = k == MM_R_PEERCLOSE ? "receive failed: Connection reset by peer" : NULL;
    char path[512], line[2048];
    snprintf(path, sizeof path, "%s/launch.log", mm_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int n = 0, all = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "[rank 0]", 8) != 0 || !strstr(line, "bootstrap: closed connection from"))
            continue;
        all++;
        if (strstr(line, reason) || (alt && strstr(line, alt))) n++;
    }
    fclose(f);
    if (total) *total = all;
    return n;
}

MM_TEST(hostile_network_against_a_live_job)
{
    mm_cli = getenv("MEGAMOE_CLI");
    ASSERT_TRUE(mm_cli != NULL); /* set by CTest: the megamoe binary */
    signal(SIGPIPE, SIG_IGN);
    int isolated = mm_isolate();
    printf("network: %s\n", isolated ? "a namespace of its own (loopback only)"
                                      : "the host's loopback (no namespace: not root?)");
    snprintf(mm_dir, sizeof mm_dir, "/tmp/megamoe-hostile-XXXXXX");
    ASSERT_TRUE(mkdtemp(mm_dir) != NULL);
    pid_t job = mm_start_job();
    ASSERT_TRUE(job > 0);
    /* rank 0's endpoint */
    char path[512], text[128] = "";
    snprintf(path, sizeof path, "%s/endpoint", mm_dir);
    for (int i = 0; i < 600 && !mm_exists(path); i++) mm_sleep_ns(50 * MM_MS);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(fgets(text, sizeof text, f) != NULL);
    fclose(f);
    text[strcspn(text, "\n")] = '\0';
    mm_endpoint_t ep;
    ASSERT_OK(mm_endpoint_parse(text, "endpoint", &ep));
    ASSERT_EQ_STR(ep.host, "127.0.0.1"); /* loopback only */
    memset(&mm_target, 0, sizeof mm_target);
    mm_target.sin_family = AF_INET;
    mm_target.sin_port = htons((uint16_t)ep.port);
    mm_target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int probe = -1;
    for (int i = 0; i < 600 && (probe = mm_connect()) < 0; i++) mm_sleep_ns(20 * MM_MS);
    ASSERT_TRUE(probe >= 0);
    close(probe); /* rank 0 listens; this one is a peer closing during the handshake */
    mm_expected[MM_R_PEERCLOSE]++;
    double t0 = mm_now_s();

    /* 1. random bytes, 4 KiB each */
    uint8_t junk[4096];
    for (int i = 0; i < 8; i++) {
        int fd = mm_connect();
        ASSERT_TRUE(fd >= 0);
        mm_random_junk(junk, sizeof junk);
        mm_send_all(fd, junk, sizeof junk);
        ASSERT_TRUE(mm_closed_by_peer(fd, 5000));
        close(fd);
        mm_expected[MM_R_MAGIC]++;
    }
    /* 2. huge and wrong lengths, wrong types */
    const struct {
        int type;
        uint32_t len;
        int reason;
    } frames[] = {{MM_FRAME_HELLO, 1u << 30, MM_R_OVERSIZED},    {MM_FRAME_HELLO, UINT32_MAX, MM_R_OVERSIZED},
                  {MM_FRAME_HELLO, 1u << 20, MM_R_OVERSIZED},    {MM_FRAME_HELLO, 113, MM_R_OVERSIZED},
                  {MM_FRAME_HELLO, 8, MM_R_SHORT},               {MM_FRAME_HELLO, 0, MM_R_SHORT},
                  {MM_FRAME_CONTRIB, 16 + 8, MM_R_TYPE},         {MM_FRAME_RESULT, 1u << 31, MM_R_TYPE},
                  {0x7fff, 4, MM_R_TYPE}};
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        int fd = mm_connect();
        ASSERT_TRUE(fd >= 0);
        uint8_t h[MM_FRAME_HEADER];
        mm_header(h, frames[i].type, frames[i].len);
        mm_send_all(fd, h, sizeof h);
        ASSERT_TRUE(mm_closed_by_peer(fd, 5000));
        close(fd);
        mm_expected[frames[i].reason]++;
    }
    /* 3. partial frames, then the attacker leaves */
    for (int i = 0; i < 4; i++) {
        int fd = mm_connect();
        ASSERT_TRUE(fd >= 0);
        uint8_t h[MM_FRAME_HEADER];
        mm_header(h, MM_FRAME_HELLO, 112);
        mm_send_all(fd, h, (size_t)(3 * i + 1)); /* 1, 4, 7, 10 bytes of the header */
        mm_sleep_ns(30 * MM_MS);
        close(fd);
        mm_expected[MM_R_PEERCLOSE]++;
    }
    /* 4. complete HELLOs with a wrong MAC */
    for (int i = 0; i < 3; i++) {
        int fd = mm_connect();
        ASSERT_TRUE(fd >= 0);
        mm_wrong_mac(fd);
        ASSERT_TRUE(mm_closed_by_peer(fd, 5000));
        close(fd);
        mm_expected[MM_R_MAC]++;
    }
    /* 5. slow senders: random bytes one per 40 ms (closed when the 12-byte header is in), and
     *    a HELLO header whose body trickles: still incomplete when rank 1 joins */
    mm_slow_t slow[6];
    memset(slow, 0, sizeof slow);
    for (int i = 0; i < 6; i++) {
        slow[i].fd = mm_connect();
        ASSERT_TRUE(slow[i].fd >= 0);
        slow[i].n = MM_FRAME_HEADER + 112;
        if (i < 3) {
            mm_random_junk(slow[i].data, slow[i].n);
        } else {
            mm_header(slow[i].data, MM_FRAME_HELLO, 112);
            mm_random_junk(slow[i].data + MM_FRAME_HEADER, 112);
        }
    }
    mm_trickle(slow, 6, 40, MM_FRAME_HEADER + 20);
    for (int i = 0; i < 3; i++) {
        ASSERT_TRUE(mm_closed_by_peer(slow[i].fd, 5000));
        close(slow[i].fd);
        mm_expected[MM_R_MAGIC]++;
    }
    /* 6. a burst of 100 connections at once: 64 may wait for their handshake (3 slow ones
     *    already do), the others are refused at once */
    int burst[100], refused = 0, waiting = 0;
    int gone[100] = {0};
    for (int i = 0; i < 100; i++) burst[i] = mm_connect();
    for (int i = 0; i < 100; i++) ASSERT_TRUE(burst[i] >= 0);
    /* rank 0 accepts them all and closes the excess at once: count until it stops changing */
    for (int stable = 0, round = 0; stable < 3 && round < 100; round++) {
        int before = refused;
        mm_sleep_ns(100 * MM_MS);
        for (int i = 0; i < 100; i++)
            if (!gone[i] && mm_closed_by_peer(burst[i], 1)) gone[i] = 1, refused++;
        stable = refused == before && refused > 0 ? stable + 1 : 0;
    }
    waiting = 100 - refused;
    ASSERT_TRUE(refused > 0 && waiting > 0);
    for (int i = 0; i < 100; i++) close(burst[i]);
    mm_expected[MM_R_TOOMANY] += refused;
    mm_expected[MM_R_PEERCLOSE] += waiting;
    /* 7. silent connections (one after half a header), still open when rank 1 joins */
    int silent[4];
    for (int i = 0; i < 4; i++) {
        silent[i] = mm_connect();
        ASSERT_TRUE(silent[i] >= 0);
    }
    uint8_t h[MM_FRAME_HEADER];
    mm_header(h, MM_FRAME_HELLO, 112);
    mm_send_all(silent[0], h, 6);
    mm_sleep_ns(100 * MM_MS);
    double window = mm_now_s() - t0;

    /* rank 1 joins now, the slow and silent connections still open */
    snprintf(path, sizeof path, "%s/go", mm_dir);
    f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    double go = mm_now_s();
    for (int i = 3; i < 6; i++) mm_expected[MM_R_FINISHED]++;
    mm_expected[MM_R_FINISHED] += 4;
    /* the job forms although they never finish: rank 0 closes them */
    int closed_at_join = 0;
    for (int i = 0; i < 4; i++) closed_at_join += mm_closed_by_peer(silent[i], 20000);
    for (int i = 3; i < 6; i++) closed_at_join += mm_closed_by_peer(slow[i].fd, 5000);
    double joined = mm_now_s() - go;
    for (int i = 0; i < 4; i++) close(silent[i]);
    for (int i = 3; i < 6; i++) close(slow[i].fd);
    ASSERT_EQ_INT(closed_at_join, 7);

    /* after the join: the listener is closed, every attempt is refused by the kernel */
    int after = 0, after_refused = 0, after_other = 0, status = 0;
    pid_t done = 0;
    while ((done = waitpid(job, &status, WNOHANG)) == 0 && after < 200) {
        int n_at_once = after % 40 == 0 ? 20 : 1; /* now and then 20 at once */
        for (int k = 0; k < n_at_once; k++) {
            int fd = mm_connect();
            after++;
            if (fd < 0 && errno == ECONNREFUSED) {
                after_refused++;
            } else if (fd >= 0) {
                after_other++; /* someone listens: say nothing and leave */
                close(fd);
            } else {
                after_other++;
            }
        }
        mm_sleep_ns(25 * MM_MS);
    }
    if (done == 0) done = waitpid(job, &status, 0);
    ASSERT_EQ_INT(done, job);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ_INT(WEXITSTATUS(status), 0);
    ASSERT_TRUE(after > 0);
    ASSERT_EQ_INT(after_refused, after);

    /* verified results on both ranks */
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/rank%d.txt", mm_dir, r);
        mm_moe_job_result_t res;
        ASSERT_EQ_INT(mm_moe_job_read(path, &res), 0);
        ASSERT_EQ_STR(res.error, "");
        ASSERT_TRUE(res.verified);
        ASSERT_TRUE(res.n_checks == 5);
        for (int c = 0; c < res.n_checks; c++)
            if (!res.checks[c].pass) MM_FAIL_("rank %d: %s does not match the reference", r, res.checks[c].name);
        unlink(path);
    }
    /* one logged refusal per hostile connection, with its reason */
    int total_logged = 0, total_expected = 0, mismatch = -1;
    printf("hostile connections during the bootstrap window (%.1f s), refusals rank 0 logged:\n",
           window);
    for (int k = 0; k < MM_R_COUNT; k++) {
        int got = mm_count_log(k, &total_logged);
        printf("  %-26s %3d connections, %3d logged \"%s\"%s\n", mm_reason_name[k],
               mm_expected[k], got, mm_reason_text[k], k == MM_R_PEERCLOSE ? " (or reset)" : "");
        total_expected += mm_expected[k];
        if (got != mm_expected[k]) mismatch = k;
    }
    printf("  total %d connections, %d refusals logged; rank 1 joined %.2f s after go with 7 "
           "hostile connections open\n",
           total_expected, total_logged, joined);
    printf("after the join: %d connection attempts during the run, %d refused by the kernel "
           "(listener closed), %d other\n",
           after, after_refused, after_other);
    if (mismatch >= 0) MM_FAIL_("%s: not one logged refusal per connection", mm_reason_name[mismatch]);
    ASSERT_EQ_INT(total_logged, total_expected);
    snprintf(path, sizeof path, "%s/launch.log", mm_dir);
    if (!mm_test_failed()) unlink(path);
    snprintf(path, sizeof path, "%s/endpoint", mm_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/go", mm_dir);
    unlink(path);
    if (!mm_test_failed()) rmdir(mm_dir);
    else printf("logs kept in %s\n", mm_dir);
}

/* Rank mode: the job's ranks are this binary (see the top). */
__attribute__((constructor)) static void mm_rank_mode(void)
{
    const char *dir = getenv("MM_HOSTILE_RANK_DIR");
    if (dir != NULL) exit(mm_rank_main(dir));
}
