/* Fuzz target: the bootstrap wire protocol (src/shmem/bootstrap.c, boot_net.c) — every
 * message type, frame lengths, the HMAC handshake, truncated and oversized frames — against
 * the real code on loopback sockets.
 *
 * Two modes, chosen by the first input byte:
 *   server: the real rank 0 (mm_boot_create in a thread) faces up to three hostile
 *           connections driven by the input: raw bytes, frames of any type and length,
 *           HELLOs built by the real encoder (bootstrap_test.h) with bytes flipped and the
 *           MAC recomputed or not, cut short or left open. A connection that joins as rank 1
 *           then sends collective contributions of any shape. Otherwise a legitimate rank 1
 *           joins afterwards and rank 0 must accept it and run the collective correctly:
 *           hostile connections never stop a job from forming.
 *   client: the real rank 1 (mm_boot_create in a thread) talks to a hostile rank 0 played
 *           by the input: any CHALLENGE, an ACCEPT with the right or a wrong proof, REJECT
 *           texts, VERDICT statuses, RESULT frames of any shape.
 * Either side must end with a status (never crash, hang or leak); with well-formed
 * messages the job forms and the collective's result is right.
 *
 * The harness runs in a network namespace of its own when it can (unshare), so it never
 * talks to anyone else's port; otherwise it checks that a port it connects to is held by
 * this process.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "megamoe/log.h"

#include "base/clock.h"
#include "fuzz.h"
#include "shmem/boot_net.h"
#include "shmem/bootstrap.h"
#include "shmem/bootstrap_test.h"

#define MM_TOKEN "fuzz-job-token"
#define MM_MS 1000000ull

static mm_boot_wire_t mm_wire;
static int mm_isolated;

static void mm_fz_silent(megamoe_log_level_t level, const char *line, void *user)
{
    (void)level, (void)line, (void)user;
}

/* A network namespace of our own with only loopback up. */
static void mm_isolate(void)
{
    if (unshare(CLONE_NEWNET) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) return;
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        mm_isolated = ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    }
    if (s >= 0) close(s);
}

/* Without a namespace: 1 when this process holds the socket listening on 127.0.0.1:port. */
static int mm_port_is_ours(int port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    if (f == NULL) return 0;
    char line[512];
    unsigned long inode = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned la, lp, ra, rp, st;
        unsigned long ino;
        if (sscanf(line, " %*d: %x:%x %x:%x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &la, &lp, &ra, &rp,
                   &st, &ino) == 6 &&
            la == htonl(INADDR_LOOPBACK) && (int)lp == port && st == 0x0a)
            inode = ino;
    }
    fclose(f);
    if (inode == 0) return 0;
    DIR *d = opendir("/proc/self/fd");
    int ours = 0;
    struct dirent *de;
    char want[64], path[300], link[64];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    while (d && !ours && (de = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = '\0';
            ours = strcmp(link, want) == 0;
        }
    }
    if (d) closedir(d);
    return ours;
}

static int mm_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static mm_endpoint_t mm_ep(int port)
{
    char text[64];
    snprintf(text, sizeof text, "tcp://127.0.0.1:%d", port);
    mm_endpoint_t ep;
    FUZZ_CHECK(mm_endpoint_parse(text, "fuzz", &ep) == MEGAMOE_OK, "endpoint");
    return ep;
}

static mm_boot_config_t mm_cfg(const mm_endpoint_t *ep, int rank, uint64_t timeout_ms)
{
    mm_boot_config_t c;
    memset(&c, 0, sizeof c);
    c.rank = rank;
    c.world = 2;
    c.endpoint = *ep;
    c.token = MM_TOKEN;
    c.settings.heap_size = 1u << 20;
    c.settings.layout = 7;
    c.settings.world = 2;
    snprintf(c.settings.version, sizeof c.settings.version, "fuzz");
    c.timeout_ns = timeout_ms * MM_MS;
    c.handshake_timeout_ns = 10000 * MM_MS; /* generous: a loaded machine must not fail a join */
    return c;
}

/* ---- one real rank in a thread: join, then one collective ---- */

enum { MM_OP_NONE, MM_OP_BARRIER, MM_OP_ALLGATHER, MM_OP_BCAST, MM_OP_AGREE, MM_OP_COUNT };

