/* The rows of the environment table (env_table.h) as data: their ids, names, defaults and
 * ENUM words, and the word lookup; no parsing, no errors. The log reads its own variable
 * through this (it cannot use env.c, whose errors it logs); env.h builds the getters on it. */
#ifndef MM_BASE_ENV_IDS_H
#define MM_BASE_ENV_IDS_H

#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "env_table.h"

typedef enum mm_env_id {
#define MM_ENV_ID_(id, name, type, def, lo, hi, choices, help) MM_ENV_##id,
    MM_ENV_TABLE(MM_ENV_ID_)
#undef MM_ENV_ID_
        MM_ENV_COUNT
} mm_env_id_t;

/* Name of the variable ("HYPER_PARALLEL_SHMEM_HEAP_SIZE"); NULL for a bad id. */
static inline const char *mm_env_row_name(mm_env_id_t id)
{
    switch (id) {
#define MM_ENV_ROW_NAME_(id, name, type, def, lo, hi, choices, help) \
    case MM_ENV_##id:                                                \
        return name;
        MM_ENV_TABLE(MM_ENV_ROW_NAME_)
#undef MM_ENV_ROW_NAME_
    default:
        return NULL;
    }
}

/* Text form of the default ("" = none); NULL for a bad id. */
static inline const char *mm_env_row_default(mm_env_id_t id)
{
    switch (id) {
#define MM_ENV_ROW_DEF_(id, name, type, def, lo, hi, choices, help) \
    case MM_ENV_##id:                                               \
        return def;
        MM_ENV_TABLE(MM_ENV_ROW_DEF_)
#undef MM_ENV_ROW_DEF_
    default:
        return NULL;
    }
}

/* '|'-separated words of an ENUM row ("" for other types); NULL for a bad id. */
static inline const char *mm_env_row_choices(mm_env_id_t id)
{
    switch (id) {
#define MM_ENV_ROW_CHOICES_(id, name, type, def, lo, hi, choices, help) \
    case MM_ENV_##id:                                                   \
        return choices;
        MM_ENV_TABLE(MM_ENV_ROW_CHOICES_)
#undef MM_ENV_ROW_CHOICES_
    default:
        return NULL;
    }
}

/* Index of word in the '|'-separated choices (case-insensitive), or -1. */
static inline int mm_env_choice_index(const char *choices, const char *word)
{
    const size_t wlen = strlen(word);
    int index = 0;
    for (const char *c = choices; *c; index++) {
        const char *end = strchr(c, '|');
        const size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == wlen && strncasecmp(c, word, len) == 0) return index;
        c += len + (end ? 1 : 0);
    }
    return -1;
}

#endif /* MM_BASE_ENV_IDS_H */
