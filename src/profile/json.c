/* Strict JSON reader for the trace files (json.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include "json.h"

/* ---- arena -------------------------------------------------------------------------------- */

typedef struct mm_json_block {
    struct mm_json_block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} mm_json_block_t;

struct mm_json_doc {
    mm_json_block_t *blocks;
    mm_json_value_t root;
};

static void *mm_json_alloc(mm_json_doc_t *doc, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    mm_json_block_t *b = doc->blocks;
    if (b == NULL || b->size - b->used < bytes) {
        size_t size = bytes > (size_t)1 << 16 ? bytes : (size_t)1 << 16;
        b = malloc(sizeof *b + size);
        if (b == NULL) return NULL;
        b->used = 0;
        b->size = size;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    return p;
}

/* ---- parser ------------------------------------------------------------------------------- */

typedef struct mm_json_parser {
    const char *text, *end, *p;
    const char *source;
    const char *line_start;
    uint32_t line;
    mm_json_doc_t *doc;
    /* Scratch stacks of the open containers' children (copied to the arena on close). */
    mm_json_value_t *vals;
    size_t n_vals, cap_vals;
    mm_json_member_t *mems;
    size_t n_mems, cap_mems;
    char *buf; /* string unescape buffer */
    size_t cap_buf;
    megamoe_status_t status;
} mm_json_parser_t;

static uint32_t mm_json_col(const mm_json_parser_t *ps, const char *at)
{
    return (uint32_t)(at - ps->line_start) + 1;
}

static megamoe_status_t mm_json_fail_at(mm_json_parser_t *ps, const char *at, const char *what)
{
    if (ps->status != MEGAMOE_OK) return ps->status;
    if (at > ps->end) at = ps->end;
    const char *shown = at < ps->end ? at : NULL;
    char near[24] = "end of input";
    if (shown != NULL) {
        size_t k = 0;
        near[k++] = '\'';
        for (const char *q = shown; q < ps->end && k < 14; q++)
            near[k++] = (*q >= 0x20 && *q < 0x7f && *q != '\'') ? *q : '?';
        near[k++] = '\'';
        near[k] = '\0';
    }
    /* Error path only: recount lines up to `at` (it may lie before the current line). */
    uint32_t line = 1;
    const char *ls = ps->text;
    for (const char *q = ps->text; q < at; q++)
        if (*q == '\n') {
            line++;
            ls = q + 1;
        }
    ps->status = mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                                "%s:%u:%u: malformed JSON: %s (at %s); the file is not a trace "
                                "this tool wrote, or it was truncated",
                                ps->source, line, (uint32_t)(at - ls) + 1, what, near);
    return ps->status;
}

static megamoe_status_t mm_json_oom(mm_json_parser_t *ps)
{
    if (ps->status == MEGAMOE_OK)
        ps->status = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "%s: out of memory while reading JSON",
                                    ps->source);
    return ps->status;
}

static void mm_json_skip_ws(mm_json_parser_t *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->line_start = ps->p + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        ps->p++;
    }
}

