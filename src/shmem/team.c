/* Teams and their collectives over the heap: barrier, allgather, broadcast, agree, split.
 *
 * Every team owns one slot of the reserve on each member PE (the world team slot 0). The
 * barrier is a dissemination barrier: in round k a member stores the team's barrier
 * generation into line k of member (me + 2^k) mod n and waits until its own line k reaches
 * the generation. Generations only grow, so nothing is reset between barriers, and a fast
 * member already at generation g+1 satisfies a slow one waiting for g (>=). The collectives
 * copy into the member's own outbox, run a barrier, then read the other members' outboxes
 * directly; two outboxes used alternately mean that the next collective's barrier separates
 * the reads of call k from the overwrite by call k+2, so one barrier per call suffices.
 * That holds only while barriers complete: a member whose barrier failed (a lost peer, a
 * timeout) may not write its outbox again, since a slow member may still be reading the
 * outbox of the call before (seen: its route counts overwritten by a later call of a member
 * that had already seen the loss). So a failed barrier ends the team: every later collective
 * on it fails at once, before touching any shared memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "shmem_internal.h"
#include "survive.h"

static megamoe_status_t mm_team_handle_check(const mm_shmem_team_t *t, const char *op)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running(op);
    if (t == NULL || t->magic != MM_SHMEM_TEAM_MAGIC)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: not a live team handle (destroyed, or "
                        "from an earlier SHMEM lifecycle)", op);
    return MEGAMOE_OK;
}

static int mm_team_pe(const mm_shmem_team_t *t, int i);

int mm_shmem_team_lost_member(const mm_shmem_team_t *t)
{
    for (int i = 0; i < t->n; i++)
        if (mm_surv_retired(mm_team_pe(t, i))) return mm_team_pe(t, i);
    return -1;
}

/* A collective may start on t: every loss known here is acknowledged first (survive.h: this
 * waits for the survivors' agreement), and t has no lost member. */
static megamoe_status_t mm_team_check(const mm_shmem_team_t *t, const char *op)
{
    MM_CHECK(mm_team_handle_check(t, op));
    MM_CHECK(mm_surv_recover(op));
    int q = mm_shmem_team_lost_member(t);
    if (q < 0) return MEGAMOE_OK;
    return mm_error(MEGAMOE_PEER_LOST, "%s: rank %d of this team was lost; the team cannot be "
                    "used any more: destroy it (frees of what was allocated on it are local "
                    "now) and go on with a team of the survivors (megamoe_comm_survivors)", op, q);
}

/* Slots of teams that ended without their final barrier (a lost member, a failed collective):
 * a member that has not noticed yet may still write into this PE's lines, so the slot is
 * zeroed and kept out of use until every survivor is past that (several peer timeouts). */
static uint64_t mm_team_quarantine[MM_SHMEM_MAX_TEAMS];

static void mm_team_zero_lines(int slot) /* barrier lines and push arrival words */
{
    memset(mm_shmem_slot_line(mm_shmem_g.my_base, slot, 0), 0, MM_SHMEM_SLOT_WORDS);
}

static void mm_team_quarantine_expire(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    uint64_t now = mm_now_ns();
    for (int s = 1; s < MM_SHMEM_MAX_TEAMS; s++) {
        if (mm_team_quarantine[s] == 0 || now < mm_team_quarantine[s]) continue;
        mm_team_zero_lines(s);
        mm_team_quarantine[s] = 0;
        g->slots_used &= ~(1ull << s);
    }
}

static atomic_ullong mm_team_uids;

uint64_t mm_shmem_team_next_uid(void) { return atomic_fetch_add(&mm_team_uids, 1) + 1; }

uint64_t mm_shmem_team_uid(const mm_shmem_team_t *t)
{
    return t && t->magic == MM_SHMEM_TEAM_MAGIC ? t->uid : 0;
}

