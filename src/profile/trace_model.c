/* The trace model: growable tables, interned strings, tracks and ranks (trace.h). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include "trace.h"

void mm_trace_init(mm_trace_t *t) { memset(t, 0, sizeof *t); }

void mm_trace_free(mm_trace_t *t)
{
    if (t == NULL) return;
    for (size_t i = 0; i < t->n_strings; i++) free(t->strings[i]);
    free(t->strings);
    free(t->hash);
    free(t->tracks);
    free(t->events);
    free(t->invs);
    free(t->ranks);
    free(t->warnings);
    memset(t, 0, sizeof *t);
}

/* Make room for one more element of a table. */
static megamoe_status_t mm_trace_grow(void **data, size_t n, size_t *cap, size_t elem,
                                      const char *what)
{
    if (n < *cap) return MEGAMOE_OK;
    size_t c = *cap ? *cap * 2 : 64;
    void *g = realloc(*data, c * elem);
    if (g == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: cannot grow the %s table to %zu entries",
                        what, c);
    *data = g;
    *cap = c;
    return MEGAMOE_OK;
}

static uint32_t mm_trace_hash_of(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static megamoe_status_t mm_trace_rehash(mm_trace_t *t)
{
    size_t cap = t->hash_cap ? t->hash_cap * 2 : 256;
    uint32_t *h = calloc(cap, sizeof *h);
    if (h == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: cannot grow the string table");
    for (size_t i = 0; i < t->n_strings; i++) {
        size_t at = mm_trace_hash_of(t->strings[i], strlen(t->strings[i])) & (cap - 1);
        while (h[at] != 0) at = (at + 1) & (cap - 1);
        h[at] = (uint32_t)i + 1;
    }
    free(t->hash);
    t->hash = h;
    t->hash_cap = cap;
    return MEGAMOE_OK;
}

int mm_trace_utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
        n = 2;
        cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3;
        cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)n > avail) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at a NUL */
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* s with every byte that starts no valid UTF-8 sequence replaced by U+FFFD (malloc'd). */
static char *mm_trace_sanitize(const char *s, size_t len, size_t *out_len)
{
    char *o = malloc(3 * len + 1);
    if (o == NULL) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int k = mm_trace_utf8_len((const unsigned char *)s + i, len - i);
        if (k == 0) {
            memcpy(o + n, "\xef\xbf\xbd", 3);
            n += 3;
            i++;
        } else {
            memcpy(o + n, s + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
        }
    }
    o[n] = '\0';
    *out_len = n;
    return o;
}

megamoe_status_t mm_trace_intern(mm_trace_t *t, const char *s, size_t len, uint32_t *id_p)
{
    for (size_t i = 0; i < len;) {
        int k = mm_trace_utf8_len((const unsigned char *)s + i, len - i);
        if (k == 0) {
            size_t clean_len;
            char *clean = mm_trace_sanitize(s, len, &clean_len);
            if (clean == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: cannot copy a string");
            megamoe_status_t st = mm_trace_intern(t, clean, clean_len, id_p);
            free(clean);
            return st;
        }
        i += (size_t)k;
    }
    if ((t->n_strings + 1) * 2 > t->hash_cap) MM_CHECK(mm_trace_rehash(t));
    size_t at = mm_trace_hash_of(s, len) & (t->hash_cap - 1);
    while (t->hash[at] != 0) {
        const char *have = t->strings[t->hash[at] - 1];
        if (strncmp(have, s, len) == 0 && have[len] == '\0') {
            *id_p = t->hash[at] - 1;
            return MEGAMOE_OK;
        }
        at = (at + 1) & (t->hash_cap - 1);
    }
    MM_CHECK(mm_trace_grow((void **)&t->strings, t->n_strings, &t->cap_strings,
                           sizeof *t->strings, "string"));
    char *copy = malloc(len + 1);
    if (copy == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: cannot copy a string");
    memcpy(copy, s, len);
    copy[len] = '\0';
    t->strings[t->n_strings] = copy;
    t->hash[at] = (uint32_t)t->n_strings + 1;
    *id_p = (uint32_t)t->n_strings++;
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_warn(mm_trace_t *t, const char *fmt, ...)
{
    /* Whole, however long (a warning read from a file is kept as it was written). */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *text = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (text == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: cannot format a warning");
    va_start(ap, fmt);
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    va_end(ap);
    uint32_t id;
    megamoe_status_t st = mm_trace_intern(t, text, strlen(text), &id);
    free(text);
    MM_CHECK(st);
    for (size_t i = 0; i < t->n_warnings; i++)
        if (t->warnings[i] == id) return MEGAMOE_OK; /* same text once */
    MM_CHECK(mm_trace_grow((void **)&t->warnings, t->n_warnings, &t->cap_warnings,
                           sizeof *t->warnings, "warning"));
    t->warnings[t->n_warnings++] = id;
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_track(mm_trace_t *t, int pid, int group, int role, int worker,
                                uint32_t name, int want_tid, uint32_t *index_p)
{
    /* Only cube and vector tracks have a worker index: a launch track named with another
     * worker value is still the one launch track (found by fuzzing: a second one was made). */
    if (role != MM_TRACK_CUBE && role != MM_TRACK_VECTOR) worker = -1;
    int max_tid = -1, tid_taken = 0;
    for (size_t i = 0; i < t->n_tracks; i++) {
        const mm_trace_track_t *tr = &t->tracks[i];
        if (tr->pid != pid) continue;
        if (tr->group == group && tr->role == role &&
            (role == MM_TRACK_OTHER ? tr->name == name : tr->worker == worker)) {
            *index_p = (uint32_t)i;
            return MEGAMOE_OK;
        }
        if (tr->tid > max_tid) max_tid = tr->tid;
        if (tr->tid == want_tid) tid_taken = 1;
    }
    MM_CHECK(mm_trace_grow((void **)&t->tracks, t->n_tracks, &t->cap_tracks, sizeof *t->tracks,
                           "track"));
    mm_trace_track_t *tr = &t->tracks[t->n_tracks];
    tr->pid = pid;
    tr->group = group;
    tr->role = role;
    tr->worker = worker;
    tr->name = name;
    tr->tid = want_tid >= 0 && !tid_taken ? want_tid : max_tid + 1;
    *index_p = (uint32_t)t->n_tracks++;
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_rank(mm_trace_t *t, int pid, mm_trace_rank_t **rank_p)
{
    for (size_t i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].rank == pid) {
            *rank_p = &t->ranks[i];
            return MEGAMOE_OK;
        }
    uint32_t unknown;
    MM_CHECK(mm_trace_intern(t, "unknown", 7, &unknown));
    MM_CHECK(mm_trace_grow((void **)&t->ranks, t->n_ranks, &t->cap_ranks, sizeof *t->ranks,
                           "rank"));
    /* Keep ranks sorted: insert in place. */
    size_t at = t->n_ranks;
    while (at > 0 && t->ranks[at - 1].rank > pid) at--;
    memmove(&t->ranks[at + 1], &t->ranks[at], (t->n_ranks - at) * sizeof *t->ranks);
    memset(&t->ranks[at], 0, sizeof *t->ranks);
    t->ranks[at].rank = pid;
    t->ranks[at].host = unknown;
    t->n_ranks++;
    *rank_p = &t->ranks[at];
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_add_event(mm_trace_t *t, const mm_trace_event_t *e)
{
    MM_CHECK(mm_trace_grow((void **)&t->events, t->n_events, &t->cap_events, sizeof *t->events,
                           "event"));
    t->events[t->n_events++] = *e;
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_add_invocation(mm_trace_t *t, const mm_trace_invocation_t *inv)
{
    MM_CHECK(mm_trace_grow((void **)&t->invs, t->n_invs, &t->cap_invs, sizeof *t->invs,
                           "invocation"));
    t->invs[t->n_invs++] = *inv;
    return MEGAMOE_OK;
}

int mm_trace_group_count(const mm_trace_t *t, int pid)
{
    int count = 0;
    for (size_t i = 0; i < t->n_tracks; i++) {
        if (t->tracks[i].pid != pid) continue;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = t->tracks[j].pid == pid && t->tracks[j].group == t->tracks[i].group;
        count += !seen;
    }
    return count;
}

const mm_trace_invocation_t *mm_trace_find_invocation(const mm_trace_t *t, int pid, int group,
                                                      uint32_t index)
{
    for (size_t i = 0; i < t->n_invs; i++)
        if (t->invs[i].pid == pid && t->invs[i].group == group && t->invs[i].index == index)
            return &t->invs[i];
    return NULL;
}

const char *mm_trace_kind_name(int kind)
{
    static const char *const names[] = {"wait", "compute", "signal"};
    return kind >= 0 && kind < MM_KIND_COUNT ? names[kind] : "unknown";
}

const char *mm_trace_role_name(int role)
{
    static const char *const names[] = {"cube", "vector", "launch", "other"};
    return role >= 0 && role <= MM_TRACK_OTHER ? names[role] : "other";
}

void mm_trace_track_label(const mm_trace_t *t, const mm_trace_track_t *tr, char *buf,
                          size_t size)
{
    char group[32] = "";
    if (mm_trace_group_count(t, tr->pid) > 1) snprintf(group, sizeof group, "group %d/", tr->group);
    if (tr->role == MM_TRACK_CUBE || tr->role == MM_TRACK_VECTOR)
        snprintf(buf, size, "%s%s %d", group, mm_trace_role_name(tr->role), tr->worker);
    else if (tr->role == MM_TRACK_LAUNCH)
        snprintf(buf, size, "%slaunch", group);
    else
        snprintf(buf, size, "%s%s", group, mm_trace_str(t, tr->name));
}
