/* Internal access to the environment table (src/base/env_table.h).
 *
 * Values are read from the environment at every call (so a new SHMEM lifecycle re-reads its
 * settings); getters return the default when the variable is unset and INVALID_ARGUMENT (with
 * a message naming the variable and the accepted form) when it is set to a bad value.
 */
#ifndef MM_BASE_ENV_H
#define MM_BASE_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#include "env_ids.h" /* mm_env_id_t: MM_ENV_<ID> of env_table.h */

/* 1 when the variable is set (even to an empty string), else 0. */
int mm_env_is_set(mm_env_id_t id);
/* Name of the variable ("HYPER_PARALLEL_SHMEM_HEAP_SIZE"). */
const char *mm_env_name(mm_env_id_t id);

megamoe_status_t mm_env_int(mm_env_id_t id, int64_t *value_p);
megamoe_status_t mm_env_size(mm_env_id_t id, uint64_t *value_p);
megamoe_status_t mm_env_bool(mm_env_id_t id, int *value_p);
/* ENUM: index of the chosen word in CHOICES. */
megamoe_status_t mm_env_enum(mm_env_id_t id, int *index_p);
/* STRING: the value or the default; never NULL. */
megamoe_status_t mm_env_string(mm_env_id_t id, const char **value_p);

/* Parsers shared with API arguments (text -> value); name is used in the error message. */
megamoe_status_t mm_parse_size(const char *name, const char *text, uint64_t lo, uint64_t hi,
                               uint64_t *value_p);
megamoe_status_t mm_parse_int(const char *name, const char *text, int64_t lo, int64_t hi,
                              int64_t *value_p);
megamoe_status_t mm_parse_bool(const char *name, const char *text, int *value_p);

#endif /* MM_BASE_ENV_H */
