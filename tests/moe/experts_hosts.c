/* One rank of the MegaMoeExperts tests across (simulated) hosts, run by hosts_experts_cases.py
 * under `megamoe launch [--hosts H] -n N`:
 *
 *   experts_hosts dump DIR PLAN        EP = the world; runs the configs of PLAN ("a" or "a,b")
 *   experts_hosts groups DIR block|strided
 *                                      4 ranks = 2 EP groups of 2 (block: {0,1} {2,3}, each on
 *                                      one host at 2 x 2; strided: {0,2} {1,3}, each spanning
 *                                      both); group 0 runs config a, group 1 config b
 *   experts_hosts fault fwd|bwd O0|O1 SECONDS
 *                                      a loop of forwards (or of backwards of one forward) until
 *                                      a call fails or SECONDS pass; then close the layer
 *   experts_hosts mismatch heap|shape|version|token|endpoint
 *                                      a setting that differs on host 1 (NODE_RANK 1)
 *
 * dump / groups: for both schedules every call (forward + backward) is checked against the
 * fp32 reference (bench/moe_verify.h rule) and its bytes (output, grad hidden, grad
 * topk_weights, grad gate_up, grad down) are appended to DIR/<cfg>.ep<EP>.r<ep rank>.<O0|O1>.bin,
 * so the test can compare the files of a multi-host job with the single-host job's byte for
 * byte. Exit status: 0 ok; fault: 3 PEER_LOST, 4 TIMEOUT (and the layer closed promptly);
 * 1 anything else. The last stderr line says what happened (the launcher's summary quotes it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "megamoe/version.h"
#include "moe_check.h"
#include "shmem/bootstrap.h"
#include "shmem/shmem_internal.h"

typedef struct mm_cfg {
    const char *name;
    int64_t T, H, I, E, K;
    int ncalls;
    mm_route_pattern_t route[3];
} mm_cfg_t;

/* Two configs of different shapes and call counts (EP 2 and 4 both divide E). */
static const mm_cfg_t mm_cfgs[] = {
    {"a", 128, 64, 32, 8, 2, 3, {MM_ROUTE_BALANCED, MM_ROUTE_SKEW, MM_ROUTE_ZERO}},
    {"b", 256, 96, 64, 4, 3, 2, {MM_ROUTE_SINGLE, MM_ROUTE_BALANCED}},
};

static const mm_cfg_t *mm_cfg_find(const char *name)
{
    for (size_t i = 0; i < sizeof mm_cfgs / sizeof mm_cfgs[0]; i++)
        if (strcmp(mm_cfgs[i].name, name) == 0) return &mm_cfgs[i];
    return NULL;
}

static int mm_env_int_or(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static megamoe_experts_params_t mm_layer_params(const mm_cfg_t *c, const char *sched)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = c->T;
    p.hidden_size = c->H;
    p.intermediate_size = c->I;
    p.num_experts = c->E;
    p.top_k = c->K;
    p.schedule = sched;
    p.workers = 2; /* fixed, so every placement splits the work alike */
    return p;
}

