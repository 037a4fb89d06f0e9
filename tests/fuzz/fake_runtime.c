/* A fake SHMEM runtime for the operator fuzz harness (fuzz_ops_args.c): one process plays
 * world rank `me` of `n`, so the v2 operators' argument validation, the world agreement on
 * the records and the workspace sizing run exactly as in a job, with no peers.
 *
 * Linked instead of src/shmem (the ops objects are linked without the shmem layer, so a
 * function missing here is a link error, not a silent use of the real runtime). The
 * allgather returns this rank's record for every rank, with the harness's mutations applied
 * to the peers' operator records (peers that called with other arguments or other counts); the
 * symmetric allocation always fails (OUT_OF_MEMORY), so a call that passes validation and
 * agreement stops before any data moves. The data-path functions are never reached: they
 * abort, and the fuzzer reports that as a crash.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "fake_runtime.h"
#include "shmem/comm_impl.h"
#include "shmem/shmem.h"

struct mm_shmem_team {
    int n, me;
    int pe[2]; /* world PE of each member (TP team); the world and EP teams are the identity */
    uint64_t uid; /* new for every mm_fake_runtime_set: the operators' scopes are per team */
};

struct megamoe_comm {
    struct mm_shmem_team team;
};

static struct {
    int running;
    struct mm_shmem_team world;
    megamoe_comm_t ep, tp;
    const mm_fake_mutation_t *mut;
    int n_mut;
    mm_fake_fixup_t fixup;
    int ranks_per_host;
    uint64_t generation;
    mm_shmem_release_hook_t release[8];
    void *release_arg[8];
    int n_release;
} mm_fake;

void mm_fake_set_hosts(int ranks_per_host) { mm_fake.ranks_per_host = ranks_per_host; }

/* Hosts: consecutive blocks of ranks_per_host world PEs (0: all on one host). */
int mm_shmem_host_of(int pe)
{
    if (pe < 0 || pe >= mm_fake.world.n) return -1;
    return mm_fake.ranks_per_host > 0 ? pe / mm_fake.ranks_per_host : 0;
}

int mm_shmem_n_hosts(void)
{
    return mm_fake.world.n > 0 ? mm_shmem_host_of(mm_fake.world.n - 1) + 1 : 0;
}

void mm_fake_set_fixup(mm_fake_fixup_t fn) { mm_fake.fixup = fn; }

void mm_fake_runtime_set(int world, int me, int tp_me, const mm_fake_mutation_t *mutations,
                         int n_mutations)
{
    int partner = (me ^ 1) < world ? me ^ 1 : 0;
    /* a new input is a new lifecycle: what the layers above keep per lifecycle goes first */
    if (mm_fake.running)
        for (int i = 0; i < mm_fake.n_release; i++) (void)mm_fake.release[i](mm_fake.release_arg[i]);
    uint64_t g = ++mm_fake.generation << 2;
    mm_fake.running = 1;
    mm_fake.world = (struct mm_shmem_team){world, me, {-1, -1}, g | 1};
    mm_fake.ep.team = mm_fake.world;
    mm_fake.ep.team.uid = g | 2;
    mm_fake.tp.team = (struct mm_shmem_team){2, tp_me, {tp_me ? partner : me, tp_me ? me : partner},
                                             g | 3};
    mm_fake.mut = mutations;
    mm_fake.n_mut = n_mutations;
}

megamoe_comm_t *mm_fake_comm_ep(void) { return &mm_fake.ep; }
megamoe_comm_t *mm_fake_comm_tp(void) { return &mm_fake.tp; }

static void mm_fake_unreachable(const char *what)
{
    fprintf(stderr, "fake runtime: %s reached although no symmetric memory was allocated\n", what);
    abort();
}

mm_shmem_team_t *mm_comm_team(const megamoe_comm_t *comm)
{
    if (comm != &mm_fake.ep && comm != &mm_fake.tp) return NULL;
    return (mm_shmem_team_t *)&comm->team;
}

int mm_shmem_is_running(void) { return mm_fake.running; }
int mm_shmem_my_pe(void) { return mm_fake.world.me; }
int mm_shmem_n_pes(void) { return mm_fake.world.n; }
mm_shmem_team_t *mm_shmem_team_world(void) { return &mm_fake.world; }
int mm_shmem_team_my_pe(const mm_shmem_team_t *team) { return team->me; }
int mm_shmem_team_n_pes(const mm_shmem_team_t *team) { return team->n; }

int mm_shmem_team_world_pe(const mm_shmem_team_t *team, int i)
{
    if (i < 0 || i >= team->n) return -1;
    return team->pe[0] >= 0 ? team->pe[i] : i;
}

