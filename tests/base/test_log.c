#include <stdlib.h>

#include "base/error.h"
#include "harness/harness.h"
#include "megamoe/log.h"

static char captured[512];
static int captured_count;

static void capture(megamoe_log_level_t level, const char *line, void *user)
{
    (void)level;
    (void)user;
    snprintf(captured, sizeof captured, "%s", line);
    captured_count++;
}

MM_TEST(callback_receives_prefixed_lines_at_or_above_level)
{
    megamoe_log_set_callback(capture, NULL);
    megamoe_log_set_level(MEGAMOE_LOG_INFO);
    megamoe_log_set_rank(3);
    captured_count = 0;
    megamoe_log(MEGAMOE_LOG_DEBUG, "hidden %d", 1);
    ASSERT_EQ_INT(captured_count, 0);
    megamoe_log(MEGAMOE_LOG_WARN, "shown %d", 2);
    ASSERT_EQ_INT(captured_count, 1);
    ASSERT_EQ_STR(captured, "[megamoe][rank 3][warn] shown 2");
    mm_error(MEGAMOE_TIMEOUT, "waited %d s", 5);
    ASSERT_EQ_STR(captured, "[megamoe][rank 3][error] TIMEOUT: waited 5 s");
    megamoe_log_set_rank(-1);
    megamoe_log_set_callback(NULL, NULL);
}

MM_TEST(level_names)
{
    ASSERT_EQ_STR(megamoe_log_level_name(MEGAMOE_LOG_TRACE), "trace");
    ASSERT_EQ_STR(megamoe_log_level_name(MEGAMOE_LOG_OFF), "off");
    ASSERT_EQ_STR(megamoe_log_level_name((megamoe_log_level_t)42), "unknown");
}
