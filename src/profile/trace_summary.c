/* Per-stage statistics of a trace model: the table (or JSON) of `megamoe trace summary`. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include "trace.h"

typedef struct mm_sort_key {
    uint64_t a, b;
    uint32_t idx;
} mm_sort_key_t;

static int mm_sort_key_cmp(const void *x, const void *y)
{
    const mm_sort_key_t *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    return p->idx < q->idx ? -1 : p->idx > q->idx;
}

static uint64_t mm_bias(int64_t v) { return (uint64_t)v ^ ((uint64_t)1 << 63); }

megamoe_status_t mm_trace_sorted_events(const mm_trace_t *t, uint32_t **order_p)
{
    size_t n = t->n_events;
    mm_sort_key_t *keys = malloc((n ? n : 1) * sizeof *keys);
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    if (keys == NULL || order == NULL) {
        free(keys);
        free(order);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: out of memory sorting %zu events", n);
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = (mm_sort_key_t){t->events[i].track, mm_bias(t->events[i].ts_ns), (uint32_t)i};
    qsort(keys, n, sizeof *keys, mm_sort_key_cmp);
    for (size_t i = 0; i < n; i++) order[i] = keys[i].idx;
    free(keys);
    *order_p = order;
    return MEGAMOE_OK;
}

/* Locale-independent fixed-point text of x with `decimals` digits. */
static void mm_fmt_fixed(char *buf, size_t size, double x, int decimals)
{
    static const double pow10[] = {1, 10, 100, 1000, 10000, 100000, 1000000};
    if (decimals < 0) decimals = 0;
    if (decimals > 6) decimals = 6;
    if (!(x == x)) {
        snprintf(buf, size, "0");
        return;
    }
    int neg = x < 0;
    double a = (neg ? -x : x) * pow10[decimals] + 0.5;
    if (a > 9.0e18) a = 9.0e18;
    uint64_t v = (uint64_t)a, scale = (uint64_t)pow10[decimals];
    if (decimals == 0)
        snprintf(buf, size, "%s%" PRIu64, neg && v ? "-" : "", v);
    else
        snprintf(buf, size, "%s%" PRIu64 ".%0*" PRIu64, neg && v ? "-" : "", v / scale, decimals,
                 v % scale);
}

/* One (role, stage, kind) row of a rank. */
typedef struct mm_stage_row {
    int role;
    uint32_t stage;
    int kind;
    uint64_t count;
    int64_t total, mean, p50, p99, first_ts;
} mm_stage_row_t;

typedef struct mm_worker_row {
    uint32_t track;
    int64_t kind_ns[MM_KIND_COUNT];
    uint64_t records;
    int64_t launch_ns;
} mm_worker_row_t;

typedef struct mm_rank_stats {
    int pid;
    int64_t launch_ns, wall_ns, first_ns, last_ns;
    uint64_t records, invocations, by_dir_count;
    mm_stage_row_t *rows;
    size_t n_rows;
    mm_worker_row_t *workers;
    size_t n_workers;
    int role_workers[MM_TRACK_OTHER + 1];
} mm_rank_stats_t;

static int mm_stage_row_cmp(const void *x, const void *y)
{
    const mm_stage_row_t *p = x, *q = y;
    if (p->role != q->role) return p->role < q->role ? -1 : 1;
    if (p->first_ts != q->first_ts) return p->first_ts < q->first_ts ? -1 : 1;
    if (p->stage != q->stage) return p->stage < q->stage ? -1 : 1;
    return p->kind - q->kind;
}

static int mm_keep(const mm_trace_event_t *e, int64_t invocation)
{
    return invocation < 0 || (int64_t)e->invocation == invocation;
}

