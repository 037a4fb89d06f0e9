/* The call-order check: descriptor records, their exchange, the decisions, sequence numbers
 * (see call_order.h). */
#include "ops/call_order.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/freelist.h"

#define MM_CALL_MAGIC 0xc411de5c0de0beefull
#define MM_CALL_TEXT 512
/* Records up to this size go in one allgather with the payload (one barrier, whatever the
 * peers' call is); a larger payload follows in a second allgather once the calls agreed. */
#define MM_CALL_INLINE ((size_t)16 << 10)
#define MM_CALL_NOTICE 300

/* Gathered records and payloads of calls that ended, handed out again to the next call. */
static mm_freelist_t mm_call_blocks = MM_FREELIST_INIT;

/* One member's record. Its first bytes are laid out like an mm_shmem_team_agree entry (an
 * int32 status, then text): a peer that is in a plain agree while we are here reads
 * CALL_MISMATCH and the text naming our call. */
typedef struct mm_call_wire {
    int32_t notice;                   /* MEGAMOE_CALL_MISMATCH, always */
    char notice_text[MM_CALL_NOTICE]; /* NUL-terminated inside an agree entry's text */
    uint64_t magic;
    int32_t kind, status;
    uint64_t group, object, seq, digest, aux, payload_bytes;
    char what[MM_CALL_WHAT];
    /* a failing member's message follows in a second allgather, made only when some status
     * is not OK (so the common record stays small) */
} mm_call_wire_t;
_Static_assert(sizeof(mm_call_wire_t) % 8 == 0, "payload alignment");

/* A record from a member in this exchange: both marks. A member in another collective wrote
 * something else over (part of) its outbox: an agree entry (status, text over the magic), a
 * symmetric allocation's or a split's record (its first word is a counter or a colour), so at
 * least one mark fails even where the rest of the outbox still holds an older record of ours. */
static int mm_call_valid(const mm_call_wire_t *r)
{
    return r->notice == MEGAMOE_CALL_MISMATCH && r->magic == MM_CALL_MAGIC;
}

static const char *const mm_call_kind_names[MM_CALL_KIND_COUNT] = {
    "(no call)",
#define MM_CALL_KIND_NAME_(name, text) text,
    MM_CALL_KINDS(MM_CALL_KIND_NAME_)
#undef MM_CALL_KIND_NAME_
};

const char *mm_call_kind_name(int kind)
{
    return kind > 0 && kind < MM_CALL_KIND_COUNT ? mm_call_kind_names[kind] : "(unknown call)";
}

/* ---- registry ------------------------------------------------------------------------- */

static pthread_mutex_t mm_call_lock = PTHREAD_MUTEX_INITIALIZER;
mm_call_group_t mm_call_operators = {MM_CALL_GROUP_OPERATORS, 0, NULL, NULL, 1};
static mm_call_group_t *mm_call_groups = &mm_call_operators;

/* Numbers seen in records for groups not registered here (yet): a group created later on
 * this rank — an operator scope made by the first operator call of THIS rank, while its peers
 * called one already — starts from the number its peers used. Bounded; oldest forgotten. */
#define MM_CALL_SEEN 64
static struct {
    uint64_t id, calls;
} mm_call_seen[MM_CALL_SEEN];
static unsigned mm_call_seen_next;

static void mm_call_seen_note(uint64_t id, uint64_t calls) /* lock held */
{
    for (int i = 0; i < MM_CALL_SEEN; i++)
        if (mm_call_seen[i].id == id) {
            if (mm_call_seen[i].calls < calls) mm_call_seen[i].calls = calls;
            return;
        }
    mm_call_seen[mm_call_seen_next % MM_CALL_SEEN].id = id;
    mm_call_seen[mm_call_seen_next % MM_CALL_SEEN].calls = calls;
    mm_call_seen_next++;
}

