/*
 * flags.c - number and unit parsing, the flag-value helpers and getopt_long's error
 * messages, shared by every subcommand (see flags.h for the message and status rules).
 *
 * Numbers are exact uint64_t arithmetic checked with the compiler's overflow builtins, so a
 * value is either exact or refused: "1e3" or "5x" is an error, never a silent 1 or 5.
 *
 * Cost: O(length of the value) per call; nothing is allocated.
 */
#include "flags.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

/* ---- parsing ------------------------------------------------------------------------------ */

/* A unit suffix and its multiplier. */
typedef struct unit {
    const char *name; /* lower-case suffix; "" for none */
    uint64_t mult;    /* what one of it is worth */
} unit;

static int mul_add(uint64_t *v, uint64_t mult, uint64_t add)
{
    return __builtin_mul_overflow(*v, mult, v) || __builtin_add_overflow(*v, add, v);
}

/* Step 1: digits before the point; Step 2: up to 6 after it; Step 3: the unit, looked up
 * case-insensitively; Step 4: value = int * mult + frac * mult / 10^digits, checked. */
static int parse_scaled(const char *s, const unit *units, size_t n_units, uint64_t *out)
{
    if (s == NULL)
        return CLI_EINVAL;
    const char *p = s;
    uint64_t ip = 0, frac = 0, scale = 1;
    int n_int = 0, n_frac = 0;

    /* Step 1: */
    for (; isdigit((unsigned char)*p); p++, n_int++)
        if (mul_add(&ip, 10, (uint64_t)(*p - '0')))
            return CLI_EOVERFLOW;
    /* Step 2: */
    if (*p == '.') {
        for (p++; isdigit((unsigned char)*p); p++, n_frac++) {
            if (n_frac == 6)
                return CLI_EINVAL;
            frac = frac * 10 + (uint64_t)(*p - '0');
            scale *= 10;
        }
        if (n_frac == 0)
            return CLI_EINVAL;
    }
    if (n_int == 0 && n_frac == 0)
        return CLI_EINVAL;
    /* Step 3: */
    uint64_t mult = 0;
    for (size_t i = 0; i < n_units && mult == 0; i++)
        if (strcasecmp(p, units[i].name) == 0)
            mult = units[i].mult;
    if (mult == 0)
        return CLI_EINVAL;
    /* Step 4: frac < 10^6 and mult <= 2^40 keep frac * mult below 2^60. */
    uint64_t v = ip;
    if (mul_add(&v, mult, frac * mult / scale))
        return CLI_EOVERFLOW;
    *out = v;
    return CLI_OK;
}

int cli_parse_bytes(const char *s, uint64_t *out)
{
    static const unit units[] = {
        {"", 1},
        {"b", 1},
        {"kb", UINT64_C(1000)},
        {"mb", UINT64_C(1000000)},
        {"gb", UINT64_C(1000000000)},
        {"tb", UINT64_C(1000000000000)},
        {"kib", UINT64_C(1) << 10},
        {"mib", UINT64_C(1) << 20},
        {"gib", UINT64_C(1) << 30},
        {"tib", UINT64_C(1) << 40},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], out);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int cli_parse_sized(const char *s, int *unit_out, uint64_t *amount)
{
    char buf[64];
    size_t n = strlen(s);
    if (n >= sizeof buf)
        return CLI_EINVAL;
    memcpy(buf, s, n + 1);
    int u = 0, rc;
    uint64_t x = 0;
    if (ends_with(buf, "tokens") || ends_with(buf, "tok")) {
        buf[n - (ends_with(buf, "tokens") ? 6 : 3)] = '\0';
        u = 1;
        rc = cli_parse_count(buf, &x);
    } else if (n > 0 && (buf[n - 1] == 'B' || buf[n - 1] == 'b')) {
        u = 2;
        rc = cli_parse_bytes(buf, &x);
    } else {
        rc = cli_parse_count(buf, &x);
    }
    if (rc != CLI_OK || x == 0)
        return CLI_EINVAL;
    *unit_out = u;
    *amount = x;
    return CLI_OK;
}