typedef struct mm_rank {
    mm_boot_config_t cfg;
    int op;
    megamoe_status_t st, op_st;
    char error[256]; /* the rank's last error */
    uint64_t out[2];
    pthread_t th;
} mm_rank_t;

static void *mm_rank_main(void *arg)
{
    mm_rank_t *r = arg;
    mm_boot_t *b = NULL;
    r->st = mm_boot_create(&r->cfg, &b);
    r->op_st = MEGAMOE_OK;
    snprintf(r->error, sizeof r->error, "%s", megamoe_last_error());
    if (r->st != MEGAMOE_OK) return NULL;
    uint64_t mine = 1000 + (uint64_t)r->cfg.rank;
    switch (r->op) {
    case MM_OP_BARRIER: r->op_st = mm_boot_barrier(b); break;
    case MM_OP_ALLGATHER: r->op_st = mm_boot_allgather(b, &mine, sizeof mine, r->out); break;
    case MM_OP_BCAST:
        r->out[0] = mine;
        r->op_st = mm_boot_bcast(b, &r->out[0], sizeof r->out[0], 0);
        break;
    case MM_OP_AGREE: r->op_st = mm_boot_agree(b, MEGAMOE_OK); break;
    default: break;
    }
    mm_boot_destroy(b);
    return NULL;
}

static void mm_rank_start(mm_rank_t *r)
{
    FUZZ_CHECK(pthread_create(&r->th, NULL, mm_rank_main, r) == 0, "pthread_create");
}

static void mm_rank_check_result(const mm_rank_t *r)
{
    FUZZ_CHECK(r->op_st == MEGAMOE_OK, "rank %d: collective %d failed: %s", r->cfg.rank, r->op,
               megamoe_status_name(r->op_st));
    if (r->op == MM_OP_ALLGATHER)
        FUZZ_CHECK(r->out[0] == 1000 && r->out[1] == 1001, "allgather gave %llu %llu",
                   (unsigned long long)r->out[0], (unsigned long long)r->out[1]);
    if (r->op == MM_OP_BCAST) FUZZ_CHECK(r->out[0] == 1000, "bcast gave %llu", (unsigned long long)r->out[0]);
}

/* ---- raw socket helpers of the hostile side ---- */

static int mm_send(int fd, const void *p, size_t n)
{
    return mm_net_write_all(fd, p, n, mm_now_ns() + 500 * MM_MS) == MEGAMOE_OK;
}

static int mm_send_frame(int fd, int type, uint32_t len, const void *body, size_t body_len)
{
    uint8_t hdr[MM_FRAME_HEADER];
    mm_frame_encode_header(hdr, type, len);
    return mm_send(fd, hdr, sizeof hdr) && (body_len == 0 || mm_send(fd, body, body_len));
}

/* Up to n bytes of the input, as given. */
static size_t mm_take(mm_fz_t *f, uint8_t *buf, size_t n)
{
    size_t k = 0;
    for (; k < n && f->n; k++) buf[k] = mm_fz_u8(f);
    return k;
}

/* ---- server mode: the real rank 0 against hostile connections ---- */

/* One hostile connection; returns 1 when rank 0 accepted it as rank 1 (it holds the token:
 * its settings decide the verdict; when the job formed it has also played the collective and
 * closed). *open_fd gets a connection left open, else -1. */
