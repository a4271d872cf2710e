/*
 * errbuf.c - error messages of the tool: formatting one into a caller's buffer, for the
 * readers (logread.c, models.c), which report "FILE:LINE: what is wrong" to their callers
 * instead of printing it themselves; printing a subcommand's own error; the one name
 * every message gives standard input; and a failed library call's code with its detail.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "escape.h"
#include "kvprefix.h"

/* Format into err[0 .. size) (truncating); does nothing when err is NULL or size is 0. */
void cli_errf(char *err, size_t size, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || size == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
}

int cli_fail(const char *cmd, int code, const char *fmt, ...)
{
    /* Messages quote file names and bytes of the input: no control character reaches the
     * terminal. */
    char msg[1024], safe[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_escape_str(safe, sizeof safe, msg);
    fprintf(stderr, "kvprefix %s: %s\n", cmd, safe);
    if (code == CLI_EXIT_USAGE)
        fprintf(stderr, "Try 'kvprefix %s --help'.\n", cmd);
    return code;
}

const char *cli_input_name(const char *path)
{
    return path == NULL || strcmp(path, "-") == 0 ? "<stdin>" : path;
}

const char *cli_kvp_error(int rc)
{
    static _Thread_local char buf[384];
    const char *code = kvp_strerror(rc), *detail = kvp_errmsg();
    if (detail[0] == '\0' || strcmp(detail, code) == 0)
        return code;
    snprintf(buf, sizeof buf, "%s: %s", code, detail);
    return buf;
}
