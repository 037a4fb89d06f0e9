/* Simulated hosts: namespaces, links and their teardown (launch_hosts.h). Links are configured
 * with iproute2 (`ip -batch -`, one process per namespace and step); the namespaces are made
 * with unshare() in holder processes, which die with the launcher (PR_SET_PDEATHSIG), so a
 * launcher killed by SIGKILL leaves only its bridge and links, removed by the next launcher. */
#include "launch_hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MM_SIM_LOCK "/run/megamoe-launch.lock"
#define MM_SIM_SLOTS 2560 /* 10.200.0.0/24 .. 10.209.255.0/24 */
#define MM_SIM_ALIAS "megamoe-launch"

static const int mm_ns_types[3] = {CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWNS};
static const char *const mm_ns_names[3] = {"net", "uts", "mnt"};

/* ---- small helpers ---------------------------------------------------------------------- */

static int mm_read_text(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks): with the pid, it names a process
 * for good (a pid alone may be reused). 0 when the process is gone. */
static unsigned long long mm_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (mm_read_text(path, buf, sizeof buf) != 0) return 0;
    const char *p = strrchr(buf, ')');
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static int mm_link_exists(const char *name)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/class/net/%s", name);
    return access(path, F_OK) == 0;
}

static int mm_find_ip_bin(char *out, size_t len)
{
    static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(out, len, "%s/ip", dirs[i]);
        if (access(out, X_OK) == 0) return 0;
    }
    return -1;
}

/* Run `ip [-force] -batch -` with `script` on stdin, in the root namespace (netns_fd < 0) or
 * in the given network namespace. Returns ip's exit status (-1 when it could not run). The
 * child gets its own process group, so a Ctrl-C meant for the launcher does not cut a
 * teardown short. */
