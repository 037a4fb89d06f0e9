/* The SHMEM lifecycle: process-wide reference count, start-up and teardown.
 *
 * The first acquire bootstraps the job and maps every heap; later acquires count. The last
 * release refuses to tear down while symmetric allocations or teams are alive (the reference
 * stays, so the caller can free them and retry), then synchronises all PEs over the bootstrap
 * and tears down. A failed first acquire undoes everything it did (no reference, no file in
 * /dev/shm) and may be retried. Start-up order (each step agreed by all PEs, so a failure on
 * one PE is the same error on all):
 *   bootstrap (membership, token, settings) -> create own segment -> exchange pids, host ids
 *   and segment names -> map every peer's segment -> remove own name -> liveness monitor.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "megamoe/log.h"
#include "megamoe/version.h"
#include "boot_secret.h"
#include "sha256.h"
#include "shmem_internal.h"
#include "survive.h"

mm_shmem_global_t mm_shmem_g = {.lock = PTHREAD_MUTEX_INITIALIZER, .lost_pe = -1, .wake_fd = -1};

megamoe_status_t mm_shmem_not_running(const char *what)
{
    return mm_error(MEGAMOE_INVALID_STATE, "%s: the SHMEM runtime is not running (call "
                    "mm_shmem_acquire first; after the last mm_shmem_release it must be acquired "
                    "again)", what);
}

mm_shmem_params_t mm_shmem_params_default(void)
{
    return (mm_shmem_params_t){.rank = -1, .world_size = -1, .endpoint = NULL, .heap_size = 0,
                               .timeout_sec = 0, .job_token = NULL};
}

/* ---- parameters: explicit value, else environment, else default ---- */

static megamoe_status_t mm_env_int_or(mm_env_id_t a, mm_env_id_t b, int64_t def, int64_t *v)
{
    *v = def;
    if (mm_env_is_set(a)) return mm_env_int(a, v);
    if (mm_env_is_set(b)) return mm_env_int(b, v);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_shmem_resolve(const mm_shmem_params_t *in, mm_shmem_params_t *out,
                                         mm_endpoint_t *ep)
{
    mm_shmem_params_t d = mm_shmem_params_default();
    if (in == NULL) in = &d;
    int64_t rank = in->rank, world = in->world_size;
    if (rank < 0) MM_CHECK(mm_env_int_or(MM_ENV_RANK, MM_ENV_OMPI_RANK, 0, &rank));
    if (world <= 0) MM_CHECK(mm_env_int_or(MM_ENV_WORLD_SIZE, MM_ENV_OMPI_SIZE, 1, &world));
    if (world < 1 || world > MM_SHMEM_MAX_PES)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "world size %" PRId64 " is not in [1, %d] "
                        "(WORLD_SIZE or the world_size parameter)", world, MM_SHMEM_MAX_PES);
    if (rank >= world)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "rank %" PRId64 " is not in [0, %" PRId64 ") "
                        "(RANK or the rank parameter)", rank, world);
    const char *text = in->endpoint;
    if (text == NULL) MM_CHECK(mm_env_string(MM_ENV_SHMEM_BOOTSTRAP_ENDPOINT, &text));
    MM_CHECK(mm_endpoint_parse(text, in->endpoint ? "the endpoint parameter"
                                                  : "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", ep));
    uint64_t heap = in->heap_size;
    if (heap == 0) MM_CHECK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &heap));
    if (heap < (1u << 20) || heap > (1ull << 40))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "heap size %" PRIu64 " is not in [1 MiB, 1 TiB]"
                        " (HYPER_PARALLEL_SHMEM_HEAP_SIZE or the heap_size parameter)", heap);
    int64_t timeout = in->timeout_sec;
    if (timeout <= 0) MM_CHECK(mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &timeout));
    if (timeout < 1 || timeout > 86400)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "timeout %" PRId64 " s is not in [1, 86400] "
                        "(HYPER_PARALLEL_SHMEM_TIMEOUT_SEC or the timeout_sec parameter)", timeout);
    out->rank = (int)rank;
    out->world_size = (int)world;
    out->endpoint = NULL;
    out->heap_size = heap;
    out->timeout_sec = (int)timeout;
    return MEGAMOE_OK;
}

/* ---- what PEs exchange to find and watch each other ---- */