void mm_call_group_register(mm_call_group_t *g)
{
    pthread_mutex_lock(&mm_call_lock);
    if (!g->registered) {
        g->next = mm_call_groups;
        mm_call_groups = g;
        g->registered = 1;
        for (int i = 0; i < MM_CALL_SEEN; i++)
            if (mm_call_seen[i].id == g->id && g->calls < mm_call_seen[i].calls)
                g->calls = mm_call_seen[i].calls;
    }
    pthread_mutex_unlock(&mm_call_lock);
}

void mm_call_forget_seen(void)
{
    pthread_mutex_lock(&mm_call_lock);
    memset(mm_call_seen, 0, sizeof mm_call_seen);
    mm_call_seen_next = 0;
    pthread_mutex_unlock(&mm_call_lock);
}

void mm_call_group_unregister(mm_call_group_t *g)
{
    pthread_mutex_lock(&mm_call_lock);
    for (mm_call_group_t **p = &mm_call_groups; g->registered && *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            g->registered = 0;
            break;
        }
    pthread_mutex_unlock(&mm_call_lock);
}

/* Every registered group named by a record moves to at least that record's number. */
static void mm_call_resync(const mm_call_t *c)
{
    pthread_mutex_lock(&mm_call_lock);
    if (c->group->calls < c->seq) c->group->calls = c->seq;
    for (int i = 0; i < c->n; i++) {
        const mm_call_wire_t *r = (const mm_call_wire_t *)(const void *)(c->records +
                                                                        (size_t)i * c->rec_bytes);
        if (!mm_call_valid(r)) continue;
        int found = 0;
        for (mm_call_group_t *g = mm_call_groups; g; g = g->next)
            if (g->id == r->group) {
                found = 1;
                if (g->calls < r->seq) g->calls = r->seq;
            }
        if (!found) mm_call_seen_note(r->group, r->seq);
    }
    pthread_mutex_unlock(&mm_call_lock);
}

/* ---- the call ------------------------------------------------------------------------- */