static int mm_write(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* Every call of config c on one schedule, on EP communicator ep (this rank is ep rank me):
 * checked against the reference, bytes written to the dump file in dir (NULL: none). 0 when
 * all passed. */
static int mm_run_cfg(megamoe_comm_t *ep, const mm_cfg_t *c, const char *sched, const char *dir)
{
    const int n = megamoe_comm_size(ep), me = megamoe_comm_rank(ep);
    const int64_t L = c->E / n, T = c->T, H = c->H, I = c->I, K = c->K;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.ep%d.r%d.%s.bin", dir ? dir : "", c->name, n, me, sched);
    FILE *f = dir ? fopen(path, "wb") : NULL;
    if (dir && f == NULL) {
        fprintf(stderr, "cannot write %s\n", path);
        return -1;
    }
    mm_moe_problem_t P;
    if (mm_moe_problem_create(&P, n, T, H, I, c->E, K, c->route[0], 1000 + (uint64_t)T) != 0) {
        if (f) fclose(f);
        return -1;
    }
    megamoe_experts_params_t prm = mm_layer_params(c, sched);
    megamoe_experts_t *x = NULL;
    megamoe_status_t st = megamoe_experts_create(ep, &prm, &x);
    int ok = st == MEGAMOE_OK;
    if (!ok) fprintf(stderr, "create %s %s: %s\n", c->name, sched, megamoe_last_error());
    uint16_t *out = malloc((size_t)(T * H) * 2), *gh = malloc((size_t)(T * H) * 2);
    float *gp = malloc((size_t)(T * K) * 4);
    uint16_t *g1 = malloc((size_t)(L * H * 2 * I) * 2), *g2 = malloc((size_t)(L * I * H) * 2);
    ok &= out && gh && gp && g1 && g2;
    for (int call = 0; ok && call < c->ncalls; call++) {
        mm_moe_problem_route(&P, c->route[call], 77 + (uint64_t)call);
        mm_ref_result_t ref;
        mm_input_buf_t ib;
        if (mm_ref_compute(&P, 0.0f, &ref) != 0 || mm_input_make(&P, me, NULL, &ib) != 0) {
            ok = 0;
            break;
        }
        megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
        megamoe_experts_saved_t *sv = NULL;
        megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
        st = megamoe_experts_forward(x, &w, &ib.in, out, &sv);
        if (st == MEGAMOE_OK)
            st = megamoe_experts_backward(x, sv, &w, P.grad_out + (size_t)(me * T * H), &g);
        megamoe_experts_saved_destroy(sv);
        if (st != MEGAMOE_OK) {
            fprintf(stderr, "%s %s call %d: %s\n", c->name, sched, call, megamoe_last_error());
            ok = 0;
        } else {
            char what[96];
            snprintf(what, sizeof what, "%s ep%d rank %d %s call %d (%s)", c->name, n, me, sched,
                     call, mm_route_name(c->route[call]));
            mm_layer_result_t res;
            ok &= mm_layer_result_from(&P, out, gh, gp, 0, g1, g2, &res) == 0 &&
                  mm_compare(what, &P, me, &res, &ref);
            mm_layer_result_free(&res);
            ok &= !f || (mm_write(f, out, (size_t)(T * H) * 2) == 0 &&
                  mm_write(f, gh, (size_t)(T * H) * 2) == 0 &&
                  mm_write(f, gp, (size_t)(T * K) * 4) == 0 &&
                  mm_write(f, g1, (size_t)(L * H * 2 * I) * 2) == 0 &&
                  mm_write(f, g2, (size_t)(L * I * H) * 2) == 0);
        }
        mm_input_free(&ib);
        mm_ref_free(&ref);
    }
    if (x != NULL && megamoe_experts_close(x) != MEGAMOE_OK) {
        fprintf(stderr, "close %s %s: %s\n", c->name, sched, megamoe_last_error());
        ok = 0;
    }
    megamoe_experts_destroy(x);
    free(out), free(gh), free(gp), free(g1), free(g2);
    mm_moe_problem_free(&P);
    if (f) ok &= fclose(f) == 0;
    printf("%s %s ep %d rank %d (world rank %d, host %d of %d) %s: %d calls\n",
           ok ? "ok" : "FAILED", c->name, n, me, megamoe_comm_world_rank(ep, me),
           megamoe_comm_host_of(ep, me), megamoe_comm_num_hosts(ep), sched, c->ncalls);
    fflush(stdout);
    return ok ? 0 : -1;
}

static int mm_run_plan(megamoe_comm_t *ep, const char *plan, const char *dir)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", plan);
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const mm_cfg_t *c = mm_cfg_find(tok);
        if (c == NULL) {
            fprintf(stderr, "unknown config %s\n", tok);
            return -1;
        }
        for (int s = 0; s < 2 && rc == 0; s++) rc = mm_run_cfg(ep, c, s ? "O1" : "O0", dir);
    }
    return rc;
}

