/*
 * outfile.c - outputs written to a temporary file and renamed into place on success (see
 * outfile.h for the rules and why).
 *
 * Cleanup on a fatal signal. Each live temporary file's path is copied into a slot of a
 * fixed registry, so that the handler of SIGTERM, SIGINT and SIGHUP touches only memory
 * prepared beforehand and calls only async-signal-safe functions (unlink, sigaction,
 * raise):
 *
 *   reg_path[CLI_OUT_MAX_TEMPS][PATH_MAX]   the temporary files' paths (static storage)
 *   reg_armed[i]                            1 while reg_path[i] names a file to remove
 *   reg_busy                                1 while the registry and the files change
 *
 * Invariants: reg_armed[i] is set only after the file named by reg_path[i] exists and was
 * created by this process (mkstemp), and cleared before that path may name something else
 * (after rename or unlink). A transition (mkstemp + arm, rename + disarm, unlink + disarm)
 * runs with the three signals blocked in the calling thread and reg_busy set, so that a
 * handler never removes a file the tool did not create: in that thread the handler cannot
 * run during a transition, and in another thread (fleet's router workers) it waits for
 * reg_busy to clear, which takes the few system calls of the transition. One thread uses
 * cli_out_* at a time (the tool's main thread). The handler removes the armed files, then
 * restores the default action and raises the signal again, so the process dies of it
 * (exit status 128 + signal in a shell) as it would have without the handler. A signal the
 * caller ignores (SIG_IGN inherited, as under nohup) stays ignored.
 *
 * Cost: one mkstemp, fsync of the file, one rename, fsync of its directory; the data is
 * written once, through stdio. The two fsyncs wait for the disk (milliseconds on a local
 * SSD, nothing on tmpfs): the price of a target that is never empty after a power loss.
 */
#define _XOPEN_SOURCE 700 /* realpath */

#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* The temporary files alive at once: a subcommand writes at most a report and a chart. */
#define CLI_OUT_MAX_TEMPS 8

#if ATOMIC_INT_LOCK_FREE != 2
#error "the signal handler needs lock-free atomic ints"
#endif

static const int fatal_signals[] = {SIGTERM, SIGINT, SIGHUP};
static char reg_path[CLI_OUT_MAX_TEMPS][PATH_MAX]; /* valid while reg_armed[i] */
static atomic_int reg_armed[CLI_OUT_MAX_TEMPS];    /* 1: reg_path[i] is ours to remove */
static atomic_int reg_busy;                        /* 1 during a transition */
static bool reg_handlers_set;                      /* handlers installed (main thread) */

/* Remove the armed temporary files, then die of sig as if there were no handler. Uses only
 * async-signal-safe calls. */
static void on_fatal_signal(int sig)
{
    while (atomic_load(&reg_busy))
        ; /* another thread is in a transition of a few system calls */
    for (int i = 0; i < CLI_OUT_MAX_TEMPS; i++)
        if (atomic_load(&reg_armed[i]))
            unlink(reg_path[i]);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* pending until this handler returns, then fatal */
}

/* Install the handler for each fatal signal whose action is the default (once). A signal
 * ignored or already handled by someone else is left alone. Cannot fail (a signal whose
 * action cannot be read keeps it). */
static void install_handlers(void)
{
    if (reg_handlers_set)
        return;
    reg_handlers_set = true;
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(fatal_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t j = 0; j < sizeof fatal_signals / sizeof fatal_signals[0]; j++)
            sigaddset(&sa.sa_mask, fatal_signals[j]); /* one cleanup at a time */
        sigaction(fatal_signals[i], &sa, NULL);
    }
}

/* Start a transition: block the fatal signals in this thread (old mask into saved) and
 * mark the registry busy. Cannot fail. */
static void reg_begin(sigset_t *saved)
{
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        sigaddset(&block, fatal_signals[i]);
    pthread_sigmask(SIG_BLOCK, &block, saved);
    atomic_store(&reg_busy, 1);
}

