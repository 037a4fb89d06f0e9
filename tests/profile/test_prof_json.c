/* The strict JSON reader of the trace tools: values, escapes, exact numbers, every kind of
 * malformed input (with its position), and random corruption of a real trace (never a crash:
 * run under ASan). */
#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "profile/json.h"
#include "profile/prof.h"

static mm_json_doc_t *parse_ok(const char *text)
{
    mm_json_doc_t *doc = NULL;
    if (mm_json_parse(text, strlen(text), "t.json", &doc) != MEGAMOE_OK) return NULL;
    return doc;
}

MM_TEST(values_and_structure)
{
    const char *text = " {\"a\": [1, -2.5, true, false, null, \"x\"], \"b\": {\"c\": {}}, \"d\": []} ";
    mm_json_doc_t *doc = parse_ok(text);
    ASSERT_TRUE(doc != NULL);
    const mm_json_value_t *root = mm_json_root(doc);
    ASSERT_EQ_INT(root->type, MM_JSON_OBJECT);
    ASSERT_EQ_INT(root->len, 3);
    const mm_json_value_t *a = mm_json_get(root, "a");
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ_INT(a->type, MM_JSON_ARRAY);
    ASSERT_EQ_INT(a->len, 6);
    ASSERT_EQ_INT(a->u.items[0].type, MM_JSON_NUMBER);
    ASSERT_EQ_INT(a->u.items[2].type, MM_JSON_TRUE);
    ASSERT_EQ_INT(a->u.items[3].type, MM_JSON_FALSE);
    ASSERT_EQ_INT(a->u.items[4].type, MM_JSON_NULL);
    ASSERT_TRUE(mm_json_str_is(&a->u.items[5], "x"));
    double d;
    ASSERT_TRUE(mm_json_double(&a->u.items[1], &d));
    ASSERT_NEAR(d, -2.5, 0);
    const mm_json_value_t *c = mm_json_get(mm_json_get(root, "b"), "c");
    ASSERT_TRUE(c != NULL && c->type == MM_JSON_OBJECT && c->len == 0);
    ASSERT_EQ_INT(mm_json_get(root, "d")->len, 0);
    ASSERT_TRUE(mm_json_get(root, "missing") == NULL);
    ASSERT_TRUE(mm_json_get(a, "a") == NULL); /* not an object */
    mm_json_free(doc);
}

MM_TEST(string_escapes_and_unicode)
{
    mm_json_doc_t *doc =
        parse_ok("[\"q\\\"b\\\\s\\/n\\nt\\tr\\rb\\bf\\f\", \"\\u00e9\\u4e2d\\ud83d\\ude00\", \"raw \xc3\xa9\"]");
    ASSERT_TRUE(doc != NULL);
    const mm_json_value_t *r = mm_json_root(doc);
    ASSERT_EQ_STR(r->u.items[0].u.str, "q\"b\\s/n\nt\tr\rb\bf\f");
    ASSERT_EQ_STR(r->u.items[1].u.str, "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
    ASSERT_EQ_INT(r->u.items[1].len, 9);
    ASSERT_EQ_STR(r->u.items[2].u.str, "raw \xc3\xa9");
    mm_json_free(doc);
}

MM_TEST(exact_scaled_numbers)
{
    struct {
        const char *text;
        int decimals;
        int64_t want;
    } cases[] = {
        {"123456.789", 3, 123456789},     {"0", 3, 0},
        {"1e3", 3, 1000000},              {"1.5E-3", 3, 2}, /* 1.5 -> 2, half away from zero */
        {"-0.0005", 3, -1},               {"12.3456", 3, 12346},
        {"9007199254740993", 0, 9007199254740993LL}, /* above 2^53: exact, unlike a double */
        {"4102444800000000.001", 3, 4102444800000000001LL},
        {"-42", 0, -42},                  {"0.1", 0, 0},
        {"250e-2", 1, 25},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "[%s]", cases[i].text);
        mm_json_doc_t *doc = parse_ok(text);
        ASSERT_TRUE(doc != NULL);
        int64_t v = -777;
        int ok = mm_json_scaled(&mm_json_root(doc)->u.items[0], cases[i].decimals, &v);
        mm_json_free(doc);
        if (!ok) MM_FAIL_("%s: not read", cases[i].text);
        if (v != cases[i].want) MM_FAIL_("%s: %lld != %lld", cases[i].text, (long long)v, (long long)cases[i].want);
    }
    /* Out of range and non-integers. */
    mm_json_doc_t *doc = parse_ok("[1e30, 99999999999999999999, 1.5, 2.0, \"7\"]");
    ASSERT_TRUE(doc != NULL);
    const mm_json_value_t *r = mm_json_root(doc);
    int64_t v;
    ASSERT_FALSE(mm_json_scaled(&r->u.items[0], 0, &v));
    ASSERT_FALSE(mm_json_scaled(&r->u.items[1], 0, &v));
    ASSERT_FALSE(mm_json_int(&r->u.items[2], 0, 10, &v));
    ASSERT_TRUE(mm_json_int(&r->u.items[3], 0, 10, &v));
    ASSERT_EQ_INT(v, 2);
    ASSERT_FALSE(mm_json_int(&r->u.items[3], 3, 10, &v)); /* out of [lo, hi] */
    ASSERT_FALSE(mm_json_scaled(&r->u.items[4], 0, &v));  /* a string */
    mm_json_free(doc);
    /* An integer check on a number near INT64_MAX / 1000 with a fraction (found by fuzzing:
     * a signed overflow, UB, in mm_json_int; tests/fuzz/regressions/trace/). */
    doc = parse_ok("[9223372036854775.807, -9223372036854775.808, 9223372036854775.000]");
    ASSERT_TRUE(doc != NULL);
    r = mm_json_root(doc);
    ASSERT_FALSE(mm_json_int(&r->u.items[0], INT64_MIN, INT64_MAX, &v));
    ASSERT_FALSE(mm_json_int(&r->u.items[1], INT64_MIN, INT64_MAX, &v));
    ASSERT_TRUE(mm_json_int(&r->u.items[2], INT64_MIN, INT64_MAX, &v)); /* x 1000 still fits */
    ASSERT_EQ_INT(v, 9223372036854775LL);
    mm_json_free(doc);
}