static int mm_json_hex4(const char *p, const char *end, uint32_t *out)
{
    if (end - p < 4) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static int mm_json_buf_reserve(mm_json_parser_t *ps, size_t need)
{
    if (need <= ps->cap_buf) return 1;
    size_t cap = ps->cap_buf ? ps->cap_buf : 256;
    while (cap < need) cap *= 2;
    char *b = realloc(ps->buf, cap);
    if (b == NULL) return 0;
    ps->buf = b;
    ps->cap_buf = cap;
    return 1;
}

/* At the opening quote; on success out and len_out hold the unescaped copy (in the arena). */
static megamoe_status_t mm_json_string(mm_json_parser_t *ps, const char **out, uint32_t *len_out)
{
    const char *start = ps->p;
    ps->p++; /* opening quote */
    size_t n = 0;
    for (;;) {
        if (ps->p >= ps->end) return mm_json_fail_at(ps, start, "unterminated string");
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20)
            return mm_json_fail_at(ps, ps->p, "control character inside a string (escape it)");
        if (!mm_json_buf_reserve(ps, n + 5)) return mm_json_oom(ps);
        if (c != '\\') {
            ps->buf[n++] = (char)c;
            ps->p++;
            continue;
        }
        const char *esc = ps->p;
        if (ps->p + 1 >= ps->end) return mm_json_fail_at(ps, esc, "unterminated escape");
        char e = ps->p[1];
        ps->p += 2;
        switch (e) {
        case '"': ps->buf[n++] = '"'; break;
        case '\\': ps->buf[n++] = '\\'; break;
        case '/': ps->buf[n++] = '/'; break;
        case 'b': ps->buf[n++] = '\b'; break;
        case 'f': ps->buf[n++] = '\f'; break;
        case 'n': ps->buf[n++] = '\n'; break;
        case 'r': ps->buf[n++] = '\r'; break;
        case 't': ps->buf[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!mm_json_hex4(ps->p, ps->end, &cp))
                return mm_json_fail_at(ps, esc, "\\u needs four hex digits");
            ps->p += 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' ||
                    !mm_json_hex4(ps->p + 2, ps->end, &lo) || lo < 0xdc00 || lo > 0xdfff)
                    return mm_json_fail_at(ps, esc, "unpaired UTF-16 high surrogate");
                ps->p += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                return mm_json_fail_at(ps, esc, "unpaired UTF-16 low surrogate");
            }
            if (cp == 0) return mm_json_fail_at(ps, esc, "\\u0000 is not allowed in a name");
            if (cp < 0x80) {
                ps->buf[n++] = (char)cp;
            } else if (cp < 0x800) {
                ps->buf[n++] = (char)(0xc0 | (cp >> 6));
                ps->buf[n++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                ps->buf[n++] = (char)(0xe0 | (cp >> 12));
                ps->buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                ps->buf[n++] = (char)(0x80 | (cp & 0x3f));
            } else {
                ps->buf[n++] = (char)(0xf0 | (cp >> 18));
                ps->buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                ps->buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                ps->buf[n++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default:
            return mm_json_fail_at(ps, esc, "unknown escape");
        }
    }
    char *copy = mm_json_alloc(ps->doc, n + 1);
    if (copy == NULL) return mm_json_oom(ps);
    if (n) memcpy(copy, ps->buf, n); /* buf may still be NULL when n == 0 (UBSan: memcpy(p, NULL, 0)) */
    copy[n] = '\0';
    *out = copy;
    *len_out = (uint32_t)n;
    return MEGAMOE_OK;
}

static int mm_json_digit(const mm_json_parser_t *ps, const char *p)
{
    return p < ps->end && *p >= '0' && *p <= '9';
}

static megamoe_status_t mm_json_number(mm_json_parser_t *ps, mm_json_value_t *v)
{
    const char *s = ps->p, *p = ps->p;
    if (p < ps->end && *p == '-') p++;
    if (!mm_json_digit(ps, p)) return mm_json_fail_at(ps, s, "invalid number");
    if (*p == '0') {
        p++;
        if (mm_json_digit(ps, p)) return mm_json_fail_at(ps, s, "number with a leading zero");
    } else {
        while (mm_json_digit(ps, p)) p++;
    }
    if (p < ps->end && *p == '.') {
        p++;
        if (!mm_json_digit(ps, p)) return mm_json_fail_at(ps, s, "digits expected after '.'");
        while (mm_json_digit(ps, p)) p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < ps->end && (*p == '+' || *p == '-')) p++;
        if (!mm_json_digit(ps, p)) return mm_json_fail_at(ps, s, "digits expected in exponent");
        while (mm_json_digit(ps, p)) p++;
    }
    if (p - s > 4096) return mm_json_fail_at(ps, s, "number literal longer than 4096 characters");
    v->type = MM_JSON_NUMBER;
    v->u.num = s;
    v->len = (uint32_t)(p - s);
    ps->p = p;
    return MEGAMOE_OK;
}

static int mm_json_literal(mm_json_parser_t *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
    ps->p += n;
    return 1;
}