int cli_parse_seconds(const char *s, double *out)
{
    char *end;
    double x = strtod(s, &end), scale = -1.0;
    if (end != s && strcmp(end, "s") == 0)
        scale = 1.0;
    else if (end != s && strcmp(end, "ms") == 0)
        scale = 1e-3;
    else if (end != s && strcmp(end, "us") == 0)
        scale = 1e-6;
    else if (end != s && strcmp(end, "ns") == 0)
        scale = 1e-9;
    else if (end != s && *end == '\0' && x == 0.0)
        scale = 1.0;
    if (scale < 0 || !isfinite(x) || x < 0.0 || x > 3600.0)
        return CLI_EINVAL;
    *out = x * scale;
    return CLI_OK;
}

int cli_parse_rate(const char *s, double *out)
{
    char buf[64];
    size_t n = strlen(s);
    if (n >= sizeof buf)
        return CLI_EINVAL;
    memcpy(buf, s, n + 1);
    if (ends_with(buf, "/s"))
        buf[n - 2] = '\0';
    uint64_t b;
    if (cli_parse_bytes(buf, &b) != CLI_OK || b == 0)
        return CLI_EINVAL;
    *out = (double)b;
    return CLI_OK;
}

int cli_parse_count(const char *s, uint64_t *out)
{
    static const unit units[] = {
        {"", 1},
        {"k", UINT64_C(1000)},
        {"m", UINT64_C(1000000)},
        {"b", UINT64_C(1000000000)},
        {"t", UINT64_C(1000000000000)},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], out);
}

int cli_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    if (s == NULL || *s == '\0')
        return CLI_EINVAL;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return CLI_EINVAL;
        if (mul_add(&v, 10, (uint64_t)(*p - '0')))
            return CLI_EOVERFLOW;
    }
    if (v > max)
        return CLI_EOVERFLOW;
    *out = v;
    return CLI_OK;
}

int cli_parse_fraction(const char *s, uint32_t *ppm)
{
    static const unit units[] = {{"", 1000000}};
    uint64_t v;
    if (ppm == NULL || parse_scaled(s, units, 1, &v) != CLI_OK || v == 0 || v > 1000000)
        return CLI_EINVAL;
    *ppm = (uint32_t)v;
    return CLI_OK;
}

char *cli_fmt_binary(uint64_t bytes, char *buf, size_t size)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned i = 0;
    while (i + 1 < sizeof names / sizeof names[0] && bytes >= (UINT64_C(1) << (10 * (i + 1))))
        i++;
    uint64_t unit_bytes = UINT64_C(1) << (10 * i);
    if (bytes % unit_bytes == 0)
        snprintf(buf, size, "%llu %s", (unsigned long long)(bytes / unit_bytes), names[i]);
    else
        snprintf(buf, size, "%.2f %s", (double)bytes / (double)unit_bytes, names[i]);
    return buf;
}

char *cli_fmt_count(uint64_t v, char *buf, size_t size)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    size_t j = 0;
    for (int i = 0; i < n && j + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    if (size > 0)
        buf[j < size ? j : size - 1] = '\0';
    return buf;
}

/* ---- flag values -------------------------------------------------------------------------- */

/* The shared tail of the range helpers: x parsed with rc; in min .. max or a message that
 * ends with hint (examples of the syntax, or ""). */
static int in_range(const char *cmd, const char *flag, const char *v, int rc, uint64_t x,
                    uint64_t min, uint64_t max, const char *what, const char *hint, uint64_t *out)
{
    if (rc != CLI_OK || x < min || x > max)
        return cli_fail(cmd, CLI_EXIT_USAGE, "%s: '%s' is not %s in %" PRIu64 "..%" PRIu64 "%s",
                        flag, v, what, min, max, hint);
    *out = x;
    return 0;
}

int cli_flag_uint(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                  uint64_t *out)
{
    uint64_t x = 0;
    int rc = cli_parse_uint(v, UINT64_MAX, &x);
    return in_range(cmd, flag, v, rc, x, min, max, "an integer", "", out);
}

int cli_flag_count(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                   uint64_t *out)
{
    uint64_t x = 0;
    int rc = cli_parse_count(v, &x);
    return in_range(cmd, flag, v, rc, x, min, max, "a count", " (8B, 70.6B, 7000M)", out);
}

