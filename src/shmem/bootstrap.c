/* TCP bootstrap: handshake (rank 0 serves all clients with poll), verdict, control collectives. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "bootstrap.h"
#include "sha256.h"
#include "shmem_log.h"

#define MM_NONCE 32
/* HELLO body: proto, rank, world (u32 each), client nonce, settings, MAC. */
#define MM_SETTINGS_WIRE (8 + 8 + 4 + 16)
#define MM_HELLO_LEN (12 + MM_NONCE + MM_SETTINGS_WIRE + MM_SHA256_BYTES)
#define MM_CHALLENGE_LEN (MM_NONCE + 4)
#define MM_TEXT_MAX 1024
#define MM_BOOT_MAX_PENDING 64
#define MM_BOOT_MAX_RESULT (64u << 20)
#define MM_BOOT_SLACK_NS (10ull * 1000000000ull)

struct mm_boot {
    int rank, world;
    mm_endpoint_t ep;
    uint64_t timeout_ns;
    int *fds; /* rank 0: fds[r] for r >= 1; others: fds[0] */
    uint64_t seq;
    megamoe_status_t broken; /* first collective error; later calls repeat it */
    char broken_text[MM_TEXT_MAX];
};

enum { MM_OP_BARRIER = 1, MM_OP_ALLGATHER, MM_OP_BCAST, MM_OP_AGREE };
static const char *mm_op_name(uint32_t op)
{
    switch (op) {
    case MM_OP_BARRIER: return "barrier";
    case MM_OP_ALLGATHER: return "allgather";
    case MM_OP_BCAST: return "broadcast";
    case MM_OP_AGREE: return "agree";
    }
    return "unknown";
}

static double mm_sec(uint64_t ns) { return (double)ns * 1e-9; }

/* ---- wire encoding of the handshake ---- */

static void mm_settings_encode(uint8_t *p, const mm_boot_settings_t *s)
{
    mm_put_u64(p, s->heap_size);
    mm_put_u64(p + 8, s->layout);
    mm_put_u32(p + 16, s->world);
    memcpy(p + 20, s->version, 16);
}

static void mm_settings_decode(const uint8_t *p, mm_boot_settings_t *s)
{
    s->heap_size = mm_get_u64(p);
    s->layout = mm_get_u64(p + 8);
    s->world = mm_get_u32(p + 16);
    memcpy(s->version, p + 20, 16);
    s->version[15] = '\0';
}

static void mm_hello_mac(const char *token, const uint8_t *server_nonce, const uint8_t *body,
                         uint8_t mac[MM_SHA256_BYTES])
{
    static const char label[] = "megamoe-shmem-boot-hello";
    const void *parts[] = {label, server_nonce, body};
    size_t lens[] = {sizeof label, MM_NONCE, MM_HELLO_LEN - MM_SHA256_BYTES};
    mm_hmac_sha256(token, strlen(token), parts, lens, 3, mac);
}

static void mm_accept_mac(const char *token, const uint8_t *client_nonce,
                          const uint8_t *server_nonce, uint32_t rank, uint8_t mac[MM_SHA256_BYTES])
{
    static const char label[] = "megamoe-shmem-boot-accept";
    uint8_t r[4];
    mm_put_u32(r, rank);
    const void *parts[] = {label, client_nonce, server_nonce, r};
    size_t lens[] = {sizeof label, MM_NONCE, MM_NONCE, 4};
    mm_hmac_sha256(token, strlen(token), parts, lens, 4, mac);
}

static megamoe_status_t mm_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return mm_error(MEGAMOE_IO, "getrandom failed: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
    return MEGAMOE_OK;
}

/* ---- rank 0: serve handshakes ---- */

typedef struct mm_pending {
    int fd;
    uint64_t deadline;
    uint8_t nonce[MM_NONCE];
    uint8_t buf[MM_FRAME_HEADER + MM_HELLO_LEN];
    size_t got;
    char peer[64];
} mm_pending_t;

static void mm_pending_close(mm_pending_t *pend, int *n, int i, const char *why)
{
    if (why) MM_SHMEM_WARN("bootstrap: closed connection from %s: %s", pend[i].peer, why);
    close(pend[i].fd);
    pend[i] = pend[--*n];
}

/* Send a short frame to a not yet trusted client; never blocks for long. */
static void mm_send_text(int fd, int type, int32_t status, const char *text)
{
    uint8_t st[4];
    mm_put_u32(st, (uint32_t)status);
    size_t len = strlen(text);
    if (len > MM_TEXT_MAX - 1) len = MM_TEXT_MAX - 1;
    if (type == MM_FRAME_REJECT)
        mm_frame_send(fd, type, text, len, NULL, 0, mm_now_ns() + 100000000ull);
    else
        mm_frame_send(fd, type, st, 4, text, len, mm_now_ns() + 1000000000ull);
}

