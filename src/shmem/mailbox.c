/* Point-to-point mailboxes: small messages between any two PEs, without the rest of the world.
 *
 * Every PE's reserve has an inbox line per source PE (sequence word, view tag, 48-byte
 * payload) and an ack line per destination PE. A message to pe: wait until pe acknowledged the
 * previous one (the inbox line is free again), put the tag and payload into pe's inbox line for
 * this PE, then set the sequence (a signal, so the payload is visible first, on either
 * transport). A receiver waits for the sequence it expects, copies the payload out and
 * acknowledges. Sequences count per ordered pair and only grow, so nothing is reset between
 * exchanges. Used to create a team among a subset of PEs (an EP group, the survivors of a loss)
 * while the PEs outside it do something else.
 *
 * The tag is the size of the sender's installed lost set (survive.h): an exchange that a loss
 * broke can leave a message its receiver never read; the receiver, in a later view, skips it
 * (an older tag), and a message from a sender that already acknowledged a loss this PE has not
 * seen yet (a newer tag) stays in the line for this PE's retry after its own recovery.
 */
#include <stdlib.h>
#include <string.h>

#include "shmem_internal.h"
#include "survive.h"

typedef struct mm_mail_line {
    uint64_t seq;
    uint64_t tag;
    uint8_t payload[MM_SHMEM_MAIL_PAYLOAD];
} mm_mail_line_t;

_Static_assert(sizeof(mm_mail_line_t) == 64, "a mailbox line is one cache line");

/* One message to pe: wait until pe acknowledged the previous one, then the line and its
 * sequence (no_ack: only pe's loss fails the wait). */
static megamoe_status_t mm_mail_send(int pe, const mm_mail_line_t *msg, int no_ack,
                                     const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    uint64_t *ack = (uint64_t *)(g->my_base + mm_shmem_ack_off(pe));
    MM_CHECK(no_ack ? mm_shmem_wait_from(ack, MM_SHMEM_CMP_GE, g->mail_sent[pe], pe, what)
                    : mm_shmem_wait_impl(ack, MM_SHMEM_CMP_GE, g->mail_sent[pe], NULL, what));
    char *line = g->my_base + mm_shmem_inbox_off(g->my_pe); /* symmetric: pe's line for me */
    MM_CHECK(mm_shmem_put(line + offsetof(mm_mail_line_t, tag), &msg->tag,
                          sizeof *msg - offsetof(mm_mail_line_t, tag), pe));
    uint64_t seq = ++g->mail_sent[pe];
    return mm_shmem_word_op(pe, mm_shmem_inbox_off(g->my_pe), seq, MM_ENGINE_SET);
}

/* no_ack: the last exchange of a lifecycle (no later message reuses the lines, and a peer
 * that got every message may already be gone). A member leaves once it has every message, and
 * it sent (and delivered) its own before, so only what arrives decides: the exchange holds
 * once every other member's message is here. A send failing with a member's loss is no error
 * then (that member may have got the message and left before this PE saw the put complete),
 * and while this PE waits only the loss of the member it waits for counts (after a grace for
 * a message still on its way); any other member closing its endpoints is not a loss. */
static megamoe_status_t mm_mail_exchange(const int *pes, int n, int me, const void *payload,
                                         void *out, const char *what, int no_ack)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    const uint64_t tag = mm_surv_view_tag();
    memcpy((uint8_t *)out + (size_t)me * MM_SHMEM_MAIL_PAYLOAD, payload, MM_SHMEM_MAIL_PAYLOAD);
    mm_mail_line_t msg;
    msg.tag = tag;
    memcpy(msg.payload, payload, MM_SHMEM_MAIL_PAYLOAD);
    /* send to every other member (rotated start: members do not all hit the first one) */
    /* (no_ack: a member's loss is an expected outcome of the sends and the quiet, logged at
     * debug level below rather than as an error) */
    const megamoe_status_t tolerated = mm_error_tolerate(no_ack ? MEGAMOE_PEER_LOST : MEGAMOE_OK);
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 1; i < n && (st == MEGAMOE_OK || (no_ack && st == MEGAMOE_PEER_LOST)); i++)
        st = mm_mail_send(pes[(me + i) % n], &msg, no_ack, what);
    /* the last exchange: every message delivered before this PE may see all of the others'
     * and leave (an engine signal can still be queued behind its put's flush, and a teardown
     * drops what is queued) */
    if (no_ack && n > 1 && (st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST)) st = mm_shmem_quiet();
    mm_error_tolerate(tolerated);
    if (st != MEGAMOE_OK && !(no_ack && st == MEGAMOE_PEER_LOST)) return st;
    /* receive from every other member, acknowledge at once */
    for (int i = 1; i < n; i++) {
        int idx = (me + n - i) % n, pe = pes[idx];
        mm_mail_line_t *line = (mm_mail_line_t *)(g->my_base + mm_shmem_inbox_off(pe));
        for (;;) {
            uint64_t want = g->mail_recv[pe] + 1;
            MM_CHECK(no_ack ? mm_shmem_wait_from(&line->seq, MM_SHMEM_CMP_GE, want, pe, what)
                            : mm_shmem_wait_impl(&line->seq, MM_SHMEM_CMP_GE, want, NULL, what));
            uint64_t their = __atomic_load_n(&line->tag, __ATOMIC_ACQUIRE);
            if (their > tag)
                return mm_error(MEGAMOE_PEER_LOST, "%s: rank %d already acknowledged a lost rank "
                                "that this rank has not seen yet; the call fails here and the "
                                "next one runs among the survivors", what, pe);
            if (their == tag)
                memcpy((uint8_t *)out + (size_t)idx * MM_SHMEM_MAIL_PAYLOAD, line->payload,
                       MM_SHMEM_MAIL_PAYLOAD);
            g->mail_recv[pe] = want;
            if (!no_ack)
                MM_CHECK(mm_shmem_word_op(pe, mm_shmem_ack_off(g->my_pe), want, MM_ENGINE_SET));
            if (their == tag) break; /* else a message of an exchange a loss broke: skip it */
        }
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_mail_exchange(const int *pes, int n, int me, const void *payload,
                                        void *out, const char *what)
{
    return mm_mail_exchange(pes, n, me, payload, out, what, 0);
}

megamoe_status_t mm_shmem_survivors_barrier(const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    int n = 0, me = -1;
    int *pes = malloc(sizeof(int) * (size_t)g->n_pes);
    uint8_t *out = malloc((size_t)g->n_pes * MM_SHMEM_MAIL_PAYLOAD);
    if (pes == NULL || out == NULL) {
        free(pes), free(out);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    for (int q = 0; q < g->n_pes; q++) {
        if (mm_surv_kind(q) != MM_LOSS_NONE) continue;
        if (q == g->my_pe) me = n;
        pes[n++] = q;
    }
    uint8_t zero[MM_SHMEM_MAIL_PAYLOAD] = {0};
    megamoe_status_t st = me < 0 ? mm_shmem_check_peers(what)
                                 : mm_mail_exchange(pes, n, me, zero, out, what, 1);
    free(pes);
    free(out);
    return st;
}
