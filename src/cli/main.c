/*
 * main.c - the kvprefix command-line tool: dispatches to a subcommand (docs/cli.md has the
 * map of the tool's files).
 *
 *   kvprefix demo        a scripted serving session through the engine API (demo/)
 *   kvprefix plan ...    KV-cache capacity planning (plan/)
 *   kvprefix replay ...  prefix-cache hit rate of a request log (replay/)
 *   kvprefix keys ...    block keys of a token list under a hash profile (keys/)
 *   kvprefix tokenize .. token ids of a text or request under a model's tokenizer (tok/)
 *   kvprefix route ...   what-if fleet routing simulation (route/)
 *   kvprefix router ...  the subscriber daemon: KV events in, scores out (routerd/; only
 *                        built with libkvprefix-events and libmicrohttpd)
 *   kvprefix version     library and tool version
 *
 * Exit status, the same in every subcommand (common/cli.h): 0 done, 1 bad input or failed
 * I/O, 2 usage, 3 internal error.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "keys.h"
#include "tokcmd.h"
#include "kvprefix.h"
#include "outfile.h"
#include "route.h"
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
               "  route     what-if fleet simulation: routing policies against hit rate and\n"
               "            time to first token (kvprefix route --help)\n"
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
    if (strcmp(cmd, "route") == 0)
        return rt_main(argc - 1, argv + 1);
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
    fprintf(stderr, "kvprefix: unknown command '%s'\n", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