typedef struct mm_peer_info {
    int32_t pid;
    uint32_t intra_engine; /* this PE asked for the engine also between same-host peers */
    uint64_t start_time;
    uint8_t host[MM_SHA256_BYTES]; /* boot id, host name, pid and mount namespaces */
    char seg_name[MM_SHMEM_SEG_NAME_MAX];
} mm_peer_info_t;

/* What a PE publishes for the engine: the record of the bootstrap allgather. */
typedef struct mm_engine_rec {
    uint32_t len;
    uint8_t blob[MM_ENGINE_BLOB_MAX];
} mm_engine_rec_t;

static void mm_read_small(const char *path, char *buf, size_t len, int is_link)
{
    buf[0] = '\0';
    if (is_link) {
        ssize_t n = readlink(path, buf, len - 1);
        buf[n > 0 ? n : 0] = '\0';
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
}

static uint64_t mm_self_start_time(void)
{
    char buf[1024];
    mm_read_small("/proc/self/stat", buf, sizeof buf, 0);
    const char *p = strrchr(buf, ')');
    for (int field = 2; field < 22 && p; field++) {
        p = strchr(p + 1, ' ');
    }
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Two PEs share memory when boot id, host name (UTS namespace) and the pid and mount
 * namespaces agree: a simulated host (its own UTS and network namespace) is another host. */
static void mm_host_id(uint8_t out[MM_SHA256_BYTES])
{
    char parts[4][256];
    mm_read_small("/proc/sys/kernel/random/boot_id", parts[0], sizeof parts[0], 0);
    if (gethostname(parts[1], sizeof parts[1]) != 0) parts[1][0] = '\0';
    parts[1][sizeof parts[1] - 1] = '\0';
    mm_read_small("/proc/self/ns/pid", parts[2], sizeof parts[2], 1);
    mm_read_small("/proc/self/ns/mnt", parts[3], sizeof parts[3], 1);
    mm_sha256_t s;
    mm_sha256_init(&s);
    for (int i = 0; i < 4; i++) mm_sha256_update(&s, parts[i], strlen(parts[i]) + 1);
    mm_sha256_final(&s, out);
}

/* ---- start-up and teardown ---- */

static void mm_shmem_cleanup(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    atomic_store_explicit(&g->running, 0, memory_order_release);
    mm_shmem_liveness_stop(); /* before the engine: the monitor may publish through it */
    if (g->engine) g->engine_ops->fini(g->engine);
    g->engine = NULL;
    mm_shmem_team_drop_all();
    for (int pe = 0; g->peers && pe < g->n_pes; pe++) {
        g->transport->seg_unpublish(&g->peers[pe].seg); /* only our own is still published */
        g->transport->seg_detach(&g->peers[pe].seg);
    }
    mm_boot_destroy(g->boot);
    mm_heap_alloc_fini(&g->alloc);
    free(g->peers);
    free(g->bases);
    free((void *)g->dead);
    free(g->host_of);
    free(g->remote);
    g->boot = NULL;
    g->peers = NULL;
    g->bases = NULL;
    g->dead = NULL;
    g->host_of = NULL;
    g->remote = NULL;
    g->n_hosts = 0;
    g->my_base = g->heap_base = NULL;
    mm_surv_fini();
    free(g->mail_sent);
    free(g->mail_recv);
    g->mail_sent = g->mail_recv = NULL;
}

/* Host map from the gathered identities: hosts numbered by their lowest PE; a peer is
 * reached through the engine when it is on another host (or every PE asked for the engine
 * between same-host peers too, MEGAMOE_SHMEM_INTRA_HOST=engine: one PE asking is enough, so
 * every PE decides the same from the same table). Returns 1 when the job has PEs that do
 * not share memory (the same answer on every PE), so the engine is needed. */
static int mm_shmem_map_hosts(const mm_peer_info_t *info)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    int force = 0;
    for (int pe = 0; pe < g->n_pes; pe++) force |= info[pe].intra_engine != 0;
    g->n_hosts = 0;
    for (int pe = 0; pe < g->n_pes; pe++) {
        g->host_of[pe] = -1;
        for (int q = 0; q < pe && g->host_of[pe] < 0; q++)
            if (memcmp(info[q].host, info[pe].host, MM_SHA256_BYTES) == 0)
                g->host_of[pe] = g->host_of[q];
        if (g->host_of[pe] < 0) g->host_of[pe] = g->n_hosts++;
    }
    g->my_host = g->host_of[g->my_pe];
    for (int pe = 0; pe < g->n_pes; pe++)
        g->remote[pe] = pe != g->my_pe && (force || g->host_of[pe] != g->my_host);
    return g->n_pes > 1 && (force || g->n_hosts > 1);
}

/* Bring up the engine to every remote peer: register, publish, connect. Collective (every PE
 * calls it when any PE has a remote peer; a PE without remote peers only publishes). */
static megamoe_status_t mm_shmem_engine_start(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    megamoe_status_t st = MEGAMOE_OK;
    char ifname[64] = "";
    int fd = mm_boot_fd(g->boot, g->my_pe == 0 ? (g->n_pes > 1 ? 1 : -1) : 0);
    if (fd >= 0) mm_net_local_ifname(fd, ifname, sizeof ifname);
    g->engine_ops = &mm_shmem_engine_ucx;
    mm_engine_init_t in = {.my_pe = g->my_pe, .n_pes = g->n_pes, .seg_base = g->my_base,
                           .seg_size = g->seg_size, .net_device = ifname};
    int mine_remote = 0;
    for (int pe = 0; pe < g->n_pes; pe++) mine_remote |= g->remote[pe];
    if (mine_remote) st = g->engine_ops->init(&in, &g->engine);
    mm_engine_rec_t *recs = calloc((size_t)g->n_pes, sizeof *recs);
    mm_engine_rec_t *mine = calloc(1, sizeof *mine);
    uint32_t *lens = calloc((size_t)g->n_pes, sizeof *lens);
    if (st == MEGAMOE_OK && (!recs || !mine || !lens))
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "SHMEM start-up: out of memory for the engine "
                      "records of %d PEs", g->n_pes);
    if (st == MEGAMOE_OK && g->engine) {
        size_t len = 0;
        st = g->engine_ops->publish(g->engine, mine->blob, &len);
        mine->len = (uint32_t)len;
    }
    st = mm_boot_agree(g->boot, st);
    if (st == MEGAMOE_OK) st = mm_boot_allgather(g->boot, mine, sizeof *mine, recs);
    if (st == MEGAMOE_OK && g->engine) {
        for (int pe = 0; pe < g->n_pes; pe++) lens[pe] = recs[pe].len;
        st = g->engine_ops->startup(g->engine, recs[0].blob, sizeof *recs, lens, g->remote);
    }
    free(recs);
    free(mine);
    free(lens);
    st = mm_boot_agree(g->boot, st);
    if (st == MEGAMOE_OK && g->engine) {
        char desc[192];
        g->engine_ops->describe(g->engine, desc, sizeof desc);
        MM_SHMEM_INFO("inter-host engine up: %s; %d host(s)", desc, g->n_hosts);
    }
    return st;
}