static megamoe_status_t mm_json_value(mm_json_parser_t *ps, mm_json_value_t *v, int depth);

static megamoe_status_t mm_json_push_val(mm_json_parser_t *ps, const mm_json_value_t *v)
{
    if (ps->n_vals == ps->cap_vals) {
        size_t cap = ps->cap_vals ? ps->cap_vals * 2 : 256;
        mm_json_value_t *g = realloc(ps->vals, cap * sizeof *g);
        if (g == NULL) return mm_json_oom(ps);
        ps->vals = g;
        ps->cap_vals = cap;
    }
    ps->vals[ps->n_vals++] = *v;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_json_push_mem(mm_json_parser_t *ps, const mm_json_member_t *m)
{
    if (ps->n_mems == ps->cap_mems) {
        size_t cap = ps->cap_mems ? ps->cap_mems * 2 : 256;
        mm_json_member_t *g = realloc(ps->mems, cap * sizeof *g);
        if (g == NULL) return mm_json_oom(ps);
        ps->mems = g;
        ps->cap_mems = cap;
    }
    ps->mems[ps->n_mems++] = *m;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_json_array(mm_json_parser_t *ps, mm_json_value_t *v, int depth)
{
    const char *open = ps->p;
    ps->p++; /* [ */
    size_t base = ps->n_vals;
    mm_json_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
    } else {
        for (;;) {
            mm_json_value_t item;
            MM_CHECK(mm_json_value(ps, &item, depth + 1));
            MM_CHECK(mm_json_push_val(ps, &item));
            if (ps->n_vals - base > UINT32_MAX - 1)
                return mm_json_fail_at(ps, ps->p, "array with more than 2^32 items");
            mm_json_skip_ws(ps);
            if (ps->p >= ps->end) return mm_json_fail_at(ps, open, "unterminated array");
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p == ']') {
                ps->p++;
                break;
            }
            return mm_json_fail_at(ps, ps->p, "expected ',' or ']' in an array");
        }
    }
    size_t n = ps->n_vals - base;
    v->type = MM_JSON_ARRAY;
    v->len = (uint32_t)n;
    v->u.items = NULL;
    if (n > 0) {
        v->u.items = mm_json_alloc(ps->doc, n * sizeof(mm_json_value_t));
        if (v->u.items == NULL) return mm_json_oom(ps);
        memcpy(v->u.items, ps->vals + base, n * sizeof(mm_json_value_t));
    }
    ps->n_vals = base;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_json_object(mm_json_parser_t *ps, mm_json_value_t *v, int depth)
{
    const char *open = ps->p;
    ps->p++; /* { */
    size_t base = ps->n_mems;
    mm_json_skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            mm_json_member_t m;
            mm_json_skip_ws(ps);
            if (ps->p >= ps->end) return mm_json_fail_at(ps, open, "unterminated object");
            if (*ps->p != '"') return mm_json_fail_at(ps, ps->p, "expected a member name string");
            MM_CHECK(mm_json_string(ps, &m.key, &m.key_len));
            mm_json_skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return mm_json_fail_at(ps, ps->p, "expected ':' after a member name");
            ps->p++;
            MM_CHECK(mm_json_value(ps, &m.value, depth + 1));
            MM_CHECK(mm_json_push_mem(ps, &m));
            if (ps->n_mems - base > UINT32_MAX - 1)
                return mm_json_fail_at(ps, ps->p, "object with more than 2^32 members");
            mm_json_skip_ws(ps);
            if (ps->p >= ps->end) return mm_json_fail_at(ps, open, "unterminated object");
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p == '}') {
                ps->p++;
                break;
            }
            return mm_json_fail_at(ps, ps->p, "expected ',' or '}' in an object");
        }
    }
    size_t n = ps->n_mems - base;
    v->type = MM_JSON_OBJECT;
    v->len = (uint32_t)n;
    v->u.members = NULL;
    if (n > 0) {
        v->u.members = mm_json_alloc(ps->doc, n * sizeof(mm_json_member_t));
        if (v->u.members == NULL) return mm_json_oom(ps);
        memcpy(v->u.members, ps->mems + base, n * sizeof(mm_json_member_t));
    }
    ps->n_mems = base;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_json_value(mm_json_parser_t *ps, mm_json_value_t *v, int depth)
{
    mm_json_skip_ws(ps);
    memset(v, 0, sizeof *v);
    v->line = ps->line;
    v->col = mm_json_col(ps, ps->p);
    if (depth > MM_JSON_MAX_DEPTH)
        return mm_json_fail_at(ps, ps->p, "nesting deeper than 256 levels");
    if (ps->p >= ps->end) return mm_json_fail_at(ps, ps->p, "a value was expected");
    switch (*ps->p) {
    case '{': return mm_json_object(ps, v, depth);
    case '[': return mm_json_array(ps, v, depth);
    case '"':
        v->type = MM_JSON_STRING;
        return mm_json_string(ps, &v->u.str, &v->len);
    case 't':
        v->type = MM_JSON_TRUE;
        return mm_json_literal(ps, "true") ? MEGAMOE_OK
                                           : mm_json_fail_at(ps, ps->p, "invalid literal");
    case 'f':
        v->type = MM_JSON_FALSE;
        return mm_json_literal(ps, "false") ? MEGAMOE_OK
                                            : mm_json_fail_at(ps, ps->p, "invalid literal");
    case 'n':
        v->type = MM_JSON_NULL;
        return mm_json_literal(ps, "null") ? MEGAMOE_OK
                                           : mm_json_fail_at(ps, ps->p, "invalid literal");
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return mm_json_number(ps, v);
        return mm_json_fail_at(ps, ps->p, "a value was expected");
    }
}