void mm_shmem_team_world_init(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    free(g->world.agree_buf); /* the previous lifecycle's */
    free(g->world.push_buf);
    g->world = (struct mm_shmem_team){.magic = MM_SHMEM_TEAM_MAGIC,
                                      .n = g->n_pes,
                                      .me = g->my_pe,
                                      .slot = 0,
                                      .is_world = 1,
                                      .uid = mm_shmem_team_next_uid()};
    g->teams = NULL;
    g->slots_used = 1;
    memset(mm_team_quarantine, 0, sizeof mm_team_quarantine);
}

void mm_shmem_team_drop_all(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    while (g->teams) {
        struct mm_shmem_team *t = g->teams;
        g->teams = t->next;
        t->magic = 0;
        free(t->pes);
        free(t->agree_buf);
        free(t->push_buf);
        free(t);
    }
    g->world.magic = 0;
    free(g->world.agree_buf);
    g->world.agree_buf = NULL;
    free(g->world.push_buf);
    g->world.push_buf = NULL;
    g->slots_used = 0;
}

int mm_shmem_team_live_count(void)
{
    int n = 0;
    for (struct mm_shmem_team *t = mm_shmem_g.teams; t; t = t->next) n++;
    return n;
}

mm_shmem_team_t *mm_shmem_team_world(void)
{
    return mm_shmem_running_now() ? &mm_shmem_g.world : NULL;
}

static int mm_team_pe(const mm_shmem_team_t *t, int i) { return t->is_world ? i : t->pes[i]; }

int mm_shmem_team_my_pe(const mm_shmem_team_t *t)
{
    return t && t->magic == MM_SHMEM_TEAM_MAGIC ? t->me : -1;
}

int mm_shmem_team_n_pes(const mm_shmem_team_t *t)
{
    return t && t->magic == MM_SHMEM_TEAM_MAGIC ? t->n : -1;
}

int mm_shmem_team_world_pe(const mm_shmem_team_t *t, int i)
{
    if (!t || t->magic != MM_SHMEM_TEAM_MAGIC || i < 0 || i >= t->n) return -1;
    return mm_team_pe(t, i);
}

/* The error of a collective on a team whose barrier failed before: the lost peer when there
 * is one (the root cause), else the earlier failure's status. */
static megamoe_status_t mm_team_failed(const mm_shmem_team_t *t, const char *what)
{
    megamoe_status_t st = mm_shmem_check_peers(what);
    if (st != MEGAMOE_OK) return st;
    return mm_error(t->failed, "%s: an earlier collective of this team did not complete (%s), so "
                    "its members are out of step: destroy the team and create a new one (or "
                    "release SHMEM and restart every rank)", what, megamoe_status_name(t->failed));
}

/* ---- push collectives (teams that span hosts) ----
 *
 * Across hosts the dissemination barrier costs a quiet (a round trip when data is in flight)
 * and log2(n) one-way latencies, and an allgather after it a blocking get of every remote
 * member's outbox (a round trip each). In push mode every member sends every other member one
 * message (a put-with-signal): an entry in the receiver's inbox of the call's parity (a header,
 * and the contribution itself when it fits the entry, MM_SHMEM_COLL_CHUNK / n bytes), then its
 * arrival word in the slot's sync area; then it waits for the n - 1 words of its own inbox. A
 * contribution too large for an entry is read from the sender's outbox as in the pull scheme
 * (the entry says so). Every pair of members exchanges a message that arrives after everything
 * its sender put to the receiver before (the engine applies a PE's messages in issue order;
 * mapped stores are ordered by the release of the word), so a member leaving sees every put any
 * member did to it before entering: the barrier's guarantee, in one one-way latency and no
 * round trip. An arrival word holds its sender's count of push rounds, so an earlier round's
 * word never satisfies a later wait, and a later one proves the earlier message applied; the
 * inboxes alternate like the outboxes (file comment), since every round needs every member's
 * arrival. A member in another collective (a bug the call-order layer reports) leaves an entry
 * of another size or none: the reader takes what matches and zeros for the rest, the same
 * bytes-of-a-foreign-record view the pull scheme gives. Used, by every member alike, when the
 * team has members on another host and at most MM_SHMEM_PUSH_MAX members. */
typedef struct mm_push_head {
    uint64_t gen;   /* the sender's push round */
    uint64_t bytes; /* its contribution; the data follows when it fits the entry */
} mm_push_head_t;