/* Launch time of (pid, group) (group < 0: all groups). */
static int64_t mm_launch_ns(const mm_trace_t *t, int pid, int group, int64_t invocation,
                            uint64_t *count_p)
{
    int64_t total = 0;
    uint64_t count = 0;
    for (size_t i = 0; i < t->n_invs; i++) {
        const mm_trace_invocation_t *inv = &t->invs[i];
        if (inv->pid != pid || (group >= 0 && inv->group != group)) continue;
        if (invocation >= 0 && (int64_t)inv->index != invocation) continue;
        count++;
        if (inv->end_ns > inv->begin_ns) total = mm_trace_sat_add(total, inv->end_ns - inv->begin_ns);
    }
    if (count_p != NULL) *count_p = count;
    return total;
}

static megamoe_status_t mm_rank_stats(const mm_trace_t *t, int pid, int64_t invocation,
                                      mm_rank_stats_t *rs)
{
    memset(rs, 0, sizeof *rs);
    rs->pid = pid;
    rs->first_ns = INT64_MAX;
    rs->last_ns = INT64_MIN;
    rs->launch_ns = mm_launch_ns(t, pid, -1, invocation, &rs->invocations);
    /* Workers: one row per track of this rank except the launch track. */
    rs->workers = calloc(t->n_tracks ? t->n_tracks : 1, sizeof *rs->workers);
    size_t n = 0;
    for (size_t i = 0; i < t->n_events; i++)
        n += t->tracks[t->events[i].track].pid == pid && mm_keep(&t->events[i], invocation);
    mm_sort_key_t *keys = malloc((n ? n : 1) * sizeof *keys);
    if (rs->workers == NULL || keys == NULL) {
        free(keys);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace summary: out of memory");
    }
    for (size_t i = 0; i < t->n_tracks; i++) {
        const mm_trace_track_t *tr = &t->tracks[i];
        if (tr->pid != pid || tr->role == MM_TRACK_LAUNCH) continue;
        mm_worker_row_t *w = &rs->workers[rs->n_workers++];
        w->track = (uint32_t)i;
        w->launch_ns = mm_launch_ns(t, pid, tr->group, invocation, NULL);
        rs->role_workers[tr->role]++;
    }
    size_t k = 0;
    for (size_t i = 0; i < t->n_events; i++) {
        const mm_trace_event_t *e = &t->events[i];
        const mm_trace_track_t *tr = &t->tracks[e->track];
        if (tr->pid != pid || !mm_keep(e, invocation)) continue;
        /* Key: role, stage, kind | duration. */
        keys[k++] = (mm_sort_key_t){((uint64_t)tr->role << 40) | ((uint64_t)e->stage << 8) | e->kind,
                                    mm_bias(e->dur_ns), (uint32_t)i};
        if (e->ts_ns < rs->first_ns) rs->first_ns = e->ts_ns;
        if (e->ts_ns + e->dur_ns > rs->last_ns) rs->last_ns = e->ts_ns + e->dur_ns;
        for (size_t w = 0; w < rs->n_workers; w++)
            if (rs->workers[w].track == e->track) {
                rs->workers[w].kind_ns[e->kind] = mm_trace_sat_add(rs->workers[w].kind_ns[e->kind], e->dur_ns);
                rs->workers[w].records++;
                break;
            }
    }
    rs->records = k;
    rs->wall_ns = k ? rs->last_ns - rs->first_ns : 0;
    if (rs->launch_ns == 0) rs->launch_ns = rs->wall_ns;
    for (size_t w = 0; w < rs->n_workers; w++)
        if (rs->workers[w].launch_ns == 0) rs->workers[w].launch_ns = rs->launch_ns;
    qsort(keys, k, sizeof *keys, mm_sort_key_cmp);
    rs->rows = calloc(k ? k : 1, sizeof *rs->rows);
    if (rs->rows == NULL) {
        free(keys);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace summary: out of memory");
    }
    for (size_t s = 0; s < k;) {
        size_t e = s;
        while (e < k && keys[e].a == keys[s].a) e++;
        mm_stage_row_t *row = &rs->rows[rs->n_rows++];
        const mm_trace_event_t *ev = &t->events[keys[s].idx];
        row->role = t->tracks[ev->track].role;
        row->stage = ev->stage;
        row->kind = ev->kind;
        row->count = e - s;
        row->first_ts = INT64_MAX;
        for (size_t j = s; j < e; j++) {
            const mm_trace_event_t *x = &t->events[keys[j].idx];
            row->total = mm_trace_sat_add(row->total, x->dur_ns);
            if (x->ts_ns < row->first_ts) row->first_ts = x->ts_ns;
        }
        row->mean = row->total / (int64_t)row->count;
        /* Nearest-rank percentiles of the sorted durations. */
        size_t c = e - s, i50 = (c * 50 + 99) / 100, i99 = (c * 99 + 99) / 100;
        row->p50 = t->events[keys[s + (i50 ? i50 - 1 : 0)].idx].dur_ns;
        row->p99 = t->events[keys[s + (i99 ? i99 - 1 : 0)].idx].dur_ns;
        s = e;
    }
    qsort(rs->rows, rs->n_rows, sizeof *rs->rows, mm_stage_row_cmp);
    free(keys);
    return MEGAMOE_OK;
}

