/* megamoe — version. */
#ifndef MEGAMOE_VERSION_H
#define MEGAMOE_VERSION_H

#include <stdint.h>

#include "megamoe/export.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 1
#define MEGAMOE_VERSION_PATCH 0
#define MEGAMOE_VERSION_STRING "0.1.0"
/* Bump on any incompatible change of a public struct or signature (SONAME
 * libmegamoe.so.<MEGAMOE_ABI_VERSION>); growing a struct under the scheme below is not one. */
#define MEGAMOE_ABI_VERSION 2

/* Version of the library actually loaded ("0.1.0"). */
const char *megamoe_version(void);
/* ABI version of the loaded library; compare with MEGAMOE_ABI_VERSION. */
int megamoe_abi_version(void);

/* ---- Public structs: how they may change without an ABI bump (since ABI 2) ----------------
 *
 * Extensible structs start with `size_t struct_size`, which the caller's megamoe_X_default()
 * sets to sizeof(megamoe_X_t) as the caller was compiled (the default is an inline function
 * over the exported megamoe_X_init(p, sizeof *p), so the size is the caller's, never the
 * library's). Every entry that takes such a struct checks struct_size against the library's
 * own layout, the rule of the Linux kernel's extensible syscall structs (copy_struct_from_user):
 *  - below the struct's minimum (the end of the fields it had when it entered the scheme):
 *    INVALID_ARGUMENT naming the struct and megamoe_X_default() (also for 0 or garbage);
 *  - smaller than the library's (an older caller): the fields past struct_size take their
 *    defaults;
 *  - larger (a newer caller): accepted when every byte the library does not know is zero,
 *    else UNSUPPORTED ("built against a newer megamoe").
 * So the ordinary rules for a field: append it at the end; its zero value means what the
 *    library did before it existed; set its default in megamoe_X_init(); never reorder,
 *    retype or remove a field (that is an ABI bump). One extensible struct embedded in another
 *    (combine_add_rms_norm_args.combine) is located by its own struct_size.
 * Structs the library fills (megamoe_experts_info_t): the caller passes its sizeof with the
 *    call (the function-like macro of the same name does it, e.g. megamoe_experts_get_info(e,
 *    &info) calls megamoe_experts_get_info_sized(e, &info, sizeof info)); the library writes
 *    min(caller's, own) bytes; new fields go at the end.
 * Frozen structs (no struct_size: megamoe_tensor_t, megamoe_experts_weights_t / _grads_t
 *    (positional initialisers), array elements such as megamoe_experts_replica_t, ...) never
 *    change under an ABI version; a new need gets a new struct or function.
 * A new public struct: extensible (struct_size first, megamoe_X_init + static inline
 *    megamoe_X_default, a row in src/base/abi.c with its minimum, the entry's check with
 *    mm_abi_copy_in) unless it is an array element or built positionally (then frozen: a row
 *    with minimum 0). The committed layouts (tests/install/abi_layout.txt) are checked by
 *    tests/install/test_abi_layout.py; after appending fields or adding a struct run
 *    `make abi-layout` and commit the file. The Python ctypes mirrors are checked against the
 *    library at import (megamoe_struct_size) and field by field by that test. */

/* sizeof() in this library of the public struct type type_name ("megamoe_experts_params_t");
 * -1 for a name the library does not know. */
int64_t megamoe_struct_size(const char *type_name);
/* The smallest struct_size the library accepts for an extensible struct; 0 for a frozen one;
 * -1 for an unknown name. */
int64_t megamoe_struct_min_size(const char *type_name);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_VERSION_H */