static int mm_team_push_mode(const mm_shmem_team_t *t)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->engine == NULL || t->n > MM_SHMEM_PUSH_MAX) return 0;
    for (int i = 0; i < t->n; i++)
        if (g->remote[mm_team_pe(t, i)]) return 1;
    return 0;
}

/* One round: nbytes <= MM_SHMEM_COLL_CHUNK per member into dest + member * stride (dest NULL
 * and nbytes 0: a barrier). */
static megamoe_status_t mm_team_push(mm_shmem_team_t *t, void *dest, size_t stride,
                                     const void *src, size_t nbytes, const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    megamoe_status_t st = mm_shmem_check_peers(what);
    if (st != MEGAMOE_OK) {
        t->failed = st;
        return st;
    }
    /* a barrier (no data) uses no box, so it leaves the parity alone: the pull scheme's
     * chunks rely on it alternating between their own calls */
    const uint64_t parity = nbytes ? t->coll_gen++ : 0, gen = ++t->push_gen;
    const size_t entry = (MM_SHMEM_COLL_CHUNK / (size_t)t->n) & ~(size_t)63;
    const int fits = sizeof(mm_push_head_t) + nbytes <= entry;
    const uint64_t inbox = mm_shmem_slot_inbox_off(t->slot, parity);
    const uint64_t word = mm_shmem_slot_push_off(t->slot, t->me);
    if (nbytes && !fits) /* readers fetch it from here */
        memcpy(mm_shmem_slot_outbox(g->my_base, t->slot, parity), src, nbytes);
    if (nbytes && t->push_buf == NULL && (t->push_buf = malloc(MM_SHMEM_COLL_CHUNK)) == NULL) {
        t->failed = mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: out of memory", what);
        return t->failed;
    }
    char *msg = t->push_buf;
    if (nbytes) {
        mm_push_head_t h = {gen, nbytes};
        memcpy(msg, &h, sizeof h);
        if (fits) memcpy(msg + sizeof h, src, nbytes);
    }
    const size_t msg_bytes = !nbytes ? 0 : fits ? sizeof(mm_push_head_t) + nbytes
                                                : sizeof(mm_push_head_t);
    for (int i = 1; i < t->n && st == MEGAMOE_OK; i++) {
        int pe = mm_team_pe(t, (t->me + i) % t->n); /* rotated: not everyone to member 0 first */
        st = mm_shmem_seg_put_signal(pe, inbox + (uint64_t)t->me * entry, msg, msg_bytes, word,
                                     gen, MM_ENGINE_SET | MM_ENGINE_NO_QUIET);
    }
    if (st == MEGAMOE_OK && nbytes) memmove((char *)dest + (size_t)t->me * stride, src, nbytes);
    for (int i = 1; i < t->n && st == MEGAMOE_OK; i++) {
        int j = (t->me + t->n - i) % t->n;
        uint64_t *w = (uint64_t *)(void *)(g->my_base + mm_shmem_slot_push_off(t->slot, j));
        st = mm_shmem_wait_impl(w, MM_SHMEM_CMP_GE, gen, NULL, what);
        if (st != MEGAMOE_OK || nbytes == 0) continue;
        const char *e = g->my_base + inbox + (uint64_t)j * entry;
        mm_push_head_t h;
        memcpy(&h, e, sizeof h);
        char *out = (char *)dest + (size_t)j * stride;
        size_t take = h.gen == gen ? (h.bytes < nbytes ? (size_t)h.bytes : nbytes) : 0;
        if (take && sizeof h + h.bytes <= entry) memcpy(out, e + sizeof h, take);
        else if (take)
            st = mm_shmem_seg_read(mm_team_pe(t, j), mm_shmem_slot_outbox_off(t->slot, parity), out,
                                   take);
        memset(out + take, 0, nbytes - take);
    }
    if (st != MEGAMOE_OK) t->failed = st; /* the members are out of step now */
    return st;
}

