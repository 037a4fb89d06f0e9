/* Extensible public structs: the library side of the scheme in include/megamoe/version.h.
 *
 * An entry taking an extensible struct copies it into a full-size local first and works on
 * the copy only:
 *     megamoe_experts_params_t p = megamoe_experts_params_default();  (the library's defaults)
 *     MM_CHECK(mm_abi_copy_in(&p, sizeof p, caller_p, "megamoe_experts_params_t"));
 * Every public struct has a row in src/base/abi.c (size, minimum struct_size).
 */
#ifndef MM_BASE_ABI_H
#define MM_BASE_ABI_H

#include <stddef.h>

#include "megamoe/status.h"

/* The end of a field: offset + size (a struct's minimum is the end of its last field at the
 * ABI version it entered the scheme). */
#define MM_ABI_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* *dst (dst_size bytes, holding the defaults) <- the caller's struct at src, by src's
 * struct_size: below the minimum INVALID_ARGUMENT; fields past it keep the defaults; bytes
 * the library does not know must be zero (else UNSUPPORTED). dst's struct_size becomes
 * dst_size. Logged once; dst unchanged on error. */
megamoe_status_t mm_abi_copy_in(void *dst, size_t dst_size, const void *src, const char *type);

/* The same for a part of a struct that has no struct_size of its own (the fields after an
 * embedded extensible struct): src_size bytes at src, at least min_size of them. */
megamoe_status_t mm_abi_copy_part_in(void *dst, size_t dst_size, const void *src,
                                     size_t src_size, size_t min_size, const char *what);

/* The library's struct src (src_size bytes) -> the caller's dst of dst_size bytes (its
 * sizeof, passed with the call): INVALID_ARGUMENT below the minimum, min(dst_size, src_size)
 * bytes copied, a newer caller's tail zeroed. */
megamoe_status_t mm_abi_copy_out(void *dst, size_t dst_size, const void *src, size_t src_size,
                                 const char *type);

/* megamoe_X_init(p, size): p <- the defaults (defaults_size bytes) for the caller's size,
 * struct_size = size; a tail the library does not know is zeroed. INVALID_ARGUMENT for NULL
 * or a size below the minimum. */
megamoe_status_t mm_abi_init(void *p, size_t size, const void *defaults, size_t defaults_size,
                             const char *type);

#endif /* MM_BASE_ABI_H */