static int mm_attack(mm_fz_t *f, const mm_endpoint_t *ep, int port, int *open_fd)
{
    *open_fd = -1;
    uint8_t flags = mm_fz_u8(f);
    int fd = -1;
    uint64_t deadline = mm_now_ns() + 20000 * MM_MS;
    while (mm_now_ns() < deadline) { /* rank 0 may not listen yet */
        if (mm_net_connect(ep, mm_now_ns() + 200 * MM_MS, &fd) == MEGAMOE_OK) break;
        fd = -1;
        mm_sleep_ns(1 * MM_MS);
    }
    FUZZ_CHECK(fd >= 0, "rank 0 never listened on port %d", port);
    if (!mm_isolated && !mm_port_is_ours(port)) { /* not our listener: say nothing */
        close(fd);
        return 0;
    }
    uint8_t nonce[64] = {0};
    if (flags & 1) { /* read the challenge first */
        void *body = NULL;
        size_t len = 0;
        if (mm_frame_recv(fd, MM_FRAME_CHALLENGE, mm_wire.challenge, &body, &len,
                          mm_now_ns() + 500 * MM_MS) == MEGAMOE_OK &&
            len >= mm_wire.nonce)
            memcpy(nonce, body, mm_wire.nonce);
        free(body);
    }
    uint8_t hello[512];
    FUZZ_CHECK(mm_wire.hello <= sizeof hello, "hello of %zu bytes", mm_wire.hello);
    int complete = 0; /* a whole HELLO frame went out: rank 0 may accept it */
    if (flags & 2) { /* a HELLO from the real encoder, then bytes flipped */
        mm_boot_config_t me = mm_cfg(ep, 1, 1000);
        mm_boot_test_hello(&me, nonce, hello);
        int n_flip = mm_fz_u8(f) % 4;
        for (int i = 0; i < n_flip; i++) {
            size_t at = mm_fz_u8(f) % mm_wire.hello;
            hello[at] ^= mm_fz_u8(f);
        }
        if (flags & 4) mm_boot_test_hello_mac(MM_TOKEN, nonce, hello, hello + mm_wire.hello - 32);
        int type = (flags & 8) ? mm_fz_u8(f) % 9 : MM_FRAME_HELLO;
        uint32_t len = (flags & 16) ? (uint32_t)mm_fz_bytes_le(f, 4) : (uint32_t)mm_wire.hello;
        size_t send_len = (flags & 32) ? mm_fz_u8(f) % (mm_wire.hello + 1) : mm_wire.hello;
        mm_send_frame(fd, type, len, hello, send_len);
        complete = type == MM_FRAME_HELLO && len == mm_wire.hello && send_len == mm_wire.hello;
    } else { /* raw bytes, possibly a header of any type and length first */
        if (flags & 8) mm_send_frame(fd, mm_fz_u8(f) % 9, (uint32_t)mm_fz_bytes_le(f, 4), NULL, 0);
        uint8_t raw[1024];
        size_t n = mm_take(f, raw, mm_fz_u8(f) * 4u);
        if (n) mm_send(fd, raw, n);
    }
    /* What rank 0 answers (after the challenge if that was not read): ACCEPT, then the
     * VERDICT. A whole HELLO gets an answer at once; anything else may get none. */
    int accepted = 0, joined = 0, type = 0;
    void *body = NULL;
    size_t len = 0;
    uint64_t answer_by = mm_now_ns() + (complete ? 2000 : 20) * MM_MS;
    for (int k = 0; k < 2; k++) {
        free(body);
        body = NULL;
        if (mm_frame_recv_any(fd, 4096, &type, &body, &len, answer_by) != MEGAMOE_OK) break;
        if (type == MM_FRAME_CHALLENGE) continue;
        accepted = type == MM_FRAME_ACCEPT;
        break;
    }
    if (accepted) {
        free(body);
        body = NULL;
        joined = mm_frame_recv(fd, MM_FRAME_VERDICT, 4096, &body, &len, mm_now_ns() + 2000 * MM_MS) ==
                     MEGAMOE_OK &&
                 len >= 4 && mm_get_u32(body) == 0;
    }
    free(body);
    if (!joined) {
        if (!accepted && (flags & 64)) *open_fd = fd; /* stays open until the job is complete */
        else close(fd);
        return accepted;
    }
    /* As rank 1: contributions of any shape to rank 0's collective. */
    int n_contrib = mm_fz_u8(f) % 3;
    for (int i = 0; i < n_contrib; i++) {
        uint8_t c[16 + 64];
        uint8_t cf = mm_fz_u8(f);
        size_t payload = mm_fz_u8(f) % 65;
        mm_take(f, c, 16 + payload);
        if (cf & 1) { /* well-formed header fields: op, length, sequence number */
            mm_put_u32(c, mm_fz_u8(f) % 6);
            mm_put_u32(c + 4, (uint32_t)payload);
            mm_put_u64(c + 8, (uint64_t)i + 1);
        }
        uint32_t flen = (cf & 2) ? (uint32_t)mm_fz_bytes_le(f, 4) : (uint32_t)(16 + payload);
        size_t send_len = (cf & 4) ? mm_fz_u8(f) % (17 + payload) : 16 + payload;
        mm_send_frame(fd, (cf & 8) ? mm_fz_u8(f) % 9 : MM_FRAME_CONTRIB, flen, c, send_len);
        body = NULL;
        if (mm_frame_recv_any(fd, 1 << 20, &type, &body, &len, mm_now_ns() + 30 * MM_MS) !=
            MEGAMOE_OK) {
            free(body);
            break;
        }
        free(body);
    }
    close(fd); /* rank 0 sees rank 1 leave */
    return 1;
}