static int mm_ip_batch(const mm_sim_hosts_t *s, int netns_fd, const char *script, int force,
                       int quiet)
{
    int in[2];
    if (pipe2(in, O_CLOEXEC) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGPIPE, SIG_DFL);
        if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) _exit(126);
        dup2(in[0], STDIN_FILENO);
        if (quiet) {
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        }
        if (force) execl(s->ip_bin, "ip", "-force", "-batch", "-", (char *)NULL);
        else execl(s->ip_bin, "ip", "-batch", "-", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    size_t len = strlen(script), off = 0;
    while (off < len) {
        ssize_t w = write(in[1], script + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(in[1]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- slots: which subnets running launchers hold, what dead ones left -------------------- */

static void mm_slot_subnet(int slot, char *out, size_t len, int host_octet)
{
    unsigned a = 200u + (unsigned)slot % MM_SIM_SLOTS / 256u, b = (unsigned)slot % 256u;
    if (host_octet < 0) snprintf(out, len, "10.%u.%u.0/24", a, b);
    else snprintf(out, len, "10.%u.%u.%u", a, b, (unsigned)host_octet % 256u);
}

/* 1 when 10.x.y.0/24 of `slot` overlaps a route or an interface address of this namespace. */
static int mm_slot_overlaps(int slot)
{
    uint32_t net = (10u << 24) | ((uint32_t)(200 + slot / 256) << 16) | ((uint32_t)(slot % 256) << 8);
    const uint32_t mask24 = 0xffffff00u;
    FILE *f = fopen("/proc/net/route", "r");
    char line[256];
    int hit = 0;
    while (f && !hit && fgets(line, sizeof line, f)) {
        char ifname[64];
        unsigned int dest, gw, flags, refcnt, use, metric, mask;
        if (sscanf(line, "%63s %x %x %x %u %u %u %x", ifname, &dest, &gw, &flags, &refcnt, &use,
                   &metric, &mask) != 8)
            continue; /* the header */
        uint32_t d = ntohl(dest), m = ntohl(mask);
        if (m == 0) continue; /* a default route covers everything; it is not a subnet in use */
        uint32_t both = m & mask24;
        if ((d & both) == (net & both)) hit = 1;
    }
    if (f) fclose(f);
    struct ifaddrs *ifa = NULL;
    if (!hit && getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *a = ifa; a && !hit; a = a->ifa_next) {
            if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_netmask) continue;
            uint32_t ad = ntohl(((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr);
            uint32_t m = ntohl(((struct sockaddr_in *)a->ifa_netmask)->sin_addr.s_addr);
            uint32_t both = m & mask24;
            if ((ad & both) == (net & both)) hit = 1;
        }
        freeifaddrs(ifa);
    }
    return hit;
}

/* A bridge mmlb<pid> carries the alias "megamoe-launch:pid=P:start=T:slot=S". */
static int mm_parse_alias(const char *bridge, pid_t *pid, unsigned long long *start, int *slot)
{
    char path[96], alias[256];
    snprintf(path, sizeof path, "/sys/class/net/%.32s/ifalias", bridge);
    if (mm_read_text(path, alias, sizeof alias) != 0) return -1;
    int p = 0, sl = -1;
    unsigned long long t = 0;
    if (sscanf(alias, MM_SIM_ALIAS ":pid=%d:start=%llu:slot=%d", &p, &t, &sl) != 3) return -1;
    if (sl < 0 || sl >= MM_SIM_SLOTS) return -1;
    *pid = p;
    *start = t;
    *slot = sl;
    return 0;
}

/* Under the lock: mark the slots of running launchers in used[]; remove the bridges and links
 * of launchers that are gone (reported on stderr). */
static void mm_scan_and_clean(const mm_sim_hosts_t *s, unsigned char *used)
{
    enum { MAX_JOBS = 512 };
    pid_t live[MAX_JOBS], dead[MAX_JOBS];
    int n_live = 0, n_dead = 0;
    DIR *d = opendir("/sys/class/net");
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) { /* pass 1: bridges */
        if (strncmp(e->d_name, "mmlb", 4) != 0 || !isdigit((unsigned char)e->d_name[4])) continue;
        pid_t pid;
        unsigned long long start;
        int slot;
        if (mm_parse_alias(e->d_name, &pid, &start, &slot) != 0 || pid != atoi(e->d_name + 4)) {
            /* no alias: a launcher that died between making the bridge and naming it */
            pid = atoi(e->d_name + 4);
            if (kill(pid, 0) != 0 && errno == ESRCH && n_dead < MAX_JOBS) dead[n_dead++] = pid;
            continue;
        }
        if (mm_start_time(pid) == start) {
            used[slot] = 1;
            if (n_live < MAX_JOBS) live[n_live++] = pid;
        } else if (n_dead < MAX_JOBS) {
            dead[n_dead++] = pid;
        }
    }
    /* pass 2: links mmlv<pid>h<h> whose launcher has no live bridge (a live launcher makes its
     * bridge before its links, and we hold the lock under which bridges are made) */
    rewinddir(d);
    char script[8192] = "";
    size_t len = 0;
    int n_links = 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "mmlv", 4) != 0 || !isdigit((unsigned char)e->d_name[4])) continue;
        pid_t pid = atoi(e->d_name + 4);
        int alive = 0;
        for (int i = 0; i < n_live; i++) alive |= live[i] == pid;
        if (alive || len + 64 > sizeof script) continue;
        len += (size_t)snprintf(script + len, sizeof script - len, "link del dev %s\n", e->d_name);
        n_links++;
    }
    closedir(d);
    for (int i = 0; i < n_dead && len + 64 < sizeof script; i++)
        len += (size_t)snprintf(script + len, sizeof script - len, "link del dev mmlb%d\n", (int)dead[i]);
    if (len == 0) return;
    mm_ip_batch(s, -1, script, 1, 1);
    fprintf(stderr, "megamoe launch: removed %d bridge(s) and %d link(s) left by launchers that "
                    "are gone:", n_dead, n_links);
    for (int i = 0; i < n_dead; i++) fprintf(stderr, " mmlb%d", (int)dead[i]);
    fprintf(stderr, "\n");
}

/* ---- holders ------------------------------------------------------------------------------ */

/* The holder's body (after fork): new namespaces, hostname, private /dev/shm and /etc/hosts;
 * reports "ok" or "<step>: <error>" on status_fd, then waits for ctl_fd to close. */