static void mm_rank_stats_free(mm_rank_stats_t *rs)
{
    free(rs->rows);
    free(rs->workers);
}

static double mm_share(int64_t part, int64_t whole)
{
    return whole > 0 ? (double)part / (double)whole : 0.0;
}

static void mm_put_pct(FILE *out, double share)
{
    char b[32];
    mm_fmt_fixed(b, sizeof b, share * 100.0, 1);
    fprintf(out, "%7s%%", b);
}

static void mm_put_ms(FILE *out, int width, int64_t ns)
{
    char b[32];
    mm_fmt_fixed(b, sizeof b, (double)ns * 1e-6, 3);
    fprintf(out, "%*s", width, b);
}

static void mm_put_us(FILE *out, int width, int64_t ns)
{
    char b[32];
    mm_fmt_fixed(b, sizeof b, (double)ns * 1e-3, 2);
    fprintf(out, "%*s", width, b);
}

static int mm_inv_shown(const mm_trace_invocation_t *inv, int pid, int64_t invocation)
{
    return inv->pid == pid && (invocation < 0 || (int64_t)inv->index == invocation);
}

static void mm_summary_text_rank(const mm_trace_t *t, const mm_trace_rank_t *rk,
                                 const mm_rank_stats_t *rs, int64_t invocation, FILE *out)
{
    fprintf(out, "\nrank %d (host %s): %" PRIu64 " invocation%s", rs->pid,
            mm_trace_str(t, rk->host), rs->invocations, rs->invocations == 1 ? "" : "s");
    /* Invocations by direction. */
    const char *sep = " (";
    for (size_t i = 0; i < t->n_invs; i++) {
        const mm_trace_invocation_t *inv = &t->invs[i];
        if (!mm_inv_shown(inv, rs->pid, invocation)) continue;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = mm_inv_shown(&t->invs[j], rs->pid, invocation) &&
                   t->invs[j].direction == inv->direction;
        if (seen) continue;
        uint64_t c = 0;
        for (size_t j = i; j < t->n_invs; j++)
            c += mm_inv_shown(&t->invs[j], rs->pid, invocation) &&
                 t->invs[j].direction == inv->direction;
        fprintf(out, "%s%s %" PRIu64, sep, mm_trace_str(t, inv->direction), c);
        sep = ", ";
    }
    if (sep[0] == ',') fputc(')', out);
    fputs(", launch time ", out);
    mm_put_ms(out, 0, rs->launch_ns);
    fputs(" ms, span ", out);
    mm_put_ms(out, 0, rs->wall_ns);
    fprintf(out, " ms, %" PRIu64 " records, %" PRIu64 " dropped\n", rs->records, rk->dropped);
    for (size_t i = 0; i < t->n_invs; i++) { /* the producers' notes (e.g. a replica plan) */
        const mm_trace_invocation_t *inv = &t->invs[i];
        if (!mm_inv_shown(inv, rs->pid, invocation) || inv->note == MM_TRACE_NO_NOTE) continue;
        fprintf(out, "  %s #%" PRIu32 ": %s\n", mm_trace_str(t, inv->direction), inv->index,
                mm_trace_str(t, inv->note));
    }
    for (int role = 0; role <= MM_TRACK_OTHER; role++) {
        if (role == MM_TRACK_LAUNCH) continue;
        int any = 0;
        for (size_t i = 0; i < rs->n_rows; i++) any |= rs->rows[i].role == role;
        if (!any) continue;
        int nw = rs->role_workers[role] ? rs->role_workers[role] : 1;
        fprintf(out, "  %s (%d worker%s)\n", mm_trace_role_name(role), nw, nw == 1 ? "" : "s");
        fprintf(out, "    %-20s %-8s %8s %11s %10s %10s %10s %8s\n", "stage", "kind", "count",
                "total ms", "mean us", "p50 us", "p99 us", "share");
        for (size_t i = 0; i < rs->n_rows; i++) {
            const mm_stage_row_t *r = &rs->rows[i];
            if (r->role != role) continue;
            fprintf(out, "    %-20.20s %-8s %8" PRIu64 " ", mm_trace_str(t, r->stage),
                    mm_trace_kind_name(r->kind), r->count);
            mm_put_ms(out, 11, r->total);
            fputc(' ', out);
            mm_put_us(out, 10, r->mean);
            fputc(' ', out);
            mm_put_us(out, 10, r->p50);
            fputc(' ', out);
            mm_put_us(out, 10, r->p99);
            fputc(' ', out);
            mm_put_pct(out, mm_share(r->total, mm_trace_sat_mul(rs->launch_ns, nw)));
            fputc('\n', out);
        }
    }
    if (rs->n_workers == 0) return;
    fprintf(out, "  %-24s %8s %8s %8s %8s %9s\n", "worker (share of launch)", "wait", "compute",
            "signal", "idle", "records");
    for (size_t w = 0; w < rs->n_workers; w++) {
        const mm_worker_row_t *wr = &rs->workers[w];
        char label[160];
        mm_trace_track_label(t, &t->tracks[wr->track], label, sizeof label);
        fprintf(out, "  %-24.24s", label);
        int64_t busy = 0;
        for (int k = 0; k < MM_KIND_COUNT; k++) {
            fputc(' ', out);
            mm_put_pct(out, mm_share(wr->kind_ns[k], wr->launch_ns));
            busy = mm_trace_sat_add(busy, wr->kind_ns[k]);
        }
        double idle = 1.0 - mm_share(busy, wr->launch_ns);
        fputc(' ', out);
        mm_put_pct(out, idle > 0 ? idle : 0);
        fprintf(out, " %9" PRIu64 "\n", wr->records);
    }
}

