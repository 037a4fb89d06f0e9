/* Raw UCX UCP between two ranks (bench_ucx.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "base/clock.h"
#include "base/env.h"
#include "bench_ucx.h"

#define MM_BUCX_FLAGS 256 /* flag values in flight */

typedef struct {
    uint64_t value;
    volatile int busy;
} mm_bucx_flag_t;

struct mm_bucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_address_t *addr;
    size_t addr_len;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base, peer_base;
    size_t len;
    int efd, wake_fd, thread_started;
    pthread_t thread;
    atomic_int stop;
    mm_bucx_flag_t flags[MM_BUCX_FLAGS];
    unsigned flag_next;
    char desc[128];
};

static int mm_bucx_fail(const char *what, ucs_status_t s)
{
    fprintf(stderr, "bench ucx: %s: %s\n", what, ucs_status_string(s));
    return -1;
}

mm_bucx_t *mm_bucx_create(const char *net_device, void *base, size_t len)
{
    mm_bucx_t *u = calloc(1, sizeof *u);
    if (u == NULL) return NULL;
    u->efd = u->wake_fd = -1;
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        mm_bucx_fail("ucp_config_read", s);
        free(u);
        return NULL;
    }
    /* megamoe's engine defaults where the user set nothing (engine_ucx.c, mm_ucx_config) */
    const char *tls = "", *devs = "", *tx = "", *rx = "";
    mm_env_string(MM_ENV_UCX_TLS, &tls);
    mm_env_string(MM_ENV_UCX_NET_DEVICES, &devs);
    mm_env_string(MM_ENV_UCX_TCP_TX_SEG_SIZE, &tx);
    mm_env_string(MM_ENV_UCX_TCP_RX_SEG_SIZE, &rx);
    if (!*tls) ucp_config_modify(cfg, "TLS", "^sm");
    if (!*devs && net_device && *net_device) ucp_config_modify(cfg, "NET_DEVICES", net_device);
    if (!*tx) ucp_config_modify(cfg, "TX_SEG_SIZE", "64k"); /* UCX applies a transport's key by its own name */
    if (!*rx) ucp_config_modify(cfg, "RX_SEG_SIZE", "256k");
    ucp_params_t prm;
    memset(&prm, 0, sizeof prm);
    prm.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    prm.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    prm.name = "megamoe-bench";
    s = ucp_init(&prm, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        mm_bucx_fail("ucp_init", s);
        free(u);
        return NULL;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED; /* the caller or the progress thread, in turn */
    s = ucp_worker_create(u->ctx, &wp, &u->worker);
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = len;
    if (s == UCS_OK) s = ucp_mem_map(u->ctx, &mp, &u->memh);
    if (s == UCS_OK) s = ucp_rkey_pack(u->ctx, u->memh, &u->rkey_buf, &u->rkey_len);
    if (s == UCS_OK) s = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (s != UCS_OK) {
        mm_bucx_fail("worker / memory registration", s);
        mm_bucx_destroy(u);
        return NULL;
    }
    u->base = (uint64_t)(uintptr_t)base;
    u->len = len;
    snprintf(u->desc, sizeof u->desc, "UCX %s ucp_put_nbx, %s, device %s, TCP segments %s/%s",
             ucp_get_version_string(), *tls ? tls : "^sm",
             *devs ? devs : net_device && *net_device ? net_device : "any", *tx ? tx : "64k",
             *rx ? rx : "256k");
    return u;
}

size_t mm_bucx_blob(mm_bucx_t *u, void *buf, size_t cap)
{
    size_t n = 24 + u->addr_len + u->rkey_len;
    if (n > cap) return 0;
    uint64_t h[3] = {u->base, u->addr_len, u->rkey_len};
    memcpy(buf, h, sizeof h);
    memcpy((char *)buf + 24, u->addr, u->addr_len);
    memcpy((char *)buf + 24 + u->addr_len, u->rkey_buf, u->rkey_len);
    return n;
}

typedef struct {
    volatile int done;
    ucs_status_t status;
} mm_bucx_req_t;

static void mm_bucx_req_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_bucx_req_t *r = user_data;
    r->status = status;
    r->done = 1;
    ucp_request_free(request);
}

/* Wait for a request returned by a *_nbx call with mm_bucx_req_cb. */
static int mm_bucx_wait_req(mm_bucx_t *u, ucs_status_ptr_t p, mm_bucx_req_t *r, const char *what)
{
    if (p == NULL) return 0;
    if (UCS_PTR_IS_ERR(p)) return mm_bucx_fail(what, UCS_PTR_STATUS(p));
    double end = mm_now_s() + 120;
    while (!r->done) {
        ucp_worker_progress(u->worker);
        if (mm_now_s() > end) return mm_bucx_fail(what, UCS_ERR_TIMED_OUT);
    }
    return r->status == UCS_OK ? 0 : mm_bucx_fail(what, r->status);
}

static ucp_request_param_t mm_bucx_param(mm_bucx_req_t *r)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = mm_bucx_req_cb;
    prm.user_data = r;
    return prm;
}

int mm_bucx_connect(mm_bucx_t *u, const void *blob, size_t len)
{
    uint64_t h[3];
    if (len < 24) return -1;
    memcpy(h, blob, sizeof h);
    if (24 + h[1] + h[2] > len) return -1;
    u->peer_base = h[0];
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = (const ucp_address_t *)((const char *)blob + 24);
    ucs_status_t s = ucp_ep_create(u->worker, &ep, &u->ep);
    if (s == UCS_OK) s = ucp_ep_rkey_unpack(u->ep, (const char *)blob + 24 + h[1], &u->rkey);
    if (s != UCS_OK) return mm_bucx_fail("connect", s);
    /* wire up now: a get completes only over an established connection */
    uint64_t probe = 0;
    mm_bucx_req_t r = {0, UCS_OK};
    ucp_request_param_t prm = mm_bucx_param(&r);
    return mm_bucx_wait_req(u, ucp_get_nbx(u->ep, &probe, sizeof probe, u->peer_base, u->rkey, &prm),
                            &r, "wire-up get");
}

