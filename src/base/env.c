/* The environment table: strict parsers, getters, and the printed/markdown listing. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/config.h"

#include "env.h"
#include "error.h"

typedef enum { MM_ENV_STRING, MM_ENV_SIZE, MM_ENV_BOOL, MM_ENV_INT, MM_ENV_ENUM } mm_env_type_t;

typedef struct mm_env_def {
    const char *name;
    mm_env_type_t type;
    const char *def;
    int64_t lo, hi;
    const char *choices;
    const char *help;
} mm_env_def_t;

static const mm_env_def_t mm_env_defs[MM_ENV_COUNT] = {
#define MM_ENV_DEF_(id, name, type, def, lo, hi, choices, help) \
    {name, MM_ENV_##type, def, (int64_t)(lo), (int64_t)(hi), choices, help},
    MM_ENV_TABLE(MM_ENV_DEF_)
#undef MM_ENV_DEF_
};

static const char *const mm_env_type_names[] = {"string", "size", "bool", "int", "enum"};

int mm_env_is_set(mm_env_id_t id) { return getenv(mm_env_defs[id].name) != NULL; }

const char *mm_env_name(mm_env_id_t id) { return mm_env_defs[id].name; }

static void mm_env_accepted(const mm_env_def_t *d, char *buf, size_t len)
{
    switch (d->type) {
    case MM_ENV_STRING:
        snprintf(buf, len, "text");
        break;
    case MM_ENV_SIZE:
        snprintf(buf, len, "bytes, optional suffix K/M/G/T (x1024), in [%" PRId64 ", %" PRId64 "]",
                 d->lo, d->hi);
        break;
    case MM_ENV_BOOL:
        snprintf(buf, len, "0, 1, true, false, on or off");
        break;
    case MM_ENV_INT:
        snprintf(buf, len, "integer in [%" PRId64 ", %" PRId64 "]", d->lo, d->hi);
        break;
    case MM_ENV_ENUM:
        snprintf(buf, len, "one of %s", d->choices);
        break;
    }
}

static int mm_is_blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return 0;
    return 1;
}

megamoe_status_t mm_parse_int(const char *name, const char *text, int64_t lo, int64_t hi,
                              int64_t *value_p)
{
    const char *p = text;
    if (*p == '+' || *p == '-') p++;
    int digits = 0;
    for (const char *q = p; *q; q++) {
        if (!isdigit((unsigned char)*q)) {
            digits = -1;
            break;
        }
        digits++;
    }
    if (digits <= 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s='%s' is not an integer; use an integer in [%" PRId64 ", %" PRId64 "]",
                        name, text, lo, hi);
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s=%s is out of range; use an integer in [%" PRId64 ", %" PRId64 "]", name,
                        text, lo, hi);
    *value_p = (int64_t)v;
    return MEGAMOE_OK;
}

megamoe_status_t mm_parse_size(const char *name, const char *text, uint64_t lo, uint64_t hi,
                               uint64_t *value_p)
{
    const char *p = text;
    uint64_t v = 0;
    int digits = 0;
    for (; isdigit((unsigned char)*p); p++, digits++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) goto range;
        v = v * 10 + d;
    }
    if (digits == 0) goto bad;
    uint64_t mult = 1;
    switch (toupper((unsigned char)*p)) {
    case 'K': mult = 1ull << 10; p++; break;
    case 'M': mult = 1ull << 20; p++; break;
    case 'G': mult = 1ull << 30; p++; break;
    case 'T': mult = 1ull << 40; p++; break;
    default: break;
    }
    /* Optional unit letters: "B", or "iB" after a suffix ("64MiB", "64MB", "1024B"). */
    if (mult > 1 && *p == 'i' && toupper((unsigned char)p[1]) == 'B') p += 2;
    else if (toupper((unsigned char)*p) == 'B') p++;
    if (*p != '\0') goto bad;
    if (v > UINT64_MAX / mult) goto range;
    v *= mult;
    if (v < lo || v > hi) goto range;
    *value_p = v;
    return MEGAMOE_OK;
bad:
    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                    "%s='%s' is not a size; use bytes with an optional K/M/G/T suffix, e.g. 256M",
                    name, text);
range:
    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                    "%s=%s is out of range; use a size in [%" PRIu64 ", %" PRIu64 "] bytes", name,
                    text, lo, hi);
}

megamoe_status_t mm_parse_bool(const char *name, const char *text, int *value_p)
{
    static const char *const yes[] = {"1", "true", "on"};
    static const char *const no[] = {"0", "false", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = 1;
            return MEGAMOE_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = 0;
            return MEGAMOE_OK;
        }
    }
    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                    "%s='%s' is not a boolean; use 0, 1, true, false, on or off", name, text);
}

/* Value text: the environment's, else the default. NULL when neither. */
static const char *mm_env_text(mm_env_id_t id)
{
    const char *v = getenv(mm_env_defs[id].name);
    if (v != NULL) return v;
    return mm_env_defs[id].def[0] ? mm_env_defs[id].def : NULL;
}

