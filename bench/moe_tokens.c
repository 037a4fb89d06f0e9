/* Per-call token count distributions (see moe_tokens.h). */
#include "moe_tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mm_tokens_int(const char *text, const char **end_p, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(text, &end, 10);
    if (errno || end == text || x < 0 || x > (1ll << 24)) return -1;
    *v = x;
    *end_p = end;
    return 0;
}

int mm_tokens_parse(const char *opt, const char *spec, mm_tokens_dist_t *d)
{
    memset(d, 0, sizeof *d);
    const char *p = spec, *end = NULL;
    int rc = -1;
    if (!strncmp(p, "fixed:", 6) || (p[0] >= '0' && p[0] <= '9')) {
        if (!strncmp(p, "fixed:", 6)) p += 6;
        d->kind = MM_TOKENS_FIXED;
        rc = mm_tokens_int(p, &end, &d->lo) == 0 && *end == '\0' ? 0 : -1;
        d->hi = d->lo;
    } else if (!strncmp(p, "uniform:", 8)) {
        d->kind = MM_TOKENS_UNIFORM;
        rc = mm_tokens_int(p + 8, &end, &d->lo) == 0 && *end == '-' &&
                     mm_tokens_int(end + 1, &end, &d->hi) == 0 && *end == '\0' && d->lo <= d->hi
                 ? 0
                 : -1;
    } else if (!strncmp(p, "list:", 5)) {
        d->kind = MM_TOKENS_LIST;
        p += 5;
        rc = 0;
        while (rc == 0) {
            if (d->n == MM_TOKENS_MAX_LIST || mm_tokens_int(p, &end, &d->item[d->n]) != 0) rc = -1;
            else {
                if (d->item[d->n] > d->hi) d->hi = d->item[d->n];
                d->n++;
                if (*end == '\0') break;
                if (*end != ',') rc = -1;
                p = end + 1;
            }
        }
    }
    if (rc != 0)
        fprintf(stderr, "megamoe: %s '%s' is not a token-count distribution; use N (every rank "
                        "and call), uniform:A-B (drawn per rank and call) or list:a,b,... (rank r "
                        "at call c takes item (r + c) mod count), counts in [0, 2^24]\n",
                opt, spec);
    return rc;
}

static uint64_t mm_tokens_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int64_t mm_tokens_count(const mm_tokens_dist_t *d, uint64_t seed, int64_t call, int rank)
{
    switch (d->kind) {
    case MM_TOKENS_UNIFORM: {
        uint64_t h = mm_tokens_mix(seed * 0x100000001b3ull ^ mm_tokens_mix((uint64_t)call * 4099u +
                                                                            (uint64_t)rank));
        return d->lo + (int64_t)(h % (uint64_t)(d->hi - d->lo + 1));
    }
    case MM_TOKENS_LIST: return d->item[(call + rank) % d->n];
    default: return d->lo;
    }
}

int64_t mm_tokens_max(const mm_tokens_dist_t *d) { return d->hi; }

int64_t mm_tokens_min(const mm_tokens_dist_t *d)
{
    if (d->kind != MM_TOKENS_LIST) return d->lo;
    int64_t m = d->item[0];
    for (int i = 1; i < d->n; i++)
        if (d->item[i] < m) m = d->item[i];
    return m;
}

double mm_tokens_mean(const mm_tokens_dist_t *d)
{
    if (d->kind == MM_TOKENS_LIST) {
        double s = 0;
        for (int i = 0; i < d->n; i++) s += (double)d->item[i];
        return s / d->n;
    }
    return 0.5 * (double)(d->lo + d->hi);
}
