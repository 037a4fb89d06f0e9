/* megamoe trace merge|summary|svg — MegaKernel Chrome traces (include/megamoe/prof.h,
 * docs/profiling.md). Public headers only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/megamoe.h"

#include "cli.h"

static void mm_trace_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe trace <command> <trace files or directories>... [options]\n"
            "MegaKernel traces: trace_<rank>.json written by MEGAMOE_PROFILE=<dir>, the C API\n"
            "or megamoe.profiler (a directory means every trace_<rank>*.json inside it).\n"
            "\n"
            "  merge   INPUTS... -o merged.json   one trace with every rank on one time axis\n"
            "  summary INPUTS... [--json] [--invocation N] [--svg out.svg [--width W]]\n"
            "                                     per rank and role: per-stage count, total,\n"
            "                                     mean, p50/p99 and share of launch time; the\n"
            "                                     wait share of every worker; warnings\n"
            "  svg     INPUTS... -o timeline.svg [--width W] [--invocation N]\n"
            "                                     timeline picture: a row per rank/worker,\n"
            "                                     stages coloured, waits hatched grey\n"
            "\n"
            "Open a trace (or the merged one) in https://ui.perfetto.dev or chrome://tracing.\n"
            "Exit status: 0 done, 1 bad or unreadable trace, 2 usage.\n");
}

typedef struct mm_trace_args {
    const char **inputs;
    size_t n_inputs;
    const char *output; /* -o */
    const char *svg;    /* --svg */
    int json;
    int width;
    long long invocation;
} mm_trace_args_t;

static int mm_trace_number(const char *cmd, const char *opt, const char *text, long long lo,
                           long long hi, long long *out)
{
    char *end;
    long long v = strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "megamoe trace %s: %s '%s' must be an integer in [%lld, %lld]\n", cmd,
                opt, text, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

/* Parse argv[2..]: inputs and options. Returns 0 on success, else the exit status. */
static int mm_trace_parse(const char *cmd, int argc, char **argv, mm_trace_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->invocation = -1;
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    if (a->inputs == NULL) return 1;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        long long v;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            mm_trace_usage(stdout);
            return -1;
        } else if (strcmp(arg, "-o") == 0 || strcmp(arg, "--output") == 0) {
            if (!has_value) goto missing;
            a->output = argv[++i];
        } else if (strcmp(arg, "--svg") == 0) {
            if (!has_value) goto missing;
            a->svg = argv[++i];
        } else if (strcmp(arg, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(arg, "--width") == 0) {
            if (!has_value) goto missing;
            if (!mm_trace_number(cmd, arg, argv[++i], 400, 20000, &v)) return 2;
            a->width = (int)v;
        } else if (strcmp(arg, "--invocation") == 0) {
            if (!has_value) goto missing;
            if (!mm_trace_number(cmd, arg, argv[++i], 0, 4294967295LL, &v)) return 2;
            a->invocation = v;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            fprintf(stderr, "megamoe trace %s: unknown option '%s' (see megamoe trace --help)\n",
                    cmd, arg);
            return 2;
        } else {
            a->inputs[a->n_inputs++] = arg;
        }
        continue;
    missing:
        fprintf(stderr, "megamoe trace %s: %s needs a value\n", cmd, arg);
        return 2;
    }
    if (a->n_inputs == 0) {
        fprintf(stderr, "megamoe trace %s: no trace given (a trace_<rank>.json file or a "
                        "directory of them)\n",
                cmd);
        return 2;
    }
    return 0;
}

static int mm_trace_failed(const char *cmd)
{
    fprintf(stderr, "megamoe trace %s: %s\n", cmd, megamoe_last_error());
    return 1;
}

int mm_cmd_trace(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        mm_trace_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "merge") != 0 && strcmp(cmd, "summary") != 0 && strcmp(cmd, "svg") != 0) {
        fprintf(stderr, "megamoe trace: unknown command '%s'\n\n", cmd);
        mm_trace_usage(stderr);
        return 2;
    }
    mm_trace_args_t a;
    int rc = mm_trace_parse(cmd, argc, argv, &a);
    if (rc != 0) {
        free(a.inputs);
        return rc < 0 ? 0 : rc;
    }
    megamoe_status_t st = MEGAMOE_OK;
    if (strcmp(cmd, "merge") == 0) {
        if (a.output == NULL || a.svg || a.json || a.width || a.invocation >= 0) {
            fprintf(stderr, "megamoe trace merge: takes INPUTS... -o merged.json only\n");
            rc = 2;
        } else {
            st = megamoe_trace_merge(a.inputs, a.n_inputs, a.output);
            if (st == MEGAMOE_OK) fprintf(stderr, "megamoe trace merge: wrote %s\n", a.output);
        }
    } else if (strcmp(cmd, "svg") == 0) {
        if (a.output == NULL || a.svg || a.json) {
            fprintf(stderr, "megamoe trace svg: takes INPUTS... -o timeline.svg [--width W] "
                            "[--invocation N]\n");
            rc = 2;
        } else {
            megamoe_trace_svg_options_t o = {a.width, a.invocation};
            st = megamoe_trace_svg(a.inputs, a.n_inputs, &o, a.output);
            if (st == MEGAMOE_OK) fprintf(stderr, "megamoe trace svg: wrote %s\n", a.output);
        }
    } else {
        if (a.output != NULL || (a.width && a.svg == NULL)) {
            fprintf(stderr, "megamoe trace summary: prints to stdout (no -o); --width goes "
                            "with --svg\n");
            rc = 2;
        } else {
            megamoe_trace_summary_options_t o = {a.json, a.invocation};
            st = megamoe_trace_summary(a.inputs, a.n_inputs, &o, stdout);
            fflush(stdout);
            if (st == MEGAMOE_OK && a.svg != NULL) {
                megamoe_trace_svg_options_t so = {a.width, a.invocation};
                st = megamoe_trace_svg(a.inputs, a.n_inputs, &so, a.svg);
                if (st == MEGAMOE_OK) fprintf(stderr, "megamoe trace summary: wrote %s\n", a.svg);
            }
        }
    }
    free(a.inputs);
    if (rc != 0) return rc;
    return st == MEGAMOE_OK ? 0 : mm_trace_failed(cmd);
}
