/* Minimal test harness: self-registering test cases and typed asserts that print both sides.
 *
 *   MM_TEST(heap_alloc_is_symmetric) {
 *       ASSERT_OK(shmem_acquire(NULL));
 *       ASSERT_EQ_INT(offset_a, offset_b);
 *   }
 *
 * main() (in harness.c) runs every case, or the ones named on the command line, and exits
 * non-zero if any failed. `--list` prints the names. A failing assert ends the current case.
 * A name on the command line that matches no case is an error (exit 2), never ignored.
 *
 * A case that cannot run here (no AMX, no AVX-512, ...) says so with MM_SKIP("why"): it ends
 * the case, prints `[SKIP] name: why`, is counted apart from the passed ones and is never
 * reported as OK. When every case a single-process run ran was skipped, main() exits 77
 * (CTest's SKIP_RETURN_CODE, set by megamoe_add_test, shows the test as skipped); otherwise
 * skips do not change the exit status but each is appended to $MEGAMOE_TEST_SKIP_LOG when
 * set (`make test-c` prints that list at the end). A case that failed before MM_SKIP stays
 * failed.
 */
#ifndef MM_TEST_HARNESS_H
#define MM_TEST_HARNESS_H

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "megamoe/status.h"

typedef void (*mm_test_fn)(void);
void mm_test_register(const char *name, mm_test_fn fn);
void mm_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int mm_test_failed(void);
void mm_test_skip(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Exit status of a single-process run whose every selected case was skipped. */
#define MM_TEST_EXIT_SKIPPED 77

/* RANK / WORLD_SIZE of a multi-rank test (0 / 1 when unset). */
int mm_test_rank(void);
int mm_test_world(void);
/* Multiplier for timeouts under sanitizers (MEGAMOE_TEST_TIMEOUT_MULTIPLIER, default 1). */
double mm_test_timeout_multiplier(void);

/* Compare arrays with |got - want| <= atol + rtol * |want|; prints the worst element and a
 * PASS/FAIL line. Returns 1 when all close. NaN in got is a failure unless want is NaN. */
int mm_test_allclose(const char *what, const float *got, const float *want, size_t n,
                     double rtol, double atol);

#define MM_TEST(name)                                                                      \
    static void mm_test_##name(void);                                                      \
    __attribute__((constructor)) static void mm_test_register_##name(void)                 \
    {                                                                                      \
        mm_test_register(#name, mm_test_##name);                                           \
    }                                                                                      \
    static void mm_test_##name(void)

#define MM_FAIL_(...)                                                                      \
    do {                                                                                   \
        mm_test_fail(__FILE__, __LINE__, __VA_ARGS__);                                     \
        return;                                                                            \
    } while (0)

/* End the current case as skipped, with the reason (printf format). */
#define MM_SKIP(...)                                                                       \
    do {                                                                                   \
        mm_test_skip(__FILE__, __LINE__, __VA_ARGS__);                                     \
        return;                                                                            \
    } while (0)

#define ASSERT_TRUE(c)                                                                     \
    do {                                                                                   \
        if (!(c)) MM_FAIL_("expected true: %s", #c);                                       \
    } while (0)
#define ASSERT_FALSE(c) ASSERT_TRUE(!(c))

#define ASSERT_EQ_INT(a, b)                                                                \
    do {                                                                                   \
        long long mm_a_ = (long long)(a), mm_b_ = (long long)(b);                          \
        if (mm_a_ != mm_b_) MM_FAIL_("%s == %s: %lld != %lld", #a, #b, mm_a_, mm_b_);      \
    } while (0)
#define ASSERT_NE_INT(a, b)                                                                \
    do {                                                                                   \
        long long mm_a_ = (long long)(a), mm_b_ = (long long)(b);                          \
        if (mm_a_ == mm_b_) MM_FAIL_("%s != %s: both %lld", #a, #b, mm_a_);                \
    } while (0)
#define ASSERT_LE_INT(a, b)                                                                \
    do {                                                                                   \
        long long mm_a_ = (long long)(a), mm_b_ = (long long)(b);                          \
        if (!(mm_a_ <= mm_b_)) MM_FAIL_("%s <= %s: %lld > %lld", #a, #b, mm_a_, mm_b_);    \
    } while (0)
#define ASSERT_EQ_U64(a, b)                                                                \
    do {                                                                                   \
        uint64_t mm_a_ = (uint64_t)(a), mm_b_ = (uint64_t)(b);                             \
        if (mm_a_ != mm_b_)                                                                \
            MM_FAIL_("%s == %s: 0x%" PRIx64 " != 0x%" PRIx64, #a, #b, mm_a_, mm_b_);       \
    } while (0)
#define ASSERT_EQ_STR(a, b)                                                                \
    do {                                                                                   \
        const char *mm_a_ = (a), *mm_b_ = (b);                                             \
        if (strcmp(mm_a_, mm_b_) != 0) MM_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, mm_a_, mm_b_); \
    } while (0)
#define ASSERT_CONTAINS(haystack, needle)                                                  \
    do {                                                                                   \
        const char *mm_h_ = (haystack), *mm_n_ = (needle);                                 \
        if (strstr(mm_h_, mm_n_) == NULL)                                                  \
            MM_FAIL_("\"%s\" does not contain \"%s\"", mm_h_, mm_n_);                      \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                             \
    do {                                                                                   \
        double mm_a_ = (double)(a), mm_b_ = (double)(b);                                   \
        if (!(fabs(mm_a_ - mm_b_) <= (double)(tol)))                                       \
            MM_FAIL_("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, mm_a_, mm_b_, (double)(tol)); \
    } while (0)
#define ASSERT_STATUS(expr, expected)                                                      \
    do {                                                                                   \
        megamoe_status_t mm_s_ = (expr), mm_e_ = (expected);                               \
        if (mm_s_ != mm_e_)                                                                \
            MM_FAIL_("%s: got %s, expected %s (last error: %s)", #expr,                    \
                     megamoe_status_name(mm_s_), megamoe_status_name(mm_e_),               \
                     megamoe_last_error());                                                \
    } while (0)
#define ASSERT_OK(expr) ASSERT_STATUS(expr, MEGAMOE_OK)
#define ASSERT_ALLCLOSE(what, got, want, n, rtol, atol)                                    \
    do {                                                                                   \
        if (!mm_test_allclose(what, got, want, n, rtol, atol))                             \
            MM_FAIL_("%s not close (rtol %g, atol %g)", what, (double)(rtol), (double)(atol)); \
    } while (0)

#endif /* MM_TEST_HARNESS_H */
