/* Peer liveness: a monitor thread watches every peer; what it and the engine see feeds the
 * survivors' agreement (survive.c).
 *
 * Sources, all event-driven through one poll(): a pidfd per same-host peer (readable when the
 * process exits, even before it is reaped: the peer is dead), the bootstrap socket (POLLRDHUP
 * when the peer's end closes, which the kernel does when a process dies: dead; an error after
 * unanswered keepalive probes when a whole host vanishes: unreachable, boot_net.c) and, where
 * pidfd_open is missing, a /proc/<pid>/stat check every 100 ms (state and start time, so a
 * reused pid is no alive peer). Pids mean nothing on another host, so peers there are watched
 * through the sockets (rank 0 sees every rank's), the engine's connection errors and the
 * heartbeats of survive.c. The monitor also runs survive.c's periodic work (reports of other
 * PEs, heartbeats, the agreement), woken by an eventfd when a loss is seen anywhere here.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shmem_internal.h"
#include "survive.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

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

/* A loss seen by this PE (the engine, the test seam, a failed control signal): unreachable
 * unless proven dead. Every PE learns it through survive.c. */
void mm_shmem_mark_lost(int pe, const char *why) { mm_surv_observe(pe, MM_LOSS_UNREACHABLE, why); }

void mm_shmem_declare_lost(int pe, const char *why)
{
    if (mm_shmem_running_now() && pe >= 0 && pe < mm_shmem_g.n_pes && pe != mm_shmem_g.my_pe)
        mm_surv_observe(pe, MM_LOSS_UNREACHABLE, why);
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

int mm_shmem_lost_pe(void) { return mm_surv_pending_pe(); }

megamoe_status_t mm_shmem_recover(void)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_recover");
    return mm_surv_recover("mm_shmem_recover");
}

int mm_shmem_pe_lost(int pe) { return mm_shmem_running_now() && mm_surv_retired(pe); }

megamoe_status_t mm_shmem_check_peers(const char *what) { return mm_surv_check(what); }

static void mm_monitor_kick(void)
{
    int fd = mm_shmem_g.wake_fd;
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0) { /* full: a wake-up is pending anyway */
    }
}

/* A bootstrap connection to pe ended: how sure is the loss? The peer's kernel closing it (an
 * orderly close or a reset) means its process is gone; silence (keepalive or user timeout)
 * means unreachable. A same-host PE whose pidfd says it runs cut the connection itself:
 * unreachable — except rank 0 seen from another rank (rank 0 sees the same close and reports
 * this PE, the one cut off; blaming the live root could reach the job first). Returns
 * MM_LOSS_NONE when there is nothing to report. */
static int mm_boot_close_kind(int pe, int fd, char *why, size_t len)
{
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    snprintf(why, len, "its bootstrap connection closed");
    if (mm_shmem_same_host(pe) && mm_peer_running(pe))
        return pe == 0 && mm_shmem_g.my_pe != 0 ? MM_LOSS_NONE : MM_LOSS_UNREACHABLE;
    if (err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN) {
        snprintf(why, len, "its bootstrap connection timed out (%s)", strerror(err));
        return MM_LOSS_UNREACHABLE;
    }
    return MM_LOSS_DEAD;
}

