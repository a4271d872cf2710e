/*
 * flags.h - the one module of flag values and units for every subcommand: number and unit
 * parsing (pure functions), the flag-value helpers built on them, which print the same
 * message and return the same exit status for the same mistake in every subcommand, and
 * the reporting of getopt_long's own errors.
 *
 * Every helper takes the subcommand's name (for "kvprefix CMD: ..."), the flag as the user
 * spells it ("--block-size") and the value as given; it returns 0 and writes *out, or prints
 *
 *   kvprefix CMD: --flag: 'VALUE' is not <what it should be>
 *   Try 'kvprefix CMD --help'.
 *
 * and returns CLI_EXIT_USAGE (2) with *out untouched. A value that parses but does not fit
 * what the run finds later (a capacity below one block of the log's format) is the caller's
 * to report, as bad input (1).
 */
#ifndef CLI_FLAGS_H
#define CLI_FLAGS_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

/* Results of the cli_parse_* functions. */
enum {
    CLI_OK = 0,
    CLI_EINVAL = -1,   /* malformed: not a number, an unknown unit, too many decimals */
    CLI_EOVERFLOW = -2 /* a number, but above the maximum or beyond 64 bits */
};

/* ---- parsing (no messages) ------------------------------------------------------------ */

/* Parse a size in bytes: a plain number, a decimal unit (KB, MB, GB, TB = 10^3k) or a
 * binary one (KiB, MiB, GiB, TiB = 2^10k), case-insensitive, with an optional fraction of at
 * most 6 decimals ("1.5GiB"). A bare K/M/G/T is refused as ambiguous. The result is rounded
 * down to whole bytes. Returns CLI_OK, CLI_EINVAL or CLI_EOVERFLOW; *out untouched on
 * failure. */
int cli_parse_bytes(const char *s, uint64_t *out);

/* Parse a count with an optional SI suffix K, M, B (10^9) or T (10^12), e.g. "8B", "70.6B",
 * "46700M". Returns as cli_parse_bytes. */
int cli_parse_count(const char *s, uint64_t *out);

/* Parse a tier or cache size with its unit (replay and fleet --tiers): a count of blocks
 * ("20000", "64K": unit 0), of tokens with a "tok" or "tokens" suffix ("1Mtok": unit 1),
 * or bytes with a B suffix ("512GiB", cli_parse_bytes: unit 2). Returns CLI_OK, or
 * CLI_EINVAL when malformed, too long or zero; *unit_out and *amount untouched on failure. */
int cli_parse_sized(const char *s, int *unit_out, uint64_t *amount);

/* Parse a duration "0.5s", "2ms", "10us", "3ns" or a bare "0" into seconds, 0..3600.
 * Returns CLI_OK or CLI_EINVAL; *out untouched on failure. */
int cli_parse_seconds(const char *s, double *out);

/* Parse a bandwidth "50GB/s", "25GiB/s" or "12.5GB" (cli_parse_bytes, "/s" optional) into
 * bytes per second, above 0. Returns CLI_OK or CLI_EINVAL; *out untouched on failure. */
int cli_parse_rate(const char *s, double *out);

/* Parse a plain non-negative integer (decimal digits only, no sign, no suffix) up to max.
 * Returns CLI_OK, CLI_EINVAL (malformed), CLI_EOVERFLOW (above max). */
int cli_parse_uint(const char *s, uint64_t max, uint64_t *out);

/* Parse a fraction in (0, 1] with at most 6 decimals ("0.9", "1", ".85") into millionths.
 * Returns CLI_OK or CLI_EINVAL. */
int cli_parse_fraction(const char *s, uint32_t *ppm);

/* Format bytes in binary units ("2 GiB", "1.5 MiB", "512 B") into buf: exact values print
 * without decimals, others with two. Returns buf. Cannot fail (truncates to size). */
char *cli_fmt_binary(uint64_t bytes, char *buf, size_t size);

/* Format a count with thousands separators (1234567 -> "1,234,567") into buf. Returns buf.
 * Cannot fail (truncates to size). */
char *cli_fmt_count(uint64_t v, char *buf, size_t size);

/* ---- flag values (message and CLI_EXIT_USAGE on a bad value) ---------------------------- */

/* A plain integer in min .. max. */
int cli_flag_uint(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                  uint64_t *out);

/* A count with an optional K/M/B/T suffix, in min .. max. */
int cli_flag_count(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                   uint64_t *out);

/* A size in blocks, tokens or bytes (cli_parse_sized), a duration in seconds
 * (cli_parse_seconds), a bandwidth in bytes per second (cli_parse_rate): replay's and
 * fleet's --tiers, --tier-bw and --tier-latency items. */
int cli_flag_sized(const char *cmd, const char *flag, const char *v, int *unit_out,
                   uint64_t *amount);
int cli_flag_seconds(const char *cmd, const char *flag, const char *v, double *out);
int cli_flag_rate(const char *cmd, const char *flag, const char *v, double *out);

/* A size with an optional unit (cli_parse_bytes), in min .. max bytes. */
int cli_flag_bytes(const char *cmd, const char *flag, const char *v, uint64_t min, uint64_t max,
                   uint64_t *out);

/* A fraction in (0, 1], into millionths. */
int cli_flag_fraction(const char *cmd, const char *flag, const char *v, uint32_t *ppm);

/* One name of a choice list and the value it stands for. */
typedef struct cli_choice {
    const char *name; /* as typed; NULL ends the list */
    int value;        /* what it stands for */
} cli_choice;

/* One of the names in choices (exact match); the message lists them all. */
int cli_flag_choice(const char *cmd, const char *flag, const char *v, const cli_choice *choices,
                    int *out);

/* Called for each item of a comma-separated list: the item is item[0 .. len), not
 * NUL-terminated; index counts from 0. Returns 0, or an exit status that stops the list. */
typedef int (*cli_list_fn)(void *ctx, const char *item, size_t len, size_t index);

/* Split v at commas into at most max_items non-empty items and call fn on each in order.
 * An empty item or too many items: the message names the flag, exit 2. Returns 0 or the
 * first non-zero status fn returned. */
int cli_flag_list(const char *cmd, const char *flag, const char *v, size_t max_items,
                  cli_list_fn fn, void *ctx);

/* Copy item[0 .. len) into buf (NUL-terminated) for the cli_parse_* functions; false when
 * it does not fit (len >= size). Cannot fail otherwise. */
int cli_item_copy(const char *item, size_t len, char *buf, size_t size);

/* ---- getopt_long ------------------------------------------------------------------------ */

/* The flag of option value c as the user spells it ("--top") into buf, from the
 * subcommand's option table; buf is left as it was when no row has value c. Returns buf.
 * Cannot fail. */
char *cli_opt_name(const struct option *longopts, int c, char *buf, size_t size);

/* Start parsing a subcommand's argv (argv[0] is its name): resets getopt's state and turns
 * off its own messages. Cannot fail. */
void cli_getopt_begin(void);

/* Report what getopt_long returned as an error ('?' an unknown option or a value given to a
 * flag that takes none; ':' a missing value): "unknown option '--x'", "--x takes no value",
 * "--x needs a value". Returns CLI_EXIT_USAGE. argv is the subcommand's. */
int cli_getopt_error(const char *cmd, int c, char **argv, const struct option *longopts);

#endif /* CLI_FLAGS_H */
