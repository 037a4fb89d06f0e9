/* Replays inputs through a fuzz harness without libFuzzer (CTest, every build):
 *   replay_<target> FILE|DIR...          run every file (directories: every file inside)
 *   replay_<target> --write-seeds DIR    regenerate the checked-in seed corpus
 * Exits 0 when every input ran (a crash or a violated property ends the process). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int mm_replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (buf == NULL) break;
        if (n == cap) {
            uint8_t *g = realloc(buf, cap * 2);
            if (g == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    if (buf == NULL) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return -1;
    }
    /* An exact-size copy, so ASan sees reads past the input as libFuzzer would. */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact == NULL) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int mm_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int mm_replay_path(const char *path, int *count)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (mm_replay_file(path) != 0) return -1;
        (*count)++;
        return 0;
    }
    DIR *d = opendir(path);
    if (d == NULL) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **g = realloc(names, cap * sizeof *g);
            if (g == NULL) break;
            names = g;
        }
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, mm_name_cmp); /* a stable order for reproducible runs */
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        if (rc == 0 && mm_replay_path(full, count) != 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) {
        int n = mm_fuzz_write_seeds(argv[2]);
        if (n < 0) {
            fprintf(stderr, "replay: cannot write seeds into %s\n", argv[2]);
            return 1;
        }
        printf("replay: wrote %d seeds into %s\n", n, argv[2]);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR... | --write-seeds DIR\n", argv[0]);
        return 2;
    }
    int count = 0;
    for (int i = 1; i < argc; i++)
        if (mm_replay_path(argv[i], &count) != 0) return 1;
    printf("replay: %d inputs ran without a crash or a violated property\n", count);
    return count > 0 ? 0 : 1;
}
