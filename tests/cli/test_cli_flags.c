/*
 * test_cli_flags.c - every subcommand of the built kvprefix binary (replay, plan, demo, keys) run
 * with a bad value for each of its flags, and with getopt_long's own mistakes (unknown
 * option, missing value, a value given to a flag that takes none): each must exit with the
 * status of the one table in common/cli.h (2 for usage) and print the shared message of the
 * flag helpers (common/flags.c), naming the flag and the value.
 *
 * Before getopt_long and the shared helpers, the same mistake exited 1 in plan and 2 in
 * replay, and was worded differently in each.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cliutil.h"

typedef struct bad_flag {
    const char *sub;  /* subcommand */
    const char *args; /* its arguments, LOG replaced by a valid log's path */
    int status;       /* expected exit status */
    const char *msg;  /* expected in stderr */
} bad_flag;

static const bad_flag replay_cases[] = {
    {"replay", "--capacity abc LOG", 2, "--capacity: 'abc' is not a positive capacity"},
    {"replay", "--capacity 0 LOG", 2, "--capacity: '0' is not a positive capacity"},
    {"replay", "--capacity 40GiB LOG", 2, "a capacity in bytes needs --model or --config"},
    {"replay", "--capacities 1,,2 LOG", 2,
     "--capacities: '1,,2' is not a comma-separated list of at most 64 values"},
    {"replay", "--capacities 1,x LOG", 2, "--capacities: 'x' is not a positive capacity"},
    {"replay", "--sweep=1 LOG", 2, "--sweep: '1' is not an integer in 2..64"},
    {"replay", "--sweep=x LOG", 2, "--sweep: 'x' is not an integer in 2..64"},
    {"replay", "--capacity 4 --model Nope LOG", 2, "--model: no preset 'Nope'"},
    {"replay", "--capacity 4 --config /nonexistent/config.json LOG", 1, "/nonexistent/config.json"},
    {"replay", "--capacity 4 --model Llama-3.1-8B --kv-dtype fp4 LOG", 2,
     "--kv-dtype: unknown dtype 'fp4'"},
    {"replay", "--capacity 4 --kv-dtype fp8 LOG", 2, "--kv-dtype needs --model or --config"},
    {"replay", "--capacity 4 --format xml LOG", 2,
     "--format: 'xml' is not one of auto, tokens, mooncake, openai"},
    {"replay", "--capacity 4 --block-size 0 LOG", 2,
     "--block-size: '0' is not an integer in 1..65536"},
    {"replay", "--capacity 4 --block-size 65537 LOG", 2, "--block-size: '65537' is not an integer"},
    {"replay", "--capacity 4 --trace-block-size x LOG", 2,
     "--trace-block-size: 'x' is not an integer in 1..65536"},
    {"replay", "--capacity 4 --tokenizer x.tiktoken --tokenizer-kind bpe LOG", 2,
     "--tokenizer-kind: 'bpe' is not one of llama3, cl100k, o200k"},
    {"replay", "--capacity 4 --tokenizer-kind llama3 LOG", 2,
     "--tokenizer-kind needs --tokenizer FILE"},
    {"replay", "--capacity 4 --template jinja LOG", 2,
     "--template: 'jinja' is not one of model, llama3, chatml, qwen2.5, mistral"},
    {"replay", "--capacity 4 --seed -1 LOG", 2, "--seed: '-1' is not an integer in 0.."},
    {"replay", "--capacity 4 --max-line-bytes 10 LOG", 2, "--max-line-bytes: '10' is not a size"},
    {"replay", "--capacity 4 --max-line-bytes 4G LOG", 2, "--max-line-bytes: '4G' is not a size"},
    {"replay", "--capacity 4 --top 0 LOG", 2, "--top: '0' is not an integer in 1..1000"},
    {"replay", "--capacity 4 LOG --plot", 2, "--plot needs a value"},
    {"replay", "--capacity 4 LOG -o", 2, "-o needs a value"},
    {"replay", "--capacity 4 --plot x.svg LOG", 2, "--plot draws a sweep"},
    {"replay", "--capacity 4 --json=1 LOG", 2, "--json takes no value"},
    {"replay", "--capacity 4 --bogus LOG", 2, "unknown option '--bogus'"},
    {"replay", "--capacity 4 -x LOG", 2, "unknown option '-x'"},
    {"replay", "--capacity 4 LOG LOG", 2, "one log at a time"},
    {"replay", "--capacity 4 --json --csv LOG", 2, "--json and --csv exclude each other"},
    {"replay", "LOG", 2, "give --capacity C, --sweep or --capacities"},
    {"replay", "--capacity 4", 2, "no log given"},
    {"replay", "--capacity 4 --hash md5 LOG", 2,
     "--hash: 'md5' is not one of keyed, xxh3, siphash, vllm-sha256-cbor, vllm-xxhash-cbor"},
    {"replay", "--capacity 4 LOG --hash", 2, "--hash needs a value"},
    {"replay", "--capacity 4 --hash-key abcd LOG", 2,
     "--hash-key: 'abcd' is not a key of 32..64 hex digits (16..32 bytes)"},
    {"replay", "--capacity 4 --hash-key 000102030405060708090a0b0c0d0e0g LOG", 2,
     "--hash-key: '000102030405060708090a0b0c0d0e0g' is not a key of 32..64 hex digits"},
    {"replay", "--capacity 4 --hash xxh3 --hash-key 000102030405060708090a0b0c0d0e0f LOG", 2,
     "--hash-key applies to --hash keyed and siphash, not xxh3"},
    {"replay", "--capacity 4 --vllm-seed 0 LOG", 2,
     "--vllm-seed applies to --hash vllm-sha256-cbor and vllm-xxhash-cbor, not keyed"},
    {"replay", "--capacity 4 --seed 7 LOG", 2,
     "--seed is the xxh3 profile's seed: add --hash xxh3"},
    {"replay", "--capacity 4 --vocab-size 0 LOG", 2,
     "--vocab-size: '0' is not an integer in 1..4294967295"},
    {"replay", "--capacity 4 --vocab-size 4294967296 LOG", 2,
     "--vocab-size: '4294967296' is not an integer in 1..4294967295"},
};

