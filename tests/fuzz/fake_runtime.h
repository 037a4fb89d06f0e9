/* The fake SHMEM runtime of the operator fuzz harness (see fake_runtime.c). */
#ifndef MM_TESTS_FUZZ_FAKE_RUNTIME_H
#define MM_TESTS_FUZZ_FAKE_RUNTIME_H

#include <stddef.h>

#include "megamoe/comm.h"

/* One byte of a peer's operator record flipped: record[4 + offset % (size - 4)] ^= xor_mask
 * (the status word stays a status: a peer can send other arguments, not another status; the
 * call-order header around the record is left alone). */
typedef struct mm_fake_mutation {
    int peer;
    unsigned offset;
    unsigned char xor_mask;
} mm_fake_mutation_t;

/* This process is world rank me of world; the EP communicator's team is the world, the TP one
 * is {me, me ^ 1} with this process at tp_me. Mutations apply to the peers' records in every
 * allgather until the next call (the array must stay valid). */
void mm_fake_runtime_set(int world, int me, int tp_me, const mm_fake_mutation_t *mutations,
                         int n_mutations);
/* Called on every allgather result (n elements of elem_bytes, this rank's copied to all):
 * when it is the operators' record exchange, the harness makes the peers' copies look like
 * their own (their TP rank and partner), which the fake cannot know, sets where the record
 * lies in an element and returns 1; then the mutations are applied to the peers' records. */
typedef int (*mm_fake_fixup_t)(void *elems, size_t elem_bytes, int n, int me, size_t *rec_off,
                               size_t *rec_len);
void mm_fake_set_fixup(mm_fake_fixup_t fn);
/* World PEs form hosts of ranks_per_host consecutive PEs (0: one host). */
void mm_fake_set_hosts(int ranks_per_host);
megamoe_comm_t *mm_fake_comm_ep(void);
megamoe_comm_t *mm_fake_comm_tp(void);

#endif /* MM_TESTS_FUZZ_FAKE_RUNTIME_H */
