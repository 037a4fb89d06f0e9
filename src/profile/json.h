/* A small strict JSON reader (RFC 8259) for the trace files: a read-only tree in one arena.
 *
 * Robustness: malformed input of any kind (truncation, bad escapes, control characters,
 * nesting deeper than MM_JSON_MAX_DEPTH, trailing garbage, inputs over 2 GiB) is an
 * INVALID_ARGUMENT whose message names the source, line and column; the parser never reads
 * past the buffer and never recurses unboundedly. Strings are unescaped to NUL-terminated
 * UTF-8 (\u0000 is refused so C strings stay whole). Numbers keep their text: read them with
 * mm_json_scaled() for exact integers (timestamps) or mm_json_double().
 *
 * Errors are not logged (mm_error_quiet): the caller decides how to report a bad file.
 */
#ifndef MM_PROFILE_JSON_H
#define MM_PROFILE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#define MM_JSON_MAX_DEPTH 256

typedef enum mm_json_type {
    MM_JSON_NULL,
    MM_JSON_FALSE,
    MM_JSON_TRUE,
    MM_JSON_NUMBER,
    MM_JSON_STRING,
    MM_JSON_ARRAY,
    MM_JSON_OBJECT
} mm_json_type_t;

typedef struct mm_json_value mm_json_value_t;
typedef struct mm_json_member mm_json_member_t;

struct mm_json_value {
    mm_json_type_t type;
    uint32_t len;        /* string bytes, number text bytes, array items, object members */
    uint32_t line, col;  /* where the value starts (1-based) */
    union {
        const char *str;            /* STRING: unescaped, NUL-terminated */
        const char *num;            /* NUMBER: the literal (not NUL-terminated) */
        mm_json_value_t *items;     /* ARRAY */
        mm_json_member_t *members;  /* OBJECT (in file order; duplicates kept) */
    } u;
};

struct mm_json_member {
    const char *key; /* unescaped, NUL-terminated */
    uint32_t key_len;
    mm_json_value_t value;
};

typedef struct mm_json_doc mm_json_doc_t;

/* Parse text[0..len) (text may hold NULs; it must outlive the document: numbers point into
 * it). source names the input in error messages. */
megamoe_status_t mm_json_parse(const char *text, size_t len, const char *source,
                               mm_json_doc_t **doc_p);
const mm_json_value_t *mm_json_root(const mm_json_doc_t *doc);
void mm_json_free(mm_json_doc_t *doc);

/* Member `key` of an object (the first one), NULL when v is not an object or has none. */
const mm_json_value_t *mm_json_get(const mm_json_value_t *v, const char *key);
/* 1 when v is a string equal to s. */
int mm_json_str_is(const mm_json_value_t *v, const char *s);
/* Exact integer value * 10^decimals (decimals in [0, 9]); digits beyond are rounded half
 * away from zero. 0 when v is not a number or the result does not fit in int64. */
int mm_json_scaled(const mm_json_value_t *v, int decimals, int64_t *out);
/* An integral number in [lo, hi] (no fraction after scaling by 0 decimals). */
int mm_json_int(const mm_json_value_t *v, int64_t lo, int64_t hi, int64_t *out);
/* Any number as a double (locale-independent); 0 when v is not a number. */
int mm_json_double(const mm_json_value_t *v, double *out);
const char *mm_json_type_name(mm_json_type_t type);

#endif /* MM_PROFILE_JSON_H */