static void mm_fuzz_server(mm_fz_t *f)
{
    int port = mm_free_port();
    FUZZ_CHECK(port > 0, "no free port");
    mm_endpoint_t ep = mm_ep(port);
    mm_rank_t root;
    memset(&root, 0, sizeof root);
    root.cfg = mm_cfg(&ep, 0, 20000); /* hostile inputs end by closing, never by this timeout */
    root.op = mm_fz_u8(f) % MM_OP_COUNT;
    mm_rank_start(&root);
    int n_attacks = 1 + mm_fz_u8(f) % 3, accepted = 0, open_fds[3];
    for (int i = 0; i < 3; i++) open_fds[i] = -1;
    for (int i = 0; i < n_attacks && !accepted; i++) accepted = mm_attack(f, &ep, port, &open_fds[i]);
    if (accepted) {
        pthread_join(root.th, NULL); /* it ends with the verdict or rank 1's departure */
    } else {
        /* The legitimate rank 1 joins while the silent connections are still open. */
        mm_rank_t peer;
        memset(&peer, 0, sizeof peer);
        peer.cfg = mm_cfg(&ep, 1, 20000);
        peer.op = root.op;
        mm_rank_start(&peer);
        pthread_join(root.th, NULL);
        pthread_join(peer.th, NULL);
        FUZZ_CHECK(root.st == MEGAMOE_OK && peer.st == MEGAMOE_OK, "hostile connections stopped "
                   "the job: rank 0 %s, rank 1 %s", megamoe_status_name(root.st),
                   megamoe_status_name(peer.st));
        mm_rank_check_result(&root);
        mm_rank_check_result(&peer);
    }
    for (int i = 0; i < 3; i++)
        if (open_fds[i] >= 0) close(open_fds[i]);
    if (getenv("MM_FUZZ_VERBOSE"))
        fprintf(stderr, "server: %d attacks, accepted %d; rank 0 %s, op %d %s\n", n_attacks,
                accepted, megamoe_status_name(root.st), root.op, megamoe_status_name(root.op_st));
}

/* ---- client mode: the real rank 1 against a hostile rank 0 ---- */