uint64_t mm_call_digest(const void *p, size_t n, uint64_t h)
{
    const uint8_t *b = p;
    if (h == 0) h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void mm_call_begin(mm_call_t *c, mm_call_group_t *group, int kind, uint64_t object,
                   uint64_t digest)
{
    memset(c, 0, sizeof *c);
    c->group = group;
    c->kind = kind;
    c->object = object;
    c->digest = digest;
    pthread_mutex_lock(&mm_call_lock);
    c->seq = group->calls + 1;
    pthread_mutex_unlock(&mm_call_lock);
    if (group->noun && object)
        snprintf(c->what, sizeof c->what, "%s of %s #%llu", mm_call_kind_name(kind), group->noun,
                 (unsigned long long)object);
    else
        snprintf(c->what, sizeof c->what, "%s", mm_call_kind_name(kind));
}

void mm_call_end(mm_call_t *c)
{
    mm_freelist_put(&mm_call_blocks, c->records);
    mm_freelist_put(&mm_call_blocks, c->payloads);
    c->records = c->payloads = NULL;
}

static const mm_call_wire_t *mm_call_rec(const mm_call_t *c, int i)
{
    return (const mm_call_wire_t *)(const void *)(c->records + (size_t)i * c->rec_bytes);
}

const void *mm_call_payload(const mm_call_t *c, int i)
{
    if (c->inline_payload) return c->records + (size_t)i * c->rec_bytes + sizeof(mm_call_wire_t);
    return c->payloads ? c->payloads + (size_t)i * c->payload_bytes : NULL;
}

uint64_t mm_call_aux(const mm_call_t *c, int i) { return mm_call_rec(c, i)->aux; }

megamoe_status_t mm_call_aux_agree(const mm_call_t *c, megamoe_status_t status, const char *what)
{
    for (int i = 1; i < c->n; i++)
        if (mm_call_aux(c, i) != mm_call_aux(c, 0))
            return mm_error(status, "%s: rank 0 passed #%llu but rank %d passed #%llu; pass every "
                            "rank the same one", what, (unsigned long long)mm_call_aux(c, 0), i,
                            (unsigned long long)mm_call_aux(c, i));
    return MEGAMOE_OK;
}

static int mm_call_same(const mm_call_wire_t *a, const mm_call_wire_t *b)
{
    return mm_call_valid(a) && mm_call_valid(b) && a->kind == b->kind &&
           a->group == b->group && a->object == b->object && a->seq == b->seq &&
           a->digest == b->digest && strncmp(a->what, b->what, MM_CALL_WHAT) == 0;
}

/* Append "rank 1" / "ranks 0, 2-3" (world ranks of the listed members, ascending) to buf. */
static size_t mm_call_ranks(char *buf, size_t len, size_t off, const mm_shmem_team_t *team,
                            const int *members, int count)
{
    off += (size_t)snprintf(buf + off, off < len ? len - off : 0, "%s", count > 1 ? "ranks " : "rank ");
    for (int k = 0; k < count && off < len; k++) {
        int lo = members[k], hi = lo;
        while (k + 1 < count && members[k + 1] == hi + 1) hi = members[++k];
        const char *sep = lo == members[0] ? "" : ", ";
        int wlo = mm_shmem_team_world_pe(team, lo), whi = mm_shmem_team_world_pe(team, hi);
        if (hi == lo) off += (size_t)snprintf(buf + off, len - off, "%s%d", sep, wlo);
        else off += (size_t)snprintf(buf + off, len - off, "%s%d-%d", sep, wlo, whi);
    }
    return off;
}

/* CALL_MISMATCH naming what every member called, the calls in order of first appearance. */
static megamoe_status_t mm_call_mismatch(const mm_call_t *c, const mm_shmem_team_t *team)
{
    char list[720];
    size_t off = 0;
    int *done = calloc((size_t)c->n, sizeof *done), *members = calloc((size_t)c->n, sizeof *members);
    if (done == NULL || members == NULL) {
        free(done);
        free(members);
        return mm_error(MEGAMOE_CALL_MISMATCH, "collective calls out of order between the ranks "
                        "(no memory to name them); every rank must make the same collective "
                        "calls in the same order");
    }
    list[0] = '\0';
    for (int i = 0; i < c->n && off < sizeof list; i++) {
        if (done[i]) continue;
        const mm_call_wire_t *a = mm_call_rec(c, i);
        int count = 0;
        for (int j = i; j < c->n; j++) {
            const mm_call_wire_t *b = mm_call_rec(c, j);
            int same = mm_call_valid(a) ? mm_call_same(a, b) : !mm_call_valid(b);
            if (!done[j] && same) {
                done[j] = 1;
                members[count++] = j;
            }
        }
        if (off) off += (size_t)snprintf(list + off, sizeof list - off, ", ");
        if (off >= sizeof list) break;
        off = mm_call_ranks(list, sizeof list, off, team, members, count);
        if (off >= sizeof list) break;
        if (!mm_call_valid(a))
            off += (size_t)snprintf(list + off, sizeof list - off, " %s in another collective of "
                                    "this communicator (creating a layer, a split, a symmetric "
                                    "allocation: not one of the calls above)",
                                    count > 1 ? "are" : "is");
        else
        {
            const mm_call_wire_t *r0 = mm_call_rec(c, 0);
            int settings = mm_call_valid(r0) && a->kind == r0->kind &&
                           a->group == r0->group && a->object == r0->object &&
                           a->seq == r0->seq && a->digest != r0->digest;
            off += (size_t)snprintf(list + off, sizeof list - off, " called %.*s (call %llu%s)",
                                    MM_CALL_WHAT, a->what, (unsigned long long)a->seq,
                                    settings ? ", other settings" : "");
        }
    }
    free(done);
    free(members);
    if (off >= sizeof list) memcpy(list + sizeof list - 5, "...", 4);
    return mm_error(MEGAMOE_CALL_MISMATCH,
                    "collective calls out of order across ranks: %s; every rank of the group must "
                    "make the same collective calls (MegaMoeExperts forward, backward, close, "
                    "share_execution_resources; the dispatch/combine operators) in the same "
                    "order. Nothing ran and no output was written on any rank; calls made in the "
                    "same order work again",
                    list);
}

/* The lowest failing member's status, "rank R: <its message>" (operators: a failing member
 * keeps its own message). Collective: the messages are gathered once some status failed. */
static megamoe_status_t mm_call_failure(const mm_call_t *c, mm_shmem_team_t *team,
                                        megamoe_status_t local, const char *own_text)
{
    const int me = mm_shmem_team_my_pe(team);
    int first = -1;
    for (int i = 0; i < c->n && first < 0; i++)
        if (mm_call_rec(c, i)->status != MEGAMOE_OK) first = i;
    if (first < 0) return MEGAMOE_OK;
    const mm_call_wire_t *r = mm_call_rec(c, first);
    megamoe_status_t st = r->status < 0 ? (megamoe_status_t)r->status : MEGAMOE_INTERNAL;
    /* room for n + 1 messages was allocated with the records, so no member can drop out */
    char(*texts)[MM_CALL_TEXT] = (char(*)[MM_CALL_TEXT])(void *)(c->records +
                                                               (size_t)(c->n + 1) * c->rec_bytes);
    snprintf(texts[c->n], MM_CALL_TEXT, "%s", own_text);
    MM_CHECK(mm_shmem_team_allgather(team, texts, texts[c->n], MM_CALL_TEXT));
    if (c->keep_own_error && local != MEGAMOE_OK) {
        mm_set_last_error(own_text);
        return local;
    }
    char *t = texts[first];
    t[MM_CALL_TEXT - 1] = '\0';
    char text[MM_CALL_TEXT + 64];
    if (t[0]) snprintf(text, sizeof text, "rank %d: %s", mm_shmem_team_world_pe(team, first), t);
    else snprintf(text, sizeof text, "rank %d: %s (that rank gave no message)",
                  mm_shmem_team_world_pe(team, first), megamoe_status_name(st));
    if (first != me) MM_LOG(MEGAMOE_LOG_ERROR, "%s", text); /* ours was logged where decided */
    mm_set_last_error(text);
    return st;
}

/* Append str to buf (capacity cap, NUL-terminated, truncating). */
static void mm_call_append(char *buf, size_t cap, size_t *off, const char *str)
{
    size_t n = strlen(str);
    if (*off + n >= cap) n = cap - 1 - *off;
    memcpy(buf + *off, str, n);
    *off += n;
    buf[*off] = '\0';
}

static const char *mm_call_u64(char out[24], uint64_t v)
{
    char *p = out + 23;
    *p = '\0';
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return p;
}

megamoe_status_t mm_call_exchange(mm_call_t *c, mm_shmem_team_t *team, megamoe_status_t local,
                                  const void *payload, size_t payload_bytes)
{
    const int n = mm_shmem_team_n_pes(team), me = mm_shmem_team_my_pe(team);
    if (n < 1 || me < 0)
        return mm_error(MEGAMOE_INVALID_STATE, "%s: the communicator of this call is not usable "
                        "(destroyed, or the SHMEM runtime stopped)", c->what);
    char own_text[MM_CALL_TEXT];
    own_text[0] = '\0';
    if (local != MEGAMOE_OK) {
        snprintf(own_text, sizeof own_text, "%s", megamoe_last_error());
        if (own_text[0] == '\0')
            snprintf(own_text, sizeof own_text, "%s: %s", megamoe_status_name(local),
                     megamoe_status_str(local));
    }
    const size_t pb = mm_align_up(payload_bytes, 8);
    const int inl = sizeof(mm_call_wire_t) + pb <= MM_CALL_INLINE;
    const size_t rb = sizeof(mm_call_wire_t) + (inl ? pb : 0);
    mm_freelist_put(&mm_call_blocks, c->payloads); /* (a call may exchange more than once) */
    c->payloads = NULL;
    c->n = n;
    c->rec_bytes = rb;
    c->payload_bytes = payload_bytes;
    c->inline_payload = inl;
    /* n gathered records, ours to send, then n + 1 message slots (mm_call_failure) */
    const size_t need = (size_t)(n + 1) * (rb + MM_CALL_TEXT);
    if (c->records != NULL && mm_freelist_size(c->records) < need) {
        mm_freelist_put(&mm_call_blocks, c->records);
        c->records = NULL;
    }
    megamoe_status_t st = MEGAMOE_OK;
    if (c->records == NULL &&
        mm_freelist_get(&mm_call_blocks, need, 0, "call records", (void **)&c->records) !=
            MEGAMOE_OK)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: no memory for %d call records", c->what, n);
    mm_call_wire_t *mine = (mm_call_wire_t *)(void *)(c->records + (size_t)n * rb);
    memset(mine, 0, rb);
    mine->notice = MEGAMOE_CALL_MISMATCH;
    /* (assembled without printf: this runs on every call) */
    char seq[24];
    size_t off = 0;
    mm_call_append(mine->notice_text, sizeof mine->notice_text, &off, "CALL_MISMATCH: it called ");
    mm_call_append(mine->notice_text, sizeof mine->notice_text, &off, c->what);
    mm_call_append(mine->notice_text, sizeof mine->notice_text, &off, " (call ");
    mm_call_append(mine->notice_text, sizeof mine->notice_text, &off, mm_call_u64(seq, c->seq));
    mm_call_append(mine->notice_text, sizeof mine->notice_text, &off,
                   ") while this rank is in another collective of the same communicator; every "
                   "rank must make the same collective calls in the same order");
    mine->magic = MM_CALL_MAGIC;
    mine->kind = c->kind;
    mine->status = local;
    mine->group = c->group->id;
    mine->object = c->object;
    mine->seq = c->seq;
    mine->digest = c->digest;
    mine->aux = c->aux;
    mine->payload_bytes = payload_bytes;
    memcpy(mine->what, c->what, sizeof mine->what); /* NUL-terminated by mm_call_begin */
    if (inl && payload_bytes) memcpy(mine + 1, payload, payload_bytes);

    st = mm_shmem_team_allgather(team, c->records, mine, rb);
    if (st != MEGAMOE_OK) return st; /* the team failed (lost peer, timeout): nothing to decide */
    /* A member in another collective took no number (it never saw a descriptor): then nobody
     * does, so every sequence stays as it was on every member. Else every member commits the
     * numbers of every group named here. */
    for (int i = 0; i < n; i++)
        if (!mm_call_valid(mm_call_rec(c, i))) return mm_call_mismatch(c, team);
    mm_call_resync(c);
    for (int i = 0; i < n; i++)
        if (!mm_call_same(mm_call_rec(c, i), mm_call_rec(c, 0))) return mm_call_mismatch(c, team);
    /* (a failing member may send no payload: compared only when every member is OK) */
    st = mm_call_failure(c, team, local, own_text);
    for (int i = 1; st == MEGAMOE_OK && i < n; i++)
        if (mm_call_rec(c, i)->payload_bytes != mm_call_rec(c, 0)->payload_bytes)
            st = mm_error(MEGAMOE_CALL_MISMATCH, "%s (call %llu): rank %d exchanges %llu bytes but "
                          "rank %d %llu; the ranks run different builds of this call",
                          c->what, (unsigned long long)c->seq, mm_shmem_team_world_pe(team, 0),
                          (unsigned long long)mm_call_rec(c, 0)->payload_bytes,
                          mm_shmem_team_world_pe(team, i),
                          (unsigned long long)mm_call_rec(c, i)->payload_bytes);
    if (st != MEGAMOE_OK || inl || payload_bytes == 0) return st;
    /* a large payload: the calls agree, so every member sends the same size */
    megamoe_status_t ps = mm_freelist_get(&mm_call_blocks, (size_t)n * payload_bytes, 0,
                                          "gathered payloads", (void **)&c->payloads);
    if (ps != MEGAMOE_OK)
        ps = mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: no memory for the gathered payloads", c->what);
    ps = mm_shmem_team_agree(team, ps);
    if (ps != MEGAMOE_OK) return ps;
    return mm_shmem_team_allgather(team, c->payloads, payload, payload_bytes);
}