static megamoe_status_t mm_team_barrier_raw(mm_shmem_team_t *t, const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (t->failed != MEGAMOE_OK) return mm_team_failed(t, what);
    if (mm_team_push_mode(t)) return mm_team_push(t, NULL, 0, NULL, 0, what);
    /* after a loss every collective fails at once (the quiet below could wait for the
     * lost PE) */
    megamoe_status_t st = mm_shmem_check_peers(what);
    if (st == MEGAMOE_OK) st = mm_shmem_quiet(); /* barriers imply quiet */
    if (st != MEGAMOE_OK) {
        t->failed = st;
        return st;
    }
    uint64_t gen = ++t->bar_gen;
    for (int k = 0, d = 1; d < t->n; k++, d <<= 1) {
        int to = mm_team_pe(t, (t->me + d) % t->n);
        st = mm_shmem_word_op(to, mm_shmem_slot_line_off(t->slot, k), gen,
                              MM_ENGINE_SET | MM_ENGINE_NO_QUIET);
        if (st == MEGAMOE_OK)
            st = mm_shmem_wait_impl(mm_shmem_slot_line(g->my_base, t->slot, k), MM_SHMEM_CMP_GE,
                                    gen, NULL, what);
        if (st != MEGAMOE_OK) {
            t->failed = st;
            return st;
        }
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_team_barrier(mm_shmem_team_t *t)
{
    MM_CHECK(mm_team_check(t, "mm_shmem_team_barrier"));
    return mm_team_barrier_raw(t, "team barrier");
}

megamoe_status_t mm_shmem_barrier_all(void)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_barrier_all");
    MM_CHECK(mm_team_check(&mm_shmem_g.world, "mm_shmem_barrier_all"));
    return mm_team_barrier_raw(&mm_shmem_g.world, "barrier");
}

/* Allgather in chunks of at most one outbox (in place is fine: src may lie in dest). */
static megamoe_status_t mm_team_allgather_raw(mm_shmem_team_t *t, void *dest, const void *src,
                                              size_t nbytes, const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (t->failed != MEGAMOE_OK) return mm_team_failed(t, what); /* before the outbox write */
    if (nbytes == 0) return mm_team_barrier_raw(t, what);
    const int push = mm_team_push_mode(t);
    for (size_t done = 0; done < nbytes; done += MM_SHMEM_COLL_CHUNK) {
        size_t chunk = nbytes - done < MM_SHMEM_COLL_CHUNK ? nbytes - done : MM_SHMEM_COLL_CHUNK;
        if (push) {
            MM_CHECK(mm_team_push(t, (char *)dest + done, nbytes, (const char *)src + done, chunk,
                                  what));
            continue;
        }
        uint64_t parity = t->coll_gen++;
        memcpy(mm_shmem_slot_outbox(g->my_base, t->slot, parity), (const char *)src + done, chunk);
        MM_CHECK(mm_team_barrier_raw(t, what));
        for (int i = 0; i < t->n; i++) {
            megamoe_status_t st = mm_shmem_seg_read(mm_team_pe(t, i),
                                                    mm_shmem_slot_outbox_off(t->slot, parity),
                                                    (char *)dest + (size_t)i * nbytes + done,
                                                    chunk);
            if (st != MEGAMOE_OK) {
                t->failed = st; /* the members are out of step now */
                return st;
            }
        }
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_team_allgather(mm_shmem_team_t *t, void *dest, const void *src,
                                         size_t nbytes)
{
    MM_CHECK(mm_team_check(t, "mm_shmem_team_allgather"));
    if (nbytes && (!dest || !src))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_allgather: NULL buffer");
    return mm_team_allgather_raw(t, dest, src, nbytes, "team allgather");
}

megamoe_status_t mm_shmem_team_broadcast(mm_shmem_team_t *t, void *buf, size_t nbytes, int root)
{
    MM_CHECK(mm_team_check(t, "mm_shmem_team_broadcast"));
    if (root < 0 || root >= t->n)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_broadcast: root %d is not in "
                        "[0, %d)", root, t->n);
    if (nbytes && !buf)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_broadcast: NULL buffer");
    mm_shmem_global_t *g = &mm_shmem_g;
    if (t->failed != MEGAMOE_OK) return mm_team_failed(t, "team broadcast");
    if (nbytes == 0) return mm_team_barrier_raw(t, "team broadcast");
    for (size_t done = 0; done < nbytes; done += MM_SHMEM_COLL_CHUNK) {
        size_t chunk = nbytes - done < MM_SHMEM_COLL_CHUNK ? nbytes - done : MM_SHMEM_COLL_CHUNK;
        uint64_t parity = t->coll_gen++;
        if (t->me == root)
            memcpy(mm_shmem_slot_outbox(g->my_base, t->slot, parity), (char *)buf + done, chunk);
        MM_CHECK(mm_team_barrier_raw(t, "team broadcast"));
        if (t->me != root) {
            megamoe_status_t st = mm_shmem_seg_read(mm_team_pe(t, root),
                                                    mm_shmem_slot_outbox_off(t->slot, parity),
                                                    (char *)buf + done, chunk);
            if (st != MEGAMOE_OK) {
                t->failed = st;
                return st;
            }
        }
    }
    return MEGAMOE_OK;
}

#define MM_AGREE_TEXT 500
typedef struct mm_agree_entry {
    int32_t status;
    char text[MM_AGREE_TEXT];
} mm_agree_entry_t;

megamoe_status_t mm_shmem_team_agree(mm_shmem_team_t *t, megamoe_status_t local)
{
    MM_CHECK(mm_team_check(t, "mm_shmem_team_agree"));
    mm_agree_entry_t mine;
    memset(&mine, 0, sizeof mine);
    mine.status = local;
    if (local != MEGAMOE_OK) snprintf(mine.text, sizeof mine.text, "%s", megamoe_last_error());
    /* the team's own buffer: collectives of one team run one at a time */
    if (t->agree_buf == NULL) t->agree_buf = malloc(sizeof mine * (size_t)t->n);
    mm_agree_entry_t *all = t->agree_buf;
    if (all == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_agree: out of memory");
    megamoe_status_t st = mm_team_allgather_raw(t, all, &mine, sizeof mine, "team agree");
    if (st == MEGAMOE_OK) {
        for (int i = 0; i < t->n; i++) {
            if (all[i].status == MEGAMOE_OK) continue;
            char text[MM_AGREE_TEXT + 32];
            all[i].text[MM_AGREE_TEXT - 1] = '\0';
            snprintf(text, sizeof text, "rank %d: %s", mm_team_pe(t, i), all[i].text);
            if (i != t->me) MM_LOG(MEGAMOE_LOG_ERROR, "%s", text);
            mm_set_last_error(text);
            st = (megamoe_status_t)all[i].status;
            break;
        }
    }
    return st;
}

typedef struct mm_split_entry {
    int32_t color, key;
    uint64_t slots_used;
} mm_split_entry_t;

/* Members of color c in new-team order (key, then parent rank); returns the count. */
static int mm_split_members(const mm_split_entry_t *e, int n, int32_t c, int *out)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].color != c) continue;
        int j = k++;
        /* insertion sort: stable, so equal keys keep parent order */
        while (j > 0 && e[out[j - 1]].key > e[i].key) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
    return k;
}

