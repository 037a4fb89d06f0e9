/* SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104) for the bootstrap's challenge-response.
 * Small and dependency-free; not constant-time in the data, which is fine for nonces and MACs
 * (the secret only enters through the keyed pads). */
#ifndef MM_SHMEM_SHA256_H
#define MM_SHMEM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define MM_SHA256_BYTES 32

typedef struct mm_sha256 {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t block[64];
    size_t fill;
} mm_sha256_t;

void mm_sha256_init(mm_sha256_t *s);
void mm_sha256_update(mm_sha256_t *s, const void *data, size_t len);
void mm_sha256_final(mm_sha256_t *s, uint8_t out[MM_SHA256_BYTES]);
void mm_sha256(const void *data, size_t len, uint8_t out[MM_SHA256_BYTES]);

/* HMAC-SHA-256 over the concatenation of n_parts buffers. */
void mm_hmac_sha256(const void *key, size_t key_len, const void *const *parts,
                    const size_t *part_lens, int n_parts, uint8_t out[MM_SHA256_BYTES]);

/* Compare without an early exit (MAC checks). Returns 1 when equal. */
int mm_ct_equal(const void *a, const void *b, size_t len);

#endif /* MM_SHMEM_SHA256_H */
