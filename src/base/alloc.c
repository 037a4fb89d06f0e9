/* Aligned allocation and sleeping. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"

megamoe_status_t mm_aligned_alloc(size_t size, size_t align, const char *what, void **ptr_p)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "alignment %zu for %s is not a power of two",
                        align, what);
    void *p = NULL;
    int rc = posix_memalign(&p, align, size ? mm_align_up(size, align) : align);
    if (rc != 0 || p == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate %zu bytes for %s: %s", size,
                        what, strerror(rc));
    *ptr_p = p;
    return MEGAMOE_OK;
}

megamoe_status_t mm_aligned_calloc(size_t size, size_t align, const char *what, void **ptr_p)
{
    void *p;
    MM_CHECK(mm_aligned_alloc(size, align, what, &p));
    memset(p, 0, size ? mm_align_up(size, align) : align);
    *ptr_p = p;
    return MEGAMOE_OK;
}

void mm_aligned_free(void *ptr) { free(ptr); }

void mm_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

double mm_resident_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = 0;
        fclose(f);
    }
    return (double)rss * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}
