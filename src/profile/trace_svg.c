/* SVG timeline of a trace model: one row per rank/worker, spans coloured by stage, waits
 * grey and hatched, signals as dark ticks, invocations on each rank's launch row.
 *
 * Spans narrower than a pixel are merged with their neighbours (the picture of a long run
 * stays a few MB); every number is printed locale-independently. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include "trace.h"

#define MM_SVG_LEFT 150
#define MM_SVG_RIGHT 20
#define MM_SVG_TOP 48
#define MM_SVG_ROW 16
#define MM_SVG_GAP 3
#define MM_SVG_RANK_GAP 14

static const char *const mm_svg_palette[] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#17becf", "#8cd17d", "#d37295",
};
#define MM_SVG_COLORS (sizeof mm_svg_palette / sizeof mm_svg_palette[0])

/* Coordinates with two decimals, locale-free. */
static void mm_svg_num(FILE *out, double x)
{
    int neg = x < 0;
    double a = (neg ? -x : x) * 100.0 + 0.5;
    if (a > 9.0e15) a = 9.0e15;
    uint64_t v = (uint64_t)a;
    fprintf(out, "%s%" PRIu64 ".%02u", neg && v ? "-" : "", v / 100, (unsigned)(v % 100));
}

static void mm_svg_text_escaped(FILE *out, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&apos;", out); break;
        default:
            /* XML 1.0 forbids most control characters even escaped. */
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n') fputc('?', out);
            else fputc(*s, out);
        }
    }
}

/* "250 us", "1.5 ms", "2 s" for a tick offset. */
static void mm_svg_time_label(char *buf, size_t size, int64_t ns)
{
    if (ns == 0) {
        snprintf(buf, size, "0");
        return;
    }
    const char *unit = "ns";
    double v = (double)ns;
    if (ns >= 1000000000) {
        unit = "s";
        v = (double)ns * 1e-9;
    } else if (ns >= 1000000) {
        unit = "ms";
        v = (double)ns * 1e-6;
    } else if (ns >= 1000) {
        unit = "us";
        v = (double)ns * 1e-3;
    }
    uint64_t hundredths = (uint64_t)(v * 100.0 + 0.5);
    if (hundredths % 100 == 0)
        snprintf(buf, size, "%" PRIu64 " %s", hundredths / 100, unit);
    else if (hundredths % 10 == 0)
        snprintf(buf, size, "%" PRIu64 ".%u %s", hundredths / 100, (unsigned)(hundredths / 10 % 10), unit);
    else
        snprintf(buf, size, "%" PRIu64 ".%02u %s", hundredths / 100, (unsigned)(hundredths % 100), unit);
}

typedef struct mm_svg {
    const mm_trace_t *t;
    FILE *out;
    int64_t t0, t1;
    double x0, scale; /* px per ns */
    int64_t invocation;
    uint32_t *stage_color; /* by string id: palette index + 1, 0 = unused */
    uint32_t *stages;      /* string ids in legend order */
    size_t n_stages;
} mm_svg_t;

static double mm_svg_x(const mm_svg_t *g, int64_t ns)
{
    if (ns < g->t0) ns = g->t0;
    if (ns > g->t1) ns = g->t1;
    return g->x0 + (double)(ns - g->t0) * g->scale;
}

/* One merged rectangle of a worker row. */
typedef struct mm_svg_run {
    double x0, x1;
    uint32_t stage;
    int kind;
    uint32_t count;
    uint32_t first; /* event index */
} mm_svg_run_t;