static megamoe_status_t mm_env_type_check(mm_env_id_t id, mm_env_type_t want)
{
    if (id < 0 || id >= MM_ENV_COUNT || mm_env_defs[id].type != want)
        return mm_error(MEGAMOE_INTERNAL, "environment variable id %d read with the wrong type",
                        (int)id);
    return MEGAMOE_OK;
}

megamoe_status_t mm_env_int(mm_env_id_t id, int64_t *value_p)
{
    MM_CHECK(mm_env_type_check(id, MM_ENV_INT));
    const mm_env_def_t *d = &mm_env_defs[id];
    const char *t = mm_env_text(id);
    if (t == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "%s is not set", d->name);
    if (mm_is_blank(t))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s is set but empty; use an integer in [%" PRId64 ", %" PRId64 "]",
                        d->name, d->lo, d->hi);
    return mm_parse_int(d->name, t, d->lo, d->hi, value_p);
}

megamoe_status_t mm_env_size(mm_env_id_t id, uint64_t *value_p)
{
    MM_CHECK(mm_env_type_check(id, MM_ENV_SIZE));
    const mm_env_def_t *d = &mm_env_defs[id];
    const char *t = mm_env_text(id);
    if (t == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "%s is not set", d->name);
    return mm_parse_size(d->name, t, (uint64_t)d->lo, (uint64_t)d->hi, value_p);
}

megamoe_status_t mm_env_bool(mm_env_id_t id, int *value_p)
{
    MM_CHECK(mm_env_type_check(id, MM_ENV_BOOL));
    const mm_env_def_t *d = &mm_env_defs[id];
    const char *t = mm_env_text(id);
    if (t == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "%s is not set", d->name);
    return mm_parse_bool(d->name, t, value_p);
}

megamoe_status_t mm_env_enum(mm_env_id_t id, int *index_p)
{
    MM_CHECK(mm_env_type_check(id, MM_ENV_ENUM));
    const mm_env_def_t *d = &mm_env_defs[id];
    const char *t = mm_env_text(id);
    if (t == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "%s is not set", d->name);
    int index = mm_env_choice_index(d->choices, t);
    if (index >= 0) {
        *index_p = index;
        return MEGAMOE_OK;
    }
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s='%s' is not accepted; use one of %s", d->name,
                    t, d->choices);
}

megamoe_status_t mm_env_string(mm_env_id_t id, const char **value_p)
{
    MM_CHECK(mm_env_type_check(id, MM_ENV_STRING));
    const char *t = mm_env_text(id);
    *value_p = t ? t : "";
    return MEGAMOE_OK;
}

/* ---- public listing ---- */

size_t megamoe_config_count(void) { return MM_ENV_COUNT; }

static _Thread_local char mm_env_accepted_buf[MM_ENV_COUNT][160];

megamoe_status_t megamoe_config_entry(size_t index, megamoe_config_entry_t *entry_p)
{
    if (entry_p == NULL || index >= MM_ENV_COUNT)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "config entry %zu out of range [0, %d)", index,
                        (int)MM_ENV_COUNT);
    const mm_env_def_t *d = &mm_env_defs[index];
    mm_env_accepted(d, mm_env_accepted_buf[index], sizeof mm_env_accepted_buf[index]);
    entry_p->name = d->name;
    entry_p->type = mm_env_type_names[d->type];
    entry_p->default_value = d->def;
    entry_p->accepted = mm_env_accepted_buf[index];
    entry_p->help = d->help;
    entry_p->value = getenv(d->name);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_config_validate(void)
{
    for (int i = 0; i < MM_ENV_COUNT; i++) {
        if (!mm_env_is_set((mm_env_id_t)i)) continue;
        megamoe_status_t st = MEGAMOE_OK;
        int b, e;
        int64_t v;
        uint64_t s;
        switch (mm_env_defs[i].type) {
        case MM_ENV_STRING: break;
        case MM_ENV_SIZE: st = mm_env_size((mm_env_id_t)i, &s); break;
        case MM_ENV_BOOL: st = mm_env_bool((mm_env_id_t)i, &b); break;
        case MM_ENV_INT: st = mm_env_int((mm_env_id_t)i, &v); break;
        case MM_ENV_ENUM: st = mm_env_enum((mm_env_id_t)i, &e); break;
        }
        if (st != MEGAMOE_OK) return st;
    }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_config_print(FILE *out, int markdown)
{
    if (out == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "config print: NULL stream");
    if (markdown) {
        fprintf(out, "| variable | type | default | accepted values | meaning |\n");
        fprintf(out, "|---|---|---|---|---|\n");
    }
    for (size_t i = 0; i < MM_ENV_COUNT; i++) {
        megamoe_config_entry_t e;
        MM_CHECK(megamoe_config_entry(i, &e));
        if (markdown) {
            fprintf(out, "| `%s` | %s | %s | %s | %s |\n", e.name, e.type,
                    e.default_value[0] ? e.default_value : "(unset)", e.accepted, e.help);
        } else {
            fprintf(out, "%-40s = %-24s (default: %s)\n    %s\n    accepted: %s\n", e.name,
                    e.value ? e.value : "(unset)", e.default_value[0] ? e.default_value : "(unset)",
                    e.help, e.accepted);
        }
    }
    return MEGAMOE_OK;
}