/* End a transition: a signal that arrived meanwhile is delivered now. */
static void reg_end(const sigset_t *saved)
{
    atomic_store(&reg_busy, 0);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* A free slot for a path of path_len bytes, or -1 (none free, or a path too long). */
static int reg_find_slot(size_t path_len)
{
    if (path_len >= PATH_MAX)
        return -1;
    for (int i = 0; i < CLI_OUT_MAX_TEMPS; i++)
        if (!atomic_load(&reg_armed[i]))
            return i;
    return -1;
}

/* Arm slot for path (inside a transition). Cannot fail. */
static void reg_arm(int slot, const char *path)
{
    memcpy(reg_path[slot], path, strlen(path) + 1);
    atomic_store(&reg_armed[slot], 1);
}

int cli_out_refuse_input(const char *cmd, const char *flag, const char *out_path,
                         const char *const *inputs, size_t n_inputs)
{
    if (out_path == NULL || strcmp(out_path, "-") == 0)
        return 0;
    struct stat so;
    bool out_exists = stat(out_path, &so) == 0;
    for (size_t i = 0; i < n_inputs; i++) {
        const char *in = inputs[i];
        struct stat si;
        if (in == NULL || strcmp(in, "-") == 0)
            continue;
        bool same = strcmp(in, out_path) == 0;
        if (!same && out_exists && S_ISREG(so.st_mode) && stat(in, &si) == 0)
            same = si.st_dev == so.st_dev && si.st_ino == so.st_ino;
        if (same)
            return cli_fail(cmd, CLI_EXIT_USAGE, "%s %s is also an input; refusing to overwrite it",
                            flag, out_path);
    }
    return 0;
}

int cli_out_check_pair(const char *cmd, const char *report_path, const char *plot_path,
                       const char *const *inputs, size_t n_inputs)
{
    int rc = cli_out_refuse_input(cmd, "--plot", plot_path, inputs, n_inputs);
    if (rc == 0)
        rc = cli_out_refuse_input(cmd, "--output", report_path, inputs, n_inputs);
    if (rc == 0 && plot_path && report_path && strcmp(plot_path, report_path) == 0 &&
        strcmp(plot_path, "-") != 0)
        rc = cli_fail(cmd, CLI_EXIT_USAGE, "--plot and --output name the same file");
    if (rc == 0 && plot_path && strcmp(plot_path, "-") == 0 &&
        (!report_path || strcmp(report_path, "-") == 0))
        rc = cli_fail(cmd, CLI_EXIT_USAGE,
                      "--plot - writes the chart to standard output: send the report "
                      "elsewhere with -o FILE");
    return rc;
}

/* Disarm o's registry slot (inside a transition, once its temporary file is renamed or
 * removed). Cannot fail. */
static void reg_disarm(cli_out *o)
{
    if (o->slot >= 0 && o->slot < CLI_OUT_MAX_TEMPS)
        atomic_store(&reg_armed[o->slot], 0);
    o->slot = -1;
}

/* fsync the directory holding path, so that a rename into it survives a power loss. Best
 * effort: a directory that cannot be opened or synced (some network and FUSE filesystems)
 * is skipped, since the output is already complete and in place. */
static void sync_dir(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (!slash)
        memcpy(dir, ".", 2);
    else if (n == 0)
        memcpy(dir, "/", 2);
    else if (n < sizeof dir) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    } else
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (fsync(fd) != 0)
        errno = 0; /* best effort, see above */
    close(fd);
}

/* The temporary file's template: DIR/.NAME.XXXXXX beside path. NULL on out of memory. */
static char *tmp_template(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    size_t n = strlen(path) + 10;
    char *t = malloc(n);
    if (t)
        snprintf(t, n, "%.*s.%s.XXXXXX", (int)dir_len, path, path + dir_len);
    return t;
}