static megamoe_status_t mm_shmem_start(const mm_shmem_params_t *params)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_shmem_params_t p;
    mm_endpoint_t ep;
    MM_CHECK(mm_shmem_resolve(params, &p, &ep));
    mm_shmem_liveness_reset(); /* the engine checks for losses from its start-up on */
    static char token[MM_SECRET_MAX];
    mm_secret_source_t source = MM_SECRET_NONE;
    megamoe_log_set_rank(p.rank);
    MM_CHECK(mm_boot_secret_resolve(params ? params->job_token : NULL, &ep, p.world_size, token,
                                    sizeof token, &source));
    int intra_engine = 0; /* index in "shm|engine" */
    MM_CHECK(mm_env_enum(MM_ENV_SHMEM_INTRA_HOST, &intra_engine));

    g->my_pe = p.rank;
    g->n_pes = p.world_size;
    g->params = p;
    snprintf(g->endpoint, sizeof g->endpoint, "%s", ep.text);
    g->heap_size = p.heap_size / 64 * 64;
    g->seg_size = MM_SHMEM_RESERVE + (p.heap_size + 4095) / 4096 * 4096;
    g->timeout_ns = (uint64_t)p.timeout_sec * 1000000000ull;
    g->transport = &mm_shmem_transport_shm;
    g->engine = NULL;

    mm_boot_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = p.rank;
    cfg.world = p.world_size;
    cfg.endpoint = ep;
    cfg.token = token;
    cfg.settings.heap_size = p.heap_size;
    cfg.settings.layout = MM_SHMEM_LAYOUT_ID;
    cfg.settings.world = (uint32_t)p.world_size;
    snprintf(cfg.settings.version, sizeof cfg.settings.version, "%s", megamoe_version());
    cfg.timeout_ns = g->timeout_ns;
    megamoe_status_t bs = mm_boot_create(&cfg, &g->boot);
    memset(token, 0, sizeof token); /* the bootstrap keeps no copy either */
    MM_CHECK(bs);

    megamoe_status_t st = MEGAMOE_OK;
    g->peers = calloc((size_t)g->n_pes, sizeof *g->peers);
    g->bases = calloc((size_t)g->n_pes, sizeof *g->bases);
    g->dead = calloc((size_t)g->n_pes, sizeof *g->dead);
    g->host_of = calloc((size_t)g->n_pes, sizeof *g->host_of);
    g->remote = calloc((size_t)g->n_pes, sizeof *g->remote);
    g->mail_sent = calloc((size_t)g->n_pes, sizeof *g->mail_sent);
    g->mail_recv = calloc((size_t)g->n_pes, sizeof *g->mail_recv);
    mm_peer_info_t *info = calloc((size_t)g->n_pes, sizeof *info);
    if (!g->peers || !g->bases || !g->dead || !g->host_of || !g->remote || !g->mail_sent ||
        !g->mail_recv || !info ||
        mm_heap_alloc_init(&g->alloc, g->heap_size))
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "SHMEM start-up: out of host memory for %d PEs",
                      g->n_pes);
    if (st == MEGAMOE_OK) st = mm_surv_init(g->n_pes, g->my_pe);
    for (int pe = 0; g->peers && pe < g->n_pes; pe++) g->peers[pe].pidfd = -1;
    if (st == MEGAMOE_OK) st = g->transport->seg_create(g->seg_size, &g->peers[g->my_pe].seg);
    st = mm_boot_agree(g->boot, st);
    if (st != MEGAMOE_OK) goto fail;

    mm_peer_info_t mine;
    memset(&mine, 0, sizeof mine);
    mine.pid = (int32_t)getpid();
    mine.intra_engine = intra_engine == 1;
    mine.start_time = mm_self_start_time();
    mm_host_id(mine.host);
    snprintf(mine.seg_name, sizeof mine.seg_name, "%s", g->peers[g->my_pe].seg.name);
    st = mm_boot_allgather(g->boot, &mine, sizeof mine, info);
    if (st != MEGAMOE_OK) goto fail;
    int any_remote = mm_shmem_map_hosts(info);
    for (int pe = 0; pe < g->n_pes; pe++) {
        g->peers[pe].pid = g->host_of[pe] == g->my_host ? info[pe].pid : 0; /* pids are per host */
        g->peers[pe].start_time = info[pe].start_time;
        if (pe != g->my_pe && !g->remote[pe] && st == MEGAMOE_OK)
            st = g->transport->seg_attach(pe, info[pe].seg_name, g->seg_size, &g->peers[pe].seg);
        else if (pe != g->my_pe) /* not mapped here: keep the name for diagnostics */
            snprintf(g->peers[pe].seg.name, sizeof g->peers[pe].seg.name, "%s",
                     info[pe].seg_name);
    }
    st = mm_boot_agree(g->boot, st);
    /* Everyone has mapped every same-host peer (or gave up): the name is no longer needed. */
    g->transport->seg_unpublish(&g->peers[g->my_pe].seg);
    if (st != MEGAMOE_OK) goto fail;

    for (int pe = 0; pe < g->n_pes; pe++) g->bases[pe] = g->peers[pe].seg.base;
    g->my_base = g->bases[g->my_pe];
    g->heap_base = g->my_base + MM_SHMEM_RESERVE;
    mm_shmem_header(g->my_base)->magic = MM_SHMEM_HEADER_MAGIC;
    if (any_remote) {
        st = mm_shmem_engine_start();
        if (st != MEGAMOE_OK) goto fail;
    }
    mm_shmem_team_world_init();
    st = mm_shmem_liveness_start();
    st = mm_boot_agree(g->boot, st);
    if (st != MEGAMOE_OK) goto fail;
    free(info);
    atomic_store_explicit(&g->running, 1, memory_order_release);
    MM_SHMEM_INFO("started: rank %d of %d on host %d of %d, heap %" PRIu64 " bytes (+%u "
                  "reserved) per rank, bootstrap %s (job secret: %s), timeout %d s", g->my_pe,
                  g->n_pes, g->my_host, g->n_hosts, g->heap_size, (unsigned)MM_SHMEM_RESERVE,
                  g->endpoint, mm_secret_source_name(source), p.timeout_sec);
    return MEGAMOE_OK;
