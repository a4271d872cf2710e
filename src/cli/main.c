/*
 * main.c - the kvprefix command-line tool: dispatches to a subcommand (docs/cli.md has the
 * map of the tool's files).
 *
 *   kvprefix demo        a scripted serving session through the engine API (cmd/demo/)
 *   kvprefix plan ...    KV-cache capacity planning (cmd/plan/)
 *   kvprefix replay ...  prefix-cache hit rate of a request log (cmd/replay/)
 *   kvprefix keys ...    block keys of a token list under a hash profile (cmd/keys/)
 *   kvprefix tokenize .. token ids of a text or request under a model's tokenizer
 *                        (cmd/tokenize/)
 *   kvprefix fleet ...   what-if fleet simulation: routing policies, hit rate, TTFT
 *                        (cmd/fleet/)
 *   kvprefix router ...  the router daemon: KV events in, scores out (src/routerd/, its own
 *                        folder and library; only built with libkvprefix-events and
 *                        libmicrohttpd)
 *   kvprefix version     library and tool version
 *
 * Exit status, the same in every subcommand (common/cli.h): 0 done, 1 bad input or failed
 * I/O, 2 usage, 3 internal error.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "demo.h"
#include "fleet.h"
#include "keys.h"
#include "kvprefix.h"
#include "outfile.h"
#include "plan.h"
#include "replay.h"
#include "tokcmd.h"
#ifdef CLI_HAVE_ROUTERD
#include "routerd.h"
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: kvprefix <command> [options]\n"
               "\n"
               "commands:\n"
               "  demo      run a scripted serving session and show what the cache reused\n"
               "  plan      KV-cache capacity planning (kvprefix plan --help)\n"
               "  replay    hit rate of a request log at a cache size, or a whole curve\n"
               "            (kvprefix replay --help)\n"
               "  keys      block keys of a token list under a hash profile (keys --help)\n"
               "  tokenize  token ids of a text or request body under a model's tokenizer\n"
               "            and chat template (tokenize --help)\n"
               "  fleet     what-if fleet simulation: routing policies against hit rate and\n"
               "            time to first token (kvprefix fleet --help)\n"
#ifdef CLI_HAVE_ROUTERD
               "  router    daemon: index engines' KV events, answer scores over HTTP\n"
               "            (kvprefix router --help)\n"
#endif
               "  version   print the version\n"
               "  help      this message\n"
               "\n" CLI_EXIT_HELP);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "demo") == 0)
        return demo_main(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0)
        return pl_main(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0)
        return rp_main(argc - 1, argv + 1);
    if (strcmp(cmd, "keys") == 0)
        return keys_main(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0)
        return tokcmd_main(argc - 1, argv + 1);
    if (strcmp(cmd, "fleet") == 0)
        return fl_main(argc - 1, argv + 1);
#ifdef CLI_HAVE_ROUTERD
    if (strcmp(cmd, "router") == 0)
        return rd_main(argc - 1, argv + 1);
#endif
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvprefix %s (library %s)\n", KVP_VERSION_STRING, kvp_version());
        return cli_stdout_check("version");
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return cli_stdout_check("help");
    }
    if (strcmp(cmd, "route") == 0) {
        /* The fleet simulation was called `route` before 0.2; say where it went. */
        fprintf(stderr, "kvprefix: unknown command 'route': the fleet simulation is "
                        "'kvprefix fleet' (kvprefix fleet --help)\n");
        return CLI_EXIT_USAGE;
    }
    fprintf(stderr, "kvprefix: unknown command '%s'\n", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
