/*
 * cli.h - what every subcommand of the kvprefix tool (and the router daemon, src/routerd/)
 * shares: the exit-status table, error formatting (errbuf.c) and growable arrays (grow.c).
 * Each command declares its own entry point in its folder's header (under cmd/); main.c alone
 * includes them.
 *
 * Names. The tool is a client of the library and never uses its prefixes: cli_ and svg_
 * (this folder), bpe_ / tpl_ / pyjson_ (tok/), log_ / oai_ / tok_ / in_ / js_ (input/),
 * cap_ (capacity/), and per command rp_ (cmd/replay/), pl_ (cmd/plan/), fl_ (cmd/fleet/),
 * demo_ (cmd/demo/), keys_ (cmd/keys/), tokcmd_ (cmd/tokenize/); the daemon uses rd_
 * (src/routerd/). Library calls are kvp_*, and kvp__ internals are out of reach.
 *
 * Exit status, the same in every subcommand (docs/cli.md):
 *
 *   0  done
 *   1  bad input or failed I/O: a malformed log line, a value that does not fit the model
 *      or the log, a file that cannot be read, an output that cannot be written
 *   2  usage: an unknown flag, a flag's value that does not parse or is out of range,
 *      conflicting flags, an output path equal to an input path
 *   3  internal error: a check inside the tool failed (please report it)
 *
 * A subcommand is a function taking the arguments after its name (argv[0] is the
 * subcommand name) and returning one of these.
 */
#ifndef CLI_CLI_H
#define CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum {
    CLI_EXIT_OK = 0,      /* done */
    CLI_EXIT_INPUT = 1,   /* bad input or failed I/O */
    CLI_EXIT_USAGE = 2,   /* usage error */
    CLI_EXIT_INTERNAL = 3 /* a check inside the tool failed */
};

/* The exit-status table as --help prints it (one paragraph, ends with a newline). */
#define CLI_EXIT_HELP                                                                              \
    "Exit status: 0 done, 1 bad input or failed I/O, 2 usage error, 3 internal error.\n"

/* Format an error message into err[0 .. size) (errbuf.c). */
void cli_errf(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The value of hexadecimal digit c (either case), or -1 (hashopt.c). Cannot fail. */
int cli_hexval(int c);

/* Make room for need elements of elem bytes at *p (capacity *cap, in elements), doubling
 * from 64. Returns false on overflow or out of memory, with *p and *cap unchanged (grow.c). */
bool cli_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Results of cli_read_all. */
enum { CLI_READ_OK = 0, CLI_READ_NOMEM = 1, CLI_READ_TOOBIG = 2, CLI_READ_EIO = 3 };

/* Read f to its end into a new NUL-terminated buffer: on CLI_READ_OK *buf (the caller
 * frees it) holds *len bytes. CLI_READ_TOOBIG when f holds more than max bytes,
 * CLI_READ_NOMEM, CLI_READ_EIO (ferror; errno says why); nothing is returned on failure
 * (grow.c). */
int cli_read_all(FILE *f, size_t max, char **buf, size_t *len);

/* Print "kvprefix CMD: message" to stderr (and, for CLI_EXIT_USAGE, a pointer to
 * CMD --help); returns code, the exit status (errbuf.c). */
int cli_fail(const char *cmd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The name of an input path in messages: "<stdin>" for "-" (and NULL), else the path.
 * Cannot fail. */
const char *cli_input_name(const char *path);

/* The status rc of a kvprefix.h call that just failed, for messages: "kvp_strerror(rc):
 * kvp_errmsg()", e.g. "invalid argument: n_blocks must be at least 1" (the code's text
 * alone when the library has no more to say). Only for calls of kvprefix.h: those of
 * kvprefix_events.h do not set the detail, so print kvp_strerror for them. The text is in a
 * thread-local buffer, valid until this thread's next call (errbuf.c). Cannot fail. */
const char *cli_kvp_error(int rc);

#endif /* CLI_CLI_H */
