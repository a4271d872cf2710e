/*
 * cliutil.c - run the built kvprefix binary for the CLI tests (see cliutil.h).
 */
#include "cliutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Read a whole temporary file into buf and remove it. */
static void slurp(int fd, const char *path, char *buf, size_t size)
{
    FILE *f = fdopen(fd, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    remove(path);
}

int cli_run(const char *sub, const char *args, char *err, size_t err_size, char *out,
            size_t out_size)
{
    const char *bin = getenv("KVPREFIX_BIN");
    if (bin == NULL || *bin == '\0')
        cr_skip_test("KVPREFIX_BIN is not set");
    char errf[] = "/tmp/kvp_cli_errXXXXXX", outf[] = "/tmp/kvp_cli_outXXXXXX";
    int e = mkstemp(errf), o = mkstemp(outf);
    cr_assert(e >= 0 && o >= 0);
    static char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' %s %s >'%s' 2>'%s' </dev/null", bin, sub, args, outf, errf);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "%s did not exit normally", cmd);
    slurp(e, errf, err, err_size);
    slurp(o, outf, out, out_size);
    return WEXITSTATUS(st);
}

const char *cli_data(const char *name)
{
    static char path[4096];
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    if (dir == NULL || *dir == '\0')
        cr_skip_test("KVPREFIX_TEST_DATA is not set");
    snprintf(path, sizeof path, "%s/replay/%s", dir, name);
    return path;
}
