/* Same-host transport: one POSIX shared-memory object per PE.
 *
 * The name is "/megamoe-" + 128 random bits (unguessable), created with O_EXCL and mode 0600,
 * sized with ftruncate (sparse: only touched pages cost memory) and mapped MAP_SHARED. The
 * runtime removes the name as soon as every peer has mapped it, so nothing stays in /dev/shm
 * whatever happens to the processes afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "shmem_log.h"
#include "transport.h"

/* Map size bytes of fd shared, at an address aligned to MM_SHMEM_SEG_ALIGN (mmap alone only
 * guarantees a page): reserve size + the alignment, map the segment at the aligned address
 * inside, give the slack back. MAP_FAILED with errno on failure. */
static void *mm_shm_map(int fd, uint64_t size)
{
    const uintptr_t align = MM_SHMEM_SEG_ALIGN;
    size_t span = (size_t)size + align;
    void *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    uintptr_t lo = (uintptr_t)r, start = (lo + align - 1) & ~(align - 1);
    void *base = mmap((void *)start, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                      fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        munmap(r, span);
        errno = e;
        return MAP_FAILED;
    }
    if (start > lo) munmap(r, start - lo);
    uintptr_t end = start + (uintptr_t)size, hi = lo + span;
    if (hi > end) munmap((void *)end, hi - end);
    return base;
}

static megamoe_status_t mm_shm_create(uint64_t size, mm_shmem_segment_t *seg)
{
    memset(seg, 0, sizeof *seg);
    uint8_t rnd[16];
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return mm_error(MEGAMOE_IO, "getrandom failed: %s", strerror(errno));
        got += (size_t)n;
    }
    int o = snprintf(seg->name, sizeof seg->name, "/megamoe-");
    for (size_t i = 0; i < sizeof rnd; i++) o += snprintf(seg->name + o, sizeof seg->name - (size_t)o, "%02x", rnd[i]);
    int fd = shm_open(seg->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return mm_error(MEGAMOE_IO, "cannot create the symmetric heap segment %s: %s; check "
                        "that /dev/shm is mounted and writable", seg->name, strerror(errno));
    seg->published = 1;
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(seg->name);
        seg->published = 0;
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot size the symmetric heap segment to %llu "
                        "bytes: %s; lower HYPER_PARALLEL_SHMEM_HEAP_SIZE",
                        (unsigned long long)size, strerror(e));
    }
    void *base = mm_shm_map(fd, size);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED) {
        shm_unlink(seg->name);
        seg->published = 0;
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot map the symmetric heap segment of %llu "
                        "bytes: %s; lower HYPER_PARALLEL_SHMEM_HEAP_SIZE",
                        (unsigned long long)size, strerror(e));
    }
    seg->base = base;
    seg->size = size;
    MM_SHMEM_DEBUG("created heap segment %s (%llu bytes) at %p", seg->name,
                   (unsigned long long)size, base);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_shm_attach(int pe, const char *name, uint64_t size,
                                      mm_shmem_segment_t *seg)
{
    memset(seg, 0, sizeof *seg);
    snprintf(seg->name, sizeof seg->name, "%s", name);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return mm_error(MEGAMOE_IO, "cannot open rank %d's heap segment %s: %s (are the ranks "
                        "on the same host and run by the same user?)", pe, name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || st.st_uid != geteuid()) {
        close(fd);
        return mm_error(MEGAMOE_IO, "rank %d's heap segment %s has an unexpected size or owner",
                        pe, name);
    }
    void *base = mm_shm_map(fd, size);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot map rank %d's heap segment (%llu bytes): "
                        "%s", pe, (unsigned long long)size, strerror(e));
    seg->base = base;
    seg->size = size;
    return MEGAMOE_OK;
}

static void mm_shm_unpublish(mm_shmem_segment_t *seg)
{
    if (!seg->published) return;
    if (shm_unlink(seg->name) != 0 && errno != ENOENT)
        MM_SHMEM_WARN("cannot remove heap segment name %s: %s", seg->name, strerror(errno));
    seg->published = 0;
}

static void mm_shm_detach(mm_shmem_segment_t *seg)
{
    if (seg->base) munmap(seg->base, seg->size);
    seg->base = NULL;
}

const mm_shmem_seg_transport_t mm_shmem_transport_shm = {
    .name = "shm",
    .seg_create = mm_shm_create,
    .seg_attach = mm_shm_attach,
    .seg_unpublish = mm_shm_unpublish,
    .seg_detach = mm_shm_detach,
};