int cli_flag_bytes(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                   uint64_t *out)
{
    uint64_t x = 0;
    int rc = cli_parse_bytes(v, &x);
    return in_range(cmd, flag, v, rc, x, min, max, "a size",
                    " (80GiB, 80GB = 80x10^9, 81920MiB; a bare G is ambiguous)", out);
}

int cli_flag_sized(const char *cmd, const char *flag, const char *v, int *unit_out,
                   uint64_t *amount)
{
    if (cli_parse_sized(v, unit_out, amount) != CLI_OK)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "%s: '%s' is not a positive size (blocks: 20000 or 64K; tokens: 1Mtok; "
                        "memory: 512GiB with --model)",
                        flag, v);
    return 0;
}

int cli_flag_seconds(const char *cmd, const char *flag, const char *v, double *out)
{
    if (cli_parse_seconds(v, out) != CLI_OK)
        return cli_fail(cmd, CLI_EXIT_USAGE, "%s: '%s' is not a duration (10us, 2ms, 0.5s)", flag,
                        v);
    return 0;
}

int cli_flag_rate(const char *cmd, const char *flag, const char *v, double *out)
{
    if (cli_parse_rate(v, out) != CLI_OK)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "%s: '%s' is not a bandwidth in bytes per second (50GB/s)", flag, v);
    return 0;
}

int cli_flag_fraction(const char *cmd, const char *flag, const char *v, uint32_t *ppm)
{
    if (cli_parse_fraction(v, ppm) != CLI_OK)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "%s: '%s' is not a fraction in (0, 1] with at most 6 decimals", flag, v);
    return 0;
}

int cli_flag_choice(const char *cmd, const char *flag, const char *v, const cli_choice *choices,
                    int *out)
{
    char names[256] = "";
    size_t used = 0;
    for (const cli_choice *c = choices; c->name; c++) {
        if (strcmp(v, c->name) == 0) {
            *out = c->value;
            return 0;
        }
        int n = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", c->name);
        if (n > 0 && (size_t)n < sizeof names - used)
            used += (size_t)n;
    }
    return cli_fail(cmd, CLI_EXIT_USAGE, "%s: '%s' is not one of %s", flag, v, names);
}

int cli_flag_list(const char *cmd, const char *flag, const char *v, size_t max_items,
                  cli_list_fn fn, void *ctx)
{
    const char *p = v;
    for (size_t i = 0;; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || i == max_items)
            return cli_fail(cmd, CLI_EXIT_USAGE,
                            "%s: '%s' is not a comma-separated list of at most %zu values", flag, v,
                            max_items);
        int rc = fn(ctx, p, len, i);
        if (rc != 0)
            return rc;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

int cli_item_copy(const char *item, size_t len, char *buf, size_t size)
{
    if (len >= size)
        return 0;
    memcpy(buf, item, len);
    buf[len] = '\0';
    return 1;
}

/* ---- getopt_long -------------------------------------------------------------------------- */

char *cli_opt_name(const struct option *longopts, int c, char *buf, size_t size)
{
    for (const struct option *p = longopts; p->name; p++)
        if (p->val == c)
            snprintf(buf, size, "--%s", p->name);
    return buf;
}

void cli_getopt_begin(void)
{
    optind = 0; /* glibc: 0 also resets its argument permutation */
    opterr = 0;
}

int cli_getopt_error(const char *cmd, int c, char **argv, const struct option *longopts)
{
    const char *arg = argv[optind - 1];
    if (c == ':')
        return cli_fail(cmd, CLI_EXIT_USAGE, "%s needs a value", arg);
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    if (eq) {
        for (const struct option *o = longopts; o->name; o++)
            if (o->has_arg == no_argument && strlen(o->name) == (size_t)(eq - arg - 2) &&
                strncmp(o->name, arg + 2, (size_t)(eq - arg - 2)) == 0)
                return cli_fail(cmd, CLI_EXIT_USAGE, "--%s takes no value", o->name);
    }
    if (optopt != 0 && strncmp(arg, "--", 2) != 0)
        return cli_fail(cmd, CLI_EXIT_USAGE, "unknown option '-%c'", optopt);
    return cli_fail(cmd, CLI_EXIT_USAGE, "unknown option '%s'", arg);
}