fail:
    free(info);
    mm_shmem_cleanup();
    return st;
}

/* Do later params agree with the running runtime? */
static megamoe_status_t mm_shmem_compatible(const mm_shmem_params_t *in)
{
    const mm_shmem_global_t *g = &mm_shmem_g;
    if (in == NULL) return MEGAMOE_OK;
    const char *bad = NULL;
    if (in->rank >= 0 && in->rank != g->my_pe) bad = "rank";
    else if (in->world_size > 0 && in->world_size != g->n_pes) bad = "world_size";
    else if (in->endpoint && strcmp(in->endpoint, g->endpoint) != 0) bad = "endpoint";
    else if (in->heap_size && in->heap_size != g->params.heap_size) bad = "heap_size";
    else if (in->timeout_sec > 0 && in->timeout_sec != g->params.timeout_sec) bad = "timeout_sec";
    if (bad)
        return mm_error(MEGAMOE_INVALID_STATE, "mm_shmem_acquire: parameter %s differs from the "
                        "running SHMEM runtime (started as rank %d of %d at %s); pass defaults "
                        "or the same values, or release every reference first", bad, g->my_pe,
                        g->n_pes, g->endpoint);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_acquire(const mm_shmem_params_t *params)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    pthread_mutex_lock(&g->lock);
    megamoe_status_t st;
    if (g->refcount > 0) {
        st = mm_shmem_compatible(params);
        if (st == MEGAMOE_OK) g->refcount++;
    } else {
        st = mm_shmem_log_reload();
        if (st == MEGAMOE_OK) st = mm_shmem_start(params);
        if (st == MEGAMOE_OK) g->refcount = 1;
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

#define MM_SHMEM_MAX_HOOKS 8

static struct {
    mm_shmem_release_hook_t fn;
    void *arg;
} mm_shmem_hooks[MM_SHMEM_MAX_HOOKS];
static int mm_shmem_hook_count;

megamoe_status_t mm_shmem_add_release_hook(mm_shmem_release_hook_t fn, void *arg)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&g->lock);
    int found = 0;
    for (int i = 0; i < mm_shmem_hook_count; i++)
        if (mm_shmem_hooks[i].fn == fn && mm_shmem_hooks[i].arg == arg) found = 1;
    if (!found) {
        if (mm_shmem_hook_count == MM_SHMEM_MAX_HOOKS) {
            st = mm_error(MEGAMOE_INVALID_STATE, "mm_shmem_add_release_hook: all %d hook slots "
                          "are used", MM_SHMEM_MAX_HOOKS);
        } else {
            mm_shmem_hooks[mm_shmem_hook_count].fn = fn;
            mm_shmem_hooks[mm_shmem_hook_count].arg = arg;
            mm_shmem_hook_count++;
        }
    }
    pthread_mutex_unlock(&g->lock);
    return st;
}

