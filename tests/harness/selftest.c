/* Cases for tests/harness/test_harness.py, which runs this program with chosen names and
 * checks what the runner prints and returns (not a CTest: one case fails on purpose). */
#include "free_port.h"
#include "harness.h"

MM_TEST(passes) { ASSERT_EQ_INT(1 + 1, 2); }

MM_TEST(skips) { MM_SKIP("no frobnicator here (%d)", 42); }

MM_TEST(fails) { ASSERT_EQ_INT(1 + 1, 3); }

/* a failure recorded before the skip keeps the case failed */
MM_TEST(fails_then_skips)
{
    mm_test_fail(__FILE__, __LINE__, "wrong before the skip");
    MM_SKIP("too late to skip");
}

/* prints the port mm_free_loopback_port picks; test_harness.py checks it against the range */
MM_TEST(picks_a_free_port)
{
    int port = mm_free_loopback_port();
    fprintf(stderr, "free port %d\n", port);
    ASSERT_TRUE(port > 0);
}