static void mm_summary_json_rank(const mm_trace_t *t, const mm_trace_rank_t *rk,
                                 const mm_rank_stats_t *rs, FILE *out)
{
    char b[32];
    fprintf(out, "{\"rank\":%d,\"host\":", rs->pid);
    mm_trace_put_json_string(out, mm_trace_str(t, rk->host));
    fprintf(out,
            ",\"invocations\":%" PRIu64 ",\"launchNs\":%" PRId64 ",\"wallNs\":%" PRId64
            ",\"records\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\n \"stages\":[",
            rs->invocations, rs->launch_ns, rs->wall_ns, rs->records, rk->dropped);
    for (size_t i = 0; i < rs->n_rows; i++) {
        const mm_stage_row_t *r = &rs->rows[i];
        int nw = rs->role_workers[r->role] ? rs->role_workers[r->role] : 1;
        fprintf(out, "%s{\"role\":\"%s\",\"stage\":", i ? ",\n  " : "\n  ",
                mm_trace_role_name(r->role));
        mm_trace_put_json_string(out, mm_trace_str(t, r->stage));
        mm_fmt_fixed(b, sizeof b, mm_share(r->total, mm_trace_sat_mul(rs->launch_ns, nw)), 6);
        fprintf(out,
                ",\"kind\":\"%s\",\"count\":%" PRIu64 ",\"totalNs\":%" PRId64 ",\"meanNs\":%" PRId64
                ",\"p50Ns\":%" PRId64 ",\"p99Ns\":%" PRId64 ",\"share\":%s}",
                mm_trace_kind_name(r->kind), r->count, r->total, r->mean, r->p50, r->p99, b);
    }
    fputs("],\n \"workers\":[", out);
    for (size_t w = 0; w < rs->n_workers; w++) {
        const mm_worker_row_t *wr = &rs->workers[w];
        const mm_trace_track_t *tr = &t->tracks[wr->track];
        char label[160];
        mm_trace_track_label(t, tr, label, sizeof label);
        fprintf(out, "%s{\"name\":", w ? ",\n  " : "\n  ");
        mm_trace_put_json_string(out, label);
        mm_fmt_fixed(b, sizeof b, mm_share(wr->kind_ns[0], wr->launch_ns), 6);
        fprintf(out,
                ",\"role\":\"%s\",\"worker\":%d,\"group\":%d,\"waitNs\":%" PRId64
                ",\"computeNs\":%" PRId64 ",\"signalNs\":%" PRId64 ",\"launchNs\":%" PRId64
                ",\"records\":%" PRIu64 ",\"waitShare\":%s}",
                mm_trace_role_name(tr->role), tr->worker, tr->group, wr->kind_ns[0],
                wr->kind_ns[1], wr->kind_ns[2], wr->launch_ns, wr->records, b);
    }
    fputs("]}", out);
}