static void mm_svg_flush(const mm_svg_t *g, const mm_svg_run_t *r, double y)
{
    const mm_trace_t *t = g->t;
    double w = r->x1 - r->x0, h = MM_SVG_ROW;
    const char *fill;
    char color[32];
    if (r->kind == MM_PROF_WAIT) {
        fill = "url(#wait)";
    } else if (r->kind == MM_PROF_SIGNAL) {
        fill = "#333333";
        if (w < 1.0) w = 1.0;
    } else {
        uint32_t c = g->stage_color[r->stage];
        snprintf(color, sizeof color, "%s", mm_svg_palette[(c ? c - 1 : 0) % MM_SVG_COLORS]);
        fill = color;
    }
    if (w < 0.3) w = 0.3;
    fputs("<rect x=\"", g->out);
    mm_svg_num(g->out, r->x0);
    fputs("\" y=\"", g->out);
    mm_svg_num(g->out, y);
    fputs("\" width=\"", g->out);
    mm_svg_num(g->out, w);
    fprintf(g->out, "\" height=\"%d\" fill=\"%s\"><title>", (int)h, fill);
    const mm_trace_event_t *e = &t->events[r->first];
    mm_svg_text_escaped(g->out, mm_trace_str(t, r->stage));
    fprintf(g->out, ":%s", mm_trace_kind_name(r->kind));
    if (r->count > 1) {
        fprintf(g->out, " (%u spans merged at this zoom)", r->count);
    } else {
        char d[32];
        mm_svg_time_label(d, sizeof d, e->dur_ns);
        fprintf(g->out, " %s, task %" PRId32 ", owner %" PRId32 ", peer %" PRId32
                        ", invocation %" PRIu32,
                d, e->task, e->owner, e->peer, e->invocation);
    }
    fputs("</title></rect>\n", g->out);
}

static void mm_svg_worker_row(const mm_svg_t *g, const uint32_t *order, size_t begin, size_t end,
                              double y)
{
    const mm_trace_t *t = g->t;
    mm_svg_run_t run;
    int have = 0;
    for (size_t i = begin; i < end; i++) {
        const mm_trace_event_t *e = &t->events[order[i]];
        if (g->invocation >= 0 && (int64_t)e->invocation != g->invocation) continue;
        if (e->ts_ns + e->dur_ns < g->t0 || e->ts_ns > g->t1) continue;
        double a = mm_svg_x(g, e->ts_ns), b = mm_svg_x(g, e->ts_ns + e->dur_ns);
        if (have) {
            int same = run.stage == e->stage && run.kind == e->kind;
            if ((same && a - run.x1 < 0.5) || (b - a < 0.3 && a < run.x1 + 0.3)) {
                if (b > run.x1) run.x1 = b;
                run.count++;
                continue;
            }
            mm_svg_flush(g, &run, y);
        }
        run = (mm_svg_run_t){a, b, e->stage, e->kind, 1, order[i]};
        have = 1;
    }
    if (have) mm_svg_flush(g, &run, y);
}

static void mm_svg_launch_row(const mm_svg_t *g, int pid, int group, double y)
{
    const mm_trace_t *t = g->t;
    for (size_t i = 0; i < t->n_invs; i++) {
        const mm_trace_invocation_t *inv = &t->invs[i];
        if (inv->pid != pid || inv->group != group) continue;
        if (g->invocation >= 0 && (int64_t)inv->index != g->invocation) continue;
        int64_t end = inv->end_ns >= inv->begin_ns ? inv->end_ns : g->t1;
        if (end < g->t0 || inv->begin_ns > g->t1) continue;
        double a = mm_svg_x(g, inv->begin_ns), b = mm_svg_x(g, end);
        const char *dir = mm_trace_str(t, inv->direction);
        const char *fill = strcmp(dir, "forward") == 0    ? "#cfe2f3"
                           : strcmp(dir, "backward") == 0 ? "#fde9d9"
                                                          : "#eeeeee";
        fputs("<rect x=\"", g->out);
        mm_svg_num(g->out, a);
        fputs("\" y=\"", g->out);
        mm_svg_num(g->out, y);
        fputs("\" width=\"", g->out);
        mm_svg_num(g->out, b - a > 0.5 ? b - a : 0.5);
        fprintf(g->out, "\" height=\"%d\" fill=\"%s\" stroke=\"#555555\" stroke-width=\"0.5\"><title>",
                MM_SVG_ROW, fill);
        mm_svg_text_escaped(g->out, dir);
        fprintf(g->out, " #%" PRIu32, inv->index);
        if (inv->note != MM_TRACE_NO_NOTE) {
            fputs(": ", g->out);
            mm_svg_text_escaped(g->out, mm_trace_str(t, inv->note));
        }
        fputs("</title></rect>\n", g->out);
        if (b - a > 70) {
            fputs("<text x=\"", g->out);
            mm_svg_num(g->out, a + 3);
            fputs("\" y=\"", g->out);
            mm_svg_num(g->out, y + MM_SVG_ROW - 4);
            fputs("\" class=\"small\">", g->out);
            mm_svg_text_escaped(g->out, dir);
            fprintf(g->out, " #%" PRIu32, inv->index);
            if (inv->note != MM_TRACE_NO_NOTE && b - a > 300) { /* room for the note */
                fputs(" - ", g->out);
                mm_svg_text_escaped(g->out, mm_trace_str(t, inv->note));
            }
            fputs("</text>\n", g->out);
        }
    }
}

