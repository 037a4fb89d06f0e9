#include <stdlib.h>

#include "base/error.h"
#include "harness/harness.h"
#include "megamoe/config.h"
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

MM_TEST(a_tolerated_status_logs_at_debug_and_others_still_at_error)
{
    megamoe_log_set_callback(capture, NULL);
    megamoe_log_set_level(MEGAMOE_LOG_INFO);
    captured_count = 0;
    megamoe_status_t prev = mm_error_tolerate(MEGAMOE_PEER_LOST);
    ASSERT_EQ_INT(prev, MEGAMOE_OK);
    ASSERT_EQ_INT(mm_error(MEGAMOE_PEER_LOST, "rank %d left", 1), MEGAMOE_PEER_LOST);
    ASSERT_EQ_INT(captured_count, 0); /* debug: below the level */
    ASSERT_EQ_STR(megamoe_last_error(), "PEER_LOST: rank 1 left"); /* still remembered */
    megamoe_log_set_level(MEGAMOE_LOG_DEBUG);
    mm_error(MEGAMOE_PEER_LOST, "rank %d left", 2);
    ASSERT_EQ_INT(captured_count, 1);
    ASSERT_EQ_STR(captured, "[megamoe][debug] PEER_LOST: rank 2 left");
    mm_error(MEGAMOE_TIMEOUT, "waited");
    ASSERT_EQ_STR(captured, "[megamoe][error] TIMEOUT: waited");
    mm_error_tolerate(prev);
    megamoe_log_set_level(MEGAMOE_LOG_INFO);
    mm_error(MEGAMOE_PEER_LOST, "rank %d left", 3);
    ASSERT_EQ_STR(captured, "[megamoe][error] PEER_LOST: rank 3 left");
    megamoe_log_set_callback(NULL, NULL);
}

MM_TEST(level_names)
{
    ASSERT_EQ_STR(megamoe_log_level_name(MEGAMOE_LOG_TRACE), "trace");
    ASSERT_EQ_STR(megamoe_log_level_name(MEGAMOE_LOG_OFF), "off");
    ASSERT_EQ_STR(megamoe_log_level_name((megamoe_log_level_t)42), "unknown");
}

MM_TEST(level_words_are_the_env_table_choices)
{
    /* log.c reads MEGAMOE_LOG_LEVEL as an index into the table's words */
    char want[128] = "one of ";
    for (int l = MEGAMOE_LOG_TRACE; l <= MEGAMOE_LOG_OFF; l++) {
        if (l > MEGAMOE_LOG_TRACE) strcat(want, "|");
        strcat(want, megamoe_log_level_name((megamoe_log_level_t)l));
    }
    int found = 0;
    for (size_t i = 0; i < megamoe_config_count(); i++) {
        megamoe_config_entry_t e;
        ASSERT_OK(megamoe_config_entry(i, &e));
        if (strcmp(e.name, "MEGAMOE_LOG_LEVEL") != 0) continue;
        ASSERT_EQ_STR(e.accepted, want);
        found = 1;
    }
    ASSERT_TRUE(found);
}