static const bad_flag plan_cases[] = {
    {"plan", "--layers x --kv-heads 8 --head-dim 128", 2, "--layers: 'x' is not an integer in 1.."},
    {"plan", "--layers 32 --heads 0 --kv-heads 8 --head-dim 128", 2,
     "--heads: '0' is not an integer"},
    {"plan", "--layers 32 --kv-heads -1 --head-dim 128", 2, "--kv-heads: '-1' is not an integer"},
    {"plan", "--layers 32 --kv-heads 8 --head-dim 99999999999", 2,
     "--head-dim: '99999999999' is not an integer in 1..2147483648"},
    {"plan", "--model Llama-3.1-8B --dtype fp4", 2, "--dtype: unknown dtype 'fp4'"},
    {"plan", "--model Llama-3.1-8B --kv-dtype x", 2, "--kv-dtype: unknown dtype 'x'"},
    {"plan", "--model Llama-3.1-8B --weights-dtype x", 2, "--weights-dtype: unknown dtype 'x'"},
    {"plan", "--model Nope", 2, "--model: unknown preset 'Nope'"},
    {"plan", "--model Llama-3.1-8B --block-size 0", 2,
     "--block-size: '0' is not an integer in 1..65536"},
    {"plan", "--model Llama-3.1-8B --seq-len 0", 2, "--seq-len: '0' is not an integer in 1.."},
    {"plan", "--model Llama-3.1-8B --seq-len 8 --batch 0", 2, "--batch: '0' is not an integer"},
    {"plan", "--model Llama-3.1-8B --lens 1,,2", 2, "--lens: '1,,2' is not a comma-separated list"},
    {"plan", "--model Llama-3.1-8B --lens 1,x", 2, "--lens: 'x' is not an integer in 1.."},
    {"plan", "--model Llama-3.1-8B --seq-len 8 --max-len 0", 2, "--max-len: '0' is not an integer"},
    {"plan", "--model Llama-3.1-8B --gpu-mem 80G", 2, "--gpu-mem: '80G' is not a size"},
    {"plan", "--model Llama-3.1-8B --gpu-mem 0", 2, "--gpu-mem: '0' is not a size in 1.."},
    {"plan", "--model Llama-3.1-8B --gpu-mem 80GiB --util 0", 2,
     "--util: '0' is not a fraction in (0, 1]"},
    {"plan", "--model Llama-3.1-8B --gpu-mem 80GiB --util 1.5", 2,
     "--util: '1.5' is not a fraction"},
    {"plan", "--model Llama-3.1-8B --gpu-mem 80GiB --weights-mem x", 2,
     "--weights-mem: 'x' is not a size"},
    {"plan", "--model Llama-3.1-8B --params 0", 2, "--params: '0' is not a count"},
    {"plan", "--model Llama-3.1-8B --params 8Q", 2, "--params: '8Q' is not a count"},
    {"plan", "--model Llama-3.1-8B --gpu-mem 80GiB --reserve 4G", 2,
     "--reserve: '4G' is not a size"},
    {"plan", "--model Llama-3.1-8B --tp 0", 2, "--tp: '0' is not an integer in 1..1048576"},
    {"plan", "--model Llama-3.1-8B --kv-dtype fp8 --kv-scales x", 2, "--kv-scales: 'x' is not"},
    {"plan", "--model Llama-3.1-8B --kv-dtype fp8 --kv-scale-dtype x", 2,
     "--kv-scale-dtype: 'x' is not"},
    {"plan", "--model Mistral-7B-v0.1 --window 0", 2, "--window: '0' is not an integer in 1.."},
    {"plan", "--model Mistral-7B-v0.1 --no-window=1", 2, "--no-window takes no value"},
    {"plan", "--model Llama-3.1-8B --trace-block-size x", 2,
     "--trace-block-size: 'x' is not an integer in 0..65536"},
    {"plan", "--model Llama-3.1-8B --concurrency 0", 2, "--concurrency: '0' is not an integer"},
    {"plan", "--model Llama-3.1-8B --max-line-bytes 1", 2, "--max-line-bytes: '1' is not a size"},
    {"plan", "--model Llama-3.1-8B --json=x", 2, "--json takes no value"},
    {"plan", "--model", 2, "--model needs a value"},
    {"plan", "--bogus", 2, "unknown option '--bogus'"},
    {"plan", "--model Llama-3.1-8B extra", 2, "unexpected argument 'extra'"},
    {"plan", "--model Llama-3.1-8B --trace LOG --hash sha1", 2,
     "--hash: 'sha1' is not one of keyed, xxh3, siphash"},
    {"plan", "--model Llama-3.1-8B --trace LOG --hash-key 12", 2,
     "--hash-key: '12' is not a key of 32..64 hex digits"},
    {"plan", "--model Llama-3.1-8B --trace LOG --vocab-size x", 2,
     "--vocab-size: 'x' is not an integer in 1..4294967295"},
    {"plan", "--model Llama-3.1-8B --trace LOG --hash siphash --vllm-seed s", 2,
     "--vllm-seed applies to --hash vllm-sha256-cbor and vllm-xxhash-cbor, not siphash"},
    {"plan", "--model Llama-3.1-8B --vocab-size 32000", 2,
     "check the lines of a request log: add --trace FILE"},
};

