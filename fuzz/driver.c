/*
 * driver.c - a standalone main() for the fuzz harnesses, used when they are not built with
 * libFuzzer: `fuzz_<target> [--mutations N] PATH...` runs LLVMFuzzerTestOneInput once on
 * every regular file in each directory PATH (in name order, not recursing) or on PATH
 * itself when it is a file, and then, for each of those inputs, on N deterministic
 * mutants of it (a byte changed, inserted or removed, the input cut short; seeded by the
 * input's position, so a run is reproducible). A harness that finds a violation aborts,
 * so the process dies and the test fails; otherwise the driver prints how many inputs ran
 * and exits 0. An empty corpus is an error, so a missing
 * directory cannot pass silently.
 *
 * This is how every normal build (gcc, and clang with ASan+UBSan) exercises every harness
 * over its checked-in corpus: meson registers one test per target in the 'fuzz' suite.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

#define MAX_INPUT_BYTES (1u << 20) /* larger files are an error: the corpus stays small */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read a whole file (at most MAX_INPUT_BYTES). Returns a malloc'd buffer or NULL. */
static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "driver: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    uint8_t *buf = malloc(MAX_INPUT_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_INPUT_BYTES + 1, f) : 0;
    bool bad = !buf || ferror(f) || n > MAX_INPUT_BYTES;
    fclose(f);
    if (bad) {
        fprintf(stderr, "driver: %s: cannot read, or larger than %u bytes\n", path,
                MAX_INPUT_BYTES);
        free(buf);
        return NULL;
    }
    *size = n;
    return buf;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Run the harness on data and on n_mut mutants of it. */
static void run_input(const uint8_t *data, size_t size, unsigned n_mut, uint64_t seed)
{
    LLVMFuzzerTestOneInput(data, size);
    uint8_t *m = malloc(size + 2);
    if (!m) {
        fprintf(stderr, "driver: out of memory\n");
        exit(1);
    }
    for (unsigned k = 0; k < n_mut; k++) {
        uint64_t r = next_rand(&seed);
        size_t n = size;
        memcpy(m, data, size);
        size_t pos = size ? (size_t)(r >> 8) % size : 0;
        switch (r & 3) {
        case 0:
            if (n)
                m[pos] = (uint8_t)(r >> 40);
            break;
        case 1:
            memmove(m + pos + 1, m + pos, n - pos);
            m[pos] = (uint8_t)(r >> 40);
            n++;
            break;
        case 2:
            if (n) {
                memmove(m + pos, m + pos + 1, n - pos - 1);
                n--;
            }
            break;
        default:
            n = pos;
            break;
        }
        LLVMFuzzerTestOneInput(m, n);
    }
    free(m);
}

/* Run every regular file of dir (or dir itself if it is a file). Returns inputs run, or -1. */
static long run_path(const char *path, unsigned n_mut, uint64_t *seed)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "driver: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        size_t size;
        uint8_t *data = read_file(path, &size);
        if (!data)
            return -1;
        run_input(data, size, n_mut, (*seed)++);
        free(data);
        return 1;
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "driver: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn)
                exit(1);
            names = nn;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n])
            exit(1);
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    long count = 0;
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            size_t size;
            uint8_t *data = read_file(names[i], &size);
            if (!data)
                return -1;
            run_input(data, size, n_mut, (*seed)++);
            free(data);
            count++;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    unsigned n_mut = 0;
    uint64_t seed = 1;
    long total = 0;
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mutations") == 0 && i + 1 < argc) {
            n_mut = (unsigned)strtoul(argv[++i], NULL, 10);
            continue;
        }
        long n = run_path(argv[i], n_mut, &seed);
        if (n < 0)
            return 1;
        total += n;
        n_paths++;
    }
    if (n_paths == 0 || total == 0) {
        fprintf(stderr, "usage: %s [--mutations N] CORPUS_DIR_OR_FILE... (no input found)\n",
                argv[0]);
        return 1;
    }
    printf("driver: %ld inputs passed (%ld runs with mutants)\n", total, total * (long)(1 + n_mut));
    return 0;
}
