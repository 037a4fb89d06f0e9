/* Internal view of the public communicator (include/megamoe/comm.h) for the layers above
 * SHMEM: a communicator is a SHMEM team plus one runtime reference. */
#ifndef MM_SHMEM_COMM_IMPL_H
#define MM_SHMEM_COMM_IMPL_H

#include "megamoe/comm.h"

#include "shmem.h"

/* The team of comm (the world team for megamoe_comm_create); NULL for NULL or a destroyed
 * communicator. Valid until megamoe_comm_destroy(comm). */
mm_shmem_team_t *mm_comm_team(const megamoe_comm_t *comm);

#endif /* MM_SHMEM_COMM_IMPL_H */
