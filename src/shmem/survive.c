/* Surviving a lost peer: loss reports, heartbeats, the survivors' agreement and the view they
 * install (survive.h has the protocol; docs/shmem.md "Surviving a lost rank").
 *
 * Threads: mm_surv_observe runs on any thread (the monitor, UCX callbacks under the engine's
 * lock, waiters); it only raises atomics and wakes the monitor. mm_surv_tick runs on the
 * monitor thread only and is the one that writes into other PEs' segments. mm_surv_recover
 * runs on the callers' threads. `lock` guards the loss texts and the decision; no engine call
 * is made while it is held (UCX callbacks take it through observe).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/clock.h"
#include "base/env.h"
#include "shmem_internal.h"
#include "engine_test.h"
#include "survive.h"

#define MM_SURV_WHY 112

typedef struct mm_surv {
    int n, me;
    int policy_stop; /* MEGAMOE_SHMEM_ON_LOSS=stop: the first loss stops every PE */
    uint64_t peer_timeout_ns, hb_interval_ns;
    atomic_uchar *kind;    /* per PE: MM_LOSS_* as known here */
    atomic_uchar *retired; /* per PE: in the installed lost set */
    atomic_int pending;    /* PEs lost and not retired */
    atomic_int stopped;
    atomic_int any;        /* a loss happened in this lifecycle */
    atomic_int lost_count; /* PEs known lost (the engine closes their endpoints) */
    atomic_ullong view_gen;
    atomic_ullong retired_n;
    void (*kick)(void);
    pthread_mutex_t lock;  /* why, stop_why, the decision */
    char (*why)[MM_SURV_WHY];
    char stop_why[400];
    uint64_t dec_digest;       /* the last decided set's digest (0: none) */
    unsigned char *dec_kind;   /* its kinds */
    /* the monitor's own */
    unsigned char *told;       /* per PE: the kind this PE reported to the others */
    uint64_t posted, decided_seen;
    uint64_t hb_count, hb_sent, last_tick;
    uint64_t *hb_seen, *hb_change;
    uint64_t *heard_seen; /* per PE: the engine's count of its arrivals at the last tick */
} mm_surv_t;

static mm_surv_t S = {.lock = PTHREAD_MUTEX_INITIALIZER};

uint64_t mm_surv_report_off(int q) { return MM_SHMEM_SURV_OFF + 8u * (uint64_t)q; }
uint64_t mm_surv_heartbeat_off(int p)
{
    return MM_SHMEM_SURV_OFF + 8u * ((uint64_t)MM_SHMEM_MAX_PES + (uint64_t)p);
}
uint64_t mm_surv_proposal_off(int p)
{
    return MM_SHMEM_SURV_OFF + 8u * (2u * (uint64_t)MM_SHMEM_MAX_PES + (uint64_t)p);
}

static void mm_surv_free(void)
{
    free((void *)S.kind);
    free((void *)S.retired);
    free(S.why);
    free(S.dec_kind);
    free(S.told);
    free(S.hb_seen);
    free(S.hb_change);
    free(S.heard_seen);
    S.kind = S.retired = NULL;
    S.why = NULL;
    S.dec_kind = S.told = NULL;
    S.hb_seen = S.hb_change = S.heard_seen = NULL;
    S.n = 0;
}

megamoe_status_t mm_surv_init(int n, int me)
{
    mm_surv_free();
    int64_t timeout_ms = 10000;
    int policy = 0; /* index in "survive|stop" */
    MM_CHECK(mm_env_int(MM_ENV_SHMEM_PEER_TIMEOUT_MS, &timeout_ms));
    MM_CHECK(mm_env_enum(MM_ENV_SHMEM_ON_LOSS, &policy));
    S.kind = calloc((size_t)n, sizeof *S.kind);
    S.retired = calloc((size_t)n, sizeof *S.retired);
    S.why = calloc((size_t)n, sizeof *S.why);
    S.dec_kind = calloc((size_t)n, 1);
    S.told = calloc((size_t)n, 1);
    S.hb_seen = calloc((size_t)n, sizeof *S.hb_seen);
    S.hb_change = calloc((size_t)n, sizeof *S.hb_change);
    S.heard_seen = calloc((size_t)n, sizeof *S.heard_seen);
    if (!S.kind || !S.retired || !S.why || !S.dec_kind || !S.told || !S.hb_seen || !S.hb_change ||
        !S.heard_seen) {
        mm_surv_free();
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "SHMEM start-up: out of host memory for the "
                        "liveness state of %d PEs", n);
    }
    S.n = n;
    S.me = me;
    S.policy_stop = policy == 1;
    S.peer_timeout_ns = (uint64_t)timeout_ms * 1000000ull;
    /* several heartbeats per timeout: one late message (a busy core, a TCP retransmission)
     * is no loss */
    S.hb_interval_ns = S.peer_timeout_ns / 6;
    if (S.hb_interval_ns < 10000000ull) S.hb_interval_ns = 10000000ull;
    atomic_store(&S.pending, 0);
    atomic_store(&S.stopped, 0);
    atomic_store(&S.any, 0);
    atomic_store(&S.lost_count, 0);
    atomic_store(&S.view_gen, 0);
    atomic_store(&S.retired_n, 0);
    S.stop_why[0] = '\0';
    S.dec_digest = S.posted = S.decided_seen = 0;
    S.hb_count = 0;
    S.hb_sent = 0;
    S.last_tick = 0; /* the first tick starts every peer's silence clock */
    return MEGAMOE_OK;
}

