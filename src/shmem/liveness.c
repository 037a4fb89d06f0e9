/* Peer liveness: a monitor thread watches every peer and records the first loss.
 *
 * Sources, all event-driven through one poll(): a pidfd per same-host peer (readable when the
 * process exits, even before it is reaped), the bootstrap socket (POLLRDHUP when the peer's
 * end closes, which the kernel does when a process dies; an error after a few seconds of
 * unanswered keepalive probes when a whole host vanishes, boot_net.c) and, where pidfd_open
 * is missing, a /proc/<pid>/stat check every 100 ms (state and start time, so a reused pid is
 * no alive peer). Pids mean nothing on another host, so peers there are watched through the
 * sockets (rank 0 sees every rank's) and the engine's connection errors only.
 * A loss is published three ways: the per-PE `dead` flag, `lost_pe` with its reason, and the
 * job-lost word in the heap header, which this PE writes into its own header and pushes into
 * every peer's (a store on this host, an engine atomic across hosts), and which every PE's
 * waiters read locally: a loss seen by one PE (rank 0 sees every bootstrap socket) reaches all.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shmem_internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static atomic_int mm_lost_claim = -1;

/* 1 when /proc says process pid (started at start_time) is gone or a zombie. */
static int mm_proc_gone(int pid, uint64_t start_time)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return 0;
    p += 2; /* field 3: state */
    if (*p == 'Z' || *p == 'X' || *p == 'x') return 1;
    /* field 22: start time */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    if (p && start_time && strtoull(p, NULL, 10) != start_time) return 1;
    return 0;
}

/* Record the loss of pe here; publish != 0 also writes it into the job-lost word. */
static void mm_mark_lost(int pe, const char *why, int publish)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (pe < 0 || pe >= g->n_pes || atomic_load(&g->closing)) return;
    if (atomic_exchange(&g->dead[pe], 1)) return;
    /* A loss another PE already published in the job-lost word came first: report that one
     * (the root cause), not what it led to here, e.g. rank 0 going away after it saw the
     * first loss — which a loaded monitor thread may notice in the same poll round. A claim
     * that names this PE is not taken: it comes from a PE that lost sight of us (its own
     * connection broke), and what we see ourselves is the better report. */
    int first = pe;
    const char *first_why = why;
    if (g->my_base) {
        uint64_t w = __atomic_load_n(&mm_shmem_header(g->my_base)->lost, __ATOMIC_ACQUIRE);
        int q = (int)w - 1;
        if (w != 0 && q != pe && q != g->my_pe && q < g->n_pes) {
            first = q;
            first_why = "reported by another rank";
        }
    }
    int expected = -1;
    if (atomic_compare_exchange_strong(&mm_lost_claim, &expected, first)) {
        snprintf(g->lost_why, sizeof g->lost_why, "%s", first_why);
        atomic_store_explicit(&g->lost_pe, first, memory_order_release);
        MM_LOG(MEGAMOE_LOG_ERROR, "shmem: rank %d lost: %s", first, first_why);
    }
    if (publish && g->my_base) {
        /* first claim wins in every header; peers on other hosts get it through the engine
         * (non-blocking; a peer that cannot be reached any more learns of it otherwise) */
        const uint64_t off = offsetof(mm_shmem_header_t, lost);
        for (int q = 0; q < g->n_pes; q++) {
            if (q == pe || (q != g->my_pe && atomic_load(&g->dead[q]))) continue;
            if (g->bases[q] || (g->engine && g->remote[q]))
                mm_shmem_word_op(q, off, (uint64_t)pe + 1, MM_ENGINE_CAS0);
        }
    }
}

void mm_shmem_mark_lost(int pe, const char *why) { mm_mark_lost(pe, why, 1); }

void mm_shmem_declare_lost(int pe, const char *why)
{
    if (mm_shmem_running_now() && pe >= 0 && pe < mm_shmem_g.n_pes && pe != mm_shmem_g.my_pe)
        mm_mark_lost(pe, why, 1);
}

/* 1 when peer pe's process is known to be running (pidfd not readable, or /proc says so). */
static int mm_peer_running(int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->peers[pe].pidfd >= 0) {
        struct pollfd p = {g->peers[pe].pidfd, POLLIN, 0};
        return poll(&p, 1, 0) == 0;
    }
    return g->peers[pe].pid > 0 && !mm_proc_gone(g->peers[pe].pid, g->peers[pe].start_time);
}

int mm_shmem_lost_pe(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    int pe = atomic_load_explicit(&g->lost_pe, memory_order_acquire);
    if (pe >= 0) return pe;
    if (g->my_base) {
        uint64_t w = __atomic_load_n(&mm_shmem_header(g->my_base)->lost, __ATOMIC_ACQUIRE);
        if (w) return (int)(w - 1);
    }
    return -1;
}

megamoe_status_t mm_shmem_check_peers(const char *what)
{
    int pe = mm_shmem_lost_pe();
    if (pe < 0) return MEGAMOE_OK;
    mm_shmem_global_t *g = &mm_shmem_g;
    if (pe == g->my_pe) /* another PE lost sight of this one (e.g. our connection broke) */
        return mm_error(MEGAMOE_PEER_LOST, "rank %d (this process) was declared lost by another "
                        "rank during %s; the job cannot continue: release SHMEM and restart "
                        "every rank", pe, what);
    const char *why = atomic_load_explicit(&g->lost_pe, memory_order_acquire) == pe
                          ? g->lost_why
                          : "reported by another rank";
    return mm_error(MEGAMOE_PEER_LOST, "rank %d was lost (%s) during %s; the job cannot "
                    "continue: release SHMEM and restart every rank", pe, why, what);
}

