/* Point-to-point mailboxes: small messages between any two PEs, without the rest of the world.
 *
 * Every PE's reserve has an inbox line per source PE (sequence word, 48-byte payload) and an
 * ack line per destination PE. A message to pe: wait until pe acknowledged the previous one
 * (the inbox line is free again), put the payload into pe's inbox line for this PE, then set
 * the sequence (a signal, so the payload is visible first, on either transport). A receiver
 * waits for the sequence it expects, copies the payload out and acknowledges. Sequences count
 * per ordered pair and only grow, so nothing is reset between exchanges. Used to create a team
 * among a subset of PEs (an EP group) while the PEs outside it do something else.
 */
#include <string.h>

#include "shmem_internal.h"

typedef struct mm_mail_line {
    uint64_t seq;
    uint64_t pad;
    uint8_t payload[MM_SHMEM_MAIL_PAYLOAD];
} mm_mail_line_t;

_Static_assert(sizeof(mm_mail_line_t) == 64, "a mailbox line is one cache line");

megamoe_status_t mm_shmem_mail_exchange(const int *pes, int n, int me, const void *payload,
                                        void *out, const char *what)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    memcpy((uint8_t *)out + (size_t)me * MM_SHMEM_MAIL_PAYLOAD, payload, MM_SHMEM_MAIL_PAYLOAD);
    /* send to every other member (rotated start: members do not all hit the first one) */
    for (int i = 1; i < n; i++) {
        int pe = pes[(me + i) % n];
        uint64_t *ack = (uint64_t *)(g->my_base + mm_shmem_ack_off(pe));
        MM_CHECK(mm_shmem_wait_impl(ack, MM_SHMEM_CMP_GE, g->mail_sent[pe], NULL, what));
        char *line = g->my_base + mm_shmem_inbox_off(g->my_pe); /* symmetric: pe's line for me */
        MM_CHECK(mm_shmem_put(line + offsetof(mm_mail_line_t, payload), payload,
                              MM_SHMEM_MAIL_PAYLOAD, pe));
        uint64_t seq = ++g->mail_sent[pe];
        MM_CHECK(mm_shmem_word_op(pe, mm_shmem_inbox_off(g->my_pe), seq, MM_ENGINE_SET));
    }
    /* receive from every other member, acknowledge at once */
    for (int i = 1; i < n; i++) {
        int idx = (me + n - i) % n, pe = pes[idx];
        mm_mail_line_t *line = (mm_mail_line_t *)(g->my_base + mm_shmem_inbox_off(pe));
        uint64_t want = g->mail_recv[pe] + 1;
        MM_CHECK(mm_shmem_wait_impl(&line->seq, MM_SHMEM_CMP_GE, want, NULL, what));
        memcpy((uint8_t *)out + (size_t)idx * MM_SHMEM_MAIL_PAYLOAD, line->payload,
               MM_SHMEM_MAIL_PAYLOAD);
        g->mail_recv[pe] = want;
        MM_CHECK(mm_shmem_word_op(pe, mm_shmem_ack_off(g->my_pe), want, MM_ENGINE_SET));
    }
    return MEGAMOE_OK;
}