static void mm_holder_main(pid_t parent, const mm_sim_host_t *h, const char *hosts_text,
                           int status_fd, int ctl_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    setpgid(0, 0);
    char msg[256] = "ok";
    const char *step = NULL;
    if (unshare(CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWNS) != 0) step = "unshare(net, uts, mount)";
    else if (sethostname(h->name, strlen(h->name)) != 0) step = "sethostname";
    else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) step = "making / private";
    else if (mount("megamoe-shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0)
        step = "mounting a private /dev/shm";
    else {
        /* /etc/hosts: bind-mount a file written into the private /dev/shm, then unlink it
         * (the mount keeps it), so nothing of it exists outside the namespace */
        const char *tmp = "/dev/shm/.megamoe-hosts";
        int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        size_t len = strlen(hosts_text);
        if (fd < 0 || write(fd, hosts_text, len) != (ssize_t)len) step = "writing /etc/hosts";
        if (fd >= 0) close(fd);
        if (!step && mount(tmp, "/etc/hosts", NULL, MS_BIND, NULL) != 0) step = "bind-mounting /etc/hosts";
        unlink(tmp);
    }
    if (step) snprintf(msg, sizeof msg, "%s: %s", step, strerror(errno));
    prctl(PR_SET_NAME, h->name); /* `megamoe netns-exec NAME` finds the host by this */
    if (write(status_fd, msg, strlen(msg)) < 0) _exit(1);
    close(status_fd);
    if (step) _exit(1);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, STDIN_FILENO);
        dup2(devnull, STDOUT_FILENO);
        dup2(devnull, STDERR_FILENO);
    }
    if (dup2(ctl_fd, 3) != 3) _exit(1);
    close_range(4, ~0u, 0); /* keep no pipe of the launcher's ranks open */
    char c;
    for (;;) {
        ssize_t n = read(3, &c, 1);
        if (n == 0 || (n < 0 && errno != EINTR)) _exit(0);
    }
}

static int mm_start_holder(mm_sim_hosts_t *s, int h, const char *hosts_text)
{
    mm_sim_host_t *host = &s->host[h];
    int st[2], ctl[2];
    if (pipe2(st, O_CLOEXEC) != 0) return -1;
    if (pipe2(ctl, O_CLOEXEC) != 0) {
        close(st[0]);
        close(st[1]);
        return -1;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(st[0]);
        close(ctl[1]);
        mm_holder_main(parent, host, hosts_text, st[1], ctl[0]);
        _exit(1);
    }
    close(st[1]);
    close(ctl[0]);
    if (pid < 0) {
        close(st[0]);
        close(ctl[1]);
        return -1;
    }
    host->holder = pid;
    host->ctl_fd = ctl[1];
    char msg[256];
    size_t got = 0;
    for (;;) {
        ssize_t n = read(st[0], msg + got, sizeof msg - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(st[0]);
    msg[got] = '\0';
    if (strcmp(msg, "ok") != 0) {
        fprintf(stderr, "megamoe launch: simulated host %s: %s%s\n", host->name,
                got ? msg : "the holder process died during set-up",
                strstr(msg, "Operation not permitted")
                    ? " (namespaces need root: CAP_SYS_ADMIN and CAP_NET_ADMIN)" : "");
        return strstr(msg, "Operation not permitted") ? -2 : -1;
    }
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)pid, mm_ns_names[i]);
        host->ns_fd[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (host->ns_fd[i] < 0) {
            fprintf(stderr, "megamoe launch: simulated host %s: opening %s: %s\n", host->name,
                    path, strerror(errno));
            return -1;
        }
    }
    struct stat sb;
    if (fstat(host->ns_fd[0], &sb) != 0) return -1;
    host->net_dev = sb.st_dev;
    host->net_ino = sb.st_ino;
    return 0;
}

/* ---- create / destroy -------------------------------------------------------------------- */