megamoe_status_t mm_shmem_team_split(mm_shmem_team_t *parent, int color, int key,
                                     mm_shmem_team_t **team_p)
{
    MM_CHECK(mm_team_check(parent, "mm_shmem_team_split"));
    if (team_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_split: team_p is NULL");
    mm_shmem_global_t *g = &mm_shmem_g;
    int n = parent->n;
    mm_team_quarantine_expire();
    mm_split_entry_t mine = {color < 0 ? -1 : color, key, g->slots_used};
    mm_split_entry_t *all = malloc(sizeof mine * (size_t)n);
    int *members = malloc(sizeof(int) * (size_t)n);
    int *slot_of = malloc(sizeof(int) * (size_t)n);
    if (!all || !members || !slot_of) {
        free(all), free(members), free(slot_of);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_split: out of memory");
    }
    megamoe_status_t st = mm_team_allgather_raw(parent, all, &mine, sizeof mine, "team split");
    /* Every member decides every new team the same way, so failures are identical too. */
    for (int i = 0; i < n; i++) slot_of[i] = -1;
    for (int i = 0; i < n && st == MEGAMOE_OK; i++) {
        if (all[i].color < 0) continue;
        int first = 1;
        for (int j = 0; j < i; j++)
            if (all[j].color == all[i].color) first = 0;
        if (!first) continue;
        int k = mm_split_members(all, n, all[i].color, members);
        uint64_t used = 0;
        for (int m = 0; m < k; m++) used |= all[members[m]].slots_used;
        int slot = -1;
        for (int s = 1; s < MM_SHMEM_MAX_TEAMS; s++)
            if (!(used >> s & 1)) {
                slot = s;
                break;
            }
        if (slot < 0)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_split: no free team slot for "
                          "color %d (at most %d live teams per PE, world included); destroy "
                          "unused teams", all[i].color, MM_SHMEM_MAX_TEAMS);
        for (int m = 0; m < k; m++) slot_of[members[m]] = slot;
    }
    struct mm_shmem_team *t = NULL;
    if (st == MEGAMOE_OK && mine.color >= 0) {
        int k = mm_split_members(all, n, mine.color, members);
        t = calloc(1, sizeof *t);
        int *pes = malloc(sizeof(int) * (size_t)k);
        if (!t || !pes) {
            free(t), free(pes);
            t = NULL;
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_split: out of memory");
        } else {
            t->magic = MM_SHMEM_TEAM_MAGIC;
            t->uid = mm_shmem_team_next_uid();
            t->n = k;
            t->slot = slot_of[parent->me];
            t->pes = pes;
            for (int m = 0; m < k; m++) {
                pes[m] = mm_team_pe(parent, members[m]);
                if (members[m] == parent->me) t->me = m;
            }
            /* Nobody writes this slot before the barrier below, so plain zeroing is safe. */
            memset(mm_shmem_slot_line(g->my_base, t->slot, 0), 0, MM_SHMEM_SLOT_WORDS);
            g->slots_used |= 1ull << t->slot;
            t->next = g->teams;
            g->teams = t;
        }
    }
    free(all), free(members), free(slot_of);
    /* A local allocation failure must not leave the others waiting: agree, then sync. */
    if (st == MEGAMOE_OK || st == MEGAMOE_OUT_OF_MEMORY) {
        megamoe_status_t agreed = mm_shmem_team_agree(parent, st);
        if (agreed != MEGAMOE_OK) st = agreed;
    }
    if (st != MEGAMOE_OK) {
        if (t) mm_shmem_team_destroy_local(t);
        return st;
    }
    MM_SHMEM_DEBUG("team split: color %d key %d -> %d of %d (slot %d)", color, key,
                   t ? t->me : -1, t ? t->n : 0, t ? t->slot : -1);
    *team_p = t;
    return MEGAMOE_OK;
}

