#include <stdlib.h>

#include "base/env.h"
#include "base/error.h"
#include "harness/harness.h"
#include "megamoe/config.h"

static void quiet(void) { megamoe_log_set_level(MEGAMOE_LOG_OFF); }

MM_TEST(sizes_accept_suffixes_and_reject_junk)
{
    quiet();
    uint64_t v = 0;
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "64M", 1);
    ASSERT_OK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v));
    ASSERT_EQ_U64(v, 64ull << 20);
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "2g", 1);
    ASSERT_OK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v));
    ASSERT_EQ_U64(v, 2ull << 30);
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "1TiB", 1);
    ASSERT_OK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v));
    ASSERT_EQ_U64(v, 1ull << 40);
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "8388608", 1);
    ASSERT_OK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v));
    ASSERT_EQ_U64(v, 8388608);
    const char *bad[] = {"", "abc", "12X", "1.5G", "-1G", "64 M", "M", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", bad[i], 1);
        ASSERT_STATUS(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_HEAP_SIZE");
    }
    setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "1K", 1); /* below the 1 MiB minimum */
    ASSERT_STATUS(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "out of range");
    unsetenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE");
    ASSERT_OK(mm_env_size(MM_ENV_SHMEM_HEAP_SIZE, &v));
    ASSERT_EQ_U64(v, 1ull << 30);
}

MM_TEST(booleans_are_strict)
{
    quiet();
    int b = -1;
    const char *yes[] = {"1", "true", "on", "TRUE", "On"};
    const char *no[] = {"0", "false", "off", "False"};
    for (size_t i = 0; i < 5; i++) {
        setenv("MEGAMOE_CHECK", yes[i], 1);
        ASSERT_OK(mm_env_bool(MM_ENV_CHECK, &b));
        ASSERT_EQ_INT(b, 1);
    }
    for (size_t i = 0; i < 4; i++) {
        setenv("MEGAMOE_CHECK", no[i], 1);
        ASSERT_OK(mm_env_bool(MM_ENV_CHECK, &b));
        ASSERT_EQ_INT(b, 0);
    }
    const char *bad[] = {"", "yes", "2", "enable", " 1"};
    for (size_t i = 0; i < 5; i++) {
        setenv("MEGAMOE_CHECK", bad[i], 1);
        ASSERT_STATUS(mm_env_bool(MM_ENV_CHECK, &b), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_CHECK");
        ASSERT_CONTAINS(megamoe_last_error(), "0, 1, true, false, on or off");
    }
    unsetenv("MEGAMOE_CHECK");
    ASSERT_OK(mm_env_bool(MM_ENV_CHECK, &b));
    ASSERT_EQ_INT(b, 0);
}

MM_TEST(integers_are_range_checked)
{
    quiet();
    int64_t v;
    setenv("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "30", 1);
    ASSERT_OK(mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &v));
    ASSERT_EQ_INT(v, 30);
    const char *bad[] = {"0", "86401", "3s", "", "1e3", "-5"};
    for (size_t i = 0; i < 6; i++) {
        setenv("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", bad[i], 1);
        ASSERT_STATUS(mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &v), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC");
    }
    unsetenv("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC");
    ASSERT_OK(mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &v));
    ASSERT_EQ_INT(v, 120);
    /* No default: NOT_FOUND, quietly. */
    unsetenv("RANK");
    ASSERT_STATUS(mm_env_int(MM_ENV_RANK, &v), MEGAMOE_NOT_FOUND);
}

MM_TEST(enums_name_their_choices)
{
    quiet();
    int idx;
    setenv("MEGAMOE_GEMM", "ref", 1);
    ASSERT_OK(mm_env_enum(MM_ENV_GEMM, &idx));
    ASSERT_EQ_INT(idx, 4);
    setenv("MEGAMOE_GEMM", "cublas", 1);
    ASSERT_STATUS(mm_env_enum(MM_ENV_GEMM, &idx), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "auto|amx|avx512|onednn|ref");
    unsetenv("MEGAMOE_GEMM");
}

MM_TEST(validate_reports_first_bad_variable)
{
    quiet();
    ASSERT_OK(megamoe_config_validate());
    setenv("MEGAMOE_LOG_LEVEL", "loud", 1);
    ASSERT_STATUS(megamoe_config_validate(), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_LOG_LEVEL");
    unsetenv("MEGAMOE_LOG_LEVEL");
    ASSERT_OK(megamoe_config_validate());
}

MM_TEST(listing_has_every_entry)
{
    ASSERT_EQ_INT(megamoe_config_count(), MM_ENV_COUNT);
    megamoe_config_entry_t e;
    int seen_heap = 0;
    for (size_t i = 0; i < megamoe_config_count(); i++) {
        ASSERT_OK(megamoe_config_entry(i, &e));
        ASSERT_TRUE(e.name && e.help && e.accepted && e.type && e.default_value);
        if (strcmp(e.name, "HYPER_PARALLEL_SHMEM_HEAP_SIZE") == 0) {
            seen_heap = 1;
            ASSERT_EQ_STR(e.type, "size");
            ASSERT_EQ_STR(e.default_value, "1G");
        }
    }
    ASSERT_TRUE(seen_heap);
    quiet();
    ASSERT_STATUS(megamoe_config_entry(megamoe_config_count(), &e), MEGAMOE_INVALID_ARGUMENT);
}
