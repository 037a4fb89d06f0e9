/* megamoe bench serve --loop SECONDS: one rank of a serving loop that survives lost ranks.
 *
 *     megamoe launch -n 4 --timeout 60 --fault kill-rank:0@3 -- megamoe bench serve --loop 10
 *
 * Every rank (started by `megamoe launch`, optionally with --fault) creates one symmetric
 * buffer on the world and calls mega_moe in a loop until SECONDS after the job's start (the
 * launcher's clock, MEGAMOE_LAUNCH_T0_NS, which also times the faults), each call with fresh
 * tokens and routing, and checks every output against an fp32 evaluation of the masked
 * routing: pairs routed to a rank the buffer's mask disables (a lost rank, masked by the
 * runtime) contribute nothing, nothing is renormalised (docs/serve.md §7's rule). A call that
 * fails with PEER_LOST is counted, and the loop goes on: the next call runs among the
 * survivors. The ranks stop together: after each call the ranks still serving vote (an
 * allgather on a team of them, rebuilt from the survivors after a loss).
 *
 * Each rank that is still running at the end prints one JSON line (or appends it to --out):
 * rank, serving (false: this rank stopped — declared lost, or on the smaller side of a cut),
 * calls_before / failed_calls / calls_after (good calls before the first failure, failed calls,
 * good calls after the last failure), recover_ms (the loss to the end of the first good call
 * after it: the fault's time from MEGAMOE_LAUNCH_FAULTS, else the failed call's start),
 * detect_ms, wrong_outputs, target_recover_ms (1000 ms plus the stated detection time of the
 * fault: 0 for a killed process, MEGAMOE_SHMEM_PEER_TIMEOUT_MS + a heartbeat interval for a
 * cut host), the resident set and descriptors at the first call and at the end.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "megamoe/comm.h"
#include "megamoe/serve.h"
#include "shmem/comm_impl.h"
#include "shmem/shmem.h"

#include "bench_util.h"

int mm_bench_serve_loop(int argc, char **argv);

#define MM_LOOP_MAX_FAULTS 16

typedef struct {
    int64_t H, I, E, K, T;
} mm_loop_shape_t;

typedef struct {
    double at_s;
    int cut;
    char spec[48];
} mm_loop_fault_t;

/* ---- data (deterministic: any rank can rebuild any expert and any rank's tokens) --------- */