static void mm_reject(mm_pending_t *pend, int *n, int i, const char *why)
{
    mm_send_text(pend[i].fd, MM_FRAME_REJECT, 0, why);
    mm_pending_close(pend, n, i, why);
}

/* A complete HELLO arrived on pend[i]: check it; on success the connection joins as a rank. */
static void mm_serve_hello(mm_boot_t *b, const mm_boot_config_t *cfg, mm_pending_t *pend,
                           int *n, int i, mm_boot_settings_t *settings, int *joined)
{
    const uint8_t *body = pend[i].buf + MM_FRAME_HEADER;
    char why[256];
    uint32_t proto = mm_get_u32(body), rank = mm_get_u32(body + 4), world = mm_get_u32(body + 8);
    if (proto != MM_BOOT_PROTO) {
        snprintf(why, sizeof why, "protocol version %u, expected %d (different megamoe builds?)",
                 proto, MM_BOOT_PROTO);
        mm_reject(pend, n, i, why);
        return;
    }
    uint8_t mac[MM_SHA256_BYTES];
    mm_hello_mac(cfg->token, pend[i].nonce, body, mac);
    if (!mm_ct_equal(mac, body + MM_HELLO_LEN - MM_SHA256_BYTES, MM_SHA256_BYTES)) {
        mm_reject(pend, n, i, "authentication failed: the peer does not hold this job's "
                              "MEGAMOE_JOB_TOKEN");
        return;
    }
    if (rank < 1 || rank >= (uint32_t)b->world) {
        snprintf(why, sizeof why, "unexpected rank %u (world size %u on the peer; this job has "
                 "ranks 1..%d to join rank 0)", rank, world, b->world - 1);
        mm_reject(pend, n, i, why);
        return;
    }
    if (b->fds[rank] >= 0) {
        snprintf(why, sizeof why, "duplicate rank %u (already joined)", rank);
        mm_reject(pend, n, i, why);
        return;
    }
    uint8_t proof[MM_SHA256_BYTES];
    mm_accept_mac(cfg->token, body + 12, pend[i].nonce, rank, proof);
    if (mm_frame_send(pend[i].fd, MM_FRAME_ACCEPT, proof, sizeof proof, NULL, 0,
                      mm_now_ns() + 1000000000ull) != MEGAMOE_OK) {
        mm_pending_close(pend, n, i, "connection lost while accepting it");
        return;
    }
    mm_settings_decode(body + 12 + MM_NONCE, &settings[rank]);
    settings[rank].world = world;
    MM_SHMEM_INFO("bootstrap: rank %u joined from %s", rank, pend[i].peer);
    b->fds[rank] = pend[i].fd;
    pend[i] = pend[--*n];
    (*joined)++;
}

/* Read what is available on pend[i]; validate the header as soon as it is complete. */
static void mm_serve_read(mm_boot_t *b, const mm_boot_config_t *cfg, mm_pending_t *pend,
                          int *n, int i, mm_boot_settings_t *settings, int *joined)
{
    mm_pending_t *p = &pend[i];
    size_t want = p->got < MM_FRAME_HEADER ? MM_FRAME_HEADER : MM_FRAME_HEADER + MM_HELLO_LEN;
    ssize_t r = recv(p->fd, p->buf + p->got, want - p->got, 0);
    if (r == 0) {
        mm_pending_close(pend, n, i, "closed by the peer during the handshake");
        return;
    }
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        char why[128];
        snprintf(why, sizeof why, "receive failed: %s", strerror(errno));
        mm_pending_close(pend, n, i, why);
        return;
    }
    p->got += (size_t)r;
    if (p->got == MM_FRAME_HEADER) {
        int type;
        uint32_t len;
        char why[160];
        if (!mm_frame_decode_header(p->buf, &type, &len)) {
            mm_pending_close(pend, n, i, "malformed frame: bad magic (not a megamoe bootstrap "
                                         "client)");
        } else if (type != MM_FRAME_HELLO) {
            snprintf(why, sizeof why, "malformed frame: type %d where a hello was expected", type);
            mm_pending_close(pend, n, i, why);
        } else if (len > MM_HELLO_LEN) {
            snprintf(why, sizeof why, "oversized frame: %u bytes announced, the handshake "
                     "allows %d", len, MM_HELLO_LEN);
            mm_pending_close(pend, n, i, why);
        } else if (len < MM_HELLO_LEN) {
            snprintf(why, sizeof why, "malformed hello: %u bytes, expected %d", len, MM_HELLO_LEN);
            mm_pending_close(pend, n, i, why);
        }
        return;
    }
    if (p->got == MM_FRAME_HEADER + MM_HELLO_LEN) mm_serve_hello(b, cfg, pend, n, i, settings, joined);
}

