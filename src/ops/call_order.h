/* The ordering rule of collective calls: every member of a group makes the same collective
 * calls in the same order (docs/moe.md, docs/ops.md "Call order").
 *
 * Every collective entry (a MegaMoeExperts forward, backward, close or share; an operator)
 * carries a call descriptor — call kind, the identity of its call group (a resource group,
 * the operators of the world) agreed when the group was created, the group's sequence number
 * of the call, a digest of the shapes and settings that must agree — and its local status.
 * mm_call_exchange() is the FIRST exchange of the call: one team allgather of a record that
 * holds the descriptor, the local status with its message, and the call's own first payload
 * (the routing counts, the operator record), so the check costs no extra round trip.
 *
 * Decisions, identical on every member because they are computed from the same records:
 *  1. Calls that differ (kind, group, object, sequence number, digest) are CALL_MISMATCH on
 *     every member, naming what each rank called ("rank 0 called forward of layer #2
 *     (call 17), rank 1 called forward of layer #1 (call 17)"). A member that is in another
 *     collective of the same team (a plain agree, a symmetric allocation, a split) reads our
 *     record as an agree entry whose status is CALL_MISMATCH and whose text names our call,
 *     and we see its record is no descriptor: both fail, neither waits for the timeout.
 *  2. Else the lowest failing member's status with "rank R: <its message>" (the message is
 *     carried in the record, so it is never empty).
 * Nothing else happens in the exchange: no data moves before it succeeded.
 *
 * Sequence numbers. A group counts the calls that reached an exchange (group->calls); a call
 * takes number calls + 1. The exchange is lockstep (every member's record is gathered once),
 * so after it every member sets, for every group named in ANY record that it also has,
 * calls = max(calls, that record's number). Ranks that called a then b (a, b in groups A and
 * B) while their peer called b then a thereby agree afterwards on both groups' numbers
 * whatever the interleaving, and the next call in the same order on every rank matches.
 * Calls that fail before their exchange (a layer used after close, a second thread) take no
 * number.
 *
 * Adding a call kind is one line of MM_CALL_KINDS.
 */
#ifndef MM_OPS_CALL_ORDER_H
#define MM_OPS_CALL_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#include "shmem/shmem.h"

/* XX(name, what a message calls it) */
#define MM_CALL_KINDS(XX)                                                                  \
    XX(FORWARD, "forward")                                                                 \
    XX(BACKWARD, "backward")                                                               \
    XX(CLOSE, "close")                                                                     \
    XX(SHARE, "share_execution_resources")                                                 \
    XX(DISPATCH_V2, "dispatch_v2")                                                         \
    XX(COMBINE_V2, "combine_v2")                                                           \
    XX(COMBINE_ADD_RMS_NORM, "combine_add_rms_norm")                                       \
    XX(MEGA_MOE, "mega_moe")

typedef enum mm_call_kind {
    MM_CALL_NONE = 0,
#define MM_CALL_KIND_ENUM_(name, text) MM_CALL_##name,
    MM_CALL_KINDS(MM_CALL_KIND_ENUM_)
#undef MM_CALL_KIND_ENUM_
    MM_CALL_KIND_COUNT
} mm_call_kind_t;

const char *mm_call_kind_name(int kind);

/* The identity of the operators' call group (the world); layer groups use their first
 * layer's number, which is agreed at creation and far below. */
#define MM_CALL_GROUP_OPERATORS UINT64_MAX

/* One ordered sequence of collective calls. */
typedef struct mm_call_group {
    uint64_t id;      /* agreed at creation: the same on every member, never 0 */
    uint64_t calls;   /* number of the last call that reached its exchange */
    const char *noun; /* "layer": "forward of layer #2"; NULL: the kind alone ("dispatch_v2") */
    struct mm_call_group *next;
    int registered;
} mm_call_group_t;

/* The operators' call group of the process (always registered, so an exchange that sees an
 * operator call re-synchronises its numbers also on a rank that never called an operator). */
extern mm_call_group_t mm_call_operators;

/* Groups are registered while they exist, so an exchange can re-synchronise the numbers of
 * every group it saw. Idempotent; thread-safe. */
void mm_call_group_register(mm_call_group_t *g);
void mm_call_group_unregister(mm_call_group_t *g);
/* Forget the numbers seen for groups this rank does not have (a new SHMEM lifecycle). */
void mm_call_forget_seen(void);

#define MM_CALL_WHAT 96

/* One collective call (stack object: mm_call_begin, mm_call_exchange, mm_call_end). */
typedef struct mm_call {
    mm_call_group_t *group;
    int kind;
    uint64_t object;  /* the layer's number (#N), 0 when the kind names the call */
    uint64_t digest;  /* shapes and settings that must agree (mm_call_digest) */
    uint64_t aux;     /* a value the caller compares itself (mm_call_aux_agree) */
    uint64_t seq;     /* the call's number in its group */
    int keep_own_error; /* a failing member returns its own message (operators' rule) */
    char what[MM_CALL_WHAT]; /* "forward of layer #2" (mm_call_begin; may be rewritten) */
    /* the gathered records */
    int n;
    size_t rec_bytes, payload_bytes;
    int inline_payload;
    uint8_t *records;  /* n * rec_bytes */
    uint8_t *payloads; /* n * payload_bytes when not inline */
} mm_call_t;

void mm_call_begin(mm_call_t *c, mm_call_group_t *group, int kind, uint64_t object,
                   uint64_t digest);
/* The first exchange of the call over team (collective): local is this member's status so far
 * (its text in megamoe_last_error()), payload the call's own first exchange (may be NULL/0;
 * equal sizes for equal calls). Returns OK, CALL_MISMATCH, the agreed local failure, or the
 * team's own failure (PEER_LOST, TIMEOUT). A call may exchange more than once (same number). */
megamoe_status_t mm_call_exchange(mm_call_t *c, mm_shmem_team_t *team, megamoe_status_t local,
                                  const void *payload, size_t payload_bytes);
/* After a successful exchange: member i's payload and aux. */
const void *mm_call_payload(const mm_call_t *c, int i);
uint64_t mm_call_aux(const mm_call_t *c, int i);
/* OK when every member passed the same aux, else status with "<what>: rank 0 passed #a but
 * rank R passed #b; pass every rank the same one". */
megamoe_status_t mm_call_aux_agree(const mm_call_t *c, megamoe_status_t status,
                                   const char *what);
void mm_call_end(mm_call_t *c);

/* FNV-1a over n bytes, continuing from h (start with 0). */
uint64_t mm_call_digest(const void *p, size_t n, uint64_t h);

#endif /* MM_OPS_CALL_ORDER_H */
