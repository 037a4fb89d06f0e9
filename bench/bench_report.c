/* bench report: the performance story as one HTML page with PNG plots (roofline, token sweep,
 * scaling, routing skew, decode-size dispatch+combine, SHMEM bandwidth) and the tables behind
 * them. The driver is bench/report.py (matplotlib; the interpreter is mm_bench_python(): Debian's
 * /usr/bin/python3 unless MEGAMOE_PYTHON or the build says otherwise): it runs the
 * other benchmarks through this same binary, or reads their saved JSON (--from), and writes
 * DIR/report.html. This file finds the script (installed or in the source tree) and hands
 * over the arguments. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_util.h"

int mm_bench_report_main(int argc, char **argv)
{
    char script[4096];
    if (mm_bench_script("report.py", script, sizeof script) != 0) {
        fprintf(stderr, "megamoe bench report: report.py not found: looked in <prefix>/share/megamoe/"
                        "bench (installed), the source tree above %s, and ./bench\n",
                mm_bench_self_exe());
        return 2;
    }
    const char *python = mm_bench_python();
    if (strchr(python, '/') != NULL && access(python, X_OK) != 0) {
        fprintf(stderr, "megamoe bench report: needs %s with python3-matplotlib (run 'make deps' "
                        "or apt-get install python3-matplotlib; MEGAMOE_PYTHON picks another)\n",
                python);
        return 2;
    }
    char *args[64];
    if (argc - 1 > 64 - 5) {
        fprintf(stderr, "megamoe bench report: too many arguments\n");
        return 2;
    }
    int n = 0;
    args[n++] = (char *)python;
    args[n++] = script;
    args[n++] = "--megamoe";
    args[n++] = (char *)mm_bench_self_exe();
    for (int i = 1; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    execvp(python, args);
    fprintf(stderr, "megamoe bench report: cannot run %s: %s\n", python, strerror(errno));
    return 1;
}