int cli_out_open(const char *cmd, cli_out *o, const char *path)
{
    memset(o, 0, sizeof *o);
    o->slot = -1;
    o->path = path;
    if (strcmp(path, "-") == 0) {
        o->f = stdout;
        return 0;
    }
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode))
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(EISDIR));
        o->f = fopen(path, "w");
        if (!o->f)
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(errno));
        return 0;
    }
    mode_t mask = umask(0);
    umask(mask);
    o->mode = exists ? (int)(st.st_mode & 07777) : (int)(0666 & ~mask);
    /* Through a symbolic link, replace the file it names, not the link. */
    struct stat lst;
    if (exists && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        o->real = realpath(path, NULL);
        if (!o->real)
            return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(errno));
        path = o->real;
    }
    o->target = path;
    o->tmp = tmp_template(path);
    int slot = o->tmp ? reg_find_slot(strlen(o->tmp)) : -1;
    int fd = -1, create_errno = ENOMEM;
    if (o->tmp && slot < 0)
        create_errno = strlen(o->tmp) >= PATH_MAX ? ENAMETOOLONG : EMFILE;
    if (slot >= 0) {
        /* Created and registered with the fatal signals blocked: a signal cannot find the
         * file unregistered, nor the registry naming a file that is not ours. */
        install_handlers();
        sigset_t saved;
        reg_begin(&saved);
        fd = mkstemp(o->tmp);
        create_errno = errno;
        if (fd >= 0) {
            reg_arm(slot, o->tmp);
            o->slot = slot;
        }
        reg_end(&saved);
    }
    if (fd < 0) {
        free(o->tmp);
        o->tmp = NULL;
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(create_errno));
    }
    o->f = fdopen(fd, "w");
    if (!o->f) {
        int e = errno;
        close(fd);
        cli_out_abort(o);
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot create: %s", path, strerror(e));
    }
    return 0;
}

/*
 * Steps: 1. flush stdio and check the stream; 2. fsync the temporary file (its data and
 * size on disk before any name points at it; EINVAL, a file that cannot be synced, is not
 * an error); 3. close; 4. give it the target's mode; 5. rename it over the target and
 * disarm its signal cleanup, in one transition; 6. fsync the directory (best effort). A
 * failure in steps 1-5 removes the temporary file and leaves the target untouched.
 */
int cli_out_commit(const char *cmd, cli_out *o)
{
    if (o->f == stdout) {
        o->f = NULL;
        return cli_stdout_check(cmd);
    }
    /* Step 1: */
    errno = 0;
    bool ok = fflush(o->f) == 0 && !ferror(o->f);
    int e = errno;
    /* Step 2: */
    if (ok && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL) {
        ok = false;
        e = errno;
    }
    /* Step 3: */
    if (fclose(o->f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    o->f = NULL;
    /* Step 4: */
    if (ok && o->tmp && fchmodat(AT_FDCWD, o->tmp, (mode_t)o->mode, 0) != 0) {
        ok = false;
        e = errno;
    }
    /* Step 5: */
    if (ok && o->tmp) {
        sigset_t saved;
        reg_begin(&saved);
        if (rename(o->tmp, o->target) == 0)
            reg_disarm(o);
        else {
            ok = false;
            e = errno;
        }
        reg_end(&saved);
        /* Step 6: */
        if (ok)
            sync_dir(o->target);
    }
    if (!ok) {
        cli_out_abort(o);
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: cannot write: %s", o->path,
                        e ? strerror(e) : "write error");
    }
    free(o->tmp);
    o->tmp = NULL;
    free(o->real);
    o->real = NULL;
    return 0;
}

void cli_out_abort(cli_out *o)
{
    if (o->f && o->f != stdout)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp) {
        sigset_t saved;
        reg_begin(&saved);
        unlink(o->tmp);
        reg_disarm(o);
        reg_end(&saved);
    }
    free(o->tmp);
    o->tmp = NULL;
    free(o->real);
    o->real = NULL;
}

int cli_stdout_check(const char *cmd)
{
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno;
        return cli_fail(cmd, CLI_EXIT_INPUT, "standard output: cannot write: %s",
                        e ? strerror(e) : "write error");
    }
    return 0;
}