static void mm_fuzz_client(mm_fz_t *f)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    FUZZ_CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0 &&
                   getsockname(lfd, (struct sockaddr *)&a, &alen) == 0,
               "listen: %s", strerror(errno));
    mm_endpoint_t ep = mm_ep(ntohs(a.sin_port));
    mm_rank_t peer;
    memset(&peer, 0, sizeof peer);
    /* Short timeouts: a hostile rank 0 that says nothing costs one of them per input. */
    peer.cfg = mm_cfg(&ep, 1, 100);
    peer.cfg.handshake_timeout_ns = 60 * MM_MS;
    peer.op = mm_fz_u8(f) % MM_OP_COUNT;
    mm_rank_start(&peer);
    struct pollfd p = {lfd, POLLIN, 0};
    int fd = poll(&p, 1, 2000) == 1 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
    close(lfd); /* one connection; a retry is refused */
    FUZZ_CHECK(fd >= 0, "rank 1 never connected");
    int one = 1; /* header and body go out in two sends: no Nagle wait between them */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int proper = 1; /* every message so far was the right one */
    uint8_t cflags = mm_fz_u8(f);
    uint8_t nonce[64] = {0}, buf[2048];
    if (cflags & 1) { /* a well-formed challenge */
        mm_take(f, nonce, mm_wire.nonce);
        memcpy(buf, nonce, mm_wire.nonce);
        mm_put_u32(buf + mm_wire.nonce, (cflags & 2) ? mm_fz_u8(f) : 1);
        proper = !(cflags & 2);
        mm_send_frame(fd, MM_FRAME_CHALLENGE, (uint32_t)mm_wire.challenge, buf, mm_wire.challenge);
    } else {
        proper = 0;
        size_t n = mm_take(f, buf, mm_fz_u8(f) * 2u);
        if (n) mm_send(fd, buf, n);
    }
    void *hello = NULL;
    size_t hlen = 0;
    megamoe_status_t hs = mm_frame_recv(fd, MM_FRAME_HELLO, 4096, &hello, &hlen,
                                        mm_now_ns() + 500 * MM_MS);
    if (hs == MEGAMOE_OK && hlen == mm_wire.hello) {
        uint8_t answer = mm_fz_u8(f) % 4;
        if (answer == 0) { /* the right proof */
            uint8_t proof[32];
            mm_boot_test_accept_mac(MM_TOKEN, (const uint8_t *)hello + mm_wire.hello_nonce, nonce,
                                    1, proof);
            mm_send_frame(fd, MM_FRAME_ACCEPT, 32, proof, 32);
        } else if (answer == 1) { /* a proof from the input */
            proper = 0;
            size_t n = mm_take(f, buf, mm_fz_u8(f) % 40);
            mm_send_frame(fd, MM_FRAME_ACCEPT, (uint32_t)n, buf, n);
        } else if (answer == 2) { /* a rejection with any text */
            proper = 0;
            size_t n = mm_take(f, buf, mm_fz_u8(f) * 8u);
            mm_send_frame(fd, MM_FRAME_REJECT, (uint32_t)n, buf, n);
        } else {
            proper = 0;
            size_t n = mm_take(f, buf, mm_fz_u8(f));
            if (n) mm_send(fd, buf, n);
        }
        /* the verdict: any status and text, or a frame of any type and length */
        uint8_t vf = mm_fz_u8(f);
        size_t n = mm_take(f, buf + 4, mm_fz_u8(f) * 8u);
        mm_put_u32(buf, (vf & 1) ? (uint32_t)mm_fz_bytes_le(f, 4) : 0);
        proper &= !(vf & 7);
        uint32_t vlen = (vf & 2) ? (uint32_t)mm_fz_bytes_le(f, 4) : (uint32_t)(4 + n);
        mm_send_frame(fd, (vf & 4) ? mm_fz_u8(f) % 9 : MM_FRAME_VERDICT, vlen, buf, 4 + n);
        /* the collective: answer rank 1's contribution */
        void *contrib = NULL;
        size_t clen = 0;
        if (peer.op != MM_OP_NONE && proper && /* else rank 1 has given up already */
            mm_frame_recv(fd, MM_FRAME_CONTRIB, 1 << 20, &contrib, &clen,
                          mm_now_ns() + 500 * MM_MS) == MEGAMOE_OK &&
            clen >= 16) {
            uint8_t rf = mm_fz_u8(f);
            uint64_t seq = mm_get_u64((uint8_t *)contrib + 8);
            uint32_t each = mm_get_u32((uint8_t *)contrib + 4);
            uint8_t res[16 + 2 * 600];
            size_t payload = 2 * (size_t)each <= 2 * 600 ? 2 * (size_t)each : 0;
            mm_put_u64(res, (rf & 1) ? mm_fz_bytes_le(f, 8) : seq);
            mm_put_u32(res + 8, (rf & 2) ? (uint32_t)mm_fz_bytes_le(f, 4) : 0);
            mm_put_u32(res + 12, 0);
            memset(res + 16, 0, payload);
            if (each == 8 && payload == 16) { /* rank 0's and rank 1's values */
                mm_put_u64(res + 16, 1000);
                memcpy(res + 24, (uint8_t *)contrib + 16, 8);
            }
            if (rf & 4) payload = mm_fz_u8(f) % (payload + 1);
            proper &= !(rf & 7);
            mm_send_frame(fd, MM_FRAME_RESULT, (uint32_t)(16 + payload), res, 16 + payload);
        }
        free(contrib);
    }
    free(hello);
    close(fd);
    pthread_join(peer.th, NULL);
    if (getenv("MM_FUZZ_VERBOSE"))
        fprintf(stderr, "client: proper %d, hello %s; rank 1 %s, op %d %s\n", proper,
                megamoe_status_name(hs), megamoe_status_name(peer.st), peer.op,
                megamoe_status_name(peer.op_st));
    /* Well-formed messages form the job (unless a short timeout expired on a busy machine). */
    if (proper && hs == MEGAMOE_OK && !strstr(peer.error, "TIMEOUT")) {
        FUZZ_CHECK(peer.st == MEGAMOE_OK, "rank 1 refused a well-formed job: %s",
                   peer.error);
        mm_rank_check_result(&peer);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        init = 1;
        megamoe_log_set_callback(mm_fz_silent, NULL);
        mm_boot_test_wire(&mm_wire);
        mm_isolate();
    }
    mm_fz_t f = {data, size};
    if (mm_fz_u8(&f) & 1) mm_fuzz_client(&f);
    else mm_fuzz_server(&f);
    return 0;
}