static void mm_serve_accept(int lfd, mm_pending_t *pend, int *n, uint64_t hs_ns)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN or a transient error: poll again */
        mm_net_tune(fd);
        char peer[64];
        mm_net_peer_name(fd, peer, sizeof peer);
        if (*n >= MM_BOOT_MAX_PENDING) {
            MM_SHMEM_WARN("bootstrap: closed connection from %s: too many unauthenticated "
                          "connections (%d)", peer, MM_BOOT_MAX_PENDING);
            close(fd);
            continue;
        }
        mm_pending_t *p = &pend[*n];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->deadline = mm_now_ns() + hs_ns;
        snprintf(p->peer, sizeof p->peer, "%s", peer);
        uint8_t body[MM_CHALLENGE_LEN];
        if (mm_random(p->nonce, MM_NONCE) != MEGAMOE_OK) {
            close(fd);
            continue;
        }
        memcpy(body, p->nonce, MM_NONCE);
        mm_put_u32(body + MM_NONCE, MM_BOOT_PROTO);
        if (mm_frame_send(fd, MM_FRAME_CHALLENGE, body, sizeof body, NULL, 0,
                          mm_now_ns() + 100000000ull) != MEGAMOE_OK) {
            MM_SHMEM_WARN("bootstrap: closed connection from %s: cannot send the challenge", peer);
            close(fd);
            continue;
        }
        MM_SHMEM_DEBUG("bootstrap: connection from %s", peer);
        (*n)++;
    }
}

