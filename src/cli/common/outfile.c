/*
 * outfile.c - outputs written to a temporary file and renamed into place on success (see
 * outfile.h for the rules and why).
 *
 * Cost: one mkstemp, one rename; the data is written once, through stdio.
 */
#define _XOPEN_SOURCE 700 /* realpath */

#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

int cli_out_refuse_input(const char *cmd, const char *flag, const char *out_path,
                         const char *const *inputs, size_t n_inputs)
{
    if (out_path == NULL || strcmp(out_path, "-") == 0)
        return 0;
    struct stat so;
    bool out_exists = stat(out_path, &so) == 0;
    for (size_t i = 0; i < n_inputs; i++) {
        const char *in = inputs[i];
        struct stat si;
        if (in == NULL || strcmp(in, "-") == 0)
            continue;
        bool same = strcmp(in, out_path) == 0;
        if (!same && out_exists && S_ISREG(so.st_mode) && stat(in, &si) == 0)
            same = si.st_dev == so.st_dev && si.st_ino == so.st_ino;
        if (same)
            return cli_fail(cmd, CLI_EXIT_USAGE, "%s %s is also an input; refusing to overwrite it",
                            flag, out_path);
    }
    return 0;
}

int cli_out_check_pair(const char *cmd, const char *report_path, const char *plot_path,
                       const char *const *inputs, size_t n_inputs)
{
    int rc = cli_out_refuse_input(cmd, "--plot", plot_path, inputs, n_inputs);
    if (rc == 0)
        rc = cli_out_refuse_input(cmd, "--output", report_path, inputs, n_inputs);
    if (rc == 0 && plot_path && report_path && strcmp(plot_path, report_path) == 0 &&
        strcmp(plot_path, "-") != 0)
        rc = cli_fail(cmd, CLI_EXIT_USAGE, "--plot and --output name the same file");
    if (rc == 0 && plot_path && strcmp(plot_path, "-") == 0 &&
        (!report_path || strcmp(report_path, "-") == 0))
        rc = cli_fail(cmd, CLI_EXIT_USAGE,
                      "--plot - writes the chart to standard output: send the report "
                      "elsewhere with -o FILE");
    return rc;
}

/* The temporary file's template: DIR/.NAME.XXXXXX beside path. NULL on out of memory. */
static char *tmp_template(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    size_t n = strlen(path) + 10;
    char *t = malloc(n);
    if (t)
        snprintf(t, n, "%.*s.%s.XXXXXX", (int)dir_len, path, path + dir_len);
    return t;
}

int cli_out_open(const char *cmd, cli_out *o, const char *path)
{
    memset(o, 0, sizeof *o);
    o->path = path;
    if (strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode))
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(EISDIR));
        o->f = fopen(path, "w");
        if (!o->f)
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(errno));
        return 0;
    }
    mode_t mask = umask(0);
    umask(mask);
    o->mode = exists ? (int)(st.st_mode & 07777) : (int)(0666 & ~mask);
    /* Through a symbolic link, replace the file it names, not the link. */
    struct stat lst;
    if (exists && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        o->real = realpath(path, NULL);
        if (!o->real)
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(errno));
        path = o->real;
    }
    o->target = path;
    o->tmp = tmp_template(path);
    int fd = o->tmp ? mkstemp(o->tmp) : -1;
    if (fd < 0) {
        int e = o->tmp ? errno : ENOMEM;
        free(o->tmp);
        o->tmp = NULL;
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(e));
    }
    o->f = fdopen(fd, "w");
    if (!o->f) {
        int e = errno;
        close(fd);
        cli_out_abort(o);
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(e));
    }
    return 0;
}

int cli_out_commit(const char *cmd, cli_out *o)
{
    if (o->f == stdout) {
        o->f = NULL;
        return cli_stdout_check(cmd);
    }
    errno = 0;
    bool ok = fflush(o->f) == 0 && !ferror(o->f);
    int e = errno;
    if (fclose(o->f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    o->f = NULL;
    if (ok && o->tmp &&
        (fchmodat(AT_FDCWD, o->tmp, (mode_t)o->mode, 0) != 0 || rename(o->tmp, o->target) != 0)) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        cli_out_abort(o);
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot write: %s", o->path,
                        e ? strerror(e) : "write error");
    }
    free(o->tmp);
    o->tmp = NULL;
    free(o->real);
    o->real = NULL;
    return 0;
}

void cli_out_abort(cli_out *o)
{
    if (o->f && o->f != stdout)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp)
        unlink(o->tmp);
    free(o->tmp);
    o->tmp = NULL;
    free(o->real);
    o->real = NULL;
}

int cli_stdout_check(const char *cmd)
{
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno;
        return cli_fail(cmd, CLI_EXIT_INPUT, "standard output: cannot write: %s",
                        e ? strerror(e) : "write error");
    }
    return 0;
}
