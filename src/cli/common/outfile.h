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
 * Crashes and signals. A temporary file never outlives the run that made it when the run
 * is stopped by SIGTERM, SIGINT or SIGHUP: the first cli_out_open that creates one installs
 * a handler for each of those whose action is the default (an ignored signal stays
 * ignored), which removes every temporary file still open and then dies of the same signal
 * (default action re-raised: the exit status says killed by it, and the target is
 * untouched). SIGKILL and a power loss cannot be caught: they may leave a .NAME.XXXXXX
 * beside the target, never a damaged target. For a power loss, cli_out_commit fsyncs the
 * temporary file before renaming it (so the target is the old file or the whole new one,
 * never empty or short) and the directory after (so the rename itself is on disk; skipped
 * where the directory cannot be opened or synced). Direct writes (/dev/null, a FIFO) and
 * standard output are not synced. cli_out_* are for one thread (the tool's main thread);
 * the handler may run in any thread.
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
    int slot;           /* tmp's slot in the signal-cleanup registry (outfile.c), or -1 */
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

/* Open an output as the picture above says (and, for a temporary file, register it for
 * removal on a fatal signal). Returns 0 with o ready, or CLI_EXIT_INPUT with "PATH: cannot
 * create: reason" printed for cmd (nothing is left behind; "Too many open files" when more
 * than 8 temporary files would be alive at once). */
int cli_out_open(const char *cmd, cli_out *o, const char *path);

/* Finish a successful output: flush, check, fsync, close, rename into place, fsync the
 * directory. Returns 0, or CLI_EXIT_INPUT with "PATH: cannot write: reason" printed (a
 * failed fsync included); then the temporary file is removed and the target untouched. o
 * is closed either way. */
int cli_out_commit(const char *cmd, cli_out *o);

/* Give up an output: close it and remove the temporary file (never the target). Accepts an
 * output that was never opened or is already closed. Cannot fail. */
void cli_out_abort(cli_out *o);

/* Flush standard output and check it for write errors (a closed pipe, /dev/full). Returns 0
 * or CLI_EXIT_INPUT with "standard output: cannot write: reason" printed for cmd. */
int cli_stdout_check(const char *cmd);

#endif /* CLI_OUTFILE_H */