void mm_surv_fini(void) { mm_surv_free(); }

static atomic_int mm_surv_hold_heartbeats; /* test seam */

void mm_shmem_engine_test_hold_heartbeats(int on) { atomic_store(&mm_surv_hold_heartbeats, on); }

/* The kick is read by the engine's progress thread (a loss it sees) while the owner thread
 * installs or clears it (liveness start and stop): a leaf lock makes clearing it a fence, so no
 * kick runs after the monitor's wake-up descriptor is closed (and possibly reused). */
static pthread_mutex_t mm_surv_kick_lock = PTHREAD_MUTEX_INITIALIZER;

void mm_surv_set_kick(void (*kick)(void))
{
    pthread_mutex_lock(&mm_surv_kick_lock);
    S.kick = kick;
    pthread_mutex_unlock(&mm_surv_kick_lock);
}

static void mm_surv_wake(void)
{
    pthread_mutex_lock(&mm_surv_kick_lock);
    if (S.kick) S.kick();
    pthread_mutex_unlock(&mm_surv_kick_lock);
}

/* ---- what is known here ---------------------------------------------------------------- */

/* This PE is out: every later call fails with PEER_LOST naming why ("is ..."). */
static void mm_surv_stop(const char *why)
{
    pthread_mutex_lock(&S.lock);
    int first = !atomic_load(&S.stopped);
    if (first) snprintf(S.stop_why, sizeof S.stop_why, "%s", why);
    pthread_mutex_unlock(&S.lock);
    if (!first) return;
    atomic_store_explicit(&S.stopped, 1, memory_order_release);
    atomic_store(&S.any, 1);
    MM_LOG(MEGAMOE_LOG_ERROR, "shmem: this rank stops: %s", S.stop_why);
    mm_surv_wake();
}

void mm_surv_observe(int pe, int kind, const char *why)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (S.n == 0 || pe < 0 || pe >= S.n || pe == S.me || atomic_load(&g->closing)) return;
    unsigned char old = atomic_load(&S.kind[pe]);
    while (old < kind && !atomic_compare_exchange_weak(&S.kind[pe], &old, (unsigned char)kind)) {
    }
    if (old >= kind) return;
    if (g->dead) atomic_store(&g->dead[pe], 1);
    atomic_store(&S.any, 1);
    if (old == MM_LOSS_NONE) {
        atomic_fetch_add(&S.lost_count, 1);
        pthread_mutex_lock(&S.lock);
        snprintf(S.why[pe], MM_SURV_WHY, "%s", why);
        pthread_mutex_unlock(&S.lock);
        if (!atomic_load(&S.retired[pe])) atomic_fetch_add(&S.pending, 1);
        MM_LOG(MEGAMOE_LOG_ERROR, "shmem: rank %d lost: %s", pe, why);
        if (S.policy_stop) {
            char text[200];
            snprintf(text, sizeof text, "stops with the job: rank %d was lost (%s) and "
                     "MEGAMOE_SHMEM_ON_LOSS=stop", pe, why);
            mm_surv_stop(text);
        }
    }
    mm_surv_wake();
}

int mm_surv_kind(int pe)
{
    if (S.n == 0 || pe < 0 || pe >= S.n) return MM_LOSS_NONE;
    return atomic_load(&S.kind[pe]);
}

int mm_surv_retired(int pe)
{
    if (S.n == 0 || pe < 0 || pe >= S.n) return 0;
    return atomic_load_explicit(&S.retired[pe], memory_order_acquire);
}