megamoe_status_t mm_shmem_team_allgather(mm_shmem_team_t *team, void *dest, const void *src,
                                         size_t nbytes)
{
    for (int p = 0; p < team->n; p++) memcpy((char *)dest + (size_t)p * nbytes, src, nbytes);
    size_t off = 0, len = 0;
    if (mm_fake.fixup == NULL || !mm_fake.fixup(dest, nbytes, team->n, team->me, &off, &len))
        return MEGAMOE_OK;
    for (int i = 0; i < mm_fake.n_mut && len > 4; i++) {
        const mm_fake_mutation_t *m = &mm_fake.mut[i];
        int p = m->peer % team->n;
        if (p == team->me) continue;
        ((unsigned char *)dest)[(size_t)p * nbytes + off + 4 + m->offset % (len - 4)] ^= m->xor_mask;
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_team_agree(mm_shmem_team_t *team, megamoe_status_t local)
{
    (void)team;
    return local;
}

megamoe_status_t mm_shmem_team_barrier(mm_shmem_team_t *team)
{
    (void)team;
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_barrier_all(void) { return MEGAMOE_OK; }

megamoe_status_t mm_shmem_add_release_hook(mm_shmem_release_hook_t fn, void *arg)
{
    for (int i = 0; i < mm_fake.n_release; i++)
        if (mm_fake.release[i] == fn && mm_fake.release_arg[i] == arg) return MEGAMOE_OK;
    if (mm_fake.n_release == 8) return MEGAMOE_OUT_OF_MEMORY;
    mm_fake.release[mm_fake.n_release] = fn;
    mm_fake.release_arg[mm_fake.n_release++] = arg;
    return MEGAMOE_OK;
}

/* The fake never destroys a team (each input replaces them, after the release hooks). */
megamoe_status_t mm_shmem_add_team_destroy_hook(mm_shmem_team_hook_t fn, void *arg)
{
    (void)fn, (void)arg;
    return MEGAMOE_OK;
}

uint64_t mm_shmem_team_uid(const mm_shmem_team_t *team) { return team ? team->uid : 0; }

megamoe_status_t mm_shmem_malloc_site(size_t size, size_t align, const char *site, void **ptr_p)
{
    (void)align, (void)site;
    *ptr_p = NULL;
    return mm_error(MEGAMOE_OUT_OF_MEMORY, "fake runtime: no symmetric heap (%zu bytes asked)",
                    size);
}

megamoe_status_t mm_shmem_team_malloc_site(mm_shmem_team_t *team, size_t size, size_t align,
                                           const char *site, void **ptr_p)
{
    (void)team;
    return mm_shmem_malloc_site(size, align, site, ptr_p);
}

megamoe_status_t mm_shmem_team_free(mm_shmem_team_t *team, void *ptr)
{
    (void)team;
    return mm_shmem_free(ptr);
}

megamoe_status_t mm_shmem_free(void *ptr)
{
    if (ptr != NULL) mm_fake_unreachable("mm_shmem_free of a pointer");
    return MEGAMOE_OK;
}

void *mm_shmem_ptr(const void *sym, int pe)
{
    (void)sym, (void)pe;
    mm_fake_unreachable("mm_shmem_ptr");
    return NULL;
}

megamoe_status_t mm_shmem_put(void *dest, const void *src, size_t nbytes, int pe)
{
    (void)dest, (void)src, (void)nbytes, (void)pe;
    mm_fake_unreachable("mm_shmem_put");
    return MEGAMOE_INTERNAL;
}

megamoe_status_t mm_shmem_get(void *dest, const void *src, size_t nbytes, int pe)
{
    (void)dest, (void)src, (void)nbytes, (void)pe;
    mm_fake_unreachable("mm_shmem_get");
    return MEGAMOE_INTERNAL;
}

megamoe_status_t mm_shmem_put_signal(void *dest, const void *src, size_t nbytes, uint64_t *sig,
                                     uint64_t value, int sig_op, int pe)
{
    (void)dest, (void)src, (void)nbytes, (void)sig, (void)value, (void)sig_op, (void)pe;
    mm_fake_unreachable("mm_shmem_put_signal");
    return MEGAMOE_INTERNAL;
}

megamoe_status_t mm_shmem_signal_op(uint64_t *sig, uint64_t value, int sig_op, int pe)
{
    (void)sig, (void)value, (void)sig_op, (void)pe;
    mm_fake_unreachable("mm_shmem_signal_op");
    return MEGAMOE_INTERNAL;
}

uint64_t mm_shmem_signal_fetch(const uint64_t *sig)
{
    (void)sig;
    mm_fake_unreachable("mm_shmem_signal_fetch");
    return 0;
}

megamoe_status_t mm_shmem_signal_wait_until(uint64_t *sig, int cmp, uint64_t value,
                                            uint64_t *value_p)
{
    (void)sig, (void)cmp, (void)value, (void)value_p;
    mm_fake_unreachable("mm_shmem_signal_wait_until");
    return MEGAMOE_INTERNAL;
}

void mm_shmem_copy_streaming(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
megamoe_status_t mm_shmem_fence(void) { return MEGAMOE_OK; }

void mm_shmem_declare_lost(int pe, const char *why)
{
    (void)pe, (void)why;
    mm_fake_unreachable("mm_shmem_declare_lost");
}
megamoe_status_t mm_shmem_quiet(void) { return MEGAMOE_OK; }

/* Surviving a lost rank (shmem.h): in the fake every peer is alive, so the operators never
 * take the survivors' path. */
megamoe_status_t mm_shmem_recover(void) { return MEGAMOE_OK; }
int mm_shmem_pe_alive(int pe) { return pe >= 0 && pe < mm_fake.world.n; }
int mm_shmem_team_lost_member(const mm_shmem_team_t *team)
{
    (void)team;
    return -1;
}
megamoe_status_t mm_shmem_team_create_keyed(const int *world_pes, int n, uint64_t key,
                                            mm_shmem_team_t **team_p)
{
    (void)world_pes, (void)n, (void)key, (void)team_p;
    mm_fake_unreachable("mm_shmem_team_create_keyed");
    return MEGAMOE_INTERNAL;
}
megamoe_status_t mm_shmem_team_destroy(mm_shmem_team_t *team)
{
    (void)team;
    mm_fake_unreachable("mm_shmem_team_destroy");
    return MEGAMOE_INTERNAL;
}
