/*
 * errbuf.c - formatting an error message into a caller's buffer, shared by the CLI's
 * readers (logread.c, models.c), which report "FILE:LINE: what is wrong" to their callers
 * instead of printing it themselves.
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