static void *mm_monitor_main(void *arg)
{
    (void)arg;
    mm_shmem_global_t *g = &mm_shmem_g;
    int n = g->n_pes;
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof *pfd);
    int *who = calloc((size_t)(2 * n + 1), sizeof *who);
    unsigned char *boot_done = calloc((size_t)n, 1);
    if (!pfd || !who || !boot_done) {
        free(pfd), free(who), free(boot_done);
        return NULL;
    }
    for (;;) {
        int k = 0, need_proc = 0;
        pfd[k] = (struct pollfd){g->wake_fd, POLLIN, 0};
        who[k++] = -1;
        for (int pe = 0; pe < n; pe++) {
            if (pe == g->my_pe) continue;
            if (atomic_load(&g->dead[pe])) {
                /* nothing more to learn from a lost peer's descriptors: release them now */
                if (g->peers[pe].pidfd >= 0) close(g->peers[pe].pidfd);
                g->peers[pe].pidfd = -1;
                if (!boot_done[pe]) mm_boot_drop_fd(g->boot, pe);
                boot_done[pe] = 1;
                continue;
            }
            if (g->peers[pe].pidfd >= 0) {
                pfd[k] = (struct pollfd){g->peers[pe].pidfd, POLLIN, 0};
                who[k++] = pe;
            } else if (g->peers[pe].pid > 0) {
                need_proc = 1;
            }
            int fd = boot_done[pe] ? -1 : mm_boot_fd(g->boot, pe);
            if (fd >= 0) {
                pfd[k] = (struct pollfd){fd, POLLRDHUP, 0};
                who[k++] = -2 - pe;
            }
        }
        int tick = mm_surv_tick_ms();
        int rc = poll(pfd, (nfds_t)k, need_proc && tick > 100 ? 100 : tick);
        if (atomic_load(&g->closing)) break;
        if (rc < 0 && errno != EINTR) break;
        if (pfd[0].revents) {
            uint64_t v;
            if (read(g->wake_fd, &v, sizeof v) < 0) { /* drained by a concurrent read */
            }
        }
        for (int i = 1; i < k && rc > 0; i++) {
            if (!pfd[i].revents) continue;
            char why[128];
            if (who[i] >= 0) {
                snprintf(why, sizeof why, "process %d exited", g->peers[who[i]].pid);
                mm_surv_observe(who[i], MM_LOSS_DEAD, why);
            } else {
                int pe = -2 - who[i];
                int kind = mm_boot_close_kind(pe, pfd[i].fd, why, sizeof why);
                /* a closed connection stays readable: watch it no more */
                boot_done[pe] = 1;
                if (kind != MM_LOSS_NONE) mm_surv_observe(pe, kind, why);
            }
        }
        if (need_proc)
            for (int pe = 0; pe < n; pe++)
                if (pe != g->my_pe && g->peers[pe].pidfd < 0 && g->peers[pe].pid > 0 &&
                    !atomic_load(&g->dead[pe]) &&
                    mm_proc_gone(g->peers[pe].pid, g->peers[pe].start_time)) {
                    char why[128];
                    snprintf(why, sizeof why, "process %d is gone", g->peers[pe].pid);
                    mm_surv_observe(pe, MM_LOSS_DEAD, why);
                }
        mm_surv_tick();
    }
    free(pfd);
    free(who);
    free(boot_done);
    return NULL;
}

void mm_shmem_liveness_reset(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    atomic_store(&g->lost_pe, -1);
    atomic_store(&g->closing, 0);
    g->lost_why[0] = '\0';
}

megamoe_status_t mm_shmem_liveness_start(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    atomic_store(&g->closing, 0);
    g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->wake_fd < 0)
        return mm_error(MEGAMOE_IO, "cannot create the liveness monitor's eventfd: %s",
                        strerror(errno));
    mm_surv_set_kick(mm_monitor_kick);
    for (int pe = 0; pe < g->n_pes; pe++) {
        g->peers[pe].pidfd = -1;
        if (pe == g->my_pe || g->peers[pe].pid <= 0) continue;
        long fd = syscall(SYS_pidfd_open, (pid_t)g->peers[pe].pid, 0);
        if (fd >= 0) {
            fcntl((int)fd, F_SETFD, FD_CLOEXEC);
            g->peers[pe].pidfd = (int)fd;
        } else if (errno == ESRCH) {
            mm_surv_observe(pe, MM_LOSS_DEAD, "process already gone at start");
        }
    }
    int rc = pthread_create(&g->monitor, NULL, mm_monitor_main, NULL);
    if (rc != 0) {
        mm_surv_set_kick(NULL);
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
        mm_monitor_kick(); /* the join below still ends it if the write failed */
        pthread_join(g->monitor, NULL);
        g->monitor_started = 0;
    }
    mm_surv_set_kick(NULL);
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
    if (pe == g->my_pe) return !mm_surv_stopped(); /* out: declared lost, or the smaller side */
    return !atomic_load_explicit(&g->dead[pe], memory_order_acquire);
}
