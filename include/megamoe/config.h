/* megamoe — environment configuration.
 *
 * Every environment variable megamoe reads is listed in ONE table (src/base/env_table.h). This
 * header lets users inspect it: `megamoe info --config` prints it, docs/env.md is generated
 * from it. Parsing is strict: sizes take K/M/G/T suffixes (powers of 1024), booleans only
 * 0/1/true/false/on/off, integers are range-checked, enums must be one of the listed words.
 * A bad value is an INVALID_ARGUMENT error whose message names the variable and the accepted
 * form. Precedence: default < environment < explicit parameters in an API call.
 */
#ifndef MEGAMOE_CONFIG_H
#define MEGAMOE_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef struct megamoe_config_entry {
    const char *name;          /* "HYPER_PARALLEL_SHMEM_HEAP_SIZE" */
    const char *type;          /* "size", "int", "bool", "enum", "string" */
    const char *default_value; /* as text; "" when there is no default */
    const char *accepted;      /* the accepted form, e.g. "integer in [1, 86400]" */
    const char *help;          /* one sentence */
    const char *value;         /* current value from the environment, NULL when unset */
} megamoe_config_entry_t;

/* Number of variables in the table. */
size_t megamoe_config_count(void);

/* Entry i (0 <= i < count). INVALID_ARGUMENT when out of range. */
megamoe_status_t megamoe_config_entry(size_t index, megamoe_config_entry_t *entry_p);

/* Parse every variable that is set; the first bad one is returned as INVALID_ARGUMENT with a
 * message naming it. */
megamoe_status_t megamoe_config_validate(void);

/* Print the table: markdown != 0 gives the docs/env.md table, else an aligned text listing
 * with current values. */
megamoe_status_t megamoe_config_print(FILE *out, int markdown);

/* What this host offers (cpuid + OS state), for `megamoe info` and benchmark headers. Filled
 * by the library: the caller's sizeof travels with the call (the macro below). */
typedef struct megamoe_host_info {
    char cpu[64];       /* brand string */
    int cores;          /* online logical cores */
    int avx512;         /* AVX-512 F/BW/VL/DQ */
    int avx512_bf16;    /* AVX512-BF16 */
    int amx_bf16;       /* AMX-TILE + AMX-BF16 reported by cpuid */
    int amx_usable;     /* ... and the kernel granted the tile-data permission */
} megamoe_host_info_t;

megamoe_status_t megamoe_host_info_sized(megamoe_host_info_t *info_p, size_t info_size);
#define megamoe_host_info(info_p) megamoe_host_info_sized((info_p), sizeof *(info_p))

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_CONFIG_H */
