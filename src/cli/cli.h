/*
 * cli.h - the subcommands of the kvprefix tool and what they share.
 *
 * Each subcommand is a function taking the arguments after its name (argv[0] is the
 * subcommand name) and returning the process exit status: 0 on success, 1 when the input
 * was wrong (a message "FILE:LINE: what is wrong" or "kvprefix SUB: ..." went to stderr),
 * 2 on a usage error. Subcommands use only the public API in kvprefix.h.
 */
#ifndef KVP_CLI_H
#define KVP_CLI_H

#include <stdbool.h>
#include <stddef.h>

int kvp_cli_demo(int argc, char **argv);
int kvp_cli_plan(int argc, char **argv);
int kvp_cli_replay(int argc, char **argv);

/* Format an error message into err[0 .. size) (errbuf.c). */
void kvp_cli_errf(char *err, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Make room for need elements of elem bytes at *p (capacity *cap, in elements), doubling
 * from 64. Returns false on overflow or out of memory, with *p and *cap unchanged (grow.c). */
bool kvp_cli_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Print "kvprefix CMD: message" to stderr (and, for code 2, a pointer to CMD --help);
 * returns code, the exit status (errbuf.c). */
int kvp_cli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVP_CLI_H */
