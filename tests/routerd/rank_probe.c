/*
 * rank_probe.c - `kvprefix fleet`'s routing decision on inputs given on the command line,
 * for tests/routerd/test_routerd_load.py: the daemon's /score ranking must pick what the
 * fleet simulation's policy picks from the same cached blocks and loads.
 *
 *   rank_probe POLICY LOAD_CAP OVERLAP_WEIGHT PROMPT_BLOCKS CACHED:LOAD ...
 *
 * POLICY is cache-aware or cache-aware-cap; candidates are replicas 0, 1, ... in the order
 * given, and the previous pick is the last replica (so ties go to the first, as the
 * daemon's go to the first row of the index's order). Prints the chosen replica's index.
 * Exits 0, or 2 on a bad argument, 3 when fl_rank_pick fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: rank_probe POLICY LOAD_CAP OVERLAP_WEIGHT PROMPT_BLOCKS "
                        "CACHED:LOAD ...\n");
        return 2;
    }
    int policy = strcmp(argv[1], "cache-aware-cap") == 0 ? FL_CACHE_CAP
                 : strcmp(argv[1], "cache-aware") == 0   ? FL_CACHE_AWARE
                                                         : -1;
    if (policy < 0)
        return 2;
    fl_model m;
    memset(&m, 0, sizeof m);
    m.load_cap = atof(argv[2]);
    m.overlap_weight = atof(argv[3]);
    uint32_t blocks = (uint32_t)strtoul(argv[4], NULL, 10);
    uint32_t n = (uint32_t)(argc - 5);
    uint32_t *cached = calloc(n, sizeof *cached);
    double *work = calloc(n, sizeof *work);
    kvp_router_rank_input *scratch = calloc(n, sizeof *scratch);
    if (!cached || !work || !scratch)
        return 3;
    for (uint32_t i = 0; i < n; i++) {
        char *colon = strchr(argv[5 + i], ':');
        if (colon == NULL)
            return 2;
        cached[i] = (uint32_t)strtoul(argv[5 + i], NULL, 10);
        work[i] = atof(colon + 1);
    }
    uint32_t pick = 0;
    int rc = fl_rank_pick(&m, policy, blocks, cached, work, n, n - 1, scratch, &pick);
    free(cached);
    free(work);
    free(scratch);
    if (rc != FL_OK)
        return 3;
    printf("%u\n", pick);
    return 0;
}