static void mm_sim_names(mm_sim_hosts_t *s)
{
    /* interface names have at most 15 characters: pids below 10^7 (pid_max <= 4194304) */
    unsigned me = (unsigned)getpid() % 10000000u, slot = (unsigned)s->slot % MM_SIM_SLOTS;
    snprintf(s->bridge, sizeof s->bridge, "mmlb%u", me);
    mm_slot_subnet(s->slot, s->subnet, sizeof s->subnet, -1);
    for (int h = 0; h < s->n; h++) {
        mm_sim_host_t *x = &s->host[h];
        unsigned hh = (unsigned)h % MM_SIM_HOSTS_MAX;
        snprintf(x->name, sizeof x->name, "mm%u-host%u", slot, hh);
        snprintf(x->alias, sizeof x->alias, "mmhost%u", hh);
        snprintf(x->veth, sizeof x->veth, "mmlv%uh%u", me, hh);
        mm_slot_subnet(s->slot, x->ip, sizeof x->ip, h + 1);
    }
}

int mm_sim_hosts_create(mm_sim_hosts_t *s, int n, volatile sig_atomic_t *stop)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->owner = getpid();
    s->slot = -1;
    for (int h = 0; h < MM_SIM_HOSTS_MAX; h++) {
        s->host[h].holder = -1;
        s->host[h].ctl_fd = -1;
        for (int i = 0; i < 3; i++) s->host[h].ns_fd[i] = -1;
    }
    s->destroyed = 1; /* nothing to tear down yet */
    if (n < 1 || n > MM_SIM_HOSTS_MAX) {
        fprintf(stderr, "megamoe launch: --hosts must be in [1, %d]\n", MM_SIM_HOSTS_MAX);
        return 2;
    }
    if (geteuid() != 0) {
        fprintf(stderr, "megamoe launch: --hosts needs root: each simulated host is a network, "
                        "UTS and mount namespace with a veth link on a bridge, which takes "
                        "CAP_SYS_ADMIN and CAP_NET_ADMIN; run it as root (CI does) or without "
                        "--hosts\n");
        return 2;
    }
    if (mm_find_ip_bin(s->ip_bin, sizeof s->ip_bin) != 0) {
        fprintf(stderr, "megamoe launch: --hosts needs iproute2's 'ip' (apt-get install iproute2; "
                        "make deps installs it)\n");
        return 2;
    }
    int lock = open(MM_SIM_LOCK, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        fprintf(stderr, "megamoe launch: cannot lock %s: %s\n", MM_SIM_LOCK, strerror(errno));
        if (lock >= 0) close(lock);
        return 1;
    }
    unsigned char *used = calloc(MM_SIM_SLOTS, 1);
    if (used == NULL) {
        close(lock);
        return 1;
    }
    mm_scan_and_clean(s, used);
    for (int slot = 0; slot < MM_SIM_SLOTS && s->slot < 0; slot++)
        if (!used[slot] && !mm_slot_overlaps(slot)) s->slot = slot;
    free(used);
    if (s->slot < 0) {
        close(lock);
        fprintf(stderr, "megamoe launch: no free subnet in 10.200.0.0/24 .. 10.209.255.0/24 for "
                        "the simulated hosts (all used by routes or running launchers)\n");
        return 1;
    }
    mm_sim_names(s);
    s->destroyed = 0;
    s->bridge_made = 1; /* from here on the teardown deletes whatever exists */
    char script[16384];
    size_t len = (size_t)snprintf(script, sizeof script,
                                  "link add name %s type bridge forward_delay 0\n"
                                  "link set dev %s addrgenmode none\n"
                                  "link set dev %s alias " MM_SIM_ALIAS ":pid=%d:start=%llu:slot=%d\n"
                                  "link set dev %s up\n",
                                  s->bridge, s->bridge, s->bridge, (int)s->owner,
                                  mm_start_time(s->owner), s->slot, s->bridge);
    int rc = mm_ip_batch(s, -1, script, 0, 0);
    close(lock); /* the bridge and its alias now hold the slot */
    if (rc != 0) {
        fprintf(stderr, "megamoe launch: cannot create the bridge %s (ip exit status %d; the "
                        "kernel needs bridge and veth support)\n", s->bridge, rc);
        mm_sim_hosts_destroy(s);
        return 1;
    }

    /* every host's /etc/hosts: loopback, then every host of the job by name and alias */
    char hosts_text[4096];
    size_t hl = (size_t)snprintf(hosts_text, sizeof hosts_text,
                                 "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for (int h = 0; h < n && hl < sizeof hosts_text; h++)
        hl += (size_t)snprintf(hosts_text + hl, sizeof hosts_text - hl, "%s\t%s %s\n",
                               s->host[h].ip, s->host[h].name, s->host[h].alias);
    for (int h = 0; h < n; h++) {
        if (stop && *stop) goto interrupted;
        int r = mm_start_holder(s, h, hosts_text);
        if (r != 0) {
            mm_sim_hosts_destroy(s);
            return r == -2 ? 2 : 1;
        }
    }
    if (stop && *stop) goto interrupted;
    len = 0;
    s->links_made = 1;
    for (int h = 0; h < n; h++)
        len += (size_t)snprintf(script + len, sizeof script - len,
                                "link add name %s type veth peer name eth0 netns %d\n"
                                "link set dev %s addrgenmode none\n"
                                "link set dev %s master %s\n"
                                "link set dev %s up\n",
                                s->host[h].veth, (int)s->host[h].holder, s->host[h].veth,
                                s->host[h].veth, s->bridge, s->host[h].veth);
    if ((rc = mm_ip_batch(s, -1, script, 0, 0)) != 0) {
        fprintf(stderr, "megamoe launch: cannot create the veth links (ip exit status %d)\n", rc);
        mm_sim_hosts_destroy(s);
        return 1;
    }
    for (int h = 0; h < n; h++) {
        if (stop && *stop) goto interrupted;
        snprintf(script, sizeof script,
                 "link set dev lo up\n"
                 "link set dev eth0 addrgenmode none\n"
                 "addr add %s/24 dev eth0\n"
                 "link set dev eth0 up\n",
                 s->host[h].ip);
        if ((rc = mm_ip_batch(s, s->host[h].ns_fd[0], script, 0, 0)) != 0) {
            fprintf(stderr, "megamoe launch: cannot configure eth0 of %s (ip exit status %d)\n",
                    s->host[h].name, rc);
            mm_sim_hosts_destroy(s);
            return 1;
        }
    }
    return 0;
interrupted:
    mm_sim_hosts_destroy(s);
    return -1;
}