int mm_surv_any_lost(void) { return S.n && atomic_load(&S.any); }
int mm_surv_lost_count(void) { return S.n ? atomic_load(&S.lost_count) : 0; }
int mm_surv_stopped(void) { return S.n && atomic_load_explicit(&S.stopped, memory_order_acquire); }
uint64_t mm_surv_view_gen(void) { return atomic_load_explicit(&S.view_gen, memory_order_acquire); }
uint64_t mm_surv_view_tag(void) { return atomic_load(&S.retired_n); }
uint64_t mm_surv_peer_timeout_ns(void) { return S.peer_timeout_ns; }

int mm_surv_pending_pe(void)
{
    if (S.n == 0) return -1;
    int stopped = atomic_load_explicit(&S.stopped, memory_order_acquire);
    if (!stopped && atomic_load_explicit(&S.pending, memory_order_acquire) == 0) return -1;
    int first = -1;
    for (int q = 0; q < S.n; q++) {
        if (!atomic_load(&S.kind[q])) continue;
        if (first < 0) first = q;
        if (!atomic_load(&S.retired[q])) return q;
    }
    return stopped ? (first >= 0 ? first : S.me) : -1;
}

/* Digest of the lost set with its kinds (0: nothing lost). */
static uint64_t mm_surv_digest_of(const unsigned char *k, int atomic)
{
    uint64_t h = 1469598103934665603ull;
    int any = 0;
    for (int q = 0; q < S.n; q++) {
        unsigned v = atomic ? atomic_load(&((atomic_uchar *)(void *)k)[q]) : k[q];
        if (!v) continue;
        any = 1;
        uint32_t x = (uint32_t)q << 2 | v;
        for (int b = 0; b < 4; b++) h = (h ^ ((x >> (8 * b)) & 0xffu)) * 1099511628211ull;
    }
    return any ? h | (1ull << 63) : 0;
}

static uint64_t mm_surv_digest(void) { return mm_surv_digest_of((const unsigned char *)S.kind, 1); }

/* "0, 2, 5" (at most 12 ranks, then "and N more") of the PEs whose entry in k satisfies want. */
static void mm_surv_list(const unsigned char *k, int want_lost, char *out, size_t len)
{
    size_t o = 0;
    int shown = 0, more = 0;
    out[0] = '\0';
    for (int q = 0; q < S.n; q++) {
        if ((k[q] != 0) != want_lost) continue;
        if (shown == 12) {
            more++;
            continue;
        }
        int w = snprintf(out + o, len - o, "%s%d", shown ? ", " : "", q);
        if (w < 0 || (size_t)w >= len - o) break;
        o += (size_t)w;
        shown++;
    }
    if (more && o < len) snprintf(out + o, len - o, " and %d more", more);
}

megamoe_status_t mm_surv_check(const char *what)
{
    if (S.n == 0) return MEGAMOE_OK;
    if (atomic_load_explicit(&S.stopped, memory_order_acquire)) {
        char why[400];
        pthread_mutex_lock(&S.lock);
        snprintf(why, sizeof why, "%s", S.stop_why);
        pthread_mutex_unlock(&S.lock);
        return mm_error(MEGAMOE_PEER_LOST, "rank %d (this process) %s, during %s; every later "
                        "call of this rank fails: release SHMEM (the job goes on without this "
                        "rank, or restart it)", S.me, why, what);
    }
    if (atomic_load_explicit(&S.pending, memory_order_acquire) == 0) return MEGAMOE_OK;
    int q = mm_surv_pending_pe();
    if (q < 0) return MEGAMOE_OK;
    char why[MM_SURV_WHY];
    pthread_mutex_lock(&S.lock);
    snprintf(why, sizeof why, "%s", S.why[q]);
    pthread_mutex_unlock(&S.lock);
    return mm_error(MEGAMOE_PEER_LOST, "rank %d was lost (%s) during %s; %s", q, why, what,
                    S.policy_stop ? "the job cannot continue (MEGAMOE_SHMEM_ON_LOSS=stop): "
                                    "release SHMEM and restart every rank"
                                  : "this call failed; the survivors agree on who is gone and "
                                    "the next call runs among them");
}

/* ---- the monitor's tick ---------------------------------------------------------------- */

static uint64_t mm_surv_word(uint64_t off)
{
    return __atomic_load_n((const uint64_t *)(const void *)(mm_shmem_g.my_base + off),
                           __ATOMIC_ACQUIRE);
}

