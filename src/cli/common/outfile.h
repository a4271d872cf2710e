/*
 * outfile.h - the tool's one way of writing an output file (--plot, -o), as editors save:
 *
 *   target is a regular file or absent   write DIR/.NAME.XXXXXX (mkstemp, beside the
 *                                        target), and on success flush, close and rename
 *                                        it over the target; on failure remove the
 *                                        temporary file: the target is untouched
 *   target exists and is not regular     (/dev/null, a FIFO, a terminal) write it directly:
 *                                        nothing is renamed, nothing is ever removed
 *   "-"                                  standard output, flushed and checked
 *
 * Nothing the tool did not create is removed. A new file gets mode 0666 less the umask; a
 * replaced file keeps its mode; a symbolic link stays a link and the file it names is the
 * one replaced (its temporary file is written beside that file). Write errors, including those that
 * only show at fflush or fclose (a full disk, /dev/full), are reported as "PATH: cannot write:
 * reason".
 *
 * cli_out_refuse_input checks up front that an output is not one of the inputs (the same
 * path, or the same device and inode), so that --plot LOG LOG cannot replace the log;
 * cli_out_check_pair adds the checks between a report and a chart.
 */
#ifndef CLI_OUTFILE_H
#define CLI_OUTFILE_H

#include <stdbool.h>
#include <stdio.h>

typedef struct cli_out {
    FILE *f;            /* where to write; NULL before cli_out_open and after commit/abort */
    const char *path;   /* the target as given ("-" for standard output) */
    const char *target; /* the file renamed over: path, or what its symbolic link names */
    char *real;         /* realpath of path when it is a symbolic link (owned), else NULL */
    char *tmp;          /* the temporary file's path, or NULL when writing the target directly */
    int mode;           /* permissions the renamed file gets */
} cli_out;

/* Refuse an output that is one of the inputs: out_path equal to inputs[i] as a string, or
 * naming the same existing file (st_dev and st_ino). inputs may hold NULLs and "-" (skipped).
 * Returns 0, or CLI_EXIT_USAGE with "FLAG FILE is also an input; refusing to overwrite it"
 * printed for cmd. */
int cli_out_refuse_input(const char *cmd, const char *flag, const char *out_path,
                         const char *const *inputs, size_t n_inputs);

/* The checks of a subcommand with a report (-o, --output) and a chart (--plot), either
 * NULL when not given: neither is one of the inputs (cli_out_refuse_input), they do not
 * name the same file, and "--plot -" comes with the report sent elsewhere. Returns 0, or
 * CLI_EXIT_USAGE with the message printed for cmd. */
int cli_out_check_pair(const char *cmd, const char *report_path, const char *plot_path,
                       const char *const *inputs, size_t n_inputs);

/* Open an output as the picture above says. Returns 0 with o ready, or CLI_EXIT_INPUT with
 * "PATH: cannot create: reason" printed for cmd (nothing is left behind). */
int cli_out_open(const char *cmd, cli_out *o, const char *path);

/* Finish a successful output: flush, check, close, rename into place. Returns 0, or
 * CLI_EXIT_INPUT with "PATH: cannot write: reason" printed; then the temporary file is
 * removed and the target untouched. o is closed either way. */
int cli_out_commit(const char *cmd, cli_out *o);

/* Give up an output: close it and remove the temporary file (never the target). Accepts an
 * output that was never opened or is already closed. Cannot fail. */
void cli_out_abort(cli_out *o);

/* Flush standard output and check it for write errors (a closed pipe, /dev/full). Returns 0
 * or CLI_EXIT_INPUT with "standard output: cannot write: reason" printed for cmd. */
int cli_stdout_check(const char *cmd);

#endif /* CLI_OUTFILE_H */