megamoe_status_t mm_trace_print_summary(const mm_trace_t *t, int json, int64_t invocation,
                                        FILE *out)
{
    uint64_t recs = 0, dropped = 0, invs = 0;
    for (size_t r = 0; r < t->n_ranks; r++) {
        recs += t->ranks[r].records;
        dropped += t->ranks[r].dropped;
        invs += t->ranks[r].invocations;
    }
    if (json) {
        fprintf(out, "{\"invocation\":%" PRId64 ",\"ranks\":[", invocation);
    } else {
        fprintf(out, "MegaKernel trace: %zu rank%s, %" PRIu64 " invocations, %" PRIu64
                     " records, %" PRIu64 " dropped",
                t->n_ranks, t->n_ranks == 1 ? "" : "s", invs, recs, dropped);
        if (invocation >= 0) fprintf(out, " (showing invocation %" PRId64 ")", invocation);
        fputc('\n', out);
    }
    megamoe_status_t st = MEGAMOE_OK;
    for (size_t r = 0; r < t->n_ranks && st == MEGAMOE_OK; r++) {
        mm_rank_stats_t rs;
        st = mm_rank_stats(t, t->ranks[r].rank, invocation, &rs);
        if (st == MEGAMOE_OK) {
            if (json) {
                fputs(r ? ",\n" : "\n", out);
                mm_summary_json_rank(t, &t->ranks[r], &rs, out);
            } else {
                mm_summary_text_rank(t, &t->ranks[r], &rs, invocation, out);
            }
        }
        mm_rank_stats_free(&rs);
    }
    if (json) {
        fputs("],\n\"warnings\":[", out);
        for (size_t i = 0; i < t->n_warnings; i++) {
            if (i) fputc(',', out);
            mm_trace_put_json_string(out, mm_trace_str(t, t->warnings[i]));
        }
        fputs("]}\n", out);
    } else if (t->n_warnings > 0) {
        fprintf(out, "\nwarnings:\n");
        for (size_t i = 0; i < t->n_warnings; i++)
            fprintf(out, "  - %s\n", mm_trace_str(t, t->warnings[i]));
    } else {
        fprintf(out, "\nno warnings\n");
    }
    return st;
}