/* Compare every rank's settings with rank 0's; text describes the first difference. */
static megamoe_status_t mm_compare_settings(const mm_boot_t *b, const mm_boot_settings_t *s,
                                            char *text, size_t len)
{
    for (int r = 1; r < b->world; r++) {
        const mm_boot_settings_t *a = &s[0], *o = &s[r];
        if (o->world != a->world) {
            snprintf(text, len, "settings differ between ranks: rank %d has world size %u, rank "
                     "0 has %u; start every rank with the same WORLD_SIZE", r, o->world, a->world);
        } else if (o->heap_size != a->heap_size) {
            snprintf(text, len, "settings differ between ranks: rank %d has "
                     "HYPER_PARALLEL_SHMEM_HEAP_SIZE=%llu, rank 0 has %llu; set the same value "
                     "on every rank", r, (unsigned long long)o->heap_size,
                     (unsigned long long)a->heap_size);
        } else if (strcmp(o->version, a->version) != 0 || o->layout != a->layout) {
            snprintf(text, len, "settings differ between ranks: rank %d runs megamoe %s (heap "
                     "layout %llx), rank 0 runs %s (%llx); use the same library build on "
                     "every rank", r, o->version, (unsigned long long)o->layout, a->version,
                     (unsigned long long)a->layout);
        } else {
            continue;
        }
        return MEGAMOE_CONFIG_MISMATCH;
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_boot_serve(mm_boot_t *b, const mm_boot_config_t *cfg)
{
    int lfd;
    if (mm_net_listen(&b->ep, &lfd) != MEGAMOE_OK)
        return mm_error(MEGAMOE_IO, "rank 0 cannot listen on %s (HYPER_PARALLEL_SHMEM_BOOTSTRAP_"
                        "ENDPOINT): %s; choose a free port on this host", b->ep.text,
                        strerror(errno));
    uint64_t hs_ns = cfg->handshake_timeout_ns ? cfg->handshake_timeout_ns : MM_BOOT_HANDSHAKE_NS;
    uint64_t start = mm_now_ns(), deadline = start + b->timeout_ns;
    mm_boot_settings_t *settings = calloc((size_t)b->world, sizeof *settings);
    mm_pending_t *pend = calloc(MM_BOOT_MAX_PENDING, sizeof *pend);
    struct pollfd *pfd = calloc(MM_BOOT_MAX_PENDING + 1, sizeof *pfd);
    if (!settings || !pend || !pfd) {
        free(settings), free(pend), free(pfd), close(lfd);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "bootstrap: out of memory for %d ranks", b->world);
    }
    settings[0] = cfg->settings;
    int n = 0, joined = 0;
    while (joined < b->world - 1) {
        uint64_t now = mm_now_ns();
        if (now >= deadline) break;
        uint64_t wake = deadline;
        for (int i = 0; i < n; i++)
            if (pend[i].deadline < wake) wake = pend[i].deadline;
        pfd[0] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < n; i++) pfd[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
        uint64_t ms = wake > now ? (wake - now + 999999) / 1000000 : 0;
        int count = n;
        if (poll(pfd, (nfds_t)(count + 1), (int)(ms > 1000 ? 1000 : ms)) < 0 && errno != EINTR)
            break;
        /* Walk pending connections backwards: closing one moves the last into its place. */
        for (int i = count - 1; i >= 0; i--)
            if (pfd[i + 1].revents) mm_serve_read(b, cfg, pend, &n, i, settings, &joined);
        now = mm_now_ns();
        for (int i = n - 1; i >= 0; i--)
            if (now >= pend[i].deadline) {
                char why[96];
                snprintf(why, sizeof why, "handshake not completed within %.0f s", mm_sec(hs_ns));
                mm_pending_close(pend, &n, i, why);
            }
        if (pfd[0].revents & POLLIN) mm_serve_accept(lfd, pend, &n, hs_ns);
    }
    close(lfd); /* the job is complete (or failed): no more members */
    for (int i = n - 1; i >= 0; i--)
        mm_pending_close(pend, &n, i, "bootstrap finished before its handshake completed");
    free(pend);
    free(pfd);

    char text[MM_TEXT_MAX];
    megamoe_status_t st = MEGAMOE_OK;
    if (joined < b->world - 1) {
        int o = snprintf(text, sizeof text, "bootstrap timed out after %.0f s "
                         "(HYPER_PARALLEL_SHMEM_TIMEOUT_SEC): rank(s)", mm_sec(b->timeout_ns));
        for (int r = 1, shown = 0; r < b->world && o < (int)sizeof text - 160; r++)
            if (b->fds[r] < 0 && shown++ < 16) o += snprintf(text + o, sizeof text - (size_t)o, " %d", r);
        snprintf(text + o, sizeof text - (size_t)o, " did not join %s; check that every rank "
                 "runs with the same endpoint and MEGAMOE_JOB_TOKEN", b->ep.text);
        st = MEGAMOE_TIMEOUT;
    } else {
        st = mm_compare_settings(b, settings, text, sizeof text);
        if (st == MEGAMOE_OK) snprintf(text, sizeof text, "ok");
    }
    free(settings);
    for (int r = 1; r < b->world; r++)
        if (b->fds[r] >= 0) mm_send_text(b->fds[r], MM_FRAME_VERDICT, st, text);
    if (st != MEGAMOE_OK) return mm_error(st, "%s", text);
    MM_SHMEM_INFO("bootstrap: %d ranks joined %s in %.3f s", b->world, b->ep.text,
                  mm_sec(mm_now_ns() - start));
    return MEGAMOE_OK;
}

/* ---- other ranks: connect, prove the token, check rank 0's proof, wait for the verdict ---- */

static megamoe_status_t mm_boot_handshake(mm_boot_t *b, const mm_boot_config_t *cfg, int fd,
                                          uint64_t hs_deadline, int *retry_p)
{
    void *body = NULL;
    size_t len = 0;
    int type = 0;
    *retry_p = 0;
    megamoe_status_t st = mm_frame_recv(fd, MM_FRAME_CHALLENGE, MM_CHALLENGE_LEN, &body, &len,
                                        hs_deadline);
    if (st == MEGAMOE_PEER_LOST) { /* closed before talking: rank 0 busy or restarting */
        *retry_p = 1;
        return st;
    }
    if (st != MEGAMOE_OK || len != MM_CHALLENGE_LEN) {
        free(body);
        return mm_error(MEGAMOE_IO, "rank %d: the process listening at %s did not send a megamoe "
                        "bootstrap challenge (%s); is the endpoint used by another program?",
                        b->rank, b->ep.text, megamoe_status_name(st));
    }
    uint8_t server_nonce[MM_NONCE];
    memcpy(server_nonce, body, MM_NONCE);
    free(body);
    uint8_t hello[MM_HELLO_LEN];
    mm_put_u32(hello, MM_BOOT_PROTO);
    mm_put_u32(hello + 4, (uint32_t)b->rank);
    mm_put_u32(hello + 8, (uint32_t)b->world);
    MM_CHECK(mm_random(hello + 12, MM_NONCE));
    mm_settings_encode(hello + 12 + MM_NONCE, &cfg->settings);
    mm_hello_mac(cfg->token, server_nonce, hello, hello + MM_HELLO_LEN - MM_SHA256_BYTES);
    st = mm_frame_send(fd, MM_FRAME_HELLO, hello, sizeof hello, NULL, 0, hs_deadline);
    if (st == MEGAMOE_OK)
        st = mm_frame_recv_any(fd, MM_TEXT_MAX, &type, &body, &len, hs_deadline);
    if (st != MEGAMOE_OK)
        return mm_error(MEGAMOE_IO, "rank %d: bootstrap handshake with rank 0 at %s failed (%s)",
                        b->rank, b->ep.text, megamoe_status_name(st));
    if (type == MM_FRAME_REJECT) {
        st = mm_error(MEGAMOE_IO, "rank %d: rank 0 at %s rejected this process: %.*s", b->rank,
                      b->ep.text, (int)len, (const char *)body);
        free(body);
        return st;
    }
    uint8_t proof[MM_SHA256_BYTES];
    mm_accept_mac(cfg->token, hello + 12, server_nonce, (uint32_t)b->rank, proof);
    int ok = type == MM_FRAME_ACCEPT && len == MM_SHA256_BYTES && mm_ct_equal(proof, body, len);
    free(body);
    if (!ok)
        return mm_error(MEGAMOE_IO, "rank %d: the process listening at %s could not prove it "
                        "holds this job's MEGAMOE_JOB_TOKEN (another job on this port?)",
                        b->rank, b->ep.text);
    /* Rank 0 answers once everyone joined or its own timeout passed. */
    st = mm_frame_recv(fd, MM_FRAME_VERDICT, MM_TEXT_MAX, &body, &len,
                       mm_now_ns() + b->timeout_ns + MM_BOOT_SLACK_NS);
    if (st != MEGAMOE_OK || len < 4) {
        free(body);
        return mm_error(st == MEGAMOE_TIMEOUT ? MEGAMOE_TIMEOUT : MEGAMOE_PEER_LOST,
                        "rank %d: no verdict from rank 0 at %s after joining (%s)", b->rank,
                        b->ep.text, megamoe_status_name(st));
    }
    int32_t verdict = (int32_t)mm_get_u32(body);
    if (verdict != MEGAMOE_OK) {
        st = mm_error((megamoe_status_t)verdict, "%.*s", (int)(len - 4), (const char *)body + 4);
        free(body);
        return st;
    }
    free(body);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_boot_join(mm_boot_t *b, const mm_boot_config_t *cfg)
{
    uint64_t deadline = mm_now_ns() + b->timeout_ns;
    uint64_t hs_ns = cfg->handshake_timeout_ns ? cfg->handshake_timeout_ns : MM_BOOT_HANDSHAKE_NS;
    uint64_t backoff = 5000000ull; /* 5 ms, doubling to 200 ms */
    int attempts = 0;
    megamoe_status_t last = MEGAMOE_NOT_FOUND;
    int last_errno = ECONNREFUSED;
    while (mm_now_ns() < deadline) {
        int fd = -1;
        attempts++;
        last = mm_net_connect(&b->ep, deadline, &fd);
        if (last == MEGAMOE_OK) {
            uint64_t hs_deadline = mm_now_ns() + hs_ns;
            int retry = 0;
            megamoe_status_t st = mm_boot_handshake(b, cfg, fd, hs_deadline, &retry);
            if (st == MEGAMOE_OK) {
                b->fds[0] = fd;
                return MEGAMOE_OK;
            }
            close(fd);
            if (!retry) return st;
            last_errno = ECONNRESET;
        } else if (last != MEGAMOE_NOT_FOUND) {
            last_errno = errno;
            if (last == MEGAMOE_IO) break;
        } else {
            last_errno = errno;
        }
        mm_sleep_ns(backoff);
        if (backoff < 200000000ull) backoff *= 2;
    }
    return mm_error(MEGAMOE_TIMEOUT, "rank %d cannot reach rank 0 at %s after %.0f s and %d "
                    "attempts (last error: %s); check that rank 0 runs and that every rank uses "
                    "the same HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT, or raise "
                    "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", b->rank, b->ep.text,
                    mm_sec(b->timeout_ns), attempts, strerror(last_errno));
}

megamoe_status_t mm_boot_create(const mm_boot_config_t *cfg, mm_boot_t **boot_p)
{
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "bootstrap: rank %d is not in a world of %d",
                        cfg->rank, cfg->world);
    mm_boot_t *b = calloc(1, sizeof *b);
    int *fds = calloc((size_t)cfg->world, sizeof *fds);
    if (!b || !fds) {
        free(b), free(fds);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "bootstrap: out of memory");
    }
    b->rank = cfg->rank;
    b->world = cfg->world;
    b->ep = cfg->endpoint;
    b->timeout_ns = cfg->timeout_ns;
    b->fds = fds;
    for (int r = 0; r < b->world; r++) b->fds[r] = -1;
    megamoe_status_t st = MEGAMOE_OK;
    if (b->world > 1) st = b->rank == 0 ? mm_boot_serve(b, cfg) : mm_boot_join(b, cfg);
    if (st != MEGAMOE_OK) {
        mm_boot_destroy(b);
        return st;
    }
    *boot_p = b;
    return MEGAMOE_OK;
}

