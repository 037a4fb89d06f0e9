#include "base/error.h"
#include "harness/harness.h"
#include "megamoe/status.h"

MM_TEST(status_strings_cover_every_code)
{
    ASSERT_EQ_INT(MEGAMOE_OK, 0);
    ASSERT_EQ_STR(megamoe_status_name(MEGAMOE_CAPACITY_OVERFLOW), "CAPACITY_OVERFLOW");
    ASSERT_EQ_STR(megamoe_status_str(MEGAMOE_PEER_LOST), "a peer rank was lost");
    ASSERT_EQ_STR(megamoe_status_name((megamoe_status_t)-999), "UNKNOWN");
#define CHECK_(name, value, text)                                                 \
    ASSERT_TRUE(value == 0 || value == 1 || value < 0);                           \
    ASSERT_EQ_STR(megamoe_status_name(MEGAMOE_##name), #name);                    \
    ASSERT_EQ_STR(megamoe_status_str(MEGAMOE_##name), text);
    MEGAMOE_STATUS_MAP(CHECK_)
#undef CHECK_
}

MM_TEST(last_error_records_message)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    megamoe_clear_last_error();
    ASSERT_EQ_STR(megamoe_last_error(), "");
    megamoe_status_t st = mm_error(MEGAMOE_INVALID_ARGUMENT, "top_k %d must be in [1, %d]", 9, 8);
    ASSERT_EQ_INT(st, MEGAMOE_INVALID_ARGUMENT);
    ASSERT_EQ_STR(megamoe_last_error(), "INVALID_ARGUMENT: top_k 9 must be in [1, 8]");
    megamoe_clear_last_error();
    ASSERT_EQ_STR(megamoe_last_error(), "");
}

/* A message that wraps the previous one keeps it (found by the operator fuzz harness: the
 * heap-exhaustion and wait errors of dispatch/combine lost their cause, "OUT_OF_MEMORY:
 * OUT_OF_MEMORY: ; the dispatch/combine workspace needs ..."). */
MM_TEST(last_error_can_wrap_the_previous_one)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    mm_error(MEGAMOE_OUT_OF_MEMORY, "heap exhausted: raise HYPER_PARALLEL_SHMEM_HEAP_SIZE to 101M");
    mm_error(MEGAMOE_OUT_OF_MEMORY, "%s; the workspace needs %d bytes", megamoe_last_error(), 64);
    ASSERT_EQ_STR(megamoe_last_error(),
                  "OUT_OF_MEMORY: OUT_OF_MEMORY: heap exhausted: raise "
                  "HYPER_PARALLEL_SHMEM_HEAP_SIZE to 101M; the workspace needs 64 bytes");
    mm_error_quiet(MEGAMOE_TIMEOUT, "waiting: %s", megamoe_last_error());
    ASSERT_TRUE(strstr(megamoe_last_error(), "TIMEOUT: waiting: OUT_OF_MEMORY: OUT_OF_MEMORY: heap") ==
                megamoe_last_error());
    mm_set_last_error(megamoe_last_error() + 9); /* overlapping, shorter */
    ASSERT_TRUE(strncmp(megamoe_last_error(), "waiting: OUT_OF_MEMORY", 22) == 0);
}