int mm_sim_host_enter(const mm_sim_hosts_t *s, int h, const char *cwd)
{
    for (int i = 0; i < 3; i++)
        if (setns(s->host[h].ns_fd[i], mm_ns_types[i]) != 0) return -1;
    if (cwd && chdir(cwd) != 0 && chdir("/") != 0) return -1;
    return 0;
}

int mm_sim_host_cut(mm_sim_hosts_t *s, int h)
{
    char script[96];
    snprintf(script, sizeof script, "link set dev %s down\n", s->host[h].veth);
    if (mm_ip_batch(s, -1, script, 0, 0) != 0) return -1;
    s->host[h].cut = 1;
    return 0;
}

/* SIGKILL every process whose network namespace is host h's (the holder only if with_holder). */
static int mm_kill_in_netns(const mm_sim_hosts_t *s, int h, int with_holder)
{
    const mm_sim_host_t *x = &s->host[h];
    DIR *d = opendir("/proc");
    if (d == NULL) return 0;
    int count = 0;
    pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pid_t pid = atoi(e->d_name);
        if (pid == me || (pid == x->holder && !with_holder)) continue;
        char path[64];
        struct stat sb;
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
        if (stat(path, &sb) != 0 || sb.st_ino != x->net_ino || sb.st_dev != x->net_dev) continue;
        if (kill(pid, SIGKILL) == 0) count++;
    }
    closedir(d);
    return count;
}

int mm_sim_host_kill(const mm_sim_hosts_t *s, int h)
{
    if (s->host[h].holder <= 0) return 0;
    return mm_kill_in_netns(s, h, 0);
}

static void mm_record_shm(mm_sim_hosts_t *s, int h)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/root/dev/shm", (int)s->host[h].holder);
    DIR *d = opendir(path);
    if (d == NULL) return;
    struct dirent *e;
    size_t len = strlen(s->shm_leftovers);
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "megamoe-", 8) != 0) continue;
        int w = snprintf(s->shm_leftovers + len, sizeof s->shm_leftovers - len, "%s%s:/dev/shm/%s",
                         len ? " " : "", s->host[h].name, e->d_name);
        if (w < 0 || (size_t)w >= sizeof s->shm_leftovers - len) break;
        len += (size_t)w;
    }
    closedir(d);
}