static int mm_cmd_dump(const char *dir, const char *plan)
{
    megamoe_comm_t *w = NULL;
    if (megamoe_comm_create(NULL, &w) != MEGAMOE_OK) {
        fprintf(stderr, "world communicator: %s\n", megamoe_last_error());
        return 1;
    }
    int rc = mm_run_plan(w, plan, dir);
    if (megamoe_comm_destroy(w) != MEGAMOE_OK) {
        fprintf(stderr, "destroy: %s\n", megamoe_last_error());
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}

/* Two EP groups of 2 in a world of 4, each made and used by its members only. */
static int mm_cmd_groups(const char *dir, const char *layout)
{
    megamoe_comm_t *w = NULL;
    if (megamoe_comm_create(NULL, &w) != MEGAMOE_OK) {
        fprintf(stderr, "world communicator: %s\n", megamoe_last_error());
        return 1;
    }
    const int me = megamoe_comm_rank(w);
    if (megamoe_comm_size(w) != 4) {
        fprintf(stderr, "groups needs 4 ranks\n");
        megamoe_comm_destroy(w);
        return 1;
    }
    int strided = strcmp(layout, "strided") == 0, g, ranks[2];
    if (strided) {
        g = me % 2;
        ranks[0] = g, ranks[1] = g + 2;
    } else {
        g = me / 2;
        ranks[0] = 2 * g, ranks[1] = 2 * g + 1;
    }
    int rc = 0;
    megamoe_comm_t *ep = NULL;
    if (megamoe_comm_create_group(w, ranks, 2, &ep) != MEGAMOE_OK) {
        fprintf(stderr, "create_group: %s\n", megamoe_last_error());
        rc = -1;
    }
    /* group 0: config a (3 calls, T 128); group 1: config b (2 calls, T 256, other shapes) */
    if (rc == 0) rc = mm_run_plan(ep, g == 0 ? "a" : "b", dir);
    if (ep && megamoe_comm_destroy(ep) != MEGAMOE_OK) {
        fprintf(stderr, "destroy group: %s\n", megamoe_last_error());
        rc = -1;
    }
    if (megamoe_comm_destroy(w) != MEGAMOE_OK) {
        fprintf(stderr, "destroy world: %s\n", megamoe_last_error());
        rc = -1;
    }
    return rc == 0 ? 0 : 1;
}

/* A loop of layer calls until one fails (a host was killed or cut off) or `seconds` pass. */
static int mm_cmd_fault(const char *phase, const char *sched, double seconds)
{
    const int bwd = strcmp(phase, "bwd") == 0;
    const mm_cfg_t c = {"fault", 256, 256, 128, 8, 2, 1, {MM_ROUTE_BALANCED}};
    megamoe_comm_t *w = NULL;
    if (megamoe_comm_create(NULL, &w) != MEGAMOE_OK) {
        fprintf(stderr, "fault: world communicator: %s\n", megamoe_last_error());
        return 1;
    }
    const int n = megamoe_comm_size(w), me = megamoe_comm_rank(w);
    mm_moe_problem_t P;
    megamoe_experts_params_t prm = mm_layer_params(&c, sched);
    megamoe_experts_t *x = NULL;
    if (mm_moe_problem_create(&P, n, c.T, c.H, c.I, c.E, c.K, c.route[0], 5) != 0 ||
        megamoe_experts_create(w, &prm, &x) != MEGAMOE_OK) {
        fprintf(stderr, "fault: setup: %s\n", megamoe_last_error());
        return 1;
    }
    mm_input_buf_t ib;
    mm_input_make(&P, me, NULL, &ib);
    const int64_t L = c.E / n;
    uint16_t *out = malloc((size_t)(c.T * c.H) * 2), *gh = malloc((size_t)(c.T * c.H) * 2);
    float *gp = malloc((size_t)(c.T * c.K) * 4);
    uint16_t *g1 = malloc((size_t)(L * c.H * 2 * c.I) * 2), *g2 = malloc((size_t)(L * c.I * c.H) * 2);
    megamoe_experts_weights_t wt = mm_local_weights(&P, me, 1);
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    megamoe_experts_saved_t *sv = NULL;
    megamoe_status_t st = MEGAMOE_OK;
    if (bwd) st = megamoe_experts_forward(x, &wt, &ib.in, out, &sv);
    const double t0 = mm_now_s();
    printf("fault loop: %s %s started\n", bwd ? "backward" : "forward", sched);
    fflush(stdout);
    long calls = 0;
    while (st == MEGAMOE_OK && mm_now_s() - t0 < seconds) {
        st = bwd ? megamoe_experts_backward(x, sv, &wt, P.grad_out + (size_t)(me * c.T * c.H), &g)
                 : megamoe_experts_forward(x, &wt, &ib.in, out, NULL);
        calls++;
    }
    const double t_err = mm_now_s() - t0;
    char err[512];
    snprintf(err, sizeof err, "%s", st == MEGAMOE_OK ? "no error" : megamoe_last_error());
    for (char *p = err; *p; p++)
        if (*p == '\n') *p = ' ';
    double t1 = mm_now_s();
    megamoe_status_t cs = megamoe_experts_close(x);
    const double t_close = mm_now_s() - t1;
    megamoe_experts_destroy(x);
    megamoe_experts_saved_destroy(sv);
    t1 = mm_now_s();
    megamoe_status_t ds = megamoe_comm_destroy(w);
    const double t_destroy = mm_now_s() - t1;
    free(out), free(gh), free(gp), free(g1), free(g2);
    mm_input_free(&ib);
    mm_moe_problem_free(&P);
    const double limit = mm_env_int_or("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", 120);
    const int prompt = t_close <= limit && t_destroy <= limit;
    fprintf(stderr, "fault result: %s in %s call %ld of %s after %.2f s; close %s in %.2f s; "
            "communicator destroy %s in %.2f s: %s\n", megamoe_status_name(st),
            bwd ? "backward" : "forward", calls, sched, t_err, megamoe_status_name(cs), t_close,
            megamoe_status_name(ds), t_destroy, err);
    if (!prompt) return 1;
    return st == MEGAMOE_PEER_LOST ? 3 : st == MEGAMOE_TIMEOUT ? 4 : 1;
}

/* The bootstrap's settings verdict across hosts with a library version that differs on host 1
 * (the runtime fills the version from megamoe_version(); here it is set directly). */
static int mm_version_mismatch(int host)
{
    mm_boot_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = mm_env_int_or("RANK", 0);
    cfg.world = mm_env_int_or("WORLD_SIZE", 1);
    const char *ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    if (ep == NULL || mm_endpoint_parse(ep, "endpoint", &cfg.endpoint) != MEGAMOE_OK) return 1;
    cfg.token = getenv("MEGAMOE_JOB_TOKEN") ? getenv("MEGAMOE_JOB_TOKEN") : "";
    cfg.settings.heap_size = 64u << 20;
    cfg.settings.layout = MM_SHMEM_LAYOUT_ID;
    cfg.settings.world = (uint32_t)cfg.world;
    snprintf(cfg.settings.version, sizeof cfg.settings.version, "%s",
             host == 1 ? "0.0.0-other" : megamoe_version());
    cfg.timeout_ns = 20ull * 1000000000ull;
    mm_boot_t *b = NULL;
    megamoe_status_t st = mm_boot_create(&cfg, &b);
    fprintf(stderr, "mismatch result: %s: %s\n", megamoe_status_name(st),
            st == MEGAMOE_OK ? "" : megamoe_last_error());
    mm_boot_destroy(b);
    return st == MEGAMOE_CONFIG_MISMATCH ? 0 : 1;
}

/* A setting that differs on host 1; every rank reports the status of the step that failed. */
static int mm_cmd_mismatch(const char *what)
{
    const int host = mm_env_int_or("NODE_RANK", 0);
    if (strcmp(what, "version") == 0) return mm_version_mismatch(host);
    char buf[320];
    if (host == 1 && strcmp(what, "heap") == 0) setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "96M", 1);
    if (host == 1 && strcmp(what, "token") == 0) setenv("MEGAMOE_JOB_TOKEN", "not-the-job-token", 1);
    if (host == 1 && strcmp(what, "endpoint") == 0) {
        /* the right host, a port nobody listens on */
        const char *ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
        mm_endpoint_t e;
        if (ep == NULL || mm_endpoint_parse(ep, "endpoint", &e) != MEGAMOE_OK) return 1;
        snprintf(buf, sizeof buf, "tcp://%s:%d", e.host, e.port + 1);
        setenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", buf, 1);
    }
    megamoe_comm_t *w = NULL;
    megamoe_status_t st = megamoe_comm_create(NULL, &w);
    if (st != MEGAMOE_OK || strcmp(what, "shape") != 0) {
        fprintf(stderr, "mismatch result: communicator %s: %s\n", megamoe_status_name(st),
                st == MEGAMOE_OK ? "" : megamoe_last_error());
        if (w) megamoe_comm_destroy(w);
        return st == MEGAMOE_OK ? 1 : 0;
    }
    /* shapes: host 1 asks for another hidden size */
    mm_cfg_t c = mm_cfgs[0];
    if (host == 1) c.H = 128;
    megamoe_experts_params_t prm = mm_layer_params(&c, "O1");
    megamoe_experts_t *x = NULL;
    st = megamoe_experts_create(w, &prm, &x);
    snprintf(buf, sizeof buf, "%s", st == MEGAMOE_OK ? "" : megamoe_last_error());
    /* nothing moved and nothing broke: the same communicator runs a matching layer */
    int rc = st == MEGAMOE_CONFIG_MISMATCH && x == NULL ? 0 : 1;
    megamoe_experts_destroy(x);
    if (rc == 0) rc = mm_run_cfg(w, &mm_cfgs[0], "O1", NULL) == 0 ? 0 : 1;
    megamoe_status_t ds = megamoe_comm_destroy(w);
    fprintf(stderr, "mismatch result: layer %s: %s; then a matching layer %s; destroy %s\n",
            megamoe_status_name(st), buf, rc == 0 ? "ran" : "did not run",
            megamoe_status_name(ds));
    return rc == 0 && ds == MEGAMOE_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "dump") == 0) return mm_cmd_dump(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "groups") == 0) return mm_cmd_groups(argv[2], argv[3]);
    if (argc == 5 && strcmp(argv[1], "fault") == 0)
        return mm_cmd_fault(argv[2], argv[3], atof(argv[4]));
    if (argc == 3 && strcmp(argv[1], "mismatch") == 0) return mm_cmd_mismatch(argv[2]);
    fprintf(stderr, "usage: experts_hosts dump DIR PLAN | groups DIR block|strided | "
                    "fault fwd|bwd O0|O1 SECONDS | mismatch heap|shape|version|token|endpoint\n");
    return 2;
}