/* Forget t here; quarantine: keep its slot out of use for a while (file comment). */
static void mm_team_forget(mm_shmem_team_t *t, int quarantine)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    for (struct mm_shmem_team **p = &g->teams; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    if (quarantine) {
        uint64_t hold = 2 * mm_surv_peer_timeout_ns();
        if (hold < 2000000000ull) hold = 2000000000ull;
        mm_team_zero_lines(t->slot);
        mm_team_quarantine[t->slot] = mm_now_ns() + hold;
    } else {
        g->slots_used &= ~(1ull << t->slot);
    }
    t->magic = 0;
    free(t->pes);
    free(t->agree_buf);
    free(t->push_buf);
    free(t);
}

void mm_shmem_team_destroy_local(mm_shmem_team_t *t) { mm_team_forget(t, 0); }

#define MM_TEAM_MAX_HOOKS 8
typedef struct mm_team_hook {
    mm_shmem_team_hook_t fn;
    void *arg;
} mm_team_hook_t;
static mm_team_hook_t mm_team_hooks[MM_TEAM_MAX_HOOKS];
static int mm_team_hook_count;
static pthread_mutex_t mm_team_hook_lock = PTHREAD_MUTEX_INITIALIZER;

megamoe_status_t mm_shmem_add_team_destroy_hook(mm_shmem_team_hook_t fn, void *arg)
{
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&mm_team_hook_lock);
    int found = 0;
    for (int i = 0; i < mm_team_hook_count; i++)
        found |= mm_team_hooks[i].fn == fn && mm_team_hooks[i].arg == arg;
    if (!found && mm_team_hook_count == MM_TEAM_MAX_HOOKS)
        st = mm_error(MEGAMOE_INVALID_STATE, "mm_shmem_add_team_destroy_hook: all %d slots are "
                      "used", MM_TEAM_MAX_HOOKS);
    else if (!found)
        mm_team_hooks[mm_team_hook_count++] = (mm_team_hook_t){fn, arg};
    pthread_mutex_unlock(&mm_team_hook_lock);
    return st;
}