static uint32_t mm_hash(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static float mm_unit(uint32_t *s) /* [-0.5, 0.5) */
{
    *s = mm_hash(*s + 0x9e3779b9u);
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

typedef struct {
    int n;
    uint16_t *x;
    int32_t *ids;
    float *w;
} mm_loop_tokens_t;

static void mm_loop_tokens(const mm_loop_shape_t *sh, int rank, uint64_t call, mm_loop_tokens_t *t)
{
    uint32_t s = mm_hash((uint32_t)rank * 7919u + (uint32_t)call * 104729u + 17u);
    t->n = (int)sh->T;
    for (int64_t i = 0; i < sh->T * sh->H; i++) t->x[i] = megamoe_fp32_to_bf16(2.0f * mm_unit(&s));
    for (int64_t i = 0; i < sh->T; i++) {
        for (int64_t k = 0; k < sh->K; k++) {
            int32_t e;
            int dup;
            do { /* K distinct experts per token */
                s = mm_hash(s + 1u);
                e = (int32_t)(s % (uint32_t)sh->E);
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= t->ids[i * sh->K + j] == e;
            } while (dup);
            t->ids[i * sh->K + k] = e;
            t->w[i * sh->K + k] = 0.2f + mm_unit(&s) * 0.3f;
        }
    }
}

/* y = sum over unmasked pairs of w * F_e(x), fp32 from the bf16 inputs */
static void mm_loop_reference(const mm_loop_shape_t *sh, const mm_loop_tokens_t *t,
                              const uint16_t *w1, const uint16_t *w2, const int32_t *mask,
                              int64_t L, float *y, float *scratch)
{
    const int64_t H = sh->H, I = sh->I;
    float *xf = scratch, *h = xf + H, *a = h + 2 * I;
    for (int64_t i = 0; i < t->n; i++) {
        float *yi = y + i * H;
        for (int64_t o = 0; o < H; o++) yi[o] = 0.0f;
        for (int64_t j = 0; j < H; j++) xf[j] = megamoe_bf16_to_fp32(t->x[i * H + j]);
        for (int64_t k = 0; k < sh->K; k++) {
            const int32_t e = t->ids[i * sh->K + k];
            if (mask && mask[e / L]) continue; /* a disabled rank's expert: nothing */
            const uint16_t *W1 = w1 + (size_t)e * (size_t)(H * 2 * I);
            const uint16_t *W2 = w2 + (size_t)e * (size_t)(I * H);
            for (int64_t c = 0; c < 2 * I; c++) h[c] = 0.0f;
            for (int64_t j = 0; j < H; j++) {
                const float xv = xf[j];
                const uint16_t *row = W1 + j * 2 * I;
                for (int64_t c = 0; c < 2 * I; c++) h[c] += xv * megamoe_bf16_to_fp32(row[c]);
            }
            for (int64_t c = 0; c < I; c++) a[c] = h[c] / (1.0f + expf(-h[c])) * h[I + c];
            const float wk = t->w[i * sh->K + k];
            for (int64_t c = 0; c < I; c++) {
                const float av = wk * a[c];
                const uint16_t *row = W2 + c * H;
                for (int64_t o = 0; o < H; o++) yi[o] += av * megamoe_bf16_to_fp32(row[o]);
            }
        }
    }
}

/* docs/serve.md §7: elementwise |y - ref| <= 2e-2 |ref| + 2e-3 max(1, max|ref|), or else the
 * relative L2 error <= 1 %. */
static int mm_loop_close(const uint16_t *y, const float *ref, int64_t n)
{
    double maxref = 0, num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) maxref = fmax(maxref, fabs(ref[i]));
    const double atol = 2e-3 * fmax(1.0, maxref);
    int elementwise = 1;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)megamoe_bf16_to_fp32(y[i]) - ref[i];
        if (!(fabs(d) <= 2e-2 * fabs(ref[i]) + atol)) elementwise = 0;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (elementwise) return 1;
    return den > 0 && sqrt(num / den) <= 1e-2;
}

static megamoe_tensor_t mm_t(void *data, megamoe_dtype_t dt, int ndim, int64_t d0, int64_t d1)
{
    megamoe_tensor_t x = megamoe_tensor_none();
    x.data = data;
    x.dtype = dt;
    x.ndim = ndim;
    x.shape[0] = d0;
    x.shape[1] = d1;
    return x;
}

/* ---- process figures ------------------------------------------------------------------- */

static int mm_loop_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3;
}

/* The real injection time (seconds after t0) of the fault with this spec, from the launcher's
 * MEGAMOE_LAUNCH_FAULT_LOG; -1 when unknown. */
static double mm_loop_injected_s(const char *spec, size_t len, uint64_t t0)
{
    const char *path = getenv("MEGAMOE_LAUNCH_FAULT_LOG");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    double at = -1;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (sp && (size_t)(sp - line) == len && strncmp(line, spec, len) == 0)
            at = (atof(sp + 1) - (double)t0) * 1e-9;
    }
    if (f) fclose(f);
    return at;
}