static const bad_flag demo_cases[] = {
    {"demo", "--bogus", 2, "unknown option '--bogus'"},
    {"demo", "extra", 2, "unexpected argument 'extra'"},
    {"demo", "--help=x", 2, "--help takes no value"},
    {"demo", "--hash blake3", 2, "--hash: 'blake3' is not one of keyed, xxh3, siphash"},
    {"demo", "--hash-key 0011", 2, "--hash-key: '0011' is not a key of 32..64 hex digits"},
    {"demo", "--hash vllm-sha256-cbor --hash-key 000102030405060708090a0b0c0d0e0f", 2,
     "--hash-key applies to --hash keyed and siphash, not vllm-sha256-cbor"},
    {"demo", "--vllm-seed x", 2, "--vllm-seed applies to --hash vllm-sha256-cbor"},
    {"demo", "--vocab-size -1", 2, "--vocab-size: '-1' is not an integer in 1..4294967295"},
    {"demo", "--vocab-size", 2, "--vocab-size needs a value"},
};

static const bad_flag keys_cases[] = {
    {"keys", "--hash md5 1", 2, "--hash: 'md5' is not one of keyed, xxh3, siphash"},
    {"keys", "1 2", 2, "--hash keyed needs --hash-key HEX (the cache's key)"},
    {"keys", "--hash siphash --key abcd 1", 2, "--hash-key: 'abcd' is not a key of 32..64 hex"},
    {"keys", "--hash xxh3 --key 000102030405060708090a0b0c0d0e0f 1", 2,
     "--hash-key applies to --hash keyed and siphash, not xxh3"},
    {"keys", "--hash xxh3 --seed x 1", 2, "--seed: 'x' is not an integer in 0.."},
    {"keys", "--hash keyed --key 000102030405060708090a0b0c0d0e0f --seed 1 1", 2,
     "--seed applies to xxh3 and vllm-* only"},
    {"keys", "--hash vllm-sha256-cbor --seed a --vllm-seed b 1", 2,
     "--seed and --vllm-seed both give the vLLM seed"},
    {"keys", "--hash xxh3 --block-size 0 1", 2, "--block-size: '0' is not an integer in 1..65536"},
    {"keys", "--hash xxh3 --vocab-size 0 1", 2, "--vocab-size: '0' is not an integer in 1.."},
    {"keys", "--hash xxh3 --file LOG 1", 2, "give tokens as arguments or with --file, not both"},
    {"keys", "--json=1", 2, "--json takes no value"},
    {"keys", "--bogus", 2, "unknown option '--bogus'"},
    {"keys", "--file", 2, "--file needs a value"},
};

