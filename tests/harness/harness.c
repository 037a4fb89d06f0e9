/* Test runner: runs registered cases in registration order. */
#include <stdarg.h>
#include <stdlib.h>

#include "harness.h"

#define MM_TEST_MAX 1024

static struct {
    const char *name;
    mm_test_fn fn;
} mm_tests[MM_TEST_MAX];
static int mm_test_count;
static int mm_current_failed;

void mm_test_register(const char *name, mm_test_fn fn)
{
    if (mm_test_count < MM_TEST_MAX) {
        mm_tests[mm_test_count].name = name;
        mm_tests[mm_test_count].fn = fn;
        mm_test_count++;
    }
}

int mm_test_failed(void) { return mm_current_failed; }

static const char *mm_prefix(void)
{
    static char buf[32];
    const char *r = getenv("RANK");
    snprintf(buf, sizeof buf, r ? "[rank %s] " : "", r);
    return buf;
}

void mm_test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s%s:%d: FAIL: ", mm_prefix(), file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    va_end(ap);
    mm_current_failed = 1;
}

int mm_test_rank(void)
{
    const char *r = getenv("RANK");
    return r ? atoi(r) : 0;
}

int mm_test_world(void)
{
    const char *w = getenv("WORLD_SIZE");
    return w ? atoi(w) : 1;
}

double mm_test_timeout_multiplier(void)
{
    const char *m = getenv("MEGAMOE_TEST_TIMEOUT_MULTIPLIER");
    double v = m ? atof(m) : 1.0;
    return v > 0 ? v : 1.0;
}

int mm_test_allclose(const char *what, const float *got, const float *want, size_t n,
                     double rtol, double atol)
{
    size_t worst = 0, bad = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        double excess;
        if (isnan(w)) {
            excess = isnan(g) ? -1.0 : INFINITY;
        } else if (isnan(g) || isinf(g) != isinf(w)) {
            excess = INFINITY;
        } else {
            excess = fabs(g - w) - (atol + rtol * fabs(w));
        }
        if (excess > 0) bad++;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    int ok = bad == 0;
    if (!ok || getenv("MEGAMOE_TEST_VERBOSE")) {
        fprintf(stderr, "%s%s: %s (%zu of %zu outside); worst [%zu] got %.9g want %.9g\n",
                mm_prefix(), what, ok ? "PASS" : "FAIL", bad, n, worst,
                n ? (double)got[worst] : 0.0, n ? (double)want[worst] : 0.0);
    }
    return ok;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < mm_test_count; i++) printf("%s\n", mm_tests[i].name);
        return 0;
    }
    int failed = 0, ran = 0;
    for (int i = 0; i < mm_test_count; i++) {
        int selected = argc <= 1;
        for (int a = 1; a < argc && !selected; a++)
            if (strcmp(argv[a], mm_tests[i].name) == 0) selected = 1;
        if (!selected) continue;
        mm_current_failed = 0;
        mm_tests[i].fn();
        ran++;
        fprintf(stderr, "%s[%s] %s\n", mm_prefix(), mm_current_failed ? "FAIL" : " OK ",
                mm_tests[i].name);
        failed += mm_current_failed;
    }
    if (ran == 0) {
        fprintf(stderr, "%sno test matched\n", mm_prefix());
        return 2;
    }
    fprintf(stderr, "%s%d of %d test cases passed\n", mm_prefix(), ran - failed, ran);
    return failed ? 1 : 0;
}
