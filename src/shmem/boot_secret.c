/* The bootstrap's job secret (boot_secret.h). */
#include "boot_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "shmem_log.h"

const char *mm_secret_source_name(mm_secret_source_t s)
{
    switch (s) {
    case MM_SECRET_PARAM: return "the job_token parameter";
    case MM_SECRET_ENV: return "MEGAMOE_JOB_TOKEN";
    case MM_SECRET_FILE: return "MEGAMOE_JOB_TOKEN_FILE";
    case MM_SECRET_MPI: return "MPI (mpirun)";
    case MM_SECRET_NONE: break;
    }
    return "none";
}

/* The token file: a regular file of this user, not readable by group or others, 1..cap-1
 * bytes (a trailing newline is dropped). */
static megamoe_status_t mm_secret_file(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s cannot be opened: "
                        "%s (it must be a regular file, not a symbolic link)", path,
                        strerror(errno));
    struct stat st;
    megamoe_status_t s = MEGAMOE_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        s = mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s is not a regular file",
                     path);
    else if (st.st_uid != geteuid())
        s = mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s belongs to uid %u, "
                     "not to this user (uid %u)", path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if ((st.st_mode & 077) != 0)
        s = mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s has mode %04o: other "
                     "users may read the job secret; chmod 600 it", path,
                     (unsigned)(st.st_mode & 07777));
    else if (st.st_size <= 0 || (size_t)st.st_size >= cap)
        s = mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s holds %lld bytes; a "
                     "job secret is 1..%zu bytes", path, (long long)st.st_size, cap - 1);
    size_t got = 0;
    while (s == MEGAMOE_OK && got < (size_t)st.st_size) {
        ssize_t n = read(fd, out + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            s = mm_error(MEGAMOE_IO, "cannot read MEGAMOE_JOB_TOKEN_FILE=%s: %s", path,
                         n < 0 ? strerror(errno) : "short read");
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (s != MEGAMOE_OK) return s;
    while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == '\r')) got--;
    out[got] = '\0';
    if (got == 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN_FILE=%s is empty", path);
    return MEGAMOE_OK;
}

megamoe_status_t mm_boot_secret_resolve(const char *param, const mm_endpoint_t *ep, int world,
                                        char *out, size_t cap, mm_secret_source_t *src_p)
{
    out[0] = '\0';
    *src_p = MM_SECRET_NONE;
    if (param && *param) {
        if (strlen(param) >= cap)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "the job_token parameter is longer than "
                            "%zu bytes", cap - 1);
        snprintf(out, cap, "%s", param);
        *src_p = MM_SECRET_PARAM;
        return MEGAMOE_OK;
    }
    const char *env = "", *file = "";
    MM_CHECK(mm_env_string(MM_ENV_JOB_TOKEN, &env));
    MM_CHECK(mm_env_string(MM_ENV_JOB_TOKEN_FILE, &file));
    if (*env) {
        if (strlen(env) >= cap)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "MEGAMOE_JOB_TOKEN is longer than %zu "
                            "bytes", cap - 1);
        snprintf(out, cap, "%s", env);
        *src_p = MM_SECRET_ENV;
        return MEGAMOE_OK;
    }
    if (*file) {
        MM_CHECK(mm_secret_file(file, out, cap));
        *src_p = MM_SECRET_FILE;
        return MEGAMOE_OK;
    }
    if (world <= 1) return MEGAMOE_OK;
    megamoe_status_t s = mm_boot_mpi_secret(out, cap);
    if (s == MEGAMOE_OK) {
        *src_p = MM_SECRET_MPI;
        return MEGAMOE_OK;
    }
    if (s != MEGAMOE_NOT_FOUND) return s;
    int insecure = 0;
    MM_CHECK(mm_env_bool(MM_ENV_BOOTSTRAP_INSECURE, &insecure));
    if (mm_endpoint_is_loopback(ep)) {
        MM_SHMEM_INFO("no job secret: bootstrap peers on %s are not authenticated (loopback: "
                      "only processes of this host can reach it)", ep->text);
        return MEGAMOE_OK;
    }
    if (insecure) {
        MM_SHMEM_WARN("MEGAMOE_BOOTSTRAP_INSECURE=1: the bootstrap at %s admits any process that "
                      "can reach it, and an admitted process can read and write every rank's "
                      "memory; set MEGAMOE_JOB_TOKEN or MEGAMOE_JOB_TOKEN_FILE instead",
                      ep->text);
        return MEGAMOE_OK;
    }
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "the bootstrap endpoint %s is not a loopback "
                    "address, and no job secret is set: any process that can reach the port "
                    "could join the job and read and write every rank's memory. Launch with "
                    "megamoe launch, mpirun or torchrun (they carry a secret), or set the same "
                    "MEGAMOE_JOB_TOKEN (or a mode-0600 MEGAMOE_JOB_TOKEN_FILE) on every rank, or "
                    "accept the risk with MEGAMOE_BOOTSTRAP_INSECURE=1", ep->text);
}
