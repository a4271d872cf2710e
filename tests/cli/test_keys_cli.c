/*
 * test_keys_cli.c - `kvprefix keys` against the golden vectors (the vLLM rows of
 * docs/test-vectors.md that are one chain under one namespace, and the keyed vector), its
 * token sources (arguments, --file, stdin, a pasted Python list), --json, and every exit
 * status: 0 done, 1 bad input (naming FILE:LINE or the argument), 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cliutil.h"

#define TOKS_0_31                                                                                  \
    "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31"

static char out[65536], err[4096];

static int keys(const char *args)
{
    return cli_run("keys", args, err, sizeof err, out, sizeof out);
}

/* The output has a line "label digest event". */
static void expect_line(const char *label, const char *digest, const char *event)
{
    char line[256];
    snprintf(line, sizeof line, "\n%s %s %s\n", label, digest, event);
    cr_assert_not_null(strstr(out, line), "missing line '%s %s %s' in:\n%s", label, digest, event,
                       out);
}

Test(keys_cli, vllm_sha256_vectors)
{
    cr_assert_eq(keys("--hash vllm-sha256-cbor " TOKS_0_31), 0, "%s", err);
    expect_line("root", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
                "10672167085007826672");
    expect_line("0", "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749",
                "2233398808101521225");
    expect_line("1", "c300ec275d7bf08af8fc63e76cdc0086911bbc7091e03c5cf892553bef84ef0c",
                "17911472383915781900");
    cr_assert_eq(keys("--hash vllm-sha256-cbor --salt tenant-a " TOKS_0_31), 0);
    expect_line("0", "6cb0a72bb1d5fcd9e8edc0a7c0d918f6545a8d98f4370ef894cac0191c41787a",
                "10721593076989655162");
    cr_assert_eq(keys("--hash vllm-sha256-cbor --adapter my-lora --salt tenant-a " TOKS_0_31), 0);
    expect_line("0", "da5d5cddc9c34a04723d452cf1392a52f74857f914f9fa1dc281fd118778376d",
                "14015761767082768237");
    cr_assert_eq(keys("--hash vllm-sha256-cbor --seed 0 --adapter my-lora " TOKS_0_31), 0);
    expect_line("root", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
                "17921330210090130494");
    expect_line("0", "8b4227ad680a61cde1060f9e82d7d2994ea655458dd28e17c756e32d62e77a73",
                "14363917845617146483");
    cr_assert_eq(keys("--hash vllm-sha256-cbor --seed 0 " TOKS_0_31), 0);
    expect_line("1", "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac",
                "1814341696565857452");
}

/* cli_run gives the tool /dev/null as stdin, so the stdin case pipes through popen. */
Test(keys_cli, vllm_xxhash_vectors_json_from_stdin)
{
    const char *bin = getenv("KVPREFIX_BIN");
    cr_assert_not_null(bin, "KVPREFIX_BIN is not set");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "printf '[0, 1, 2, 3, 4, 5, 6, 7,\\n 8, 9, 10, 11, 12, 13, 14, 15]\\n' | "
             "'%s' keys --hash vllm-xxhash-cbor --seed 0 --json",
             bin);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"root\":{\"digest\":\"1ebe36576dcb573f26b99533a20aaeca\","
                                   "\"event\":2790425493127212746}"),
                       "%s", out);
    cr_assert_not_null(strstr(out, "{\"index\":0,\"digest\":\"209f5d549fc07c8e39d823615ede61ce\","
                                   "\"event\":4168120356241826254}"),
                       "%s", out);
    cr_assert_not_null(strstr(out, "\"n_tokens\":16,\"n_tail_tokens\":0"));
}

Test(keys_cli, keyed_vector_from_a_file)
{
    char path[] = "/tmp/kvp_keys_cli_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "0 1 2 3 4 5 6 7\n8 9 10 11 12 13 14 15\n16 17 18 19 20 21 22 23 24 25 26 27 28 "
               "29 30 31 32\n");
    fclose(f);
    char args[512];
    snprintf(args, sizeof args,
             "--hash keyed --key 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
             " --model llama --tenant acme --file %s",
             path);
    cr_assert_eq(keys(args), 0, "%s", err);
    expect_line("root", "6c6684fcccf7f1f63c7d743d06fc5acf", "4358767819823536847");
    expect_line("0", "a7180d0e54d3261a6988f24e47aa2d69", "7604594388838788457");
    expect_line("1", "ace02e0c24fce8f2097ff350606afec9", "684533194924162761");
    cr_assert_not_null(strstr(out, "33 tokens: 2 full blocks, 1 tail tokens"), "%s", out);
    /* A bad id names the file and line. */
    f = fopen(path, "w");
    fprintf(f, "1 2 3\n4 5 -6\n");
    fclose(f);
    snprintf(args, sizeof args, "--hash xxh3 --file %s", path);
    cr_assert_eq(keys(args), 1);
    char where[600];
    snprintf(where, sizeof where, "%s:2: bad token id '-6'", path);
    cr_assert_not_null(strstr(err, where), "%s", err);
    f = fopen(path, "w");
    fprintf(f, "1 2 3\n\n40 5\n");
    fclose(f);
    snprintf(args, sizeof args, "--hash xxh3 --vocab-size 32 --file %s", path);
    cr_assert_eq(keys(args), 1);
    snprintf(where, sizeof where, "%s:3: token id 40 is not below --vocab-size 32", path);
    cr_assert_not_null(strstr(err, where), "%s", err);
    unlink(path);
    cr_assert_eq(keys(args), 1, "a missing file is bad input");
}

Test(keys_cli, exit_statuses)
{
    cr_assert_eq(keys("--help"), 0);
    cr_assert_not_null(strstr(out, "Usage: kvprefix keys"));
    cr_assert_eq(keys("--hash md5 1 2"), 2);
    cr_assert_eq(keys("--bogus 1"), 2);
    cr_assert_eq(keys("1 2 3"), 2, "keyed without --key must be a usage error");
    cr_assert_eq(keys("--hash keyed --key abcd 1"), 2, "a short key");
    cr_assert_eq(keys("--hash xxh3 --key 000102030405060708090a0b0c0d0e0f 1"), 2);
    cr_assert_eq(keys("--hash xxh3 --seed -1 1"), 2);
    cr_assert_eq(keys("--hash xxh3 --block-size 0 1"), 2);
    cr_assert_eq(keys("--hash xxh3 --file /dev/null 1"), 2);
    cr_assert_eq(keys("--hash xxh3 1 2 99999999999"), 1);
    cr_assert_not_null(strstr(err, "argument:3: bad token id"), "%s", err);
    cr_assert_eq(keys("--hash vllm-sha256-cbor --tenant acme 1"), 1);
    cr_assert_not_null(strstr(err, "cannot express a tenant field"), "%s", err);
    cr_assert_eq(keys("--hash vllm-xxhash-cbor --model llama 1"), 1);
    cr_assert_eq(keys("--hash xxh3 --block-size 2 5 6 7"), 0);
    cr_assert_not_null(strstr(out, "\n0 "));
    cr_assert_null(strstr(out, "\n1 "), "a partial tail block was hashed:\n%s", out);
}