MM_TEST(malformed_inputs_are_errors_with_positions)
{
    struct {
        const char *text;
        const char *what;
    } bad[] = {
        {"", "a value was expected"},
        {"   ", "a value was expected"},
        {"{", "unterminated object"},
        {"[1,]", "a value was expected"},
        {"[1 2]", "expected ',' or ']'"},
        {"{\"a\":}", "a value was expected"},
        {"{\"a\" 1}", "expected ':'"},
        {"{a:1}", "expected a member name"},
        {"{\"a\":1,}", "expected a member name"},
        {"tru", "invalid literal"},
        {"nul", "invalid literal"},
        {"01", "leading zero"},
        {"1.", "digits expected after '.'"},
        {"1e", "digits expected in exponent"},
        {"-", "invalid number"},
        {"+1", "a value was expected"},
        {"\"abc", "unterminated string"},
        {"\"a\\x\"", "unknown escape"},
        {"\"\\u12\"", "four hex digits"},
        {"\"\\ud800\"", "unpaired UTF-16 high surrogate"},
        {"\"\\udc00\"", "unpaired UTF-16 low surrogate"},
        {"\"\\u0000\"", "\\u0000"},
        {"\"a\tb\"", "control character"},
        {"{} x", "unexpected text after the value"},
        {"[\"a\"]]", "unexpected text after the value"},
        {"'a'", "a value was expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mm_json_doc_t *doc = NULL;
        megamoe_status_t st = mm_json_parse(bad[i].text, strlen(bad[i].text), "bad.json", &doc);
        if (st != MEGAMOE_INVALID_ARGUMENT) MM_FAIL_("'%s' parsed (status %d)", bad[i].text, st);
        if (doc != NULL) MM_FAIL_("'%s': document returned on error", bad[i].text);
        if (strstr(megamoe_last_error(), bad[i].what) == NULL)
            MM_FAIL_("'%s': error '%s' lacks '%s'", bad[i].text, megamoe_last_error(), bad[i].what);
        ASSERT_CONTAINS(megamoe_last_error(), "bad.json:1:");
    }
    /* The position is line:column of the problem. */
    const char *text = "{\n  \"a\": 1,\n  \"b\": tru\n}";
    mm_json_doc_t *doc = NULL;
    ASSERT_STATUS(mm_json_parse(text, strlen(text), "pos.json", &doc), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "pos.json:3:8:");
    /* An unterminated array points at its opening bracket, lines before. */
    const char *open = "[\n1,\n2\n";
    ASSERT_STATUS(mm_json_parse(open, strlen(open), "open.json", &doc), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "open.json:1:1:");
    /* Embedded NUL bytes are not whitespace. */
    const char nul[] = {'[', '1', ']', '\0', ' '};
    ASSERT_STATUS(mm_json_parse(nul, sizeof nul, "nul.json", &doc), MEGAMOE_INVALID_ARGUMENT);
}

MM_TEST(deep_nesting_is_refused_not_a_crash)
{
    size_t n = 100000;
    char *text = malloc(2 * n + 1);
    ASSERT_TRUE(text != NULL);
    memset(text, '[', n);
    memset(text + n, ']', n);
    text[2 * n] = '\0';
    mm_json_doc_t *doc = NULL;
    ASSERT_STATUS(mm_json_parse(text, 2 * n, "deep.json", &doc), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "nesting deeper than 256");
    /* 200 levels are fine. */
    memset(text, '[', 200);
    memset(text + 200, ']', 200);
    ASSERT_OK(mm_json_parse(text, 400, "ok.json", &doc));
    mm_json_free(doc);
    free(text);
}

MM_TEST(large_arrays)
{
    size_t n = 200000;
    char *text = malloc(n * 8 + 16);
    ASSERT_TRUE(text != NULL);
    size_t k = 0;
    text[k++] = '[';
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(text + k, "%s%zu", i ? "," : "", i);
    text[k++] = ']';
    mm_json_doc_t *doc = NULL;
    ASSERT_OK(mm_json_parse(text, k, "big.json", &doc));
    const mm_json_value_t *r = mm_json_root(doc);
    ASSERT_EQ_INT(r->len, n);
    int64_t v;
    ASSERT_TRUE(mm_json_int(&r->u.items[n - 1], 0, INT64_MAX, &v));
    ASSERT_EQ_INT(v, (long long)n - 1);
    mm_json_free(doc);
    free(text);
}

/* A real export, then thousands of corrupted copies: each parses or fails cleanly. */
MM_TEST(random_corruption_never_crashes)
{
    static const char *const stages[] = {"dispatch", "gmm1"};
    mm_prof_session_t *s;
    ASSERT_OK(mm_prof_session_create(0, 1, 1, 64, stages, 2, &s));
    uint32_t inv = mm_prof_begin(s, "forward");
    for (int i = 0; i < 20; i++)
        mm_prof_push(mm_prof_ring(s, i % 2 ? MM_PROF_CUBE : MM_PROF_VECTOR, 0), (uint8_t)(i % 3),
                     (uint8_t)(i % 2), i, i % 4, i % 3 - 1, inv, 1000 * (uint64_t)i,
                     1000 * (uint64_t)i + 900);
    mm_prof_end(s);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ASSERT_OK(mm_prof_export_chrome(s, mem));
    fclose(mem);
    mm_prof_session_destroy(s);
    mm_json_doc_t *doc = NULL;
    ASSERT_OK(mm_json_parse(text, len, "export", &doc));
    mm_json_free(doc);
    char *copy = malloc(len);
    ASSERT_TRUE(copy != NULL);
    unsigned seed = 12345;
    int ok = 0, failed = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, text, len);
        size_t n = len;
        int edits = 1 + (int)(rand_r(&seed) % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)rand_r(&seed) % n;
            switch (rand_r(&seed) % 4) {
            case 0: copy[at] = (char)(rand_r(&seed) & 0xff); break;  /* any byte */
            case 1: n = at; break;                                    /* truncate */
            case 2: copy[at] = "{}[]\",:\\0e-."[rand_r(&seed) % 13]; break;
            default: memmove(copy + at, copy + at + 1, n - at - 1); n--; /* delete */
            }
            if (n == 0) break;
        }
        doc = NULL;
        megamoe_status_t st = mm_json_parse(copy, n, "fuzz", &doc);
        if (st == MEGAMOE_OK) {
            ok++;
            mm_json_free(doc);
        } else {
            if (st != MEGAMOE_INVALID_ARGUMENT) MM_FAIL_("iteration %d: status %d", iter, st);
            failed++;
        }
    }
    ASSERT_TRUE(failed > 1000); /* the corruption did bite */
    printf("corrupted traces: %d parsed, %d refused\n", ok, failed);
    free(copy);
    free(text);
}