megamoe_status_t mm_shmem_team_destroy(mm_shmem_team_t *t)
{
    MM_CHECK(mm_team_handle_check(t, "mm_shmem_team_destroy"));
    if (t->is_world)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_destroy: the world team lives "
                        "as long as the runtime");
    pthread_mutex_lock(&mm_team_hook_lock);
    int nh = mm_team_hook_count;
    mm_team_hook_t hooks[MM_TEAM_MAX_HOOKS];
    memcpy(hooks, mm_team_hooks, sizeof hooks);
    pthread_mutex_unlock(&mm_team_hook_lock);
    for (int i = 0; i < nh; i++) hooks[i].fn(t, hooks[i].arg); /* failures: the check below */
    /* Allocations of a team keep its slot as their owner: refuse while any live (the members
     * hold the same ones, but agree so that the verdict is the same everywhere). */
    int live = mm_shmem_team_live_allocations(t);
    megamoe_status_t own = MEGAMOE_OK;
    if (live > 0)
        own = mm_error(MEGAMOE_INVALID_STATE, "mm_shmem_team_destroy: the team still owns %d "
                       "symmetric allocation(s); free them (mm_shmem_team_free) first", live);
    /* A team with a lost member (or on a rank that stopped) ends here alone: nobody else
     * can take part in its last collective. */
    (void)mm_surv_recover("mm_shmem_team_destroy"); /* so the lost members are known */
    if (mm_surv_stopped() || mm_shmem_team_lost_member(t) >= 0) {
        if (own != MEGAMOE_OK) return own; /* free them (locally) and destroy again */
        mm_team_forget(t, 1);
        return MEGAMOE_OK;
    }
    megamoe_status_t st = t->failed != MEGAMOE_OK ? MEGAMOE_OK : mm_shmem_team_agree(t, own);
    if (st == MEGAMOE_INVALID_STATE) return st; /* the team stays */
    /* After this barrier no member writes into this PE's slot or reads its outboxes. */
    if (st == MEGAMOE_OK) st = mm_team_barrier_raw(t, "team destroy");
    if (st == MEGAMOE_OK) /* a later team taking the slot starts from zero lines */
        mm_team_zero_lines(t->slot);
    mm_team_forget(t, st != MEGAMOE_OK);
    return st;
}

/* ---- a team among a subset, without the rest of the world (mailbox.c) ---- */

typedef struct mm_create_msg {
    uint64_t list_hash, slots_used, n, key;
    uint8_t pad[MM_SHMEM_MAIL_PAYLOAD - 32];
} mm_create_msg_t;

_Static_assert(sizeof(mm_create_msg_t) == MM_SHMEM_MAIL_PAYLOAD, "one mailbox payload");

static uint64_t mm_list_hash(const int *pes, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the member list */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint64_t)(((unsigned)pes[i] >> (8 * b)) & 0xffu);
            h *= 1099511628211ull;
        }
    return h ^ (uint64_t)n;
}

megamoe_status_t mm_shmem_team_create(const int *world_pes, int n, mm_shmem_team_t **team_p)
{
    return mm_shmem_team_create_keyed(world_pes, n, 0, team_p);
}