static const bad_flag tokenize_cases[] = {
    {"tokenize", "LOG", 2, "give --tokenizer FILE"},
    {"tokenize", "--tokenizer x --tokenizer-kind gpt2 LOG", 2,
     "--tokenizer-kind: 'gpt2' is not one of llama3, cl100k, o200k"},
    {"tokenize", "--tokenizer x --template jinja LOG", 2,
     "--template: 'jinja' is not one of model, llama3, chatml, qwen2.5, mistral"},
    {"tokenize", "--tokenizer x --text --template llama3 LOG", 2,
     "--template applies to request bodies, not --text"},
    {"tokenize", "--tokenizer x --max-bytes 0 LOG", 2, "--max-bytes: '0' is not a size"},
    {"tokenize", "--tokenizer x LOG LOG", 2, "one input at a time"},
    {"tokenize", "--tokenizer", 2, "--tokenizer needs a value"},
    {"tokenize", "--json=1", 2, "--json takes no value"},
    {"tokenize", "--bogus", 2, "unknown option '--bogus'"},
    {"tokenize", "--tokenizer /nonexistent/rank.tiktoken LOG", 1,
     "--tokenizer: /nonexistent/rank.tiktoken: cannot open"},
    {"tokenize", "--tokenizer LOG LOG", 1,
     "replay_hand.jsonl:2: not a tokenizer.json (one JSON object): end of file expected"},
};

static void run_cases(const bad_flag *cases, size_t n)
{
    static char err[16384], out[65536], args[4096];
    for (size_t i = 0; i < n; i++) {
        const bad_flag *c = &cases[i];
        /* LOG stands for a valid log, so that only the flag is wrong. */
        const char *log = cli_data("replay_hand.jsonl");
        const char *at = strstr(c->args, "LOG");
        size_t j = 0;
        for (const char *p = c->args; *p && j + strlen(log) + 3 < sizeof args;) {
            if (p == at) {
                j += (size_t)snprintf(args + j, sizeof args - j, "'%s'", log);
                p += 3;
                at = strstr(p, "LOG");
            } else {
                args[j++] = *p++;
            }
        }
        args[j] = '\0';
        int rc = cli_run(c->sub, args, err, sizeof err, out, sizeof out);
        cr_expect_eq(rc, c->status, "%s %s: exit %d, expected %d; stderr: %s", c->sub, c->args, rc,
                     c->status, err);
        cr_expect(strstr(err, c->msg) != NULL, "%s %s: stderr lacks \"%s\": %s", c->sub, c->args,
                  c->msg, err);
        if (c->status == 2)
            cr_expect(strstr(err, "--help'") != NULL, "%s %s: no pointer to --help: %s", c->sub,
                      c->args, err);
        cr_expect_eq(out[0], '\0', "%s %s: wrote a report: %s", c->sub, c->args, out);
    }
}

Test(flags, replay_every_flag)
{
    run_cases(replay_cases, sizeof replay_cases / sizeof replay_cases[0]);
}

Test(flags, plan_every_flag)
{
    run_cases(plan_cases, sizeof plan_cases / sizeof plan_cases[0]);
}

Test(flags, demo_flags)
{
    run_cases(demo_cases, sizeof demo_cases / sizeof demo_cases[0]);
}

Test(flags, keys_every_flag)
{
    run_cases(keys_cases, sizeof keys_cases / sizeof keys_cases[0]);
}

Test(flags, tokenize_every_flag)
{
    run_cases(tokenize_cases, sizeof tokenize_cases / sizeof tokenize_cases[0]);
}

/* --help prints the exit-status table in every subcommand and exits 0. */
Test(flags, help_documents_exit_status)
{
    static char err[4096], out[65536];
    const char *subs[] = {"replay", "plan", "demo", "keys", "tokenize"};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(cli_run(subs[i], "--help", err, sizeof err, out, sizeof out), 0, "%s", err);
        cr_expect(strstr(out, "Exit status: 0 done, 1 bad input or failed I/O, 2 usage error, "
                              "3 internal error.") != NULL,
                  "%s --help: %s", subs[i], out);
    }
}
