/* Test seams of the inter-host engine and its liveness monitor (tests/shmem/test_shmem_wire.c
 * only). */
#ifndef MM_SHMEM_ENGINE_TEST_H
#define MM_SHMEM_ENGINE_TEST_H

/* 1: every other data message of the am protocol is held back and sent after the message that
 * follows it (to any PE), so targets receive messages out of order and must put them back in
 * order themselves; 0: off (the default). Process-wide. */
void mm_shmem_engine_test_reorder(int on);

/* 1: this process's liveness monitor sends no heartbeats (what a rank whose heartbeats queue
 * behind a long stream of data looks like to its peers); 0: off (the default). */
void mm_shmem_engine_test_hold_heartbeats(int on);

#endif