/* The launcher's faults (MEGAMOE_LAUNCH_FAULTS), in time order. */
static int mm_loop_faults(mm_loop_fault_t *f)
{
    const char *s = getenv("MEGAMOE_LAUNCH_FAULTS");
    int n = 0;
    while (s && *s && n < MM_LOOP_MAX_FAULTS) {
        const char *at = strchr(s, '@');
        if (at == NULL) break;
        f[n].cut = strncmp(s, "cut-host:", 9) == 0;
        f[n].at_s = atof(at + 1);
        const char *end = strchr(at, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        snprintf(f[n].spec, sizeof f[n].spec, "%.*s", (int)len, s);
        n++;
        s = end;
        if (s) s++;
    }
    for (int i = 1; i < n; i++) /* insertion sort by time */
        for (int j = i; j > 0 && f[j].at_s < f[j - 1].at_s; j--) {
            mm_loop_fault_t x = f[j];
            f[j] = f[j - 1];
            f[j - 1] = x;
        }
    return n;
}

/* ---- the loop -------------------------------------------------------------------------- */

typedef struct {
    megamoe_comm_t *world, *vote; /* the vote's communicator (the world, then survivors) */
} mm_loop_comms_t;

/* 1 when every rank still serving wants to go on; -1 when this rank is out. *saw_loss: the
 * vote itself ran into a loss (it failed once, or its team lost a member). */
static int mm_loop_vote(mm_loop_comms_t *c, int stop, int *saw_loss)
{
    *saw_loss = 0;
    for (int tries = 0; tries < 8; tries++) {
        mm_shmem_team_t *t = mm_comm_team(c->vote);
        if (t == NULL || mm_shmem_team_lost_member(t) >= 0 || tries > 0) {
            *saw_loss = 1;
            megamoe_comm_t *next = NULL;
            megamoe_status_t st = megamoe_comm_survivors(c->world, &next);
            if (st != MEGAMOE_OK) {
                if (mm_shmem_recover() != MEGAMOE_OK) return -1; /* this rank is out */
                continue;
            }
            if (c->vote != c->world) megamoe_comm_destroy(c->vote); /* broken: local */
            c->vote = next;
            t = mm_comm_team(c->vote);
        }
        int n = mm_shmem_team_n_pes(t), flags[4096];
        if (n > 4096) return -1;
        if (mm_shmem_team_allgather(t, flags, &stop, sizeof stop) != MEGAMOE_OK) {
            *saw_loss = 1;
            if (mm_shmem_recover() != MEGAMOE_OK) return -1;
            continue;
        }
        for (int i = 0; i < n; i++)
            if (flags[i]) return 0;
        return 1;
    }
    return -1;
}

/* A loss seen by a call or a vote that ran from c0 to c1: attributed to the last fault due by
 * then (its time is the loss's), else it happened at c0. */
static void mm_loop_episode(const mm_loop_fault_t *faults, int n_faults, uint64_t t0, uint64_t c0,
                            uint64_t c1, double *loss_s, int *cut_of, double *detect_ms,
                            double *recover_ms, int *episodes, int *failing)
{
    const int e = *episodes;
    const double fail_s = ((double)c1 - (double)t0) * 1e-9;
    int f = -1;
    for (int i = 0; i < n_faults; i++)
        if (faults[i].at_s <= fail_s) f = i;
    loss_s[e] = f >= 0 ? faults[f].at_s : ((double)c0 - (double)t0) * 1e-9;
    cut_of[e] = f >= 0 && faults[f].cut;
    detect_ms[e] = fail_s * 1e3 - loss_s[e] * 1e3;
    recover_ms[e] = -1;
    *episodes = e + 1;
    *failing = 1;
}

static int mm_loop_shape(const char *text, int W, mm_loop_shape_t *sh)
{
    long long H = 128, I = 64, E = 2 * W, K = 2;
    if (strcmp(text, "tiny") == 0) {
        /* the defaults */
    } else if (strcmp(text, "small") == 0) {
        H = 256, I = 128, E = 2 * W, K = 4;
    } else if (sscanf(text, "%lld:%lld:%lld:%lld", &H, &I, &E, &K) != 4) {
        return -1;
    }
    sh->H = H;
    sh->I = I;
    sh->E = E;
    sh->K = K < E ? K : E;
    return H > 0 && I > 0 && E > 0 && E % W == 0 && K > 0 ? 0 : -1;
}

int mm_bench_serve_loop(int argc, char **argv)
{
    const double seconds = atof(mm_bench_opt(argc, argv, "--loop", "0"));
    const char *shape_text = mm_bench_opt(argc, argv, "--shape", "tiny");
    const long long tokens = atoll(mm_bench_opt(argc, argv, "--tokens", "8"));
    const char *out_path = mm_bench_opt(argc, argv, "--out", NULL);
    if (seconds <= 0 || tokens < 1) {
        fprintf(stderr, "megamoe bench serve --loop SECONDS: SECONDS > 0 and --tokens >= 1\n");
        return 2;
    }
    if (getenv("RANK") == NULL || getenv("WORLD_SIZE") == NULL) {
        fprintf(stderr, "megamoe bench serve --loop runs as one rank of a job: start it with "
                        "megamoe launch -n N [--fault kill-rank:R@S] --timeout T -- megamoe bench "
                        "serve --loop %g\n", seconds);
        return 2;
    }
    const char *t0s = getenv("MEGAMOE_LAUNCH_T0_NS");
    const uint64_t t0 = t0s && *t0s ? strtoull(t0s, NULL, 10) : mm_now_ns();
    const uint64_t deadline = t0 + (uint64_t)(seconds * 1e9);
    mm_loop_fault_t faults[MM_LOOP_MAX_FAULTS];
    const int n_faults = mm_loop_faults(faults);
    const int W = atoi(getenv("WORLD_SIZE")), rank = atoi(getenv("RANK"));
    mm_loop_shape_t sh;
    if (W < 1 || mm_loop_shape(shape_text, W, &sh) != 0) {
        fprintf(stderr, "megamoe bench serve --loop: --shape tiny|small|H:I:E:K (E a multiple of "
                        "the %d ranks)\n", W);
        return 2;
    }
    sh.T = tokens;
    const int64_t H = sh.H, I = sh.I, E = sh.E, K = sh.K, T = sh.T, L = E / W;
    /* every expert's weights (the reference needs them all), the rank's own L passed */
    uint16_t *w1 = malloc(sizeof *w1 * (size_t)(E * H * 2 * I));
    uint16_t *w2 = malloc(sizeof *w2 * (size_t)(E * I * H));
    mm_loop_tokens_t tk = {0, malloc(sizeof(uint16_t) * (size_t)(T * H)),
                           malloc(sizeof(int32_t) * (size_t)(T * K)), malloc(sizeof(float) * (size_t)(T * K))};
    uint16_t *y = malloc(sizeof *y * (size_t)(T * H));
    float *ref = malloc(sizeof *ref * (size_t)(T * H)), *scr = malloc(sizeof(float) * (size_t)(H + 3 * I));
    int32_t *etn = malloc(sizeof *etn * (size_t)L);
    megamoe_tensor_t *l1 = calloc((size_t)L, sizeof *l1), *l2 = calloc((size_t)L, sizeof *l2);
    if (!w1 || !w2 || !tk.x || !tk.ids || !tk.w || !y || !ref || !scr || !etn || !l1 || !l2) {
        fprintf(stderr, "megamoe bench serve --loop: out of memory\n");
        return 1;
    }
    for (int64_t e = 0; e < E; e++) {
        uint32_t s = mm_hash(0xabcdu + (uint32_t)e);
        const float g1 = 1.0f / sqrtf((float)H), g2 = 1.0f / sqrtf((float)I);
        for (int64_t i = 0; i < H * 2 * I; i++)
            w1[e * H * 2 * I + i] = megamoe_fp32_to_bf16(2.0f * g1 * mm_unit(&s));
        for (int64_t i = 0; i < I * H; i++)
            w2[e * I * H + i] = megamoe_fp32_to_bf16(2.0f * g2 * mm_unit(&s));
    }
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    const int64_t cap = T * W * (K < L ? K : L);
    cp.heap_size = (uint64_t)((cap * (H * 2 + 64) + (64ll << 20)) / (1 << 20) + 1) << 20;
    mm_loop_comms_t comms = {NULL, NULL};
    megamoe_status_t st = megamoe_comm_create(&cp, &comms.world);
    megamoe_symm_buffer_t *buf = NULL;
    if (st == MEGAMOE_OK) {
        megamoe_symm_buffer_params_t bp = megamoe_symm_buffer_params_default();
        bp.num_experts = E;
        bp.num_max_tokens_per_rank = T;
        bp.num_topk = K;
        bp.hidden = H;
        bp.intermediate_hidden = 2 * I;
        st = megamoe_symm_buffer_create(comms.world, &bp, &buf);
    }
    if (st != MEGAMOE_OK) {
        fprintf(stderr, "megamoe bench serve --loop: rank %d: set-up failed: %s\n", rank,
                megamoe_last_error());
        return 1;
    }
    comms.vote = comms.world;
    for (int64_t j = 0; j < L; j++) {
        l1[j] = mm_t(w1 + (rank * L + j) * H * 2 * I, MEGAMOE_DTYPE_BF16, 2, H, 2 * I);
        l2[j] = mm_t(w2 + (rank * L + j) * I * H, MEGAMOE_DTYPE_BF16, 2, I, H);
    }
    long calls = 0, good = 0, before = 0, failed = 0, after = 0, wrong = 0;
    int failing = 0, serving = 1, episodes = 0;
    double recover_ms[MM_LOOP_MAX_FAULTS], detect_ms[MM_LOOP_MAX_FAULTS], loss_s[MM_LOOP_MAX_FAULTS];
    int cut_of[MM_LOOP_MAX_FAULTS];
    char last_error[300] = "";
    double rss0 = 0, rss1 = 0;
    int fds0 = -1, fds1 = -1;
    double loop_ms_sum = 0;
    for (;;) {
        mm_loop_tokens(&sh, rank, (uint64_t)calls, &tk);
        megamoe_mega_moe_args_t a = megamoe_mega_moe_args_default();
        a.x = mm_t(tk.x, MEGAMOE_DTYPE_BF16, 2, T, H);
        a.topk_ids = mm_t(tk.ids, MEGAMOE_DTYPE_INT32, 2, T, K);
        a.topk_weights = mm_t(tk.w, MEGAMOE_DTYPE_FP32, 2, T, K);
        a.l1_weights = (megamoe_tensor_list_t){L, l1};
        a.l2_weights = (megamoe_tensor_list_t){L, l2};
        a.y = mm_t(y, MEGAMOE_DTYPE_BF16, 2, T, H);
        a.expert_token_nums = mm_t(etn, MEGAMOE_DTYPE_INT32, 1, L, 0);
        const uint64_t c0 = mm_now_ns();
        st = megamoe_mega_moe(buf, &a);
        const uint64_t c1 = mm_now_ns();
        calls++;
        if (st == MEGAMOE_OK) {
            int32_t *mask = NULL;
            megamoe_symm_buffer_mask(buf, &mask);
            mm_loop_reference(&sh, &tk, w1, w2, mask, L, ref, scr);
            if (!mm_loop_close(y, ref, T * H)) {
                wrong++;
                fprintf(stderr, "rank %d: call %ld: the output does not match the reference of the "
                        "masked routing\n", rank, calls);
            }
            good++;
            if (episodes == 0) before++;
            else after++;
            loop_ms_sum += (double)(c1 - c0) * 1e-6;
            if (failing) { /* the first good call after a loss */
                recover_ms[episodes - 1] = ((double)c1 - (double)t0) * 1e-6 - loss_s[episodes - 1] * 1e3;
                failing = 0;
            }
            if (good == 1) {
                rss0 = mm_resident_mb();
                fds0 = mm_loop_fds();
            }
        } else {
            failed++;
            snprintf(last_error, sizeof last_error, "%s", megamoe_last_error());
            if (!failing && episodes < MM_LOOP_MAX_FAULTS) /* a new loss */
                mm_loop_episode(faults, n_faults, t0, c0, c1, loss_s, cut_of, detect_ms,
                                recover_ms, &episodes, &failing);
            if (st != MEGAMOE_PEER_LOST) fprintf(stderr, "rank %d: call %ld: %s\n", rank, calls, last_error);
        }
        if (mm_shmem_recover() != MEGAMOE_OK || !megamoe_comm_rank_alive(comms.world, rank)) {
            serving = 0; /* declared lost, or on the smaller side: this rank is out */
            mm_shmem_recover(); /* its reason as the last error */
            snprintf(last_error, sizeof last_error, "%s", megamoe_last_error());
            break;
        }
        int vote_loss = 0;
        const uint64_t v0 = mm_now_ns();
        const int v = mm_loop_vote(&comms, mm_now_ns() >= deadline, &vote_loss);
        if (vote_loss && !failing && episodes < MM_LOOP_MAX_FAULTS) /* seen between calls */
            mm_loop_episode(faults, n_faults, t0, v0, mm_now_ns(), loss_s, cut_of, detect_ms,
                            recover_ms, &episodes, &failing);
        if (v < 0) {
            serving = 0;
            mm_shmem_recover(); /* its reason as the last error */
            snprintf(last_error, sizeof last_error, "%s", megamoe_last_error());
            break;
        }
        if (v == 0) break;
    }
    rss1 = mm_resident_mb();
    fds1 = mm_loop_fds();
    /* the launcher may have injected a fault late (a loaded machine): measure from when it did */
    for (int e = 0; e < episodes; e++)
        for (int i = 0; i < n_faults; i++) {
            if (faults[i].at_s != loss_s[e]) continue;
            double real = mm_loop_injected_s(faults[i].spec, strlen(faults[i].spec), t0);
            if (real < 0) continue;
            detect_ms[e] -= (real - loss_s[e]) * 1e3;
            if (recover_ms[e] >= 0) recover_ms[e] -= (real - loss_s[e]) * 1e3;
            loss_s[e] = real;
            break;
        }
    /* the row */
    const char *pt = getenv("MEGAMOE_SHMEM_PEER_TIMEOUT_MS");
    const double peer_timeout_ms = pt && *pt ? atof(pt) : 10000.0;
    char row[2048];
    int o = snprintf(row, sizeof row, "{\"bench\": \"serve_loop\", \"rank\": %d, \"world\": %d, "
                     "\"serving\": %s, \"shape\": \"H%lld I%lld E%lld K%lld T%lld\", \"calls\": %ld, "
                     "\"calls_before\": %ld, \"failed_calls\": %ld, \"calls_after\": %ld, "
                     "\"wrong_outputs\": %ld", rank, W, serving ? "true" : "false", (long long)H,
                     (long long)I, (long long)E, (long long)K, (long long)T, calls, before, failed,
                     after, wrong);
    if (episodes > 0) {
        o += snprintf(row + o, sizeof row - (size_t)o, ", \"loss_at_s\": %.3f, \"detect_ms\": %.1f, "
                      "\"recover_ms\": ", loss_s[0], detect_ms[0]);
        if (recover_ms[0] >= 0) o += snprintf(row + o, sizeof row - (size_t)o, "%.1f", recover_ms[0]);
        else o += snprintf(row + o, sizeof row - (size_t)o, "null");
        double target = 1000.0 + (cut_of[0] ? peer_timeout_ms * 7.0 / 6.0 : 0.0);
        o += snprintf(row + o, sizeof row - (size_t)o, ", \"target_recover_ms\": %.0f, \"losses\": [",
                      target);
        for (int i = 0; i < episodes; i++)
            o += snprintf(row + o, sizeof row - (size_t)o, "%s{\"at_s\": %.3f, \"kind\": \"%s\", "
                          "\"detect_ms\": %.1f, \"recover_ms\": %.1f}", i ? ", " : "", loss_s[i],
                          cut_of[i] ? "cut" : "kill", detect_ms[i], recover_ms[i]);
        o += snprintf(row + o, sizeof row - (size_t)o, "]");
    } else {
        o += snprintf(row + o, sizeof row - (size_t)o, ", \"recover_ms\": null");
    }
    o += snprintf(row + o, sizeof row - (size_t)o, ", \"ms_per_call\": %.3f, \"rss_mb_start\": %.1f, "
                  "\"rss_mb_end\": %.1f, \"fds_start\": %d, \"fds_end\": %d",
                  good ? loop_ms_sum / (double)good : 0.0, rss0, rss1, fds0, fds1);
    if (!serving || (failed && last_error[0])) {
        o += snprintf(row + o, sizeof row - (size_t)o, ", \"last_error\": \"");
        for (const char *c = last_error; *c && o < (int)sizeof row - 8; c++)
            row[o++] = *c == '"' || *c == '\\' ? '\'' : *c;
        o += snprintf(row + o, sizeof row - (size_t)o, "\"");
    }
    snprintf(row + o, sizeof row - (size_t)o, "}\n");
    if (out_path) {
        FILE *f = fopen(out_path, "a");
        if (f) {
            fputs(row, f);
            fclose(f);
        }
    } else {
        fputs(row, stdout);
        fflush(stdout);
    }
    /* teardown: the buffer and the communicators (local where a member was lost) */
    megamoe_symm_buffer_destroy(buf);
    megamoe_symm_buffer_free(buf);
    if (comms.vote != comms.world) megamoe_comm_destroy(comms.vote);
    megamoe_comm_destroy(comms.world);
    free(w1), free(w2), free(tk.x), free(tk.ids), free(tk.w), free(y), free(ref), free(scr);
    free(etn), free(l1), free(l2);
    return !serving ? 3 : wrong ? 1 : 0;
}