megamoe_status_t mm_shmem_team_create_keyed(const int *world_pes, int n, uint64_t key,
                                            mm_shmem_team_t **team_p)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_team_create");
    mm_shmem_global_t *g = &mm_shmem_g;
    if (team_p == NULL || world_pes == NULL || n < 1 || n > g->n_pes)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_create: need a list of 1..%d "
                        "world ranks and a result pointer", g->n_pes);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (world_pes[i] < 0 || world_pes[i] >= g->n_pes)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_create: member %d is world "
                            "rank %d, not in [0, %d)", i, world_pes[i], g->n_pes);
        for (int j = 0; j < i; j++)
            if (world_pes[j] == world_pes[i])
                return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_create: world rank %d "
                                "is listed twice", world_pes[i]);
        if (world_pes[i] == g->my_pe) me = i;
    }
    if (me < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_create: the calling rank %d is "
                        "not in the member list (only members call it)", g->my_pe);
    MM_CHECK(mm_surv_recover("mm_shmem_team_create"));
    for (int i = 0; i < n; i++)
        if (mm_surv_kind(world_pes[i]) != MM_LOSS_NONE)
            return mm_error(MEGAMOE_PEER_LOST, "mm_shmem_team_create: world rank %d in the member "
                            "list was lost; list the survivors only", world_pes[i]);
    mm_team_quarantine_expire();
    mm_create_msg_t mine, *all = malloc(sizeof mine * (size_t)n);
    struct mm_shmem_team *t = calloc(1, sizeof *t);
    int *pes = malloc(sizeof(int) * (size_t)n);
    if (!all || !t || !pes) {
        free(all), free(t), free(pes);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_create: out of memory");
    }
    memset(&mine, 0, sizeof mine);
    mine.list_hash = mm_list_hash(world_pes, n);
    mine.slots_used = g->slots_used;
    mine.n = (uint64_t)n;
    mine.key = key;
    megamoe_status_t st = mm_shmem_mail_exchange(world_pes, n, me, &mine, all, "team creation");
    /* every member decides from the same messages (any two that differ: each member received
     * the message of one that differs from its own) */
    for (int i = 0; i < n && st == MEGAMOE_OK; i++)
        if (all[i].list_hash != mine.list_hash || all[i].n != mine.n)
            st = mm_error(MEGAMOE_CONFIG_MISMATCH, "mm_shmem_team_create: world rank %d passed "
                          "a different member list than world rank %d; every member must list "
                          "the same ranks in the same order", world_pes[i], world_pes[0]);
        else if (all[i].key != key)
            st = mm_error(mm_surv_any_lost() ? MEGAMOE_PEER_LOST : MEGAMOE_CONFIG_MISMATCH,
                          "mm_shmem_team_create: world rank %d creates a team of the same ranks "
                          "for another purpose (key %#llx, here %#llx)%s", world_pes[i],
                          (unsigned long long)all[i].key, (unsigned long long)key,
                          mm_surv_any_lost() ? ": after a loss the survivors were at different "
                                               "calls; this call fails, the next one realigns"
                                             : "; every member must create its teams in the "
                                               "same order");
    int slot = -1;
    if (st == MEGAMOE_OK) {
        uint64_t used = 0;
        for (int i = 0; i < n; i++) used |= all[i].slots_used;
        for (int s = 1; s < MM_SHMEM_MAX_TEAMS && slot < 0; s++)
            if (!(used >> s & 1)) slot = s;
        if (slot < 0)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_team_create: no team slot free on "
                          "every member (at most %d live teams per rank, world included); "
                          "destroy unused teams", MM_SHMEM_MAX_TEAMS);
    }
    free(all);
    if (st != MEGAMOE_OK) {
        free(t), free(pes);
        return st;
    }
    memcpy(pes, world_pes, sizeof(int) * (size_t)n);
    t->magic = MM_SHMEM_TEAM_MAGIC;
    t->uid = mm_shmem_team_next_uid();
    t->n = n;
    t->me = me;
    t->slot = slot;
    t->pes = pes;
    g->slots_used |= 1ull << slot;
    t->next = g->teams;
    g->teams = t;
    MM_SHMEM_DEBUG("team create: %d members, this rank %d (slot %d)", n, me, slot);
    *team_p = t;
    return MEGAMOE_OK;
}