/* The decided set: who serves on, and whether this PE is on the side that does. */
static void mm_surv_decide(uint64_t d)
{
    unsigned char *kk = malloc((size_t)S.n); /* rare: once per decision */
    if (kk == NULL) return;
    for (int q = 0; q < S.n; q++) kk[q] = atomic_load(&S.kind[q]);
    if (mm_surv_digest_of(kk, 0) != d) { /* changed while we looked: the next tick */
        free(kk);
        return;
    }
    int dead = 0, live = 0, lowest = -1;
    for (int q = 0; q < S.n; q++) {
        if (kk[q] == MM_LOSS_DEAD) {
            dead++;
            continue;
        }
        if (lowest < 0) lowest = q;
        if (!kk[q]) live++;
    }
    const int base = S.n - dead; /* ranks not known dead: the two sides of a partition */
    const int serve = 2 * live > base || (2 * live == base && lowest >= 0 && !kk[lowest]);
    char lost[160], alive[160];
    mm_surv_list(kk, 1, lost, sizeof lost);
    mm_surv_list(kk, 0, alive, sizeof alive);
    if (!serve) {
        char text[400];
        snprintf(text, sizeof text, "is on the smaller side of a partition: it reaches %d of "
                 "the %d ranks not known dead (unreachable or lost: %s); the side with more "
                 "ranks (a tie: the one holding rank %d) keeps serving", live, base, lost, lowest);
        mm_surv_stop(text);
    }
    pthread_mutex_lock(&S.lock);
    memcpy(S.dec_kind, kk, (size_t)S.n);
    S.dec_digest = d;
    pthread_mutex_unlock(&S.lock);
    S.decided_seen = d;
    if (serve)
        MM_LOG(MEGAMOE_LOG_INFO, "shmem: the survivors agree: ranks %s lost; ranks %s serve on",
               lost, alive);
    free(kk);
}

void mm_surv_tick(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (S.n == 0 || g->my_base == NULL || atomic_load(&g->closing)) return;
    const uint64_t now = mm_now_ns();
    /* 1. what the others reported into this segment */
    for (int q = 0; q < S.n; q++) {
        uint64_t w = mm_surv_word(mm_surv_report_off(q));
        if (w == 0) continue;
        if (q == S.me) {
            mm_surv_stop("was declared lost by another rank (it could not reach or hear this "
                         "rank)");
            continue;
        }
        int k = (w >> 32) ? MM_LOSS_DEAD : MM_LOSS_UNREACHABLE;
        if (k > atomic_load(&S.kind[q])) mm_surv_observe(q, k, "reported by another rank");
    }
    /* 2. heartbeats to and from the peers on other hosts (same-host peers: pidfds). A tick
     * that comes late (this monitor was not scheduled: a loaded machine, a stopped process)
     * cannot judge the others' silence: every clock restarts. */
    if (S.last_tick == 0 || now - S.last_tick > S.peer_timeout_ns / 2)
        for (int p = 0; p < S.n; p++) S.hb_change[p] = now;
    S.last_tick = now;
    if (g->engine) {
        if (now - S.hb_sent >= S.hb_interval_ns && !atomic_load(&mm_surv_hold_heartbeats)) {
            S.hb_count++;
            S.hb_sent = now;
            for (int p = 0; p < S.n; p++)
                if (p != S.me && g->remote[p] && !atomic_load(&S.kind[p]))
                    (void)mm_shmem_word_op(p, mm_surv_heartbeat_off(S.me), S.hb_count,
                                           MM_ENGINE_SET | MM_ENGINE_NO_QUIET);
        }
        for (int p = 0; p < S.n; p++) {
            if (p == S.me || !g->remote[p] || atomic_load(&S.kind[p])) continue;
            /* a heartbeat or any message from p is life: a peer streaming data at this PE
             * may hold its heartbeat behind that data (its staging ring full) for long */
            uint64_t v = mm_surv_word(mm_surv_heartbeat_off(p));
            uint64_t h = g->engine_ops->heard ? g->engine_ops->heard(g->engine, p) : 0;
            if (v != S.hb_seen[p] || h != S.heard_seen[p]) {
                S.hb_seen[p] = v;
                S.heard_seen[p] = h;
                S.hb_change[p] = now;
            } else if (now - S.hb_change[p] > S.peer_timeout_ns) {
                char why[MM_SURV_WHY];
                snprintf(why, sizeof why, "nothing heard for %.1f s (no heartbeat, data or "
                         "acknowledgement): its host is down or cut off", (double)(now - S.hb_change[p]) * 1e-9);
                mm_surv_observe(p, MM_LOSS_UNREACHABLE, why);
            }
        }
    }
    /* 3. tell every PE not known dead (the lost one too: a PE declared lost while alive must
     * learn it and stop) what this PE knows */
    for (int q = 0; q < S.n; q++) {
        unsigned k = atomic_load(&S.kind[q]);
        if (k <= S.told[q]) continue;
        uint64_t inc = (S.told[q] == MM_LOSS_NONE ? 1u : 0u) +
                       (k == MM_LOSS_DEAD ? (1ull << 32) : 0u);
        for (int p = 0; p < S.n; p++)
            if (p != S.me && atomic_load(&S.kind[p]) != MM_LOSS_DEAD)
                (void)mm_shmem_word_op(p, mm_surv_report_off(q), inc,
                                       MM_ENGINE_ADD | MM_ENGINE_NO_QUIET);
        S.told[q] = (unsigned char)k;
    }
    /* 4. the agreement: post the digest of what this PE knows to every PE it believes alive;
     * decided once each of them posted the same */
    const uint64_t d = mm_surv_digest();
    if (d == 0 || d == S.decided_seen) return;
    if (d != S.posted) {
        for (int p = 0; p < S.n; p++)
            if (p != S.me && !atomic_load(&S.kind[p]))
                (void)mm_shmem_word_op(p, mm_surv_proposal_off(S.me), d,
                                       MM_ENGINE_SET | MM_ENGINE_NO_QUIET);
        S.posted = d;
    }
    for (int p = 0; p < S.n; p++)
        if (p != S.me && !atomic_load(&S.kind[p]) && mm_surv_word(mm_surv_proposal_off(p)) != d)
            return;
    mm_surv_decide(d);
}

