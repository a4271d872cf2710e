/*
 * rd_log.c - the log lines of `kvprefix router`, on standard error, with a level and one of
 * two formats (--log-format, --log-level; docs/routing.md, "Running it"):
 *
 *   text    kvprefix router: index: by tokens ...            (info: no level word)
 *           kvprefix router: warning: scrape: engine a: ...
 *   logfmt  ts=2026-12-01T17:10:41.123Z level=info msg="index: by tokens ..."
 *
 * logfmt is one key=value line per event (journald, Loki and most log shippers parse it);
 * the message is quoted, with backslash, double quote and control characters escaped, so
 * an engine's hostile topic cannot forge a line or a key. Each line is written with one
 * fprintf to an unbuffered-by-line stream, so lines of different threads do not mix.
 *
 * State: the format and the least level, set once by rd_log_config before any thread
 * starts, read-only afterwards.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "escape.h"
#include "routerd.h"

static bool rd_log_logfmt;             /* --log-format logfmt */
static int rd_log_least = RD_LOG_INFO; /* --log-level */
static const char *const rd_level_names[] = {"debug", "info", "warn", "error"};

int rd_log_config(const char *format, const char *level, char *err, size_t err_size)
{
    if (format) {
        if (strcmp(format, "text") == 0)
            rd_log_logfmt = false;
        else if (strcmp(format, "logfmt") == 0)
            rd_log_logfmt = true;
        else {
            cli_errf(err, err_size, "--log-format: '%s' is not text or logfmt", format);
            return 1;
        }
    }
    if (level) {
        for (int l = RD_LOG_DEBUG; l <= RD_LOG_ERROR; l++)
            if (strcmp(level, rd_level_names[l]) == 0) {
                rd_log_least = l;
                return 0;
            }
        cli_errf(err, err_size, "--log-level: '%s' is not debug, info, warn or error", level);
        return 1;
    }
    return 0;
}

/* msg as a logfmt quoted value (without the quotes) into out[0 .. cap). */
static void rd_logfmt_value(char *out, size_t cap, const char *msg)
{
    size_t k = 0;
    for (const unsigned char *c = (const unsigned char *)msg; *c && k + 5 < cap; c++) {
        if (*c == '"' || *c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", *c);
        } else {
            out[k++] = (char)*c;
        }
    }
    out[k] = '\0';
}

static void rd_logv(int level, const char *fmt, va_list ap)
{
    if (level < rd_log_least)
        return;
    char msg[1024], safe[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (rd_log_logfmt) {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        rd_logfmt_value(safe, sizeof safe, msg);
        fprintf(stderr, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s msg=\"%s\"\n",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, rd_level_names[level], safe);
    } else {
        cli_escape_str(safe, sizeof safe, msg);
        fprintf(stderr, "kvprefix router: %s%s%s\n",
                level == RD_LOG_INFO   ? ""
                : level == RD_LOG_WARN ? "warning"
                                       : rd_level_names[level],
                level == RD_LOG_INFO ? "" : ": ", safe);
    }
    fflush(stderr);
}

void rd_logl(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rd_logv(level < RD_LOG_DEBUG || level > RD_LOG_ERROR ? RD_LOG_ERROR : level, fmt, ap);
    va_end(ap);
}

void rd_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rd_logv(RD_LOG_INFO, fmt, ap);
    va_end(ap);
}