/* Run the hooks without the lock (they free symmetric memory, which takes it). */
static megamoe_status_t mm_shmem_run_release_hooks(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    pthread_mutex_lock(&g->lock);
    int n = mm_shmem_hook_count;
    struct {
        mm_shmem_release_hook_t fn;
        void *arg;
    } hooks[MM_SHMEM_MAX_HOOKS];
    memcpy(hooks, mm_shmem_hooks, sizeof hooks);
    pthread_mutex_unlock(&g->lock);
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < n; i++) {
        megamoe_status_t s = hooks[i].fn(hooks[i].arg);
        if (st == MEGAMOE_OK) st = s;
    }
    return st;
}

megamoe_status_t mm_shmem_release(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    pthread_mutex_lock(&g->lock);
    if (g->refcount == 1 && mm_shmem_hook_count > 0) {
        /* Also after a peer loss: the layers above must forget what they cached in this heap
         * (it is unmapped below) even though their collective frees fail at once then. */
        pthread_mutex_unlock(&g->lock);
        megamoe_status_t hs = mm_shmem_run_release_hooks();
        if (hs != MEGAMOE_OK && !mm_surv_any_lost())
            return hs; /* logged by the hook; the reference is kept */
        pthread_mutex_lock(&g->lock);
    }
    if (g->refcount == 0) {
        pthread_mutex_unlock(&g->lock);
        return mm_error(MEGAMOE_INVALID_STATE, "mm_shmem_release without a matching "
                        "mm_shmem_acquire (the reference count is 0)");
    }
    if (g->refcount > 1) {
        g->refcount--;
        pthread_mutex_unlock(&g->lock);
        return MEGAMOE_OK;
    }
    int lost = mm_surv_any_lost();
    if (!lost && (g->alloc.live > 0 || mm_shmem_team_live_count() > 0)) {
        char table[2048];
        mm_shmem_live_table(table, sizeof table, 8);
        for (char *c = table; *c; c++)
            if (*c == '\n' && c[1]) *c = ';';
        size_t tl = strlen(table);
        if (tl && table[tl - 1] == '\n') table[tl - 1] = '\0';
        megamoe_status_t st = mm_error(
            MEGAMOE_INVALID_STATE, "the last mm_shmem_release found %d symmetric allocation(s) "
            "and %d team(s) still alive: %s; free them (mm_shmem_free and mm_shmem_team_destroy, "
            "collectively) and call mm_shmem_release again (the reference is kept)",
            g->alloc.live, mm_shmem_team_live_count(), table[0] ? table : "no allocations");
        pthread_mutex_unlock(&g->lock);
        return st;
    }
    megamoe_status_t st;
    if (lost) {
        /* a loss the survivors acknowledged: they synchronise among themselves (the bootstrap
         * needs every rank); else (this rank stopped, or a loss nobody acknowledged yet)
         * teardown is local. The monitor keeps watching through the survivors' barrier: a
         * member that tore down locally (it had not acknowledged a loss yet, e.g. one learnt
         * at a call's last transfer, which this rank's call survived) leaves, and its exit
         * fails the barrier at once (PEER_LOST) instead of after the runtime timeout. */
        st = mm_shmem_check_peers("the last mm_shmem_release (torn down locally)");
        if (st == MEGAMOE_OK) st = mm_shmem_survivors_barrier("the last mm_shmem_release");
        /* Peers leaving from now on is expected: the monitor stops reporting it. */
        atomic_store(&g->closing, 1);
    } else {
        atomic_store(&g->closing, 1); /* as above */
        /* Nobody unmaps while a peer may still write into its heap. */
        st = mm_boot_barrier(g->boot);
    }
    mm_shmem_cleanup();
    g->refcount = 0;
    pthread_mutex_unlock(&g->lock);
    if (st == MEGAMOE_OK) MM_SHMEM_INFO("released: runtime torn down");
    return st;
}