int mm_surv_tick_ms(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (S.n == 0) return 1000;
    uint64_t d = atomic_load(&S.any) ? mm_surv_digest() : 0;
    if (d != 0 && d != S.decided_seen) return 2; /* an agreement is running */
    if (g->engine) {
        uint64_t ms = S.hb_interval_ns / 2000000ull;
        return ms < 5 ? 5 : ms > 1000 ? 1000 : (int)ms;
    }
    return 1000;
}

/* ---- acknowledging a decision ---------------------------------------------------------- */

/* Install the decision (lock held): its PEs retire; a same-host one's mapping is replaced by
 * fresh anonymous memory (its pages go; a straggling access lands in zeros, never a fault). */
static void mm_surv_install(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    int n_new = 0;
    for (int q = 0; q < S.n; q++) {
        if (!S.dec_kind[q] || atomic_load(&S.retired[q])) continue;
        atomic_store_explicit(&S.retired[q], 1, memory_order_release);
        atomic_fetch_sub(&S.pending, 1);
        atomic_fetch_add(&S.retired_n, 1);
        n_new++;
        if (q != S.me && g->bases && g->bases[q] && !g->remote[q]) {
            void *r = mmap(g->bases[q], g->seg_size, PROT_READ | PROT_WRITE,
                           MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (r == MAP_FAILED) MM_SHMEM_WARN("cannot release lost rank %d's heap mapping", q);
        }
    }
    if (n_new) atomic_fetch_add_explicit(&S.view_gen, 1, memory_order_release);
}

megamoe_status_t mm_surv_recover(const char *what)
{
    if (S.n == 0) return MEGAMOE_OK;
    if (!atomic_load_explicit(&S.stopped, memory_order_acquire) &&
        atomic_load_explicit(&S.pending, memory_order_acquire) == 0)
        return MEGAMOE_OK;
    const uint64_t start = mm_now_ns(), timeout = mm_shmem_timeout_ns();
    for (;;) {
        if (atomic_load_explicit(&S.stopped, memory_order_acquire)) return mm_surv_check(what);
        pthread_mutex_lock(&S.lock);
        int done = atomic_load(&S.pending) == 0;
        if (!done && S.dec_digest != 0 && S.dec_digest == mm_surv_digest()) {
            mm_surv_install();
            done = 1;
        }
        pthread_mutex_unlock(&S.lock);
        if (done) return atomic_load(&S.stopped) ? mm_surv_check(what) : MEGAMOE_OK;
        uint64_t el = mm_now_ns() - start;
        if (el >= timeout)
            return mm_error(MEGAMOE_TIMEOUT, "%s: the survivors of a lost rank did not agree on "
                            "who is gone within %.1f s (a rank believed alive does not answer); "
                            "raise HYPER_PARALLEL_SHMEM_TIMEOUT_SEC, or check the ranks' logs",
                            what, (double)el * 1e-9);
        mm_surv_wake();
        mm_sleep_ns(el < 20000000ull ? 200000ull : 1000000ull);
    }
}
