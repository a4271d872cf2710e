/*
 * cliutil.h - running the built kvprefix binary from Criterion tests (test_plan,
 * test_replay_cli). The binary is found through the KVPREFIX_BIN environment variable and
 * fixtures through KVPREFIX_TEST_DATA; tests that need them are skipped when they are unset.
 */
#ifndef KVP_TESTS_CLIUTIL_H
#define KVP_TESTS_CLIUTIL_H

#include <stddef.h>

/* Run `$KVPREFIX_BIN SUB ARGS` through the shell with stdin from /dev/null (ARGS may hold
 * redirections and quotes). Its stderr goes to err and its stdout to out (NUL-terminated,
 * truncated to their sizes). Returns the exit status; fails the test if it did not exit
 * normally (a crash). */
int cli_run(const char *sub, const char *args, char *err, size_t err_size, char *out,
            size_t out_size);

/* The path of fixture NAME under $KVPREFIX_TEST_DATA, in a static buffer. */
const char *cli_data(const char *name);

#endif /* KVP_TESTS_CLIUTIL_H */
