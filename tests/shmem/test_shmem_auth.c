/* The bootstrap's job secret (boot_secret.c), single process: which source wins, the token
 * file's rules, the refusal for a non-loopback endpoint without a secret and the opt-out.
 * No traffic leaves this process: a refused start never opens a socket, and the opt-out case
 * runs rank 0 on an address this host does not have, so its listen fails locally. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shmem/boot_secret.h"
#include "shmem_test_util.h"

/* TEST-NET-3 (RFC 5737): documentation addresses, never assigned to a host. */
#define MM_FOREIGN_EP "tcp://203.0.113.7:29555"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void mm_clear_env(void)
{
    unsetenv("MEGAMOE_JOB_TOKEN");
    unsetenv("MEGAMOE_JOB_TOKEN_FILE");
    unsetenv("MEGAMOE_BOOTSTRAP_INSECURE");
    unsetenv("OMPI_COMM_WORLD_SIZE"); /* not under mpirun here */
}

static mm_endpoint_t mm_ep(const char *text)
{
    mm_endpoint_t ep;
    if (mm_endpoint_parse(text, "test", &ep) != MEGAMOE_OK) memset(&ep, 0, sizeof ep);
    return ep;
}

static void mm_write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ_INT((int)write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    ASSERT_EQ_INT(chmod(path, mode), 0);
}

MM_TEST(loopback_detection)
{
    mm_endpoint_t a = mm_ep("tcp://127.0.0.1:1"), b = mm_ep("tcp://127.3.4.5:1"),
                  c = mm_ep("tcp://localhost:1"), d = mm_ep("tcp://[::1]:1"),
                  e = mm_ep("tcp://10.0.0.1:1"), f = mm_ep("tcp://node7:1"),
                  g = mm_ep("tcp://[fe80::1]:1");
    ASSERT_TRUE(mm_endpoint_is_loopback(&a));
    ASSERT_TRUE(mm_endpoint_is_loopback(&b));
    ASSERT_TRUE(mm_endpoint_is_loopback(&c));
    ASSERT_TRUE(mm_endpoint_is_loopback(&d));
    ASSERT_FALSE(mm_endpoint_is_loopback(&e));
    ASSERT_FALSE(mm_endpoint_is_loopback(&f)); /* a host name may resolve anywhere */
    ASSERT_FALSE(mm_endpoint_is_loopback(&g));
}

MM_TEST(sources_in_order)
{
    mm_clear_env();
    char out[MM_SECRET_MAX];
    mm_secret_source_t src;
    mm_endpoint_t ep = mm_ep(MM_FOREIGN_EP);
    const char *path = "/tmp/mm_auth_test_token";
    mm_write_file(path, "from-the-file\n", 0600);
    setenv("MEGAMOE_JOB_TOKEN_FILE", path, 1);
    ASSERT_OK(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src));
    ASSERT_EQ_INT(src, MM_SECRET_FILE);
    ASSERT_EQ_STR(out, "from-the-file"); /* the newline is not part of it */
    setenv("MEGAMOE_JOB_TOKEN", "from-the-env", 1);
    ASSERT_OK(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src));
    ASSERT_EQ_INT(src, MM_SECRET_ENV);
    ASSERT_EQ_STR(out, "from-the-env");
    ASSERT_OK(mm_boot_secret_resolve("from-the-api", &ep, 2, out, sizeof out, &src));
    ASSERT_EQ_INT(src, MM_SECRET_PARAM);
    ASSERT_EQ_STR(out, "from-the-api");
    mm_clear_env();
    unlink(path);
}

MM_TEST(token_file_rules)
{
    mm_clear_env();
    char out[MM_SECRET_MAX];
    mm_secret_source_t src;
    mm_endpoint_t ep = mm_ep(MM_FOREIGN_EP);
    const char *path = "/tmp/mm_auth_test_token2", *link = "/tmp/mm_auth_test_link";
    setenv("MEGAMOE_JOB_TOKEN_FILE", path, 1);
    mm_write_file(path, "s3cret", 0644);
    ASSERT_STATUS(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "chmod 600");
    mm_write_file(path, "", 0600);
    ASSERT_STATUS(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "1..");
    mm_write_file(path, "s3cret", 0400);
    unlink(link);
    ASSERT_EQ_INT(symlink(path, link), 0);
    setenv("MEGAMOE_JOB_TOKEN_FILE", link, 1);
    ASSERT_STATUS(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "symbolic link");
    setenv("MEGAMOE_JOB_TOKEN_FILE", "/tmp/mm_auth_test_missing", 1);
    ASSERT_STATUS(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "mm_auth_test_missing");
    setenv("MEGAMOE_JOB_TOKEN_FILE", path, 1);
    ASSERT_OK(mm_boot_secret_resolve(NULL, &ep, 2, out, sizeof out, &src)); /* 0400 is fine */
    ASSERT_EQ_STR(out, "s3cret");
    mm_clear_env();
    unlink(link);
    unlink(path);
}

/* Through the public start-up: refused before any socket exists, the same on every rank. */
MM_TEST(non_loopback_endpoint_without_secret_is_refused)
{
    mm_clear_env();
    for (int rank = 0; rank < 2; rank++) {
        mm_shmem_params_t p = mm_t_params();
        p.rank = rank;
        p.world_size = 2;
        p.endpoint = MM_FOREIGN_EP;
        ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_INVALID_ARGUMENT);
        const char *e = megamoe_last_error();
        ASSERT_CONTAINS(e, "203.0.113.7:29555 is not a loopback address");
        ASSERT_CONTAINS(e, "MEGAMOE_JOB_TOKEN");
        ASSERT_CONTAINS(e, "MEGAMOE_BOOTSTRAP_INSECURE=1");
        ASSERT_FALSE(mm_shmem_is_running());
    }
    /* a loopback endpoint needs none (a world of one never does) */
    mm_endpoint_t lo = mm_ep("tcp://127.0.0.1:29555");
    char out[MM_SECRET_MAX];
    mm_secret_source_t src;
    ASSERT_OK(mm_boot_secret_resolve(NULL, &lo, 2, out, sizeof out, &src));
    ASSERT_EQ_INT(src, MM_SECRET_NONE);
    mm_endpoint_t far = mm_ep(MM_FOREIGN_EP);
    ASSERT_OK(mm_boot_secret_resolve(NULL, &far, 1, out, sizeof out, &src));
}

MM_TEST(opt_out_warns_and_proceeds)
{
    mm_clear_env();
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    setenv("MEGAMOE_BOOTSTRAP_INSECURE", "1", 1);
    mm_shmem_params_t p = mm_t_params();
    p.rank = 0;
    p.world_size = 2;
    p.endpoint = MM_FOREIGN_EP;
    /* past the secret check: rank 0 tries to listen on an address this host does not have */
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "cannot listen on " MM_FOREIGN_EP);
    megamoe_log_set_callback(NULL, NULL);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "MEGAMOE_BOOTSTRAP_INSECURE=1: the bootstrap at "
                                      MM_FOREIGN_EP " admits any process"));
    mm_clear_env();
}