static void *mm_monitor_main(void *arg)
{
    (void)arg;
    mm_shmem_global_t *g = &mm_shmem_g;
    int n = g->n_pes;
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof *pfd);
    int *who = calloc((size_t)(2 * n + 1), sizeof *who);
    if (!pfd || !who) {
        free(pfd), free(who);
        return NULL;
    }
    for (;;) {
        int k = 0, need_proc = 0;
        pfd[k] = (struct pollfd){g->wake_fd, POLLIN, 0};
        who[k++] = -1;
        for (int pe = 0; pe < n; pe++) {
            if (pe == g->my_pe || atomic_load(&g->dead[pe])) continue;
            if (g->peers[pe].pidfd >= 0) {
                pfd[k] = (struct pollfd){g->peers[pe].pidfd, POLLIN, 0};
                who[k++] = pe;
            } else if (g->peers[pe].pid > 0) {
                need_proc = 1;
            }
            int fd = mm_boot_fd(g->boot, pe);
            if (fd >= 0) {
                pfd[k] = (struct pollfd){fd, POLLRDHUP, 0};
                who[k++] = -2 - pe;
            }
        }
        int rc = poll(pfd, (nfds_t)k, need_proc ? 100 : 1000);
        if (atomic_load(&g->closing)) break;
        if (rc < 0 && errno != EINTR) break;
        if (pfd[0].revents) break;
        for (int i = 1; i < k; i++) {
            if (!pfd[i].revents) continue;
            char why[128];
            if (who[i] >= 0) {
                snprintf(why, sizeof why, "process %d exited", g->peers[who[i]].pid);
                mm_shmem_mark_lost(who[i], why);
            } else {
                /* A non-root PE whose connection to a rank 0 that still runs closed: rank 0
                 * sees the same close and publishes the verdict (this PE, the one cut off).
                 * Publishing "rank 0 lost" here could reach the job before rank 0's own
                 * report and blame the live root (seen under TSan); the loss still fails this
                 * PE's waiters. */
                int pe = -2 - who[i];
                int publish = !(pe == 0 && g->my_pe != 0 && mm_shmem_same_host(0) &&
                                mm_peer_running(0));
                mm_mark_lost(pe, "its bootstrap connection closed", publish);
            }
        }
        if (need_proc)
            for (int pe = 0; pe < n; pe++)
                if (pe != g->my_pe && g->peers[pe].pidfd < 0 && g->peers[pe].pid > 0 &&
                    !atomic_load(&g->dead[pe]) &&
                    mm_proc_gone(g->peers[pe].pid, g->peers[pe].start_time)) {
                    char why[128];
                    snprintf(why, sizeof why, "process %d is gone", g->peers[pe].pid);
                    mm_shmem_mark_lost(pe, why);
                }
    }
    free(pfd);
    free(who);
    return NULL;
}

void mm_shmem_liveness_reset(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    atomic_store(&mm_lost_claim, -1);
    atomic_store(&g->lost_pe, -1);
    atomic_store(&g->closing, 0);
    g->lost_why[0] = '\0';
}

megamoe_status_t mm_shmem_liveness_start(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_shmem_liveness_reset();
    for (int pe = 0; pe < g->n_pes; pe++) {
        g->peers[pe].pidfd = -1;
        if (pe == g->my_pe || g->peers[pe].pid <= 0) continue;
        long fd = syscall(SYS_pidfd_open, (pid_t)g->peers[pe].pid, 0);
        if (fd >= 0) {
            fcntl((int)fd, F_SETFD, FD_CLOEXEC);
            g->peers[pe].pidfd = (int)fd;
        } else if (errno == ESRCH) {
            mm_shmem_mark_lost(pe, "process already gone at start");
        }
    }
    g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->wake_fd < 0)
        return mm_error(MEGAMOE_IO, "cannot create the liveness monitor's eventfd: %s",
                        strerror(errno));
    int rc = pthread_create(&g->monitor, NULL, mm_monitor_main, NULL);
    if (rc != 0) {
        close(g->wake_fd);
        g->wake_fd = -1;
        return mm_error(MEGAMOE_IO, "cannot start the liveness monitor thread: %s", strerror(rc));
    }
    g->monitor_started = 1;
    return MEGAMOE_OK;
}

void mm_shmem_liveness_stop(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    atomic_store(&g->closing, 1);
    if (g->monitor_started) {
        uint64_t one = 1;
        if (write(g->wake_fd, &one, sizeof one) < 0) { /* the join below still ends it */
        }
        pthread_join(g->monitor, NULL);
        g->monitor_started = 0;
    }
    if (g->wake_fd >= 0) close(g->wake_fd);
    g->wake_fd = -1;
    for (int pe = 0; g->peers && pe < g->n_pes; pe++) {
        if (g->peers[pe].pidfd >= 0) close(g->peers[pe].pidfd);
        g->peers[pe].pidfd = -1;
    }
}

int mm_shmem_pe_alive(int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (!mm_shmem_running_now() || pe < 0 || pe >= g->n_pes) return 0;
    if (atomic_load_explicit(&g->dead[pe], memory_order_acquire)) return 0;
    if (g->my_base &&
        __atomic_load_n(&mm_shmem_header(g->my_base)->lost, __ATOMIC_ACQUIRE) == (uint64_t)pe + 1)
        return 0;
    return 1;
}