void mm_sim_hosts_destroy(mm_sim_hosts_t *s)
{
    if (s->destroyed || s->owner != getpid()) return;
    s->destroyed = 1;
    for (int h = 0; h < s->n; h++)
        if (s->host[h].holder > 0) mm_record_shm(s, h);
    /* whatever still runs on a host (a rank's stray children) goes first */
    for (int h = 0; h < s->n; h++) {
        if (s->host[h].holder <= 0 || s->host[h].ns_fd[0] < 0) continue;
        for (int round = 0; round < 20 && mm_kill_in_netns(s, h, 0) > 0; round++) usleep(5000);
    }
    /* links before the bridge; deleting our end of a veth deletes the pair at once */
    char script[8192];
    size_t len = 0;
    for (int h = 0; h < s->n && s->links_made; h++)
        if (mm_link_exists(s->host[h].veth))
            len += (size_t)snprintf(script + len, sizeof script - len, "link del dev %s\n",
                                    s->host[h].veth);
    if (s->bridge_made && mm_link_exists(s->bridge))
        len += (size_t)snprintf(script + len, sizeof script - len, "link del dev %s\n", s->bridge);
    if (len) mm_ip_batch(s, -1, script, 1, 0);
    for (int h = 0; h < s->n; h++) {
        mm_sim_host_t *x = &s->host[h];
        if (x->ctl_fd >= 0) close(x->ctl_fd);
        x->ctl_fd = -1;
        if (x->holder > 0) {
            kill(x->holder, SIGKILL);
            while (waitpid(x->holder, NULL, 0) < 0 && errno == EINTR) {}
            x->holder = -1;
        }
        for (int i = 0; i < 3; i++) {
            if (x->ns_fd[i] >= 0) close(x->ns_fd[i]);
            x->ns_fd[i] = -1;
        }
    }
    for (int h = 0; h < s->n; h++)
        if (s->links_made && mm_link_exists(s->host[h].veth)) s->cleanup_failed = 1;
    if (s->bridge_made && mm_link_exists(s->bridge)) s->cleanup_failed = 1;
    if (s->cleanup_failed)
        fprintf(stderr, "megamoe launch: could not remove the bridge %s or its links; 'ip link "
                        "del dev %s' removes them (the next --hosts launch does it too)\n",
                s->bridge, s->bridge);
}

/* ---- netns-exec ---------------------------------------------------------------------------- */

pid_t mm_sim_host_find(const char *name)
{
    DIR *d = opendir("/proc");
    if (d == NULL) return -1;
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], comm[64];
        struct stat sb;
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        if (mm_read_text(path, comm, sizeof comm) != 0 || strcmp(comm, name) != 0) continue;
        snprintf(path, sizeof path, "/proc/%s/ns/uts", e->d_name);
        if (stat(path, &sb) == 0) found = atoi(e->d_name); /* not a zombie (a holder whose
                                                               launcher died, not reaped yet) */
    }
    closedir(d);
    return found;
}

int mm_sim_host_enter_pid(pid_t pid, const char *name, const char *cwd, char *err, size_t len)
{
    int fds[3];
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)pid, mm_ns_names[i]);
        fds[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            snprintf(err, len, "opening %s: %s", path, strerror(errno));
            for (int j = 0; j < i; j++) close(fds[j]);
            return -1;
        }
    }
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        if (setns(fds[i], mm_ns_types[i]) != 0) {
            snprintf(err, len, "joining the %s namespace of process %d: %s%s", mm_ns_names[i],
                     (int)pid, strerror(errno), errno == EPERM ? " (needs root)" : "");
            rc = -1;
        }
    for (int i = 0; i < 3; i++) close(fds[i]);
    if (rc) return rc;
    if (cwd && chdir(cwd) != 0 && chdir("/") != 0) {
        snprintf(err, len, "chdir: %s", strerror(errno));
        return -1;
    }
    char host[256] = "";
    gethostname(host, sizeof host);
    if (strcmp(host, name) != 0) {
        snprintf(err, len, "process %d named %s is not a simulated host (its hostname is '%s')",
                 (int)pid, name, host);
        return -1;
    }
    return 0;
}