void mm_boot_destroy(mm_boot_t *b)
{
    if (b == NULL) return;
    for (int r = 0; r < b->world; r++)
        if (b->fds[r] >= 0) close(b->fds[r]);
    free(b->fds);
    free(b);
}

int mm_boot_rank(const mm_boot_t *b) { return b->rank; }
int mm_boot_world(const mm_boot_t *b) { return b->world; }

int mm_boot_fd(const mm_boot_t *b, int pe)
{
    if (pe < 0 || pe >= b->world || pe == b->rank) return -1;
    if (b->rank == 0) return b->fds[pe];
    return pe == 0 ? b->fds[0] : -1;
}

void mm_boot_drop_fd(mm_boot_t *b, int pe)
{
    if (b == NULL || pe < 0 || pe >= b->world || pe == b->rank) return;
    int i = b->rank == 0 ? pe : pe == 0 ? 0 : -1;
    if (i < 0 || b->fds[i] < 0) return;
    close(b->fds[i]);
    b->fds[i] = -1;
    if (b->broken == MEGAMOE_OK) {
        b->broken = MEGAMOE_PEER_LOST;
        snprintf(b->broken_text, sizeof b->broken_text, "rank %d was lost: the bootstrap "
                 "collectives need every rank", pe);
    }
}

/* ---- control collectives: contributions go to rank 0, the result comes back ---- */

