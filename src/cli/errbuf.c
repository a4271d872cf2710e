/*
 * errbuf.c - error messages of the CLI: formatting one into a caller's buffer, for the
 * readers (logread.c, models.c), which report "FILE:LINE: what is wrong" to their callers
 * instead of printing it themselves; and printing a subcommand's own error.
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli.h"

/* Format into err[0 .. size) (truncating); does nothing when err is NULL or size is 0. */
void kvp_cli_errf(char *err, size_t size, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || size == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
}

int kvp_cli_fail(const char *cmd, int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvprefix %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (code == 2)
        fprintf(stderr, "Try 'kvprefix %s --help'.\n", cmd);
    return code;
}