static int mm_svg_track_cmp_key(const mm_trace_track_t *tr)
{
    static const int order[] = {1, 2, 0, 3}; /* launch, cube, vector, other */
    return order[tr->role];
}

/* Time window and stage colours. */
static megamoe_status_t mm_svg_prepare(mm_svg_t *g, int64_t invocation)
{
    const mm_trace_t *t = g->t;
    g->t0 = INT64_MAX;
    g->t1 = INT64_MIN;
    g->invocation = invocation;
    for (size_t i = 0; i < t->n_invs; i++) {
        const mm_trace_invocation_t *inv = &t->invs[i];
        if (invocation >= 0 && (int64_t)inv->index != invocation) continue;
        if (inv->begin_ns < g->t0) g->t0 = inv->begin_ns;
        if (inv->end_ns > g->t1) g->t1 = inv->end_ns;
    }
    g->stage_color = calloc(t->n_strings ? t->n_strings : 1, sizeof *g->stage_color);
    g->stages = calloc(t->n_strings ? t->n_strings : 1, sizeof *g->stages);
    if (g->stage_color == NULL || g->stages == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace svg: out of memory");
    /* Stage colours in order of first appearance in time (the pipeline order). */
    int64_t *first = malloc((t->n_strings ? t->n_strings : 1) * sizeof *first);
    if (first == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace svg: out of memory");
    for (size_t i = 0; i < t->n_strings; i++) first[i] = INT64_MAX;
    for (size_t i = 0; i < t->n_events; i++) {
        const mm_trace_event_t *e = &t->events[i];
        if (invocation >= 0 && (int64_t)e->invocation != invocation) continue;
        if (e->ts_ns < g->t0) g->t0 = e->ts_ns;
        if (e->ts_ns + e->dur_ns > g->t1) g->t1 = e->ts_ns + e->dur_ns;
        if (e->kind != MM_PROF_WAIT && e->ts_ns < first[e->stage]) first[e->stage] = e->ts_ns;
    }
    for (;;) {
        int64_t best = INT64_MAX;
        size_t at = 0;
        for (size_t i = 0; i < t->n_strings; i++)
            if (first[i] < best && g->stage_color[i] == 0) {
                best = first[i];
                at = i;
            }
        if (best == INT64_MAX) break;
        g->stages[g->n_stages] = (uint32_t)at;
        g->stage_color[at] = (uint32_t)(g->n_stages % MM_SVG_COLORS) + 1;
        g->n_stages++;
    }
    free(first);
    if (g->t0 == INT64_MAX) { /* nothing in the window */
        g->t0 = 0;
        g->t1 = 1000;
    }
    if (g->t1 <= g->t0) g->t1 = g->t0 + 1000;
    return MEGAMOE_OK;
}

static void mm_svg_axis(const mm_svg_t *g, double y_top, double y_bottom, int width)
{
    int64_t span = g->t1 - g->t0, step = 1;
    while (step * 10 <= span / 4) step *= 10;
    if (span / step > 20) step *= 5;
    else if (span / step > 10) step *= 2;
    fputs("<g class=\"axis\">\n", g->out);
    for (int64_t off = 0; off <= span; off += step) {
        double x = mm_svg_x(g, g->t0 + off);
        char label[32];
        mm_svg_time_label(label, sizeof label, off);
        fputs("<line x1=\"", g->out);
        mm_svg_num(g->out, x);
        fputs("\" x2=\"", g->out);
        mm_svg_num(g->out, x);
        fputs("\" y1=\"", g->out);
        mm_svg_num(g->out, y_top);
        fputs("\" y2=\"", g->out);
        mm_svg_num(g->out, y_bottom);
        fputs("\" stroke=\"#e0e0e0\" stroke-width=\"1\"/>\n<text x=\"", g->out);
        mm_svg_num(g->out, x);
        fputs("\" y=\"", g->out);
        mm_svg_num(g->out, y_bottom + 14);
        fprintf(g->out, "\" class=\"small\" text-anchor=\"middle\">%s</text>\n", label);
    }
    (void)width;
    fputs("</g>\n", g->out);
}

megamoe_status_t mm_trace_render_svg(const mm_trace_t *t, int width, int64_t invocation,
                                     FILE *out)
{
    if (width == 0) width = 1600;
    if (width < 400 || width > 20000)
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "svg width %d must be in [400, 20000] pixels", width);
    mm_svg_t g;
    memset(&g, 0, sizeof g);
    g.t = t;
    g.out = out;
    megamoe_status_t st = mm_svg_prepare(&g, invocation);
    uint32_t *order = NULL;
    size_t *track_begin = NULL;
    if (st == MEGAMOE_OK) st = mm_trace_sorted_events(t, &order);
    /* Rows: ranks in order; within a rank, (group, launch/cube/vector/other, worker). */
    uint32_t *rows = calloc(t->n_tracks ? t->n_tracks : 1, sizeof *rows);
    track_begin = calloc(t->n_tracks + 1, sizeof *track_begin);
    if (st == MEGAMOE_OK && (rows == NULL || track_begin == NULL))
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "trace svg: out of memory");
    size_t n_rows = 0;
    if (st == MEGAMOE_OK) {
        for (size_t i = 0; i < t->n_tracks; i++) rows[n_rows++] = (uint32_t)i;
        for (size_t i = 1; i < n_rows; i++) /* insertion sort: few tracks */
            for (size_t j = i; j > 0; j--) {
                const mm_trace_track_t *a = &t->tracks[rows[j - 1]], *b = &t->tracks[rows[j]];
                int ka = mm_svg_track_cmp_key(a), kb = mm_svg_track_cmp_key(b);
                int swap = a->pid != b->pid     ? a->pid > b->pid
                           : a->group != b->group ? a->group > b->group
                           : ka != kb             ? ka > kb
                                                  : a->worker > b->worker;
                if (!swap) break;
                uint32_t tmp = rows[j - 1];
                rows[j - 1] = rows[j];
                rows[j] = tmp;
            }
        /* Start of each track's events in the sorted order. */
        size_t k = 0;
        for (size_t tr = 0; tr <= t->n_tracks; tr++) {
            while (k < t->n_events && t->events[order[k]].track < tr) k++;
            track_begin[tr] = k;
        }
    }
    if (st == MEGAMOE_OK) {
        int n_ranks_shown = 0;
        for (size_t i = 0; i < n_rows; i++)
            n_ranks_shown += i == 0 || t->tracks[rows[i]].pid != t->tracks[rows[i - 1]].pid;
        double plot_w = width - MM_SVG_LEFT - MM_SVG_RIGHT;
        g.x0 = MM_SVG_LEFT;
        g.scale = plot_w / (double)(g.t1 - g.t0);
        double rows_h = (double)n_rows * (MM_SVG_ROW + MM_SVG_GAP) + n_ranks_shown * MM_SVG_RANK_GAP;
        int legend_rows = (int)((g.n_stages + 2 + 5) / 6);
        int height = (int)(MM_SVG_TOP + rows_h + 30 + legend_rows * 20 + 16);
        fprintf(out,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n"
                "<style>.small{font-size:9px} .title{font-size:14px;font-weight:bold}</style>\n"
                "<defs><pattern id=\"wait\" patternUnits=\"userSpaceOnUse\" width=\"6\" "
                "height=\"6\" patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" "
                "fill=\"#dddddd\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#999999\" "
                "stroke-width=\"2\"/></pattern></defs>\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height);
        char span[32];
        mm_svg_time_label(span, sizeof span, g.t1 - g.t0);
        fprintf(out, "<text x=\"10\" y=\"22\" class=\"title\">MegaKernel timeline: %zu rank%s, ",
                t->n_ranks, t->n_ranks == 1 ? "" : "s");
        if (invocation >= 0) fprintf(out, "invocation %" PRId64 ", ", invocation);
        fprintf(out, "%s shown</text>\n", span);
        double y = MM_SVG_TOP;
        mm_svg_axis(&g, y - 6, y + rows_h, width);
        int prev_pid = -1;
        for (size_t i = 0; i < n_rows; i++) {
            const mm_trace_track_t *tr = &t->tracks[rows[i]];
            if (i == 0 || tr->pid != prev_pid) {
                y += MM_SVG_RANK_GAP;
                fprintf(out, "<text x=\"6\" y=\"");
                mm_svg_num(out, y - 3);
                fprintf(out, "\" font-weight=\"bold\">rank %d</text>\n", tr->pid);
                prev_pid = tr->pid;
            }
            char label[160];
            mm_trace_track_label(t, tr, label, sizeof label);
            fputs("<text x=\"16\" y=\"", out);
            mm_svg_num(out, y + MM_SVG_ROW - 4);
            fputs("\">", out);
            mm_svg_text_escaped(out, label);
            fputs("</text>\n", out);
            if (tr->role == MM_TRACK_LAUNCH)
                mm_svg_launch_row(&g, tr->pid, tr->group, y);
            else
                mm_svg_worker_row(&g, order, track_begin[rows[i]], track_begin[rows[i] + 1], y);
            y += MM_SVG_ROW + MM_SVG_GAP;
        }
        /* Legend. */
        y += 30;
        double x = MM_SVG_LEFT;
        for (size_t i = 0; i < g.n_stages + 2; i++) {
            if (i > 0 && i % 6 == 0) {
                x = MM_SVG_LEFT;
                y += 20;
            }
            const char *fill = i < g.n_stages ? mm_svg_palette[(g.stage_color[g.stages[i]] - 1) %
                                                               MM_SVG_COLORS]
                               : i == g.n_stages ? "url(#wait)"
                                                 : "#333333";
            fputs("<rect x=\"", out);
            mm_svg_num(out, x);
            fputs("\" y=\"", out);
            mm_svg_num(out, y);
            fprintf(out, "\" width=\"14\" height=\"12\" fill=\"%s\" stroke=\"#555555\" "
                         "stroke-width=\"0.5\"/>\n<text x=\"",
                    fill);
            mm_svg_num(out, x + 18);
            fputs("\" y=\"", out);
            mm_svg_num(out, y + 10);
            fputs("\">", out);
            if (i < g.n_stages) mm_svg_text_escaped(out, mm_trace_str(t, g.stages[i]));
            else fputs(i == g.n_stages ? "wait (any stage)" : "signal", out);
            fputs("</text>\n", out);
            x += (plot_w) / 6;
        }
        fputs("</svg>\n", out);
    }
    free(rows);
    free(track_begin);
    free(order);
    free(g.stage_color);
    free(g.stages);
    return st;
}