static megamoe_status_t mm_boot_fail(mm_boot_t *b, megamoe_status_t st, const char *text)
{
    if (b->broken == MEGAMOE_OK) {
        b->broken = st;
        snprintf(b->broken_text, sizeof b->broken_text, "%s", text);
    }
    return mm_error(st, "%s", text);
}

/* Rank 0 side: gather world contributions of len bytes into out. */
static megamoe_status_t mm_boot_root_gather(mm_boot_t *b, uint32_t op, size_t len, uint8_t *out,
                                            char *text, size_t text_len)
{
    uint64_t deadline = mm_now_ns() + b->timeout_ns;
    int remaining = b->world - 1;
    char *got = calloc((size_t)b->world, 1);
    struct pollfd *pfd = calloc((size_t)b->world, sizeof *pfd);
    int *who = calloc((size_t)b->world, sizeof *who);
    if (!got || !pfd || !who) {
        free(got), free(pfd), free(who);
        snprintf(text, text_len, "rank 0: out of memory in bootstrap %s", mm_op_name(op));
        return MEGAMOE_OUT_OF_MEMORY;
    }
    megamoe_status_t st = MEGAMOE_OK;
    while (remaining > 0 && st == MEGAMOE_OK) {
        int k = 0;
        for (int r = 1; r < b->world; r++)
            if (!got[r]) {
                pfd[k] = (struct pollfd){b->fds[r], POLLIN, 0};
                who[k++] = r;
            }
        uint64_t now = mm_now_ns();
        if (now >= deadline) {
            int o = snprintf(text, text_len, "rank(s)");
            for (int i = 0; i < k && i < 16; i++) o += snprintf(text + o, text_len - (size_t)o, " %d", who[i]);
            snprintf(text + o, text_len - (size_t)o, " did not reach bootstrap %s #%llu within "
                     "%.0f s (HYPER_PARALLEL_SHMEM_TIMEOUT_SEC); a rank is stuck or calls a "
                     "different sequence of collectives", mm_op_name(op),
                     (unsigned long long)b->seq, mm_sec(b->timeout_ns));
            st = MEGAMOE_TIMEOUT;
            break;
        }
        uint64_t ms = (deadline - now + 999999) / 1000000;
        if (poll(pfd, (nfds_t)k, (int)(ms > 1000 ? 1000 : ms)) < 0 && errno != EINTR) {
            snprintf(text, text_len, "rank 0: poll failed in bootstrap %s: %s", mm_op_name(op),
                     strerror(errno));
            st = MEGAMOE_IO;
            break;
        }
        for (int i = 0; i < k && st == MEGAMOE_OK; i++) {
            if (!pfd[i].revents) continue;
            int r = who[i];
            void *body = NULL;
            size_t blen = 0;
            megamoe_status_t rs = mm_frame_recv(b->fds[r], MM_FRAME_CONTRIB,
                                                16 + MM_BOOT_MAX_CONTRIB, &body, &blen, deadline);
            if (rs == MEGAMOE_PEER_LOST || rs == MEGAMOE_IO) {
                snprintf(text, text_len, "rank %d lost: its bootstrap connection closed during "
                         "%s #%llu (the process exited or was killed)", r, mm_op_name(op),
                         (unsigned long long)b->seq);
                st = MEGAMOE_PEER_LOST;
            } else if (rs != MEGAMOE_OK || blen < 16) {
                snprintf(text, text_len, "rank %d sent a malformed bootstrap frame during %s",
                         r, mm_op_name(op));
                st = rs == MEGAMOE_TIMEOUT ? MEGAMOE_TIMEOUT : MEGAMOE_INTERNAL;
            } else {
                const uint8_t *p = body;
                uint32_t rop = mm_get_u32(p), rlen = mm_get_u32(p + 4);
                uint64_t rseq = mm_get_u64(p + 8);
                if (rop != op || rseq != b->seq || rlen != len || blen != 16 + (size_t)rlen) {
                    snprintf(text, text_len, "ranks called different collectives: rank %d "
                             "called %s #%llu with %u bytes while rank 0 called %s #%llu with "
                             "%zu bytes; every rank must make the same SHMEM calls in the same "
                             "order", r, mm_op_name(rop), (unsigned long long)rseq, rlen,
                             mm_op_name(op), (unsigned long long)b->seq, len);
                    st = MEGAMOE_CONFIG_MISMATCH;
                } else {
                    if (len) memcpy(out + (size_t)r * len, p + 16, len);
                    got[r] = 1;
                    remaining--;
                }
            }
            free(body);
        }
    }
    free(got), free(pfd), free(who);
    return st;
}