static void mm_bucx_put_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)user_data;
    if (status != UCS_OK) fprintf(stderr, "bench ucx: put: %s\n", ucs_status_string(status));
    ucp_request_free(request);
}

int mm_bucx_put(mm_bucx_t *u, const void *src, size_t n, uint64_t off)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    prm.cb.send = mm_bucx_put_cb;
    ucs_status_ptr_t p = ucp_put_nbx(u->ep, src, n, u->peer_base + off, u->rkey, &prm);
    if (UCS_PTR_IS_ERR(p)) return mm_bucx_fail("ucp_put_nbx", UCS_PTR_STATUS(p));
    return 0;
}

int mm_bucx_flush(mm_bucx_t *u)
{
    mm_bucx_req_t r = {0, UCS_OK};
    ucp_request_param_t prm = mm_bucx_param(&r);
    return mm_bucx_wait_req(u, ucp_ep_flush_nbx(u->ep, &prm), &r, "ucp_ep_flush_nbx");
}

static void mm_bucx_flag_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    ((mm_bucx_flag_t *)user_data)->busy = 0;
    ucp_request_free(request);
}

int mm_bucx_put_flag(mm_bucx_t *u, uint64_t off, uint64_t value, int fence)
{
    mm_bucx_flag_t *f = &u->flags[u->flag_next++ % MM_BUCX_FLAGS];
    while (f->busy) ucp_worker_progress(u->worker); /* the slot's earlier put still reads it */
    f->value = value;
    f->busy = 1;
    if (fence) ucp_worker_fence(u->worker);
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = mm_bucx_flag_cb;
    prm.user_data = f;
    ucs_status_ptr_t p = ucp_put_nbx(u->ep, &f->value, 8, u->peer_base + off, u->rkey, &prm);
    if (p == NULL) f->busy = 0;
    else if (UCS_PTR_IS_ERR(p)) {
        f->busy = 0;
        return mm_bucx_fail("flag put", UCS_PTR_STATUS(p));
    }
    return 0;
}

int mm_bucx_wait_word(mm_bucx_t *u, const volatile uint64_t *word, uint64_t value, double timeout_s)
{
    double end = 0;
    for (unsigned i = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) < value; i++) {
        ucp_worker_progress(u->worker);
        if ((i & 1023) == 1023) {
            if (end == 0) end = mm_now_s() + timeout_s;
            else if (mm_now_s() > end) return -1;
        }
    }
    return 0;
}

void mm_bucx_progress(mm_bucx_t *u) { ucp_worker_progress(u->worker); }

static void *mm_bucx_thread_main(void *arg)
{
    mm_bucx_t *u = arg;
    while (!u->stop) {
        while (ucp_worker_progress(u->worker)) {
        }
        if (ucp_worker_arm(u->worker) == UCS_ERR_BUSY) continue;
        struct pollfd pfd[2] = {{u->efd, POLLIN, 0}, {u->wake_fd, POLLIN, 0}};
        if (poll(pfd, 2, 50) < 0 && errno != EINTR) break;
        if (pfd[1].revents) break;
    }
    return NULL;
}

int mm_bucx_thread_start(mm_bucx_t *u)
{
    if (u->thread_started) return 0;
    if (u->efd < 0) {
        ucs_status_t s = ucp_worker_get_efd(u->worker, &u->efd);
        if (s != UCS_OK) return mm_bucx_fail("ucp_worker_get_efd", s);
    }
    if (u->wake_fd < 0) u->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    u->stop = 0;
    if (u->wake_fd < 0 || pthread_create(&u->thread, NULL, mm_bucx_thread_main, u) != 0) return -1;
    u->thread_started = 1;
    return 0;
}

void mm_bucx_thread_stop(mm_bucx_t *u)
{
    if (!u->thread_started) return;
    u->stop = 1;
    uint64_t one = 1;
    if (write(u->wake_fd, &one, sizeof one) < 0) { /* the bounded poll ends it anyway */
    }
    pthread_join(u->thread, NULL);
    if (read(u->wake_fd, &one, sizeof one) < 0) { /* drained for the next start */
    }
    u->thread_started = 0;
}

const char *mm_bucx_describe(const mm_bucx_t *u) { return u->desc; }

void mm_bucx_destroy(mm_bucx_t *u)
{
    if (u == NULL) return;
    mm_bucx_thread_stop(u);
    if (u->wake_fd >= 0) close(u->wake_fd);
    if (u->rkey) ucp_rkey_destroy(u->rkey);
    if (u->ep) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t p = ucp_ep_close_nbx(u->ep, &prm);
        for (int i = 0; p && !UCS_PTR_IS_ERR(p) && i < 100000; i++) {
            ucp_worker_progress(u->worker);
            if (ucp_request_check_status(p) != UCS_INPROGRESS) break;
        }
        if (p && !UCS_PTR_IS_ERR(p)) ucp_request_free(p);
    }
    if (u->addr) ucp_worker_release_address(u->worker, u->addr);
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->rkey_buf) ucp_rkey_buffer_release(u->rkey_buf);
    if (u->memh) ucp_mem_unmap(u->ctx, u->memh);
    if (u->ctx) ucp_cleanup(u->ctx);
    free(u);
}
