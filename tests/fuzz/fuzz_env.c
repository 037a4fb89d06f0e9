/* Fuzz target: the environment parser (src/base/env.c) and the endpoint parser
 * (src/shmem/boot_net.c) — every variable of the one table set to arbitrary text, read back
 * through its typed getter, and the shared parsers called with arbitrary bounds.
 *
 * Beyond "no crash", each accepted value is checked against an independent reading of the
 * documented grammar (docs/env.md: integers "[+-]digits", sizes "digits[K|M|G|T][iB|B]",
 * booleans 0/1/true/false/on/off, enums one of the listed words, endpoints
 * tcp://host:port), the bounds the table prints in its "accepted" column, and every refusal
 * must name the variable. Input: records of (action, index or bounds, length, text).
 */
#include <ctype.h>
#include <inttypes.h>
#include <strings.h>

#include "megamoe/config.h"
#include "megamoe/log.h"
#include "megamoe/status.h"

#include "base/env.h"
#include "fuzz.h"
#include "shmem/boot_net.h"

static void mm_fz_silent(megamoe_log_level_t level, const char *line, void *user)
{
    (void)level, (void)line, (void)user;
}

/* ---- independent readings of the grammar ---- */

static int mm_ref_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    const char *p = s;
    int neg = 0;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (*p == '\0') return 0;
    __int128 v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        v = v * 10 + (*p - '0');
        if (v > (__int128)INT64_MAX + 1) return 0;
    }
    if (neg) v = -v;
    if (v < INT64_MIN || v > INT64_MAX || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}

static int mm_ref_size(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *p = s;
    unsigned __int128 v = 0;
    if (*p < '0' || *p > '9') return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (unsigned)(*p - '0');
        if (v > UINT64_MAX) return 0;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: break;
    }
    if (shift) p++;
    if (shift && p[0] == 'i' && (p[1] == 'B' || p[1] == 'b')) p += 2;
    else if (*p == 'B' || *p == 'b') p++;
    if (*p != '\0') return 0;
    v <<= shift;
    if (v > UINT64_MAX || v < lo || v > hi) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int mm_ref_bool(const char *s, int *out)
{
    static const char *const words[6] = {"1", "true", "on", "0", "false", "off"};
    for (int i = 0; i < 6; i++)
        if (strcasecmp(s, words[i]) == 0) {
            *out = i < 3;
            return 1;
        }
    return 0;
}

static int mm_ref_blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return 0;
    return 1;
}

/* The enum getter's index must be the position of a case-insensitive match in CHOICES. */
static int mm_ref_enum(const char *choices, const char *s)
{
    int index = 0;
    size_t n = strlen(s);
    for (const char *c = choices; *c; index++) {
        const char *end = strchr(c, '|');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == n && strncasecmp(c, s, n) == 0) return index;
        if (!end) break;
        c = end + 1;
    }
    return -1;
}

static void mm_check_refusal(megamoe_status_t st, const char *name)
{
    FUZZ_CHECK(st == MEGAMOE_INVALID_ARGUMENT, "status %s", megamoe_status_name(st));
    FUZZ_CHECK(strstr(megamoe_last_error(), name) != NULL,
               "the refusal does not name %s: %s", name, megamoe_last_error());
}

/* ---- one variable through its getter ---- */

