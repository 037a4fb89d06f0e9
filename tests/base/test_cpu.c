/* CPU detection against what the kernel reports in /proc/cpuinfo (the same cpuid, read by
 * Linux): the vendor that picks per-vendor tuning and the feature bits that pick kernels. */
#include <stdio.h>
#include <string.h>

#include "base/cpu.h"
#include "harness/harness.h"

/* The first "key : value" of /proc/cpuinfo whose key is `key`; 0 when there is none. */
static int cpuinfo_value(const char *key, char *out, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) return 0;
    char line[8192];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (colon == NULL || strncmp(line, key, strlen(key)) != 0) continue;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        snprintf(out, len, "%s", v);
        out[strcspn(out, "\n")] = '\0';
        found = 1;
    }
    fclose(f);
    return found;
}

static int has_flag(const char *flags, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = flags; (p = strstr(p, flag)) != NULL; p += n)
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

MM_TEST(vendor_matches_proc_cpuinfo)
{
    char vendor[64];
    if (!cpuinfo_value("vendor_id", vendor, sizeof vendor)) MM_SKIP("no vendor_id in /proc/cpuinfo");
    ASSERT_EQ_INT(mm_cpu_is_intel(), strcmp(vendor, "GenuineIntel") == 0);
    ASSERT_EQ_INT(mm_cpu_is_intel(), mm_cpu_is_intel()); /* cached: the same answer */
}

MM_TEST(features_match_proc_cpuinfo)
{
    static char flags[8192];
    if (!cpuinfo_value("flags", flags, sizeof flags)) MM_SKIP("no flags in /proc/cpuinfo");
    int avx512 = has_flag(flags, "avx512f") && has_flag(flags, "avx512bw") &&
                 has_flag(flags, "avx512vl") && has_flag(flags, "avx512dq");
    ASSERT_EQ_INT(mm_cpu_has_avx512(), avx512);
    ASSERT_EQ_INT(mm_cpu_has_avx512_vnni(), avx512 && has_flag(flags, "avx512_vnni"));
    if (avx512) ASSERT_EQ_INT(mm_cpu_has_avx512_bf16(), has_flag(flags, "avx512_bf16"));
}