/* ---- seeds: a clean join and collective of each kind, and the classic attacks ---- */

int mm_fuzz_write_seeds(const char *dir)
{
    struct {
        const char *name;
        uint8_t bytes[64];
        size_t n;
    } seeds[] = {
        /* server mode: op, attacks, flags ... */
        {"server_raw_garbage", {0, 2, 0, 0x00, 8, 'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}, 13},
        {"server_huge_length", {0, 1, 0, 0x08, MM_FRAME_HELLO, 0, 0, 0, 0x40, 0}, 10},
        {"server_wrong_type", {0, 1, 0, 0x08, MM_FRAME_CONTRIB, 16, 0, 0, 0, 0}, 10},
        {"server_short_hello", {0, 1, 0, 0x03 | 0x10, 0, 8, 0, 0, 0}, 9},
        {"server_bad_mac", {0, 1, 0, 0x03, 1, 200, 0x01}, 7},
        {"server_bad_rank", {0, 1, 0, 0x07, 1, 4, 0x05}, 7},
        {"server_truncated", {0, 1, 0, 0x07 | 0x20, 0, 40}, 6},
        {"server_silent_then_join", {0, 4, 1, 0x40, 0}, 5},
        {"server_joins_barrier", {0, 1, 0, 0x07, 0, 1, 0x01, 0, 1}, 9},
        {"server_joins_allgather", {0, 2, 0, 0x07, 0, 1, 0x01, 8, 1, 2, 3, 4, 5, 6, 7, 8,
                                    9, 10, 11, 12, 13, 14, 15, 16, 1, 2, 3, 4, 5, 6, 7, 8, 2}, 33},
        {"server_joins_garbage_contrib", {0, 2, 0, 0x07, 0, 2, 0x02, 4, 0, 0, 0, 0}, 12},
        {"server_legit_agree", {0, 4, 0, 0x00, 0}, 5},
        /* client mode: op, challenge flags, nonce..., answer, verdict ... */
        {"client_clean_allgather", {1, 2, 0x01}, 3},
        {"client_clean_barrier", {1, 1, 0x01}, 3},
        {"client_reject", {1, 0, 0x01, [35] = 2, 4, 'n', 'o', 'p', 'e'}, 41},
        {"client_wrong_proof", {1, 0, 0x01, [35] = 1, 32}, 37},
        {"client_bad_verdict", {1, 4, 0x01, [35] = 0, 0x01, 2, 'b', 'a', 'd', 0, 0, 0, 0, 0,
                                0, 0, 0, 0, 0, 0, 0, 0, 0xf6, 0xff, 0xff, 0xff}, 60},
        {"client_no_challenge", {1, 0, 0x00, 16, 'x', 'x'}, 6},
        {"client_bad_result", {1, 3, 0x01, [35] = 0, 0, 0, 0x03, 9, 9, 9, 9, 9, 9, 9, 9, 1, 0,
                               0, 0}, 50},
    };
    int count = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        if (mm_fz_save(dir, seeds[i].name, seeds[i].bytes, seeds[i].n) != 0) return -1;
        count++;
    }
    return count;
}