static void mm_check_getter(size_t index, const char *value)
{
    megamoe_config_entry_t e;
    FUZZ_CHECK(megamoe_config_entry(index, &e) == MEGAMOE_OK, "entry %zu", index);
    const char *text = value ? value : (e.default_value[0] ? e.default_value : NULL);
    mm_env_id_t id = (mm_env_id_t)index;
    if (strcmp(e.type, "int") == 0) {
        int64_t lo, hi, v = 0, want = 0;
        FUZZ_CHECK(sscanf(e.accepted, "integer in [%" SCNd64 ", %" SCNd64 "]", &lo, &hi) == 2,
                   "accepted text '%s'", e.accepted);
        megamoe_status_t st = mm_env_int(id, &v);
        if (text == NULL) {
            FUZZ_CHECK(st == MEGAMOE_NOT_FOUND, "unset %s: %s", e.name, megamoe_status_name(st));
        } else if (!mm_ref_blank(text) && mm_ref_int(text, lo, hi, &want)) {
            FUZZ_CHECK(st == MEGAMOE_OK && v == want, "%s='%s': got %s %" PRId64 ", want %" PRId64,
                       e.name, text, megamoe_status_name(st), v, want);
        } else {
            mm_check_refusal(st, e.name);
        }
    } else if (strcmp(e.type, "size") == 0) {
        int64_t lo, hi;
        uint64_t v = 0, want = 0;
        FUZZ_CHECK(sscanf(e.accepted, "bytes, optional suffix K/M/G/T (x1024), in [%" SCNd64
                                      ", %" SCNd64 "]", &lo, &hi) == 2,
                   "accepted text '%s'", e.accepted);
        megamoe_status_t st = mm_env_size(id, &v);
        if (text == NULL) {
            FUZZ_CHECK(st == MEGAMOE_NOT_FOUND, "unset %s", e.name);
        } else if (mm_ref_size(text, (uint64_t)lo, (uint64_t)hi, &want)) {
            FUZZ_CHECK(st == MEGAMOE_OK && v == want, "%s='%s': got %s %" PRIu64 ", want %" PRIu64,
                       e.name, text, megamoe_status_name(st), v, want);
        } else {
            mm_check_refusal(st, e.name);
        }
    } else if (strcmp(e.type, "bool") == 0) {
        int v = -1, want = -1;
        megamoe_status_t st = mm_env_bool(id, &v);
        if (text == NULL) FUZZ_CHECK(st == MEGAMOE_NOT_FOUND, "unset %s", e.name);
        else if (mm_ref_bool(text, &want))
            FUZZ_CHECK(st == MEGAMOE_OK && v == want, "%s='%s'", e.name, text);
        else mm_check_refusal(st, e.name);
    } else if (strcmp(e.type, "enum") == 0) {
        int v = -1;
        FUZZ_CHECK(strncmp(e.accepted, "one of ", 7) == 0, "accepted text '%s'", e.accepted);
        megamoe_status_t st = mm_env_enum(id, &v);
        if (text == NULL) {
            FUZZ_CHECK(st == MEGAMOE_NOT_FOUND, "unset %s", e.name);
        } else {
            int want = mm_ref_enum(e.accepted + 7, text);
            if (want >= 0) FUZZ_CHECK(st == MEGAMOE_OK && v == want, "%s='%s'", e.name, text);
            else mm_check_refusal(st, e.name);
        }
    } else {
        FUZZ_CHECK(strcmp(e.type, "string") == 0, "type %s", e.type);
        const char *v = NULL;
        FUZZ_CHECK(mm_env_string(id, &v) == MEGAMOE_OK && v != NULL, "%s", e.name);
        FUZZ_CHECK(strcmp(v, text ? text : "") == 0, "%s: got '%s'", e.name, v);
    }
}

/* ---- the endpoint parser ---- */

