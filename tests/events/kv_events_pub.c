/*
 * kv_events_pub.c - a small engine for tests/events/kv_events_peer.py: a kvp_cache with a vLLM
 * hash profile and an attached kvp_publisher, driven over stdin/stdout so that the Python
 * side (an independent decoder: pyzmq + msgpack) controls the timing.
 *
 *   kv_events_pub ENDPOINT REPLAY_ENDPOINT TOPIC FORM PROFILE DP_RANK
 *       FORM: array | map | batchmap; PROFILE: a kvp hash profile name (vllm-sha256-cbor...)
 *
 * Protocol: prints "READY <pub endpoint> <replay endpoint>" once the sockets are up (the
 * endpoints as bound, wildcard ports resolved); then reads lines:
 *   go    run the scenario below, one flush per step, and print "DONE <batches>";
 *   quit  free everything and exit 0.
 * Any failure prints "ERROR <what>: <kvp_strerror>" and exits 1.
 *
 * Scenario (block size 16, a pool of 8 blocks, replay buffer of 64 batches, served by the
 * publisher's thread):
 *   1. tokens 0..32 in the plain namespace: BlockStored of blocks 0-1, parent nil;
 *   2. tokens 0..48: BlockStored of block 2 alone, parent block 1;
 *   3. tokens 0..16 with LoRA "my-lora" and cache salt "tenant-a": block 0 of that
 *      namespace (vLLM's extra keys ('my-lora', 'tenant-a'));
 *   4. tokens 1000..1096 (6 blocks): the pool of 8 holds 4, so 2 are evicted (BlockRemoved)
 *      between the stores;
 *   5. kvp_cache_reset: BlockRemoved of every block, then AllBlocksCleared.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvprefix_events.h"

static void die(const char *what, int rc)
{
    printf("ERROR %s: %s\n", what, kvp_strerror(rc));
    fflush(stdout);
    exit(1);
}

static void check(const char *what, int rc)
{
    if (rc != KVP_OK)
        die(what, rc);
}

static void access_range(kvp_cache *c, const kvp_namespace *ns, uint32_t from, size_t n)
{
    uint32_t t[128];
    for (size_t i = 0; i < n; i++)
        t[i] = from + (uint32_t)i;
    kvp_match m;
    check("kvp_access", kvp_access(c, ns, t, n, &m));
}

static int scenario(kvp_cache *c, kvp_publisher *pub)
{
    kvp_namespace plain, lora;
    kvp_namespace_init(&plain);
    kvp_namespace_init(&lora);
    lora.adapter = kvp_field_str("my-lora");
    lora.salt = kvp_field_str("tenant-a");
    access_range(c, &plain, 0, 33);
    check("flush 1", kvp_publisher_flush(pub));
    access_range(c, &plain, 0, 49);
    check("flush 2", kvp_publisher_flush(pub));
    access_range(c, &lora, 0, 17);
    check("flush 3", kvp_publisher_flush(pub));
    access_range(c, &plain, 1000, 97);
    check("flush 4", kvp_publisher_flush(pub));
    check("kvp_cache_reset", kvp_cache_reset(c));
    check("flush 5", kvp_publisher_flush(pub));
    return 5;
}

static int parse_form(const char *s)
{
    if (strcmp(s, "array") == 0)
        return KVP_KV_FORM_ARRAY;
    if (strcmp(s, "map") == 0)
        return KVP_KV_FORM_MAP;
    if (strcmp(s, "batchmap") == 0)
        return KVP_KV_FORM_MAP | KVP_KV_BATCH_MAP;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s ENDPOINT REPLAY TOPIC FORM PROFILE DP_RANK\n", argv[0]);
        return 2;
    }
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = argv[1];
    pc.replay_endpoint = argv[2];
    pc.topic = argv[3];
    pc.form = parse_form(argv[4]);
    pc.dp_rank = strtoll(argv[6], NULL, 10);
    pc.buffer_steps = 64;
    pc.replay_thread = true;
    pc.linger_ms = 1000;
    kvp_publisher *pub = NULL;
    check("kvp_publisher_new", kvp_publisher_new(&pc, &pub));

    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 8;
    cfg.block_size = 16;
    check("hash profile", kvp_hash_profile_parse(argv[5], &cfg.hash_profile));
    check("kvp_publisher_attach", kvp_publisher_attach(pub, &cfg));
    kvp_cache *cache = NULL;
    check("kvp_cache_new", kvp_cache_new(&cfg, &cache));

    char ep[512], rep[512];
    check("endpoint", kvp_publisher_endpoint(pub, 0, ep, sizeof ep));
    check("replay endpoint", kvp_publisher_endpoint(pub, 1, rep, sizeof rep));
    printf("READY %s %s\n", ep, rep);
    fflush(stdout);

    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "go", 2) == 0) {
            printf("DONE %d\n", scenario(cache, pub));
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    kvp_cache_free(cache);
    kvp_publisher_free(pub);
    return 0;
}
