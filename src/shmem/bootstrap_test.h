/* Test seam of bootstrap.c: the handshake's wire layout and its two MACs, so a test
 * (tests/fuzz/fuzz_bootstrap.c) can speak the protocol byte by byte without a copy of it.
 * Not used by the library. Whoever changes the HELLO/CHALLENGE layout or the MAC inputs in
 * bootstrap.c keeps these in step (the fuzz seeds then still reach past the MAC check). */
#ifndef MM_SHMEM_BOOTSTRAP_TEST_H
#define MM_SHMEM_BOOTSTRAP_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"

typedef struct mm_boot_wire {
    size_t nonce;        /* bytes of a nonce */
    size_t challenge;    /* CHALLENGE body bytes (the server nonce comes first) */
    size_t hello;        /* HELLO body bytes (the MAC is the last 32) */
    size_t hello_rank;   /* offsets of the u32 rank and world and of the client nonce */
    size_t hello_world;
    size_t hello_nonce;
    size_t text_max;     /* longest REJECT / VERDICT text a client accepts */
} mm_boot_wire_t;

void mm_boot_test_wire(mm_boot_wire_t *wire);
/* The HELLO body rank cfg->rank of cfg would send after this challenge nonce (client nonce
 * random, MAC filled in): what the fuzz harness mutates. */
void mm_boot_test_hello(const mm_boot_config_t *cfg, const uint8_t *server_nonce, uint8_t *body);
/* The MAC a HELLO body carries (body: the whole HELLO body; its MAC slot is not read). */
void mm_boot_test_hello_mac(const char *token, const uint8_t *server_nonce, const uint8_t *body,
                            uint8_t mac[32]);
/* Rank 0's proof in ACCEPT. */
void mm_boot_test_accept_mac(const char *token, const uint8_t *client_nonce,
                             const uint8_t *server_nonce, uint32_t rank, uint8_t mac[32]);

#endif /* MM_SHMEM_BOOTSTRAP_TEST_H */