static megamoe_status_t mm_boot_exchange(mm_boot_t *b, uint32_t op, const void *in, size_t len,
                                         void *out)
{
    if (b->broken != MEGAMOE_OK) return mm_error(b->broken, "%s", b->broken_text);
    if (len > MM_BOOT_MAX_CONTRIB || (uint64_t)len * (uint64_t)b->world > MM_BOOT_MAX_RESULT)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "bootstrap %s of %zu bytes per rank is larger "
                        "than the control path allows", mm_op_name(op), len);
    b->seq++;
    if (len) memmove((uint8_t *)out + (size_t)b->rank * len, in, len);
    if (b->world == 1) return MEGAMOE_OK;
    char text[MM_TEXT_MAX];
    uint8_t hdr[16];
    if (b->rank == 0) {
        megamoe_status_t st = mm_boot_root_gather(b, op, len, out, text, sizeof text);
        mm_put_u64(hdr, b->seq);
        mm_put_u32(hdr + 8, (uint32_t)st);
        mm_put_u32(hdr + 12, 0);
        uint64_t deadline = mm_now_ns() + b->timeout_ns;
        for (int r = 1; r < b->world; r++) {
            if (b->fds[r] < 0) continue;
            if (st != MEGAMOE_OK)
                mm_frame_send(b->fds[r], MM_FRAME_RESULT, hdr, 16, text, strlen(text), deadline);
            else if (mm_frame_send(b->fds[r], MM_FRAME_RESULT, hdr, 16, out,
                                   len * (size_t)b->world, deadline) != MEGAMOE_OK) {
                /* The others already have the result; this rank will see its connection
                 * closed. Later collectives report the loss. */
                snprintf(text, sizeof text, "rank %d lost: its bootstrap connection closed "
                         "during %s #%llu", r, mm_op_name(op), (unsigned long long)b->seq);
                b->broken = MEGAMOE_PEER_LOST;
                snprintf(b->broken_text, sizeof b->broken_text, "%s", text);
            }
        }
        if (st != MEGAMOE_OK) return mm_boot_fail(b, st, text);
        return MEGAMOE_OK;
    }
    mm_put_u32(hdr, op);
    mm_put_u32(hdr + 4, (uint32_t)len);
    mm_put_u64(hdr + 8, b->seq);
    megamoe_status_t st = mm_frame_send(b->fds[0], MM_FRAME_CONTRIB, hdr, 16, in, len,
                                        mm_now_ns() + b->timeout_ns);
    void *body = NULL;
    size_t blen = 0;
    if (st == MEGAMOE_OK)
        st = mm_frame_recv(b->fds[0], MM_FRAME_RESULT, 16 + MM_BOOT_MAX_RESULT, &body, &blen,
                           mm_now_ns() + b->timeout_ns + MM_BOOT_SLACK_NS);
    if (st != MEGAMOE_OK) {
        if (st == MEGAMOE_TIMEOUT)
            snprintf(text, sizeof text, "rank 0 did not answer bootstrap %s #%llu within %.0f s "
                     "(HYPER_PARALLEL_SHMEM_TIMEOUT_SEC)", mm_op_name(op),
                     (unsigned long long)b->seq, mm_sec(b->timeout_ns));
        else
            snprintf(text, sizeof text, "rank 0 lost: the bootstrap connection closed during "
                     "%s #%llu (the process exited or was killed)", mm_op_name(op),
                     (unsigned long long)b->seq);
        return mm_boot_fail(b, st == MEGAMOE_TIMEOUT ? MEGAMOE_TIMEOUT : MEGAMOE_PEER_LOST, text);
    }
    const uint8_t *p = body;
    int32_t rst = blen >= 16 ? (int32_t)mm_get_u32(p + 8) : MEGAMOE_INTERNAL;
    if (blen < 16 || mm_get_u64(p) != b->seq) {
        free(body);
        return mm_boot_fail(b, MEGAMOE_INTERNAL, "malformed bootstrap result from rank 0");
    }
    if (rst != MEGAMOE_OK) {
        snprintf(text, sizeof text, "%.*s", (int)(blen - 16), (const char *)p + 16);
        free(body);
        return mm_boot_fail(b, (megamoe_status_t)rst, text);
    }
    if (blen != 16 + len * (size_t)b->world) {
        free(body);
        return mm_boot_fail(b, MEGAMOE_INTERNAL, "bootstrap result of unexpected size");
    }
    memcpy(out, p + 16, len * (size_t)b->world);
    free(body);
    return MEGAMOE_OK;
}