megamoe_status_t mm_json_parse(const char *text, size_t len, const char *source,
                               mm_json_doc_t **doc_p)
{
    if (source == NULL) source = "<json>";
    if (text == NULL && len > 0)
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "%s: no text to parse", source);
    if (len > (size_t)INT32_MAX)
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "%s: %zu bytes; JSON inputs over 2 GiB are not supported "
                              "(split the trace per rank)",
                              source, len);
    mm_json_doc_t *doc = calloc(1, sizeof *doc);
    if (doc == NULL) return mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "%s: out of memory", source);
    mm_json_parser_t ps;
    memset(&ps, 0, sizeof ps);
    ps.text = text ? text : "";
    ps.p = ps.text;
    ps.end = ps.text + len;
    ps.line_start = ps.text;
    ps.line = 1;
    ps.source = source;
    ps.doc = doc;
    /* A UTF-8 byte order mark is tolerated. */
    if (len >= 3 && memcmp(ps.p, "\xef\xbb\xbf", 3) == 0) {
        ps.p += 3;
        ps.line_start = ps.p;
    }
    megamoe_status_t st = mm_json_value(&ps, &doc->root, 0);
    if (st == MEGAMOE_OK) {
        mm_json_skip_ws(&ps);
        if (ps.p != ps.end) st = mm_json_fail_at(&ps, ps.p, "unexpected text after the value");
    }
    free(ps.vals);
    free(ps.mems);
    free(ps.buf);
    if (st != MEGAMOE_OK) {
        mm_json_free(doc);
        return st;
    }
    *doc_p = doc;
    return MEGAMOE_OK;
}

const mm_json_value_t *mm_json_root(const mm_json_doc_t *doc) { return &doc->root; }

