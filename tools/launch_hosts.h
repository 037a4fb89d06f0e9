/* Simulated hosts for `megamoe launch --hosts H` (docs/multinode.md, "Simulated hosts and
 * fault injection").
 *
 * Host h of a job is a holder process in its own network, UTS and mount namespaces: hostname
 * mm<S>-host<h>, loopback up, eth0 = one end of a veth pair with address
 * 10.<200 + S/256>.<S % 256>.<h + 1>/24, a private /dev/shm (tmpfs) and an /etc/hosts naming every
 * host of the job (also as mmhost<h>). The other end of each veth (mmlv<pid>h<h>) is a port of
 * the job's bridge mmlb<pid> in the root namespace, which has no address: nothing routes out of
 * the namespaces. S is a slot unique among running launchers, chosen under a lock and recorded
 * in the bridge's alias, so a later launcher can tell a live job from one whose launcher died
 * (and remove what that one left). Processes join a host between fork and exec
 * (mm_sim_host_enter). Everything here needs root; it is launcher code, never library code.
 */
#ifndef MM_TOOLS_LAUNCH_HOSTS_H
#define MM_TOOLS_LAUNCH_HOSTS_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#define MM_SIM_HOSTS_MAX 64
#define MM_SIM_NAME_LEN 16

typedef struct mm_sim_host {
    char name[MM_SIM_NAME_LEN];  /* hostname, e.g. mm7-host1, unique among running jobs */
    char alias[MM_SIM_NAME_LEN]; /* mmhost1: the same address in this job's /etc/hosts */
    char ip[16];                 /* 10.200.7.2 */
    char veth[MM_SIM_NAME_LEN];  /* root-side end of its link, mmlv<pid>h1 */
    pid_t holder;                /* the process that holds the namespaces, -1 none */
    int ctl_fd;                  /* the holder exits when this write end closes */
    int ns_fd[3];                /* net, uts, mnt namespaces of the holder (O_CLOEXEC) */
    dev_t net_dev;
    ino_t net_ino;               /* identity of its network namespace */
    int cut;                     /* link set down by a fault */
} mm_sim_host_t;

typedef struct mm_sim_hosts {
    int n;
    int slot;
    pid_t owner;                /* the launcher: only it tears down */
    char bridge[MM_SIM_NAME_LEN];
    char subnet[24];            /* 10.200.7.0/24 */
    char ip_bin[64];            /* iproute2's ip */
    int bridge_made, links_made, destroyed;
    int cleanup_failed;         /* a link was still there after the teardown */
    char shm_leftovers[1024];   /* "mm7-host1:/dev/shm/megamoe-..." entries, space separated */
    mm_sim_host_t host[MM_SIM_HOSTS_MAX];
} mm_sim_hosts_t;

/* Create n hosts. Returns 0; 2 when it cannot work here (not root, no iproute2: the message
 * names the fix); 1 on a failure while creating (printed; what exists is removed); -1 when
 * *stop became non-zero (interrupted; what exists is removed). */
int mm_sim_hosts_create(mm_sim_hosts_t *s, int n, volatile sig_atomic_t *stop);

/* In a forked child before exec: join host h's network, UTS and mount namespaces and go back
 * to cwd (joining a mount namespace resets it). 0 or -1 (errno set). */
int mm_sim_host_enter(const mm_sim_hosts_t *s, int h, const char *cwd);

/* Fault actions. cut: host h's veth link down (0 or -1). kill: SIGKILL every process in host
 * h's network namespace except its holder; returns how many were signalled. */
int mm_sim_host_cut(mm_sim_hosts_t *s, int h);
int mm_sim_host_kill(const mm_sim_hosts_t *s, int h);

/* Tear everything down (idempotent, only in the owner): record /dev/shm/megamoe-* leftovers,
 * kill what still runs in the namespaces, delete the links and the bridge, stop the holders,
 * then check that no link is left (cleanup_failed). */
void mm_sim_hosts_destroy(mm_sim_hosts_t *s);

/* For `megamoe netns-exec`: the holder of the running simulated host named `name`, or -1. */
pid_t mm_sim_host_find(const char *name);
/* Join the namespaces of holder `pid` (the process must be single-threaded), go back to cwd,
 * and check that the hostname is now `name`. 0, or -1 with a message in err. */
int mm_sim_host_enter_pid(pid_t pid, const char *name, const char *cwd, char *err, size_t len);

#endif