megamoe_status_t mm_boot_barrier(mm_boot_t *b)
{
    uint8_t none = 0;
    return mm_boot_exchange(b, MM_OP_BARRIER, &none, 0, &none);
}

megamoe_status_t mm_boot_allgather(mm_boot_t *b, const void *in, size_t len, void *out)
{
    return mm_boot_exchange(b, MM_OP_ALLGATHER, in, len, out);
}

megamoe_status_t mm_boot_bcast(mm_boot_t *b, void *buf, size_t len, int root)
{
    if (root < 0 || root >= b->world)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "bootstrap broadcast root %d not in [0, %d)",
                        root, b->world);
    uint8_t *all = malloc(len * (size_t)b->world + 1);
    if (all == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "bootstrap broadcast: out of memory");
    megamoe_status_t st = mm_boot_exchange(b, MM_OP_BCAST, buf, len, all);
    if (st == MEGAMOE_OK) memcpy(buf, all + (size_t)root * len, len);
    free(all);
    return st;
}

#define MM_AGREE_TEXT 500
megamoe_status_t mm_boot_agree(mm_boot_t *b, megamoe_status_t local)
{
    uint8_t mine[4 + MM_AGREE_TEXT];
    memset(mine, 0, sizeof mine);
    mm_put_u32(mine, (uint32_t)local);
    if (local != MEGAMOE_OK) snprintf((char *)mine + 4, MM_AGREE_TEXT, "%s", megamoe_last_error());
    uint8_t *all = malloc(sizeof mine * (size_t)b->world);
    if (all == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "bootstrap agree: out of memory");
    megamoe_status_t st = mm_boot_exchange(b, MM_OP_AGREE, mine, sizeof mine, all);
    if (st == MEGAMOE_OK) {
        for (int r = 0; r < b->world; r++) {
            const uint8_t *e = all + (size_t)r * sizeof mine;
            int32_t rs = (int32_t)mm_get_u32(e);
            if (rs == MEGAMOE_OK) continue;
            char text[MM_AGREE_TEXT + 32];
            snprintf(text, sizeof text, "rank %d: %.*s", r, MM_AGREE_TEXT - 1, (const char *)e + 4);
            if (r != b->rank) MM_LOG(MEGAMOE_LOG_ERROR, "%s", text);
            mm_set_last_error(text);
            st = (megamoe_status_t)rs;
            break;
        }
    }
    free(all);
    return st;
}

/* ---- test seam (bootstrap_test.h): the wire layout and the MACs, for the fuzz harness ---- */

#include "bootstrap_test.h"

void mm_boot_test_wire(mm_boot_wire_t *w)
{
    *w = (mm_boot_wire_t){MM_NONCE, MM_CHALLENGE_LEN, MM_HELLO_LEN, 4, 8, 12, MM_TEXT_MAX};
}

/* The same body mm_boot_handshake builds (keep the two in step). */
void mm_boot_test_hello(const mm_boot_config_t *cfg, const uint8_t *server_nonce, uint8_t *hello)
{
    mm_put_u32(hello, MM_BOOT_PROTO);
    mm_put_u32(hello + 4, (uint32_t)cfg->rank);
    mm_put_u32(hello + 8, (uint32_t)cfg->world);
    if (mm_random(hello + 12, MM_NONCE) != MEGAMOE_OK) memset(hello + 12, 0x5a, MM_NONCE);
    mm_settings_encode(hello + 12 + MM_NONCE, &cfg->settings);
    mm_hello_mac(cfg->token, server_nonce, hello, hello + MM_HELLO_LEN - MM_SHA256_BYTES);
}

void mm_boot_test_hello_mac(const char *token, const uint8_t *server_nonce, const uint8_t *body,
                            uint8_t mac[32])
{
    mm_hello_mac(token, server_nonce, body, mac);
}

void mm_boot_test_accept_mac(const char *token, const uint8_t *client_nonce,
                             const uint8_t *server_nonce, uint32_t rank, uint8_t mac[32])
{
    mm_accept_mac(token, client_nonce, server_nonce, rank, mac);
}
