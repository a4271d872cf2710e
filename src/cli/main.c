/*
 * main.c - the kvprefix command-line tool: dispatches to a subcommand.
 *
 *   kvprefix demo        a scripted serving session through the engine API
 *   kvprefix plan ...    KV-cache capacity planning (plan.c)
 *   kvprefix replay ...  prefix-cache hit rate of a request log (replay.c)
 *   kvprefix version     library and tool version
 *
 * Exit status: 0 success, 1 bad input (message on stderr), 2 usage error.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "keys.h"
#include "kvprefix.h"

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
               "  version   print the version\n"
               "  help      this message\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "demo") == 0)
        return kvp_cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0)
        return kvp_cli_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0)
        return kvp_cli_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "keys") == 0)
        return keys_main(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvprefix %s (library %s)\n", KVP_VERSION_STRING, kvp_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvprefix: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