int mm_shmem_refcount(void)
{
    pthread_mutex_lock(&mm_shmem_g.lock);
    int r = mm_shmem_g.refcount;
    pthread_mutex_unlock(&mm_shmem_g.lock);
    return r;
}

int mm_shmem_is_running(void) { return mm_shmem_running_now(); }

int mm_shmem_my_pe(void) { return mm_shmem_running_now() ? mm_shmem_g.my_pe : -1; }

int mm_shmem_n_pes(void) { return mm_shmem_running_now() ? mm_shmem_g.n_pes : -1; }

uint64_t mm_shmem_timeout_ns(void)
{
    if (mm_shmem_running_now()) return mm_shmem_g.timeout_ns;
    int64_t sec = 120;
    if (mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &sec) != MEGAMOE_OK) sec = 120;
    return (uint64_t)sec * 1000000000ull;
}

megamoe_status_t mm_shmem_segment_name(int pe, char *buf, size_t len)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_segment_name");
    if (pe < 0 || pe >= mm_shmem_g.n_pes || buf == NULL || len == 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_segment_name: bad PE %d or buffer", pe);
    snprintf(buf, len, "%s", mm_shmem_g.peers[pe].seg.name);
    return MEGAMOE_OK;
}

int mm_shmem_n_hosts(void) { return mm_shmem_running_now() ? mm_shmem_g.n_hosts : -1; }

int mm_shmem_host_of(int pe)
{
    if (!mm_shmem_running_now() || pe < 0 || pe >= mm_shmem_g.n_pes) return -1;
    return mm_shmem_g.host_of[pe];
}

int mm_shmem_pe_remote(int pe)
{
    if (!mm_shmem_running_now() || pe < 0 || pe >= mm_shmem_g.n_pes) return 0;
    return mm_shmem_g.remote[pe];
}

void mm_shmem_engine_stats(mm_shmem_engine_stats_t *stats)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    memset(stats, 0, sizeof *stats);
    if (mm_shmem_running_now() && g->engine && g->engine_ops->stats)
        g->engine_ops->stats(g->engine, stats);
}

void mm_shmem_engine_describe(char *buf, size_t len)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (len == 0) return;
    if (!mm_shmem_running_now() || g->engine == NULL) {
        snprintf(buf, len, "none");
        return;
    }
    g->engine_ops->describe(g->engine, buf, len);
}