void mm_json_free(mm_json_doc_t *doc)
{
    if (doc == NULL) return;
    mm_json_block_t *b = doc->blocks;
    while (b != NULL) {
        mm_json_block_t *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

/* ---- accessors ---------------------------------------------------------------------------- */

const mm_json_value_t *mm_json_get(const mm_json_value_t *v, const char *key)
{
    if (v == NULL || v->type != MM_JSON_OBJECT) return NULL;
    for (uint32_t i = 0; i < v->len; i++)
        if (strcmp(v->u.members[i].key, key) == 0) return &v->u.members[i].value;
    return NULL;
}

int mm_json_str_is(const mm_json_value_t *v, const char *s)
{
    return v != NULL && v->type == MM_JSON_STRING && strcmp(v->u.str, s) == 0;
}

int mm_json_scaled(const mm_json_value_t *v, int decimals, int64_t *out)
{
    if (v == NULL || v->type != MM_JSON_NUMBER || decimals < 0 || decimals > 9) return 0;
    const char *p = v->u.num, *end = v->u.num + v->len;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    /* Collect the significant digits and the decimal exponent of the last one. */
    const char *int_s = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    const char *int_e = p, *frac_s = p, *frac_e = p;
    if (p < end && *p == '.') {
        frac_s = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        frac_e = p;
    }
    int64_t exp10 = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        while (p < end) {
            if (exp10 < 100000) exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp10 = -exp10;
    }
    /* value = digits(int . frac) * 10^exp10; we want round(value * 10^decimals). The digit at
     * position k (0 = first integer digit) has weight 10^(n_int - 1 - k + exp10 + decimals). */
    int64_t n_int = int_e - int_s, n_frac = frac_e - frac_s;
    int64_t shift = exp10 + decimals; /* power of ten of the units digit */
    uint64_t acc = 0;
    int round_up = 0;
    for (int64_t k = 0; k < n_int + n_frac; k++) {
        char c = k < n_int ? int_s[k] : frac_s[k - n_int];
        int d = c - '0';
        int64_t weight = n_int - 1 - k + shift;
        if (weight >= 0) {
            if (d != 0 && weight > 18) return 0;
            uint64_t m = (uint64_t)d;
            for (int64_t w = 0; w < weight && m != 0; w++) {
                if (m > UINT64_MAX / 10) return 0;
                m *= 10;
            }
            if (acc > UINT64_MAX - m) return 0;
            acc += m;
        } else if (weight == -1) {
            round_up = d >= 5;
            break;
        } else {
            break;
        }
    }
    if (round_up) {
        if (acc == UINT64_MAX) return 0;
        acc++;
    }
    if (!neg && acc > (uint64_t)INT64_MAX) return 0;
    if (neg && acc > (uint64_t)INT64_MAX + 1) return 0;
    *out = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 1;
}

int mm_json_int(const mm_json_value_t *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (v == NULL || v->type != MM_JSON_NUMBER) return 0;
    for (uint32_t i = 0; i < v->len; i++)
        if (v->u.num[i] == '.' || v->u.num[i] == 'e' || v->u.num[i] == 'E') {
            /* 1.0 or 1e3 are integral too: accept when scaling loses nothing. */
            int64_t a, b, a1000;
            if (!mm_json_scaled(v, 0, &a) || !mm_json_scaled(v, 3, &b)) return 0;
            /* a * 1000 beyond int64 cannot equal b (found by fuzzing: signed overflow) */
            if (__builtin_mul_overflow(a, 1000, &a1000) || b != a1000) return 0;
            break;
        }
    int64_t x;
    if (!mm_json_scaled(v, 0, &x) || x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

int mm_json_double(const mm_json_value_t *v, double *out)
{
    if (v == NULL || v->type != MM_JSON_NUMBER) return 0;
    const char *p = v->u.num, *end = v->u.num + v->len;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    long double mant = 0;
    long exp10 = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) mant = mant * 10 + (*p - '0');
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            mant = mant * 10 + (*p - '0');
            exp10--;
        }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        long e = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        for (; p < end; p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    long double x = mant * powl(10.0L, (long double)exp10);
    *out = (double)(neg ? -x : x);
    return 1;
}

const char *mm_json_type_name(mm_json_type_t type)
{
    switch (type) {
    case MM_JSON_NULL: return "null";
    case MM_JSON_FALSE:
    case MM_JSON_TRUE: return "a boolean";
    case MM_JSON_NUMBER: return "a number";
    case MM_JSON_STRING: return "a string";
    case MM_JSON_ARRAY: return "an array";
    case MM_JSON_OBJECT: return "an object";
    }
    return "unknown";
}