static void mm_check_endpoint(const char *text)
{
    mm_endpoint_t ep;
    memset(&ep, 0x5a, sizeof ep);
    megamoe_status_t st = mm_endpoint_parse(text, "FUZZ_ENDPOINT", &ep);
    if (st != MEGAMOE_OK) {
        mm_check_refusal(st, "FUZZ_ENDPOINT");
        return;
    }
    size_t len = strlen(text);
    FUZZ_CHECK(len <= MM_ENDPOINT_MAX_LEN && strncmp(text, "tcp://", 6) == 0, "'%s'", text);
    FUZZ_CHECK(ep.port >= 1 && ep.port <= 65535, "'%s' port %d", text, ep.port);
    FUZZ_CHECK(strcmp(ep.text, text) == 0, "text '%s' vs '%s'", ep.text, text);
    size_t hl = strlen(ep.host);
    FUZZ_CHECK(hl > 0, "'%s': empty host accepted", text);
    int v6 = text[6] == '[';
    for (size_t i = 0; i < hl; i++) {
        char c = ep.host[i];
        int ok = v6 ? (isxdigit((unsigned char)c) || c == ':' || c == '.')
                    : (isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_');
        FUZZ_CHECK(ok, "'%s': host '%s' has '%c'", text, ep.host, c);
    }
    /* The parts say everything: host and port written back parse to the same endpoint. */
    char again[2 * MM_ENDPOINT_MAX_LEN];
    snprintf(again, sizeof again, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", ep.host, ep.port);
    mm_endpoint_t ep2;
    FUZZ_CHECK(mm_endpoint_parse(again, "FUZZ_ENDPOINT", &ep2) == MEGAMOE_OK, "'%s'", again);
    FUZZ_CHECK(strcmp(ep2.host, ep.host) == 0 && ep2.port == ep.port, "'%s' vs '%s'", again, text);
    const char *colon = strrchr(text, ':');
    int64_t port;
    FUZZ_CHECK(colon && mm_ref_int(colon + 1, 1, 65535, &port) && port == ep.port &&
                   colon[1] != '+' && colon[1] != '-',
               "'%s' port text", text);
}

/* ---- the harness ---- */

static char *mm_saved[64];
static int mm_saved_set[64];

/* setenv() keeps every distinct value it was given (glibc never frees them): millions of
 * fuzz inputs would grow the process without bound. putenv() of one buffer per variable
 * reuses the memory. */
static char mm_env_buf[64][400];

static void mm_setenv(size_t index, const char *name, const char *value)
{
    snprintf(mm_env_buf[index], sizeof mm_env_buf[index], "%s=%s", name, value);
    putenv(mm_env_buf[index]);
}

static void mm_init_once(void)
{
    static int done;
    if (done) return;
    done = 1;
    megamoe_log_set_callback(mm_fz_silent, NULL);
    size_t n = megamoe_config_count();
    FUZZ_CHECK(n <= 64, "%zu variables", n);
    for (size_t i = 0; i < n; i++) {
        megamoe_config_entry_t e;
        megamoe_config_entry(i, &e);
        const char *v = getenv(e.name);
        mm_saved_set[i] = v != NULL;
        mm_saved[i] = v ? strdup(v) : NULL;
    }
}

static void mm_restore_env(void)
{
    for (size_t i = 0; i < megamoe_config_count(); i++) {
        megamoe_config_entry_t e;
        megamoe_config_entry(i, &e);
        if (mm_saved_set[i]) mm_setenv(i, e.name, mm_saved[i]);
        else unsetenv(e.name);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mm_init_once();
    mm_fz_t f = {data, size};
    static FILE *devnull;
    if (devnull == NULL) devnull = fopen("/dev/null", "w");
    size_t nvars = megamoe_config_count();
    for (int record = 0; record < 32 && f.n > 0; record++) {
        uint8_t action = mm_fz_u8(&f) % 8;
        uint8_t index_byte = mm_fz_u8(&f);
        size_t index = index_byte % nvars;
        int64_t a = 0, b = 0;
        if (action == 2 || action == 3) {
            a = mm_fz_int(&f);
            b = mm_fz_int(&f);
        }
        size_t len = mm_fz_u8(&f);
        if (action == 5) len *= 2; /* endpoints beyond the 255-character limit too */
        char text[520];
        size_t k = 0;
        for (; k < len && f.n > 0; k++) text[k] = (char)mm_fz_u8(&f);
        text[k] = '\0'; /* an embedded NUL ends the text, as in an environment */
        megamoe_config_entry_t e;
        megamoe_config_entry(index, &e);
        switch (action) {
        case 0:
            mm_setenv(index, e.name, text);
            mm_check_getter(index, text);
            break;
        case 1:
            unsetenv(e.name);
            mm_check_getter(index, NULL);
            break;
        case 2: {
            int64_t lo = a < b ? a : b, hi = a < b ? b : a, v = 0, want = 0;
            megamoe_status_t st = mm_parse_int("FUZZ_INT", text, lo, hi, &v);
            if (mm_ref_int(text, lo, hi, &want))
                FUZZ_CHECK(st == MEGAMOE_OK && v == want, "'%s' in [%" PRId64 ", %" PRId64 "]",
                           text, lo, hi);
            else
                mm_check_refusal(st, "FUZZ_INT");
            break;
        }
        case 3: {
            uint64_t x = (uint64_t)a, y = (uint64_t)b, lo = x < y ? x : y, hi = x < y ? y : x;
            uint64_t v = 0, want = 0;
            megamoe_status_t st = mm_parse_size("FUZZ_SIZE", text, lo, hi, &v);
            if (mm_ref_size(text, lo, hi, &want))
                FUZZ_CHECK(st == MEGAMOE_OK && v == want, "'%s' in [%" PRIu64 ", %" PRIu64 "]",
                           text, lo, hi);
            else
                mm_check_refusal(st, "FUZZ_SIZE");
            break;
        }
        case 4: {
            int v = -1, want = -1;
            megamoe_status_t st = mm_parse_bool("FUZZ_BOOL", text, &v);
            if (mm_ref_bool(text, &want)) FUZZ_CHECK(st == MEGAMOE_OK && v == want, "'%s'", text);
            else mm_check_refusal(st, "FUZZ_BOOL");
            break;
        }
        case 5:
            mm_check_endpoint(text);
            break;
        case 6: {
            megamoe_status_t st = megamoe_config_validate();
            FUZZ_CHECK(st == MEGAMOE_OK || st == MEGAMOE_INVALID_ARGUMENT, "validate: %s",
                       megamoe_status_name(st));
            FUZZ_CHECK(megamoe_config_print(devnull, (int)(index & 1)) == MEGAMOE_OK, "print");
            break;
        }
        default: {
            megamoe_config_entry_t x;
            size_t i = (size_t)(int64_t)(int8_t)index_byte; /* also far out of range */
            megamoe_status_t st = megamoe_config_entry(i, &x);
            FUZZ_CHECK((st == MEGAMOE_OK) == (i < nvars), "entry %zu", i);
            break;
        }
        }
    }
    mm_restore_env();
    return 0;
}

/* ---- seeds: one per variable with its default and a typical bad value, the parsers'
 *      edge cases, endpoints ---- */

static int mm_seed(const char *dir, int *count, uint8_t action, uint8_t index, int64_t a,
                   int64_t b, const char *text)
{
    mm_fz_buf_t buf;
    buf.n = 0;
    mm_fz_put_u8(&buf, action);
    mm_fz_put_u8(&buf, index);
    if (action == 2 || action == 3) {
        mm_fz_put_int(&buf, a);
        mm_fz_put_int(&buf, b);
    }
    size_t len = strlen(text);
    if (action == 5) {
        len += len & 1; /* the harness reads 2 * the length byte */
        mm_fz_put_u8(&buf, (uint8_t)(len / 2));
    } else {
        mm_fz_put_u8(&buf, (uint8_t)len);
    }
    mm_fz_put_bytes(&buf, text, strlen(text));
    if (len > strlen(text)) mm_fz_put_u8(&buf, 0); /* an odd length: a NUL ends the text */
    char name[64];
    snprintf(name, sizeof name, "seed_%03d", (*count)++);
    return mm_fz_save(dir, name, buf.data, buf.n);
}

int mm_fuzz_write_seeds(const char *dir)
{
    int count = 0, rc = 0;
    for (size_t i = 0; i < megamoe_config_count(); i++) {
        megamoe_config_entry_t e;
        megamoe_config_entry(i, &e);
        rc |= mm_seed(dir, &count, 0, (uint8_t)i, 0, 0, e.default_value);
        rc |= mm_seed(dir, &count, 0, (uint8_t)i, 0, 0,
                      strcmp(e.type, "size") == 0 ? "64MiB" : strcmp(e.type, "int") == 0 ? "-7"
                      : strcmp(e.type, "bool") == 0 ? "On" : "debug");
    }
    const char *ints[] = {"0", "+12", "-9223372036854775808", "9223372036854775808", "1e3", " 5"};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        rc |= mm_seed(dir, &count, 2, 0, INT64_MIN, INT64_MAX, ints[i]);
    const char *sizes[] = {"1024", "64M", "64MiB", "2GB", "18446744073709551615", "16T", "1KiBB",
                           "0x10"};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        rc |= mm_seed(dir, &count, 3, 0, 0, -1, sizes[i]);
    rc |= mm_seed(dir, &count, 4, 0, 0, 0, "FALSE");
    const char *eps[] = {"tcp://127.0.0.1:8662", "tcp://[::1]:1", "tcp://host-a.b_c:65535",
                         "tcp://h:0", "tcp://h:65536", "tcp://:80", "tcp://[]:80", "udp://h:80",
                         "tcp://h:80 ", "tcp://[::1]80"};
    for (size_t i = 0; i < sizeof eps / sizeof *eps; i++) rc |= mm_seed(dir, &count, 5, 0, 0, 0, eps[i]);
    char longest[300];
    memset(longest, 'h', sizeof longest);
    memcpy(longest, "tcp://", 6);
    memcpy(longest + 290, ":8662", 6); /* 295 characters */
    rc |= mm_seed(dir, &count, 5, 0, 0, 0, longest);
    rc |= mm_seed(dir, &count, 6, 1, 0, 0, "");
    rc |= mm_seed(dir, &count, 7, 200, 0, 0, "");
    return rc ? -1 : count;
}
