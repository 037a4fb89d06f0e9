/* Public communicator: a SHMEM team plus one reference on the runtime. */
#include <stdlib.h>

#include "base/abi.h"
#include "base/error.h"
#include "comm_impl.h"

#define MM_COMM_MAGIC 0x636f6d6du

struct megamoe_comm {
    uint32_t magic;
    mm_shmem_team_t *team; /* NULL once its team was destroyed (destroy being retried) */
    int owns_team;
};

megamoe_status_t megamoe_comm_params_init(megamoe_comm_params_t *p, size_t struct_size)
{
    const megamoe_comm_params_t d = {.struct_size = sizeof d, .rank = -1, .world_size = -1,
                                     .endpoint = NULL, .heap_size = 0, .timeout_sec = 0,
                                     .job_token = NULL};
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_comm_params_t");
}

static int mm_comm_valid(const megamoe_comm_t *c) { return c && c->magic == MM_COMM_MAGIC; }

mm_shmem_team_t *mm_comm_team(const megamoe_comm_t *c)
{
    return mm_comm_valid(c) ? c->team : NULL;
}

megamoe_status_t megamoe_comm_create(const megamoe_comm_params_t *caller_params,
                                     megamoe_comm_t **comm_p)
{
    if (comm_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_create: comm_p is NULL");
    megamoe_comm_params_t copy = megamoe_comm_params_default(); /* version.h: extensible */
    const megamoe_comm_params_t *params = NULL;
    if (caller_params) {
        MM_CHECK(mm_abi_copy_in(&copy, sizeof copy, caller_params, "megamoe_comm_params_t"));
        params = &copy;
    }
    megamoe_comm_t *c = calloc(1, sizeof *c);
    if (c == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_create: out of memory");
    mm_shmem_params_t p = mm_shmem_params_default();
    if (params) {
        p.rank = params->rank;
        p.world_size = params->world_size;
        p.endpoint = params->endpoint;
        p.heap_size = params->heap_size;
        p.timeout_sec = params->timeout_sec;
        p.job_token = params->job_token;
    }
    megamoe_status_t st = mm_shmem_acquire(&p);
    if (st != MEGAMOE_OK) {
        free(c);
        return st;
    }
    c->magic = MM_COMM_MAGIC;
    c->team = mm_shmem_team_world();
    *comm_p = c;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_comm_split(megamoe_comm_t *parent, int color, int key,
                                    megamoe_comm_t **comm_p)
{
    if (!mm_comm_valid(parent) || parent->team == NULL || comm_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_split: invalid parent "
                        "communicator or NULL comm_p");
    MM_CHECK(mm_shmem_acquire(NULL));
    megamoe_comm_t *c = calloc(1, sizeof *c);
    mm_shmem_team_t *team = NULL;
    /* Collective even when this rank is out of memory: the split reports it on every rank
     * only if it runs, so run it and drop the result here. */
    megamoe_status_t st = mm_shmem_team_split(parent->team, c ? color : -1, key, &team);
    if (st == MEGAMOE_OK && c == NULL && color >= 0)
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_split: out of memory");
    if (st != MEGAMOE_OK || team == NULL) {
        free(c);
        mm_shmem_release();
        if (st == MEGAMOE_OK) *comm_p = NULL;
        return st;
    }
    c->magic = MM_COMM_MAGIC;
    c->team = team;
    c->owns_team = 1;
    *comm_p = c;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_comm_create_group(megamoe_comm_t *parent, const int *ranks, int n,
                                           megamoe_comm_t **comm_p)
{
    if (!mm_comm_valid(parent) || parent->team == NULL || comm_p == NULL || ranks == NULL ||
        n < 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_create_group: invalid parent "
                        "communicator, NULL ranks/comm_p or n < 1");
    int pn = mm_shmem_team_n_pes(parent->team);
    int *pes = malloc(sizeof(int) * (size_t)n);
    if (pes == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_create_group: out of memory");
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= pn) {
            free(pes);
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_create_group: rank %d is not "
                            "in the parent communicator of %d ranks", ranks[i], pn);
        }
        pes[i] = mm_shmem_team_world_pe(parent->team, ranks[i]);
    }
    megamoe_status_t st = mm_shmem_acquire(NULL);
    megamoe_comm_t *c = st == MEGAMOE_OK ? calloc(1, sizeof *c) : NULL;
    if (st == MEGAMOE_OK && c == NULL)
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_create_group: out of memory");
    mm_shmem_team_t *team = NULL;
    if (st == MEGAMOE_OK) st = mm_shmem_team_create(pes, n, &team);
    free(pes);
    if (st != MEGAMOE_OK) {
        if (c) {
            free(c);
            mm_shmem_release();
        }
        return st;
    }
    c->magic = MM_COMM_MAGIC;
    c->team = team;
    c->owns_team = 1;
    *comm_p = c;
    return MEGAMOE_OK;
}

int megamoe_comm_world_rank(const megamoe_comm_t *c, int i)
{
    return mm_comm_valid(c) && c->team ? mm_shmem_team_world_pe(c->team, i) : -1;
}

int megamoe_comm_num_hosts(const megamoe_comm_t *c)
{
    if (!mm_comm_valid(c) || c->team == NULL) return -1;
    int n = mm_shmem_team_n_pes(c->team), hosts = 0;
    for (int i = 0; i < n; i++) {
        int h = mm_shmem_host_of(mm_shmem_team_world_pe(c->team, i)), seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = mm_shmem_host_of(mm_shmem_team_world_pe(c->team, j)) == h;
        hosts += !seen;
    }
    return hosts;
}

int megamoe_comm_host_of(const megamoe_comm_t *c, int i)
{
    if (!mm_comm_valid(c) || c->team == NULL) return -1;
    return mm_shmem_host_of(mm_shmem_team_world_pe(c->team, i));
}

int megamoe_comm_rank(const megamoe_comm_t *c)
{
    return mm_comm_valid(c) && c->team ? mm_shmem_team_my_pe(c->team) : -1;
}

int megamoe_comm_size(const megamoe_comm_t *c)
{
    return mm_comm_valid(c) && c->team ? mm_shmem_team_n_pes(c->team) : -1;
}

megamoe_status_t megamoe_comm_barrier(megamoe_comm_t *c)
{
    if (!mm_comm_valid(c) || c->team == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_barrier: invalid communicator");
    return mm_shmem_team_barrier(c->team);
}

megamoe_status_t megamoe_comm_destroy(megamoe_comm_t *c)
{
    if (c == NULL) return MEGAMOE_OK;
    if (!mm_comm_valid(c))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_destroy: not a communicator "
                        "(destroyed twice?)");
    megamoe_status_t st = MEGAMOE_OK;
    if (c->owns_team && c->team) {
        st = mm_shmem_team_destroy(c->team); /* frees the team even when the barrier fails */
        c->team = NULL;
    }
    int before = mm_shmem_refcount();
    megamoe_status_t rs = mm_shmem_release();
    if (rs != MEGAMOE_OK && mm_shmem_refcount() == before && before > 0)
        return rs; /* the last release refused (objects alive): keep the handle for a retry */
    c->magic = 0;
    free(c);
    return st != MEGAMOE_OK ? st : rs;
}

int megamoe_comm_rank_alive(const megamoe_comm_t *c, int i)
{
    int pe = megamoe_comm_world_rank(c, i);
    return pe >= 0 && mm_shmem_pe_alive(pe);
}

megamoe_status_t megamoe_comm_survivors(megamoe_comm_t *c, megamoe_comm_t **out)
{
    if (!mm_comm_valid(c) || c->team == NULL || out == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_comm_survivors: invalid communicator or "
                        "NULL survivors_p");
    MM_CHECK(mm_shmem_recover());
    int n = mm_shmem_team_n_pes(c->team), k = 0;
    int *pes = malloc(sizeof(int) * (size_t)n);
    if (pes == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_survivors: out of memory");
    for (int i = 0; i < n; i++) {
        int pe = mm_shmem_team_world_pe(c->team, i);
        if (mm_shmem_pe_alive(pe)) pes[k++] = pe;
    }
    megamoe_status_t st = mm_shmem_acquire(NULL);
    megamoe_comm_t *s = st == MEGAMOE_OK ? calloc(1, sizeof *s) : NULL;
    if (st == MEGAMOE_OK && s == NULL)
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_comm_survivors: out of memory");
    mm_shmem_team_t *team = NULL;
    /* keyed by the communicator it comes from (its members, in order): not confused with
     * another team of the same survivors a peer may be creating at this point */
    uint64_t key = 0x5355525669564f52ull; /* "SURVIVOR" */
    for (int i = 0; i < n; i++)
        key = (key ^ (uint64_t)(uint32_t)mm_shmem_team_world_pe(c->team, i)) * 1099511628211ull;
    if (st == MEGAMOE_OK) st = mm_shmem_team_create_keyed(pes, k, key, &team);
    free(pes);
    if (st != MEGAMOE_OK) {
        if (s) {
            free(s);
            mm_shmem_release();
        }
        return st;
    }
    s->magic = MM_COMM_MAGIC;
    s->team = team;
    s->owns_team = 1;
    *out = s;
    return MEGAMOE_OK;
}
