/*
 * test_plan.c - tests of `kvprefix plan`: the capacity arithmetic (kvplan.c), the model
 * presets and config.json reader (models.c), the request-log reader (logread.c), and the
 * built binary's exit status and messages for wrong inputs.
 *
 * Expected values are computed by hand in the comments, not by the code under test. The
 * fixtures live in tests/cli/data/plan/ (directory given by KVPREFIX_TEST_DATA); the binary is
 * found through KVPREFIX_BIN, and the tests that need it are skipped when it is not set.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "flags.h"
#include "kvplan.h"
#include "cliutil.h"
#include "logread.h"
#include "gpus.h"
#include "models.h"

#define GiB (UINT64_C(1) << 30)
#define MiB (UINT64_C(1) << 20)

static cap_model_shape shape(uint32_t l, uint32_t hq, uint32_t hkv, uint32_t d, cap_dtype t)
{
    cap_model_shape m;
    cap_model_shape_init(&m);
    m.n_layers = l;
    m.n_heads = hq;
    m.n_kv_heads = hkv;
    m.head_dim = d;
    m.kv_dtype = t;
    m.w_dtype = t;
    return m;
}

static uint64_t seq_bytes(const cap_model_shape *m, uint64_t len)
{
    uint64_t tok = 0, b = 0;
    cr_assert_eq(cap_token_bytes(m, m->n_kv_heads, &tok), CAP_OK);
    cr_assert_eq(cap_mul(tok, len, &b), CAP_OK);
    return b;
}

static const char *data_path(const char *name)
{
    static char buf[4096];
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/plan/%s", dir ? dir : "tests/cli/data", name);
    return buf;
}

/* ---- forward arithmetic ---------------------------------------------------------------- */

Test(forward, mha_is_2gib_gqa_half_gib_ratio_4)
{
    /* 2 x 32 x 32 x 128 x 2 = 524288 bytes per token; x 4096 = 2^31 = 2 GiB. */
    cap_model_shape mha = shape(32, 32, 32, 128, CAP_DTYPE_FP16);
    cap_model_shape gqa = shape(32, 32, 8, 128, CAP_DTYPE_FP16);
    uint64_t tok = 0;
    cr_assert_eq(cap_token_bytes(&mha, 32, &tok), CAP_OK);
    cr_assert_eq(tok, 524288);
    cr_assert_eq(seq_bytes(&mha, 4096), 2 * GiB);
    cr_assert_eq(seq_bytes(&gqa, 4096), GiB / 2);
    cr_assert_eq(seq_bytes(&mha, 4096), 4 * seq_bytes(&gqa, 4096));
    cap_model_shape mqa = shape(32, 32, 1, 128, CAP_DTYPE_FP16);
    cr_assert_eq(seq_bytes(&mqa, 4096), 64 * MiB);
}

Test(forward, dtype_sizes)
{
    cap_dtype d;
    const char *names[] = {"fp32",     "float32", "fp16",          "half", "bf16",
                           "bfloat16", "fp8",     "float8_e4m3fn", "int8", "BF16"};
    unsigned sizes[] = {4, 4, 2, 2, 2, 2, 1, 1, 1, 2};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cr_assert_eq(cap_dtype_parse(names[i], &d), CAP_OK, "%s", names[i]);
        cr_assert_eq(cap_dtype_bytes(d), sizes[i], "%s", names[i]);
    }
    cr_assert_eq(cap_dtype_parse("fp4", &d), CAP_EINVAL);
    cr_assert_eq(cap_dtype_parse("", &d), CAP_EINVAL);
    cap_model_shape f32 = shape(32, 32, 8, 128, CAP_DTYPE_FP32);
    cap_model_shape f8 = shape(32, 32, 8, 128, CAP_DTYPE_FP8);
    cr_assert_eq(seq_bytes(&f32, 4096), GiB);
    cr_assert_eq(seq_bytes(&f8, 4096), GiB / 4);
}

Test(forward, doubling_t_or_b_doubles_bytes)
{
    cap_model_shape m = shape(80, 64, 8, 128, CAP_DTYPE_BF16);
    uint64_t a = seq_bytes(&m, 1000), b = seq_bytes(&m, 2000);
    cr_assert_eq(b, 2 * a);
    uint64_t lens1[] = {1000, 1000}, lens2[] = {1000, 1000, 1000, 1000}, s1, s2;
    cr_assert_eq(cap_sum(lens1, 2, &s1), CAP_OK);
    cr_assert_eq(cap_sum(lens2, 4, &s2), CAP_OK);
    cr_assert_eq(seq_bytes(&m, s2), 2 * seq_bytes(&m, s1));
}

Test(forward, variable_length_batch_sums_lengths)
{
    cap_model_shape m = shape(32, 32, 8, 128, CAP_DTYPE_BF16); /* 131072 bytes per token */
    uint64_t lens[] = {100, 2000, 513, 4096}, sum = 0;
    cr_assert_eq(cap_sum(lens, 4, &sum), CAP_OK);
    cr_assert_eq(sum, 6709);
    cr_assert_eq(seq_bytes(&m, sum), UINT64_C(6709) * 131072);
    cr_assert_eq(seq_bytes(&m, sum), seq_bytes(&m, 100) + seq_bytes(&m, 2000) + seq_bytes(&m, 513) +
                                         seq_bytes(&m, 4096));
}

Test(forward, overflow_is_refused)
{
    cap_model_shape m = shape(1u << 31, 1u << 31, 1u << 31, 1u << 31, CAP_DTYPE_FP32);
    uint64_t tok = 7;
    cr_assert_eq(cap_token_bytes(&m, m.n_kv_heads, &tok), CAP_EOVERFLOW);
    cr_assert_eq(tok, 7, "out-parameter must be untouched on failure");
    uint64_t x = 3;
    cr_assert_eq(cap_mul(UINT64_MAX, 2, &x), CAP_EOVERFLOW);
    cr_assert_eq(cap_add(UINT64_MAX, 1, &x), CAP_EOVERFLOW);
    cr_assert_eq(x, 3);
}

Test(forward, shape_errors)
{
    const char *what = NULL;
    cap_model_shape m = shape(32, 30, 8, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    cr_assert(strstr(what, "multiple") != NULL, "%s", what);
    m = shape(0, 32, 8, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    cr_assert(strstr(what, "layers") != NULL, "%s", what);
    m = shape(32, 32, 8, 0, CAP_DTYPE_BF16);
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    m = shape(32, 8, 32, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    m = shape(32, 32, 8, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_OK);
}

/* ---- tensor parallelism ---------------------------------------------------------------- */

Test(tp, split_and_replicate)
{
    cap_model_shape m = shape(80, 64, 8, 128, CAP_DTYPE_BF16);
    cap_tp t;
    const char *what;
    uint64_t per_gpu, whole;
    cr_assert_eq(cap_token_bytes(&m, 8, &whole), CAP_OK);
    cr_assert_eq(whole, 327680); /* 2 x 80 x 8 x 128 x 2 */

    cr_assert_eq(cap_tp_split(&m, 8, &t, &what), CAP_OK);
    cr_assert_eq(t.kv_heads_per_rank, 1);
    cr_assert_eq(t.replication, 1);
    cr_assert_eq(t.q_heads_per_rank, 8);
    cr_assert_eq(cap_token_bytes(&m, t.kv_heads_per_rank, &per_gpu), CAP_OK);
    cr_assert_eq(per_gpu, 40960);
    cr_assert_eq(per_gpu * 8, whole, "no replication: the GPUs together hold the model's KV");

    cr_assert_eq(cap_tp_split(&m, 2, &t, &what), CAP_OK);
    cr_assert_eq(t.kv_heads_per_rank, 4);

    /* tp 16 > 8 KV heads: one head per GPU, each head on 2 GPUs. */
    cr_assert_eq(cap_tp_split(&m, 16, &t, &what), CAP_OK);
    cr_assert_eq(t.kv_heads_per_rank, 1);
    cr_assert_eq(t.replication, 2);
    cr_assert_eq(t.q_heads_per_rank, 4);
    cr_assert_eq(cap_token_bytes(&m, t.kv_heads_per_rank, &per_gpu), CAP_OK);
    cr_assert_eq(per_gpu * 16, 2 * whole, "replicated heads are stored twice");

    cr_assert_eq(cap_tp_split(&m, 3, &t, &what), CAP_EINVAL);
    cr_assert_eq(cap_tp_split(&m, 0, &t, &what), CAP_EINVAL);
    cap_model_shape q = shape(28, 28, 4, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_tp_split(&q, 8, &t, &what), CAP_EINVAL); /* 28 % 8 */
    cr_assert_eq(cap_tp_split(&q, 4, &t, &what), CAP_OK);
    cr_assert_eq(t.kv_heads_per_rank, 1);
    cap_model_shape odd = shape(32, 48, 6, 128, CAP_DTYPE_BF16);
    cr_assert_eq(cap_tp_split(&odd, 4, &t, &what), CAP_EINVAL); /* 6 % 4 */
    cr_assert_eq(cap_tp_split(&odd, 12, &t, &what), CAP_OK);    /* 12 % 6 == 0 */
    cr_assert_eq(t.replication, 2);
}

/* ---- inverse planning ------------------------------------------------------------------ */

Test(inverse, hand_computed_and_round_trip)
{
    /* Llama-3.1-8B shape, 80 GiB, util 0.9, 16 GB of weights, 2 GiB reserve, tp 1.
     * budget = floor(85899345920 x 0.9) = 77309411328; kv = 77309411328 - 16e9 - 2147483648
     * = 59161927680; block = 16 x 131072 = 2097152; blocks = 28210 (59161927680 / 2097152
     * = 28210.76). */
    cap_model_shape m = shape(32, 32, 8, 128, CAP_DTYPE_BF16);
    uint64_t tok;
    cr_assert_eq(cap_token_bytes(&m, 8, &tok), CAP_OK);
    cap_mem_in in = {80 * GiB, 900000, UINT64_C(16000000000), 2 * GiB, 1, tok * 16, 16, 0};
    cap_mem_out out;
    cr_assert_eq(cap_memory(&in, &out), CAP_OK);
    cr_assert_eq(out.budget_bytes, UINT64_C(77309411328));
    cr_assert_eq(out.kv_bytes, UINT64_C(59161927680));
    cr_assert_eq(out.n_blocks, 28210);
    cr_assert_eq(out.n_tokens, 28210 * 16);
    /* Round trip: the tokens that fit need at most the KV bytes, one more block would not. */
    uint64_t need = seq_bytes(&m, out.n_tokens);
    cr_assert_leq(need, out.kv_bytes);
    cr_assert_gt(seq_bytes(&m, out.n_tokens + 16), out.kv_bytes);
    /* Requests of 4096 tokens (256 blocks): 28210 / 256 = 110. */
    cr_assert_eq(cap_fit_count(out.n_blocks, cap_blocks_for(4096, 16)), 110);
    cr_assert_leq(seq_bytes(&m, 110 * 4096), out.kv_bytes);
    cr_assert_gt(seq_bytes(&m, 111 * 4096), out.kv_bytes);
}

Test(inverse, tp_splits_weights)
{
    /* 141107412992 bytes of weights over 8 GPUs: 17638426624 each. */
    cap_mem_in in = {80 * GiB, 900000, UINT64_C(141107412992), 4 * GiB, 8, 655360, 16, 0};
    cap_mem_out out;
    cr_assert_eq(cap_memory(&in, &out), CAP_OK);
    cr_assert_eq(out.weights_per_gpu_bytes, UINT64_C(17638426624));
    cr_assert_eq(out.kv_bytes, UINT64_C(77309411328) - UINT64_C(17638426624) - 4 * GiB);
    cr_assert_eq(out.n_blocks, out.kv_bytes / 655360);
    in.weights_bytes = 9; /* ceil(9 / 8) = 2 */
    cr_assert_eq(cap_memory(&in, &out), CAP_OK);
    cr_assert_eq(out.weights_per_gpu_bytes, 2);
}

Test(inverse, errors)
{
    cap_mem_in in = {16 * GiB, 900000, UINT64_C(16060522496), 0, 1, 2097152, 16, 0};
    cap_mem_out out;
    memset(&out, 0xab, sizeof out);
    cap_mem_out before = out;
    cr_assert_eq(cap_memory(&in, &out), CAP_ENOSPACE);
    cr_assert_eq(memcmp(&out, &before, sizeof out), 0);
    in.weights_bytes = 0;
    in.reserve_bytes = 20 * GiB;
    cr_assert_eq(cap_memory(&in, &out), CAP_ENOSPACE);
    in.reserve_bytes = 0;
    in.util_ppm = 0;
    cr_assert_eq(cap_memory(&in, &out), CAP_EINVAL);
    in.util_ppm = 1000001;
    cr_assert_eq(cap_memory(&in, &out), CAP_EINVAL);
    in.util_ppm = 1000000;
    in.gpu_mem_bytes = 0;
    cr_assert_eq(cap_memory(&in, &out), CAP_EINVAL);
    in.gpu_mem_bytes = GiB;
    in.tp = 0;
    cr_assert_eq(cap_memory(&in, &out), CAP_EINVAL);
}

/* ---- fragmentation and statistics ------------------------------------------------------ */

Test(fragmentation, hand_computed)
{
    /* Block 16: 100 -> 7 blocks (112, waste 12); 2000 -> 125 (0); 513 -> 33 (528, 15);
     * 4096 -> 256 (0). Blocks 421, waste 27. Contiguous 8192: 8092 + 6192 + 7679 + 4096 =
     * 26059. */
    uint64_t lens[] = {100, 2000, 513, 4096};
    cap_frag f;
    cr_assert_eq(cap_fragmentation(lens, 4, 16, 8192, &f), CAP_OK);
    cr_assert_eq(f.n_tokens, 6709);
    cr_assert_eq(f.n_blocks, 421);
    cr_assert_eq(f.paged_alloc_tokens, 421 * 16);
    cr_assert_eq(f.paged_waste_tokens, 27);
    cr_assert_eq(f.contig_alloc_tokens, 4 * 8192);
    cr_assert_eq(f.contig_waste_tokens, 26059);
    /* Block 1 wastes nothing; max_len 0 skips the contiguous figures. */
    cr_assert_eq(cap_fragmentation(lens, 4, 1, 0, &f), CAP_OK);
    cr_assert_eq(f.paged_waste_tokens, 0);
    cr_assert_eq(f.contig_waste_tokens, 0);
    /* A length above max_len cannot be reserved; block size 0 is invalid. */
    cr_assert_eq(cap_fragmentation(lens, 4, 16, 4000, &f), CAP_EINVAL);
    cr_assert_eq(cap_fragmentation(lens, 4, 0, 0, &f), CAP_EINVAL);
    cr_assert_eq(cap_blocks_for(0, 16), 0);
    cr_assert_eq(cap_blocks_for(1, 16), 1);
    cr_assert_eq(cap_blocks_for(16, 16), 1);
    cr_assert_eq(cap_blocks_for(17, 16), 2);
}

Test(stats, percentiles_and_longest)
{
    uint64_t lens[] = {2048, 104, 1024, 512};
    cap_stats s;
    cr_assert_eq(cap_len_stats(lens, 4, &s), CAP_OK);
    cr_assert_eq(s.sum, 3688);
    cr_assert_float_eq(s.mean, 922.0, 1e-9);
    cr_assert_eq(s.min, 104);
    cr_assert_eq(s.p50, 512); /* rank ceil(0.5 x 4) = 2 */
    cr_assert_eq(s.p90, 2048);
    cr_assert_eq(s.p99, 2048);
    cr_assert_eq(s.max, 2048);
    uint64_t w;
    cr_assert_eq(cap_sum_longest(lens, 4, 2, &w), CAP_OK);
    cr_assert_eq(w, 3072);
    cr_assert_eq(cap_sum_longest(lens, 4, 6, &w), CAP_OK);
    cr_assert_eq(w, 3688 + 2 * 2048);
    /* Blocks of 16: 128, 64, 32, 7. 200 blocks: 128 + 64 fit, 32 does not. */
    cr_assert_eq(cap_fit_longest(lens, 4, 16, 200), 2);
    /* 231 blocks hold all four; 231 + 256 also two more of the longest. */
    cr_assert_eq(cap_fit_longest(lens, 4, 16, 231), 4);
    cr_assert_eq(cap_fit_longest(lens, 4, 16, 231 + 256), 6);
    uint64_t hundred[100];
    for (int i = 0; i < 100; i++)
        hundred[i] = (uint64_t)(100 - i);
    cr_assert_eq(cap_len_stats(hundred, 100, &s), CAP_OK);
    cr_assert_eq(s.p50, 50);
    cr_assert_eq(s.p90, 90);
    cr_assert_eq(s.p99, 99);
    cr_assert_eq(cap_len_stats(hundred, 0, &s), CAP_EINVAL);
}

/* ---- parsing --------------------------------------------------------------------------- */

Test(parse, sizes_counts_fractions)
{
    uint64_t v = 0;
    cr_assert_eq(cli_parse_bytes("80GiB", &v), CLI_OK);
    cr_assert_eq(v, 80 * GiB);
    cr_assert_eq(cli_parse_bytes("80GB", &v), CLI_OK);
    cr_assert_eq(v, UINT64_C(80000000000));
    cr_assert_eq(cli_parse_bytes("81920mib", &v), CLI_OK);
    cr_assert_eq(v, 80 * GiB);
    cr_assert_eq(cli_parse_bytes("1.5GiB", &v), CLI_OK);
    cr_assert_eq(v, 3 * GiB / 2);
    cr_assert_eq(cli_parse_bytes("4096", &v), CLI_OK);
    cr_assert_eq(v, 4096);
    cr_assert_eq(cli_parse_bytes("0", &v), CLI_OK);
    const char *bad[] = {"",        "GiB", "80G",  "-1GiB", "80 GiB",
                         "1.2.3GB", "1e9", "80XB", ".GB",   "1.1234567GiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(cli_parse_bytes(bad[i], &v), CLI_EINVAL, "%s", bad[i]);
    cr_assert_eq(cli_parse_bytes("99999999TiB", &v), CLI_EOVERFLOW);
    cr_assert_eq(cli_parse_bytes("99999999999999999999", &v), CLI_EOVERFLOW);

    cr_assert_eq(cli_parse_count("8B", &v), CLI_OK);
    cr_assert_eq(v, UINT64_C(8000000000));
    cr_assert_eq(cli_parse_count("70.6B", &v), CLI_OK);
    cr_assert_eq(v, UINT64_C(70600000000));
    cr_assert_eq(cli_parse_count("7000m", &v), CLI_OK);
    cr_assert_eq(v, UINT64_C(7000000000));
    cr_assert_eq(cli_parse_count("8Q", &v), CLI_EINVAL);

    uint32_t ppm = 0;
    cr_assert_eq(cli_parse_fraction("0.9", &ppm), CLI_OK);
    cr_assert_eq(ppm, 900000);
    cr_assert_eq(cli_parse_fraction("1", &ppm), CLI_OK);
    cr_assert_eq(ppm, 1000000);
    cr_assert_eq(cli_parse_fraction(".85", &ppm), CLI_OK);
    cr_assert_eq(ppm, 850000);
    const char *badf[] = {"0", "1.5", "-0.5", "abc", "0.1234567", ""};
    for (size_t i = 0; i < sizeof badf / sizeof badf[0]; i++)
        cr_assert_eq(cli_parse_fraction(badf[i], &ppm), CLI_EINVAL, "%s", badf[i]);

    cr_assert_eq(cli_parse_uint("42", 100, &v), CLI_OK);
    cr_assert_eq(v, 42);
    cr_assert_eq(cli_parse_uint("101", 100, &v), CLI_EOVERFLOW);
    cr_assert_eq(cli_parse_uint("-1", 100, &v), CLI_EINVAL);
    cr_assert_eq(cli_parse_uint("4x", 100, &v), CLI_EINVAL);

    char b[32];
    cr_assert_str_eq(cli_fmt_binary(2 * GiB, b, sizeof b), "2 GiB");
    cr_assert_str_eq(cli_fmt_binary(GiB / 2, b, sizeof b), "512 MiB");
    cr_assert_str_eq(cli_fmt_binary(1536 * MiB, b, sizeof b), "1.50 GiB");
    cr_assert_str_eq(cli_fmt_binary(0, b, sizeof b), "0 B");
}

/* ---- presets and config.json ----------------------------------------------------------- */

static void check_preset(const char *name, uint32_t l, uint32_t hq, uint32_t hkv, uint32_t d,
                         uint64_t params)
{
    const cap_model_preset *p = cap_model_find(name);
    cr_assert_not_null(p, "%s", name);
    cr_assert_eq(p->shape.n_layers, l, "%s", name);
    cr_assert_eq(p->shape.n_heads, hq, "%s", name);
    cr_assert_eq(p->shape.n_kv_heads, hkv, "%s", name);
    cr_assert_eq(p->shape.head_dim, d, "%s", name);
    cr_assert_eq(p->shape.n_params, params, "%s", name);
    cr_assert(strstr(p->source, "huggingface.co") != NULL, "%s", name);
    cr_assert_eq(cap_model_shape_check(&p->shape, NULL), CAP_OK, "%s", name);
}

Test(presets, published_shapes)
{
    /* From each model's config.json on Hugging Face (see models.c). */
    check_preset("Llama-3.1-8B", 32, 32, 8, 128, UINT64_C(8030261248));
    check_preset("Llama-3.1-70B", 80, 64, 8, 128, UINT64_C(70553706496));
    check_preset("Llama-2-7B", 32, 32, 32, 128, UINT64_C(6738415616));
    check_preset("Mistral-7B-v0.1", 32, 32, 8, 128, UINT64_C(7241732096));
    check_preset("Qwen2.5-7B", 28, 28, 4, 128, UINT64_C(7615616512));
    check_preset("Qwen2.5-72B", 80, 64, 8, 128, UINT64_C(72706203648));
    check_preset("Mixtral-8x7B", 32, 32, 8, 128, UINT64_C(46702792704));
    check_preset("Llama-3.3-70B", 80, 64, 8, 128, UINT64_C(70553706496));
    check_preset("Qwen3-8B", 36, 32, 8, 128, UINT64_C(8190735360));
    check_preset("Qwen3-32B", 64, 64, 8, 128, UINT64_C(32762123264));
    check_preset("Gemma-2-9B", 42, 16, 8, 256, UINT64_C(9241705984));
    check_preset("Gemma-3-27B", 62, 32, 16, 128, UINT64_C(27432406640));
    check_preset("DeepSeek-V3", 61, 128, 128, 192, UINT64_C(671026419200));
    check_preset("Jamba-v0.1", 32, 32, 8, 128, UINT64_C(51570323328));
    check_preset("Mistral-7B-v0.3", 32, 32, 8, 128, UINT64_C(7248023552));
    cr_assert_eq(cap_model_count(), 15);
    cr_assert_eq(cap_model_find("Mistral-7B-v0.1")->shape.layers.run[0].window, 4096, "window on");
    cr_assert_eq(cap_model_find("DeepSeek-V3")->shape.w_dtype, CAP_DTYPE_FP8);
    cr_assert_eq(cap_model_find("llama-3.1-8b"), cap_model_find("meta-llama/Llama-3.1-8B"));
    cr_assert_eq(cap_model_find("Llama-2-7B")->shape.kv_dtype, CAP_DTYPE_FP16);
    cr_assert_null(cap_model_find("GPT-5"));
    cr_assert_null(cap_model_at(cap_model_count()));
    /* Llama-3.1-8B bf16: 128 KiB per token. */
    uint64_t tok;
    cr_assert_eq(cap_token_bytes(&cap_model_find("Llama-3.1-8B")->shape, 8, &tok), 0);
    cr_assert_eq(tok, 131072);
}

Test(config, reads_hf_config)
{
    char err[256];
    cap_model_shape m;
    cap_model_shape_init(&m);
    cr_assert_eq(cap_model_from_config(data_path("config_llama.json"), &m, err, sizeof err), CAP_OK,
                 "%s", err);
    cr_assert_eq(m.n_layers, 32);
    cr_assert_eq(m.n_heads, 32);
    cr_assert_eq(m.n_kv_heads, 8);
    cr_assert_eq(m.head_dim, 128); /* 4096 / 32 */
    cr_assert_eq(m.kv_dtype, CAP_DTYPE_BF16);

    cap_model_shape_init(&m);
    cr_assert_eq(cap_model_from_config(data_path("config_mha.json"), &m, err, sizeof err), CAP_OK,
                 "%s", err);
    cr_assert_eq(m.n_kv_heads, 16, "no num_key_value_heads means MHA");
    cr_assert_eq(m.head_dim, 128); /* 2048 / 16 */
    cr_assert_eq(m.kv_dtype, CAP_DTYPE_FP16);
}

Test(config, errors)
{
    char err[256];
    cap_model_shape m;
    cap_model_shape_init(&m);
    m.n_layers = 77;
    cr_assert_eq(cap_model_from_config(data_path("config_bad.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert(strstr(err, "multiple") != NULL, "%s", err);
    cr_assert_eq(m.n_layers, 77, "untouched on failure");
    cr_assert_eq(cap_model_from_config(data_path("config_truncated.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert(strstr(err, "config_truncated.json") != NULL, "%s", err);
    cr_assert_eq(cap_model_from_config(data_path("nonexistent.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert_eq(cap_model_from_config(data_path("mooncake.jsonl"), &m, err, sizeof err),
                 CAP_EINVAL);
}

/* ---- the per-layer model: hand computations per family --------------------------------- */

/* The cost of the model in config file name on tp ranks (the reader must accept it). */
static cap_kv_cost config_cost(const char *name, uint32_t tp, cap_model_shape *m_out)
{
    char err[512];
    cap_model_shape m;
    cap_model_shape_init(&m);
    cr_assert_eq(cap_model_from_config(data_path(name), &m, err, sizeof err), CAP_OK, "%s: %s",
                 name, err);
    cap_kv_cost c;
    const char *what = NULL;
    cr_assert_eq(cap_kv_cost_of(&m, tp, &c, &what), CAP_OK, "%s: %s", name, what);
    if (m_out)
        *m_out = m;
    return c;
}

static uint64_t seq_of(const cap_kv_cost *c, uint64_t len)
{
    uint64_t b = 0;
    cr_assert_eq(cap_seq_bytes(c, len, &b), CAP_OK);
    return b;
}

static uint64_t paged_of(const cap_kv_cost *c, uint64_t len, uint32_t bs)
{
    uint64_t b = 0;
    cr_assert_eq(cap_seq_paged_bytes(c, len, bs, &b), CAP_OK);
    return b;
}

/* The run of kind k in c (there must be exactly one). */
static const cap_run_cost *run_of(const cap_kv_cost *c, cap_layer_kind k)
{
    const cap_run_cost *found = NULL;
    for (uint32_t i = 0; i < c->n_runs; i++)
        if (c->run[i].spec.kind == k) {
            cr_assert_null(found, "two %s runs", cap_layer_kind_name(k));
            found = &c->run[i];
        }
    cr_assert_not_null(found, "no %s run", cap_layer_kind_name(k));
    return found;
}

Test(layers, window_blocks)
{
    /* Blocks holding any of the last min(T, W) tokens: ceil(T/bs) - floor((T - min)/bs). */
    cr_assert_eq(cap_window_blocks(10, 4096, 16), 1);
    cr_assert_eq(cap_window_blocks(4096, 4096, 16), 256);
    cr_assert_eq(cap_window_blocks(4097, 4096, 16), 257); /* 257 - floor(1/16) */
    cr_assert_eq(cap_window_blocks(4112, 4096, 16), 256); /* 257 - 1: aligned again */
    cr_assert_eq(cap_window_blocks(4113, 4096, 16), 257); /* 258 - 1 */
    cr_assert_eq(cap_window_blocks(5000, 1000, 16), 63);  /* 313 - 250 */
    cr_assert_eq(cap_window_blocks(5010, 1000, 16), 64);  /* 314 - 250 = ceil(W/bs) + 1 */
    cr_assert_eq(cap_window_blocks(5010, 1000, 0), 0);
    for (uint64_t t = 1; t < 5000; t += 7)
        cr_assert_leq(cap_window_blocks(t, 1000, 16), 1000 / 16 + 1 + 1);
}

Test(layers, mistral_window)
{
    /* Mistral-7B-v0.1: 32 sliding layers, 8 KV heads x 128, bf16, W 4096:
     * 2 x 32 x 8 x 128 x 2 = 131072 bytes per token held. */
    cap_model_shape m;
    cap_kv_cost c = config_cost("config_mistral.json", 1, &m);
    cr_assert_eq(c.n_runs, 1);
    cr_assert_eq(c.run[0].spec.kind, CAP_LAYER_SLIDING);
    cr_assert_eq(c.run[0].spec.window, 4096);
    cr_assert_eq(c.token_all, 131072);
    cr_assert_eq(c.token_full, 0, "no layer keeps every token");
    cr_assert(!c.linear);
    cr_assert_eq(seq_of(&c, 4096), 512 * MiB);        /* 4096 x 131072 */
    cr_assert_eq(seq_of(&c, 32768), 512 * MiB);       /* still the window */
    cr_assert_eq(paged_of(&c, 32768, 16), 512 * MiB); /* 256 blocks of 16 x 131072 */
    cr_assert_eq(paged_of(&c, 4100, 16), UINT64_C(257) * 16 * 131072);
    /* The preset is the same model. */
    cap_kv_cost p;
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Mistral-7B-v0.1")->shape, 1, &p, NULL), CAP_OK);
    cr_assert_eq(seq_of(&p, 32768), 512 * MiB);
    /* Without the window: 32768 x 131072 = 4 GiB, eight times more. */
    cr_assert_eq(cap_model_set_window(&m, 0), CAP_OK);
    cr_assert_eq(m.layers.n_runs, 0, "back to the uniform model");
    cr_assert_eq(cap_kv_cost_of(&m, 1, &c, NULL), CAP_OK);
    cr_assert_eq(seq_of(&c, 32768), 4 * GiB);
    cr_assert(c.linear);
    /* A window put back on the uniform model. */
    cr_assert_eq(cap_model_set_window(&m, 4096), CAP_OK);
    cr_assert_eq(cap_kv_cost_of(&m, 1, &c, NULL), CAP_OK);
    cr_assert_eq(seq_of(&c, 32768), 512 * MiB);
}

Test(layers, gemma_interleaved)
{
    /* Gemma 2 9B: 42 layers, even ones sliding (W 4096), 8 KV heads x 256, bf16:
     * 2 x 8 x 256 x 2 = 8192 bytes per layer and token; 21 full + 21 sliding.
     * T = 8192: 21 x 8192 x 8192 + 21 x 4096 x 8192 = 12288 x 172032 = 2113929216. */
    cap_kv_cost c = config_cost("config_gemma2.json", 1, NULL);
    cr_assert_eq(run_of(&c, CAP_LAYER_SLIDING)->spec.n_layers, 21);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 21);
    cr_assert_eq(c.token_all, 344064);
    cr_assert_eq(c.token_full, 172032);
    cr_assert_eq(seq_of(&c, 8192), UINT64_C(2113929216));
    cr_assert_eq(seq_of(&c, 4096), UINT64_C(4096) * 344064, "inside the window: every layer");

    /* Gemma 3 27B: 62 layers, (i + 1) % 6 == 0 full: 10 full + 52 sliding (W 1024),
     * 16 KV heads x 128 bf16 = 8192 per layer and token. T = 32768:
     * 10 x 8192 x 32768 + 52 x 8192 x 1024 = 2684354560 + 436207616 = 3120562176; paged
     * identical (2048 and 64 blocks of 16, both aligned). */
    cap_model_shape m;
    c = config_cost("config_gemma3.json", 1, &m);
    cr_assert_eq(m.n_layers, 62, "read from text_config");
    cr_assert_eq(run_of(&c, CAP_LAYER_SLIDING)->spec.n_layers, 52);
    cr_assert_eq(run_of(&c, CAP_LAYER_SLIDING)->spec.window, 1024);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 10);
    cr_assert_eq(c.token_full, 81920);
    cr_assert_eq(seq_of(&c, 32768), UINT64_C(3120562176));
    cr_assert_eq(paged_of(&c, 32768, 16), UINT64_C(3120562176));
    /* 32768 + 8 tokens: full layers 2049 blocks, sliding 2049 - floor(31752/16) = 65. */
    cr_assert_eq(paged_of(&c, 32776, 16), UINT64_C(2049) * 16 * 81920 + UINT64_C(65) * 16 * 425984);
    /* TP 2: 8 KV heads per GPU, half of everything. */
    cap_kv_cost c2 = config_cost("config_gemma3.json", 2, NULL);
    cr_assert_eq(seq_of(&c2, 32768), UINT64_C(3120562176) / 2);
    /* The preset agrees with the file. */
    cap_kv_cost p;
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Gemma-3-27B")->shape, 1, &p, NULL), CAP_OK);
    cr_assert_eq(seq_of(&p, 32768), seq_of(&c, 32768));

    /* An explicit layer_types list (and dtype instead of torch_dtype): 10 sliding (W 512) +
     * 2 full, 1 KV head x 256 fp16 = 1024 per layer and token. T = 2048:
     * 2 x 1024 x 2048 + 10 x 1024 x 512 = 4194304 + 5242880. */
    c = config_cost("config_gemma3_types.json", 1, &m);
    cr_assert_eq(m.kv_dtype, CAP_DTYPE_FP16);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 2);
    cr_assert_eq(run_of(&c, CAP_LAYER_SLIDING)->spec.window, 512);
    cr_assert_eq(seq_of(&c, 2048), UINT64_C(9437184));
}

Test(layers, qwen_sliding_window_flags)
{
    /* Qwen3-8B: use_sliding_window false, sliding_window null: uniform, 36 x 2 x 8 x 128 x 2. */
    cap_model_shape m;
    cap_kv_cost c = config_cost("config_qwen3.json", 1, &m);
    cr_assert_eq(m.layers.n_runs, 0);
    cr_assert_eq(m.head_dim, 128, "head_dim given explicitly");
    cr_assert_eq(c.token_all, 147456);
    cr_assert(c.linear);
    /* use_sliding_window true, max_window_layers 20 of 28: layers 20..27 sliding (W 32768),
     * 4 KV heads x 128 (3584 / 28): 2 x 4 x 128 x 2 = 2048 per layer and token. */
    c = config_cost("config_qwen_swa.json", 1, NULL);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 20);
    cr_assert_eq(run_of(&c, CAP_LAYER_SLIDING)->spec.n_layers, 8);
    cr_assert_eq(seq_of(&c, 65536), UINT64_C(20) * 2048 * 65536 + UINT64_C(8) * 2048 * 32768);
}

Test(layers, mla_latent)
{
    /* DeepSeek-V3: 61 layers of one latent of kv_lora_rank 512 + qk_rope_head_dim 64 = 576
     * bf16 elements: 61 x 576 x 2 = 70272 bytes per token. A hypothetical MHA of the same
     * heads (128, K 192 = 128 + 64, V 128): 61 x 128 x (192 + 128) x 2 = 4997120, 71x. */
    cap_model_shape m;
    cap_kv_cost c = config_cost("config_deepseek_v3.json", 1, &m);
    cr_assert_eq(c.n_runs, 1);
    cr_assert_eq(c.run[0].spec.kind, CAP_LAYER_LATENT);
    cr_assert_eq(c.run[0].spec.latent_dim, 576);
    cr_assert_eq(m.head_dim, 192, "qk_nope_head_dim + qk_rope_head_dim");
    cr_assert_eq(c.token_all, 70272);
    cr_assert_eq(c.token_full, 70272);
    cr_assert_eq(seq_of(&c, 32768), UINT64_C(70272) * 32768);
    uint64_t mha = UINT64_C(61) * 128 * (192 + 128) * 2;
    cr_assert_eq(mha, 4997120);
    cr_assert_eq(mha / c.token_all, 71);
    /* Tensor parallelism does not split the latent: every GPU holds it whole. */
    cap_kv_cost c8 = config_cost("config_deepseek_v3.json", 8, NULL);
    cr_assert_eq(c8.token_all, 70272);
    cap_kv_cost p;
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("DeepSeek-V3")->shape, 1, &p, NULL), CAP_OK);
    cr_assert_eq(p.token_all, 70272);
}

Test(layers, hybrid_states)
{
    /* Jamba-v0.1: attention when i % 8 == 4 (layers 4, 12, 20, 28), Mamba otherwise.
     * Attention: 4 x 2 x 8 x 128 x 2 = 16384 per token. Mamba: d_inner = 2 x 4096 = 8192,
     * 8192 x (4 - 1) + 8192 x 16 = 155648 elements, bf16: 311296 bytes, x 28 = 8716288 per
     * sequence, whatever its length. */
    cap_kv_cost c = config_cost("config_jamba.json", 1, NULL);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 4);
    cr_assert_eq(run_of(&c, CAP_LAYER_STATE)->spec.n_layers, 28);
    cr_assert_eq(run_of(&c, CAP_LAYER_STATE)->spec.state_elems, 155648);
    cr_assert_eq(c.token_all, 16384);
    cr_assert_eq(c.state_bytes, 8716288);
    cr_assert_eq(seq_of(&c, 1), 16384 + 8716288);
    cr_assert_eq(seq_of(&c, 262144), UINT64_C(16384) * 262144 + 8716288);
    cr_assert_eq(paged_of(&c, 17, 16), UINT64_C(32) * 16384 + 8716288);
    cap_kv_cost p;
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Jamba-v0.1")->shape, 1, &p, NULL), CAP_OK);
    cr_assert_eq(p.state_bytes, c.state_bytes);
    cr_assert_eq(p.token_all, c.token_all);

    /* Qwen3-Next style: full attention when (i + 1) % 4 == 0: 12 of 48, 2 KV heads x 256:
     * 12 x 2 x 2 x 256 x 2 = 24576 per token. Gated DeltaNet state: conv (2 x 16 x 128 +
     * 32 x 128) x 3 = 24576 + recurrent 32 x 128 x 128 = 524288: 548864 elements, bf16,
     * x 36 layers = 39518208. TP 2: one KV head each, state halved. */
    c = config_cost("config_qwen3_next.json", 1, NULL);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 12);
    cr_assert_eq(run_of(&c, CAP_LAYER_STATE)->spec.state_elems, 548864);
    cr_assert_eq(c.token_all, 24576);
    cr_assert_eq(c.state_bytes, 39518208);
    cap_kv_cost c2 = config_cost("config_qwen3_next.json", 2, NULL);
    cr_assert_eq(c2.token_all, 12288);
    cr_assert_eq(c2.state_bytes, 19759104);
}

Test(layers, kv_sharing)
{
    /* 12 layers, the last 4 reuse earlier layers' KV: 8 x 2 x 2 x 64 x 2 = 4096 per token. */
    cap_kv_cost c = config_cost("config_kv_shared.json", 1, NULL);
    cr_assert_eq(run_of(&c, CAP_LAYER_SHARED)->spec.n_layers, 4);
    cr_assert_eq(run_of(&c, CAP_LAYER_FULL)->spec.n_layers, 8);
    cr_assert_eq(c.token_all, 4096);
    cr_assert_eq(seq_of(&c, 1000), 4096000);
}

Test(layers, config_errors)
{
    char err[512];
    cap_model_shape m;
    cap_model_shape_init(&m);
    m.n_layers = 77;
    cr_assert_eq(cap_model_from_config(data_path("config_bad_types.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert(strstr(err, "layer_types[1] is 'chunked_attention'") != NULL, "%s", err);
    cr_assert_eq(m.n_layers, 77, "untouched on failure");
    cr_assert_eq(cap_model_from_config(data_path("config_state_unsized.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert(strstr(err, "2 recurrent-state layers") != NULL, "%s", err);
    cr_assert_eq(cap_model_from_config(data_path("config_state_huge.json"), &m, err, sizeof err),
                 CAP_EINVAL);
    cr_assert(strstr(err, "does not fit 64 bits") != NULL, "%s", err);
    /* Runs that do not add up, or a zero field, are refused by the shape check. */
    cap_model_shape s = shape(4, 8, 8, 64, CAP_DTYPE_BF16);
    cap_layer_run full = {CAP_LAYER_FULL, 0, 8, 64, 0, 0, 0};
    cr_assert_eq(cap_layers_add(&s.layers, &full, 3), CAP_OK);
    const char *what = NULL;
    cr_assert_eq(cap_model_shape_check(&s, &what), CAP_EINVAL);
    cr_assert(strstr(what, "add up") != NULL, "%s", what);
    cap_layer_run bad = {CAP_LAYER_SLIDING, 0, 8, 64, 0, 0, 0};
    cr_assert_eq(cap_layers_add(&s.layers, &bad, 1), CAP_EINVAL, "a window of 0");
    cr_assert_eq(cap_layers_add(&s.layers, &full, 1), CAP_OK, "merged into the same run");
    cr_assert_eq(s.layers.n_runs, 1);
    cr_assert_eq(cap_model_shape_check(&s, &what), CAP_OK);
}

Test(layers, cache_block_bytes)
{
    /* What replay charges per cached block of 16 tokens: full and latent layers. */
    uint64_t b;
    cap_kv_cost c;
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Llama-3.1-8B")->shape, 1, &c, NULL), CAP_OK);
    cr_assert_eq(cap_cache_block_bytes(&c, 16, &b), CAP_OK);
    cr_assert_eq(b, 2097152);
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Gemma-3-27B")->shape, 1, &c, NULL), CAP_OK);
    cr_assert_eq(cap_cache_block_bytes(&c, 16, &b), CAP_OK);
    cr_assert_eq(b, 16 * 81920);
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("DeepSeek-V3")->shape, 1, &c, NULL), CAP_OK);
    cr_assert_eq(cap_cache_block_bytes(&c, 16, &b), CAP_OK);
    cr_assert_eq(b, 16 * 70272);
    /* Every layer windowed: each block is charged in full, as one block pool would be. */
    cr_assert_eq(cap_kv_cost_of(&cap_model_find("Mistral-7B-v0.1")->shape, 1, &c, NULL), CAP_OK);
    cr_assert_eq(cap_cache_block_bytes(&c, 16, &b), CAP_OK);
    cr_assert_eq(b, 16 * 131072);
    cr_assert_eq(cap_cache_block_bytes(&c, 0, &b), CAP_EINVAL);
}

/* ---- quantized KV: scales counted ------------------------------------------------------ */

static cap_kv_cost quant_cost(cap_dtype t, const char *scales, cap_dtype scale_t, uint32_t d)
{
    cap_model_shape m = shape(32, 32, 8, d, CAP_DTYPE_BF16);
    m.kv_dtype = t;
    cr_assert_eq(cap_scales_parse(scales, &m.kv_quant), CAP_OK, "%s", scales);
    m.kv_quant.scale_dtype = scale_t;
    cap_kv_cost c;
    const char *what = NULL;
    cr_assert_eq(cap_kv_cost_of(&m, 1, &c, &what), CAP_OK, "%s", what);
    return c;
}

Test(quant, scales_counted)
{
    /* Llama-3.1-8B shape (32 layers, 8 KV heads x 128). fp8 per-tensor: 2 x 32 x 8 x 128 x 1
     * = 65536 per token, and 2 scales per layer: 64 x 4 = 256 fixed bytes. */
    cap_kv_cost c = quant_cost(CAP_DTYPE_FP8, "per-tensor", CAP_DTYPE_FP32, 128);
    cr_assert_eq(c.token_all, 65536);
    cr_assert_eq(c.fixed_bytes, 256);
    /* per-head: 2 x 32 x 8 scales = 512 x 4 = 2048 fixed bytes. */
    c = quant_cost(CAP_DTYPE_FP8, "per-head", CAP_DTYPE_FP32, 128);
    cr_assert_eq(c.token_all, 65536);
    cr_assert_eq(c.fixed_bytes, 2048);
    /* int8 per-token fp32: each head's K or V vector 128 + 4 bytes: 2 x 32 x 8 x 132. */
    c = quant_cost(CAP_DTYPE_INT8, "per-token", CAP_DTYPE_FP32, 128);
    cr_assert_eq(c.token_all, 67584);
    cr_assert_eq(c.fixed_bytes, 0);
    /* int4 per-block:32 fp16: 128 x 4 bits = 64 bytes + 4 scales x 2 = 72 per vector. */
    c = quant_cost(CAP_DTYPE_INT4, "per-block:32", CAP_DTYPE_FP16, 128);
    cr_assert_eq(c.token_all, UINT64_C(2) * 32 * 8 * 72);
    /* int4 of an odd head dimension rounds up per vector: 5 x 4 bits = 3 bytes. */
    c = quant_cost(CAP_DTYPE_INT4, "per-tensor", CAP_DTYPE_FP32, 5);
    cr_assert_eq(c.token_all, UINT64_C(2) * 32 * 8 * 3);
    /* per-block with a group that does not divide D: ceil(128 / 48) = 3 scales. */
    c = quant_cost(CAP_DTYPE_FP8, "per-block:48", CAP_DTYPE_FP32, 128);
    cr_assert_eq(c.token_all, UINT64_C(2) * 32 * 8 * (128 + 12));
    /* A latent takes one scale per token (per-token) or one per tensor per layer. */
    cap_model_shape m = cap_model_find("DeepSeek-V3")->shape;
    m.kv_dtype = CAP_DTYPE_FP8;
    m.kv_quant.layout = CAP_SCALES_TENSOR;
    cr_assert_eq(cap_kv_cost_of(&m, 1, &c, NULL), CAP_OK);
    cr_assert_eq(c.token_all, 61 * 576);
    cr_assert_eq(c.fixed_bytes, 61 * 4);
    m.kv_quant.layout = CAP_SCALES_TOKEN;
    cr_assert_eq(cap_kv_cost_of(&m, 1, &c, NULL), CAP_OK);
    cr_assert_eq(c.token_all, 61 * (576 + 4));
}

Test(quant, parse_and_refuse)
{
    cap_kv_quant q = {CAP_SCALES_NONE, 0, CAP_DTYPE_FP32};
    cr_assert_eq(cap_scales_parse("per-block:64", &q), CAP_OK);
    cr_assert_eq(q.layout, CAP_SCALES_GROUP);
    cr_assert_eq(q.group, 64);
    cr_assert_eq(cap_scales_parse("PER-HEAD", &q), CAP_OK);
    cr_assert_eq(q.layout, CAP_SCALES_HEAD);
    const char *bad[] = {"per-block:",   "per-block:0", "per-block:65537",
                         "per-block:1x", "per-channel", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(cap_scales_parse(bad[i], &q), CAP_EINVAL, "%s", bad[i]);
    /* Scales on bf16, or none on fp8, are inconsistent shapes. */
    cap_model_shape m = shape(32, 32, 8, 128, CAP_DTYPE_BF16);
    m.kv_quant.layout = CAP_SCALES_TENSOR;
    const char *what = NULL;
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    m.kv_quant.layout = CAP_SCALES_NONE;
    m.kv_dtype = CAP_DTYPE_INT4;
    cr_assert_eq(cap_model_shape_check(&m, &what), CAP_EINVAL);
    uint64_t b;
    cr_assert_eq(cap_elems_bytes(3, CAP_DTYPE_INT4, &b), CAP_OK);
    cr_assert_eq(b, 2);
    cr_assert_eq(cap_elems_bytes(UINT64_MAX, CAP_DTYPE_FP32, &b), CAP_EOVERFLOW);
    cr_assert_eq(cap_elems_bytes(UINT64_MAX, CAP_DTYPE_INT4, &b), CAP_OK);
    cr_assert_eq(b, UINT64_MAX / 2 + 1);
}

/* ---- the log reader -------------------------------------------------------------------- */

Test(logread, token_log)
{
    log_reader *r = NULL;
    char err[256];
    cr_assert_eq(log_open(data_path("tokens.jsonl"), NULL, &r, err, sizeof err), 0, "%s", err);
    log_record rec;
    cr_assert_eq(log_next(r, &rec), LOG_RECORD, "%s", log_error(r));
    cr_assert_eq(rec.format, LOG_TOKENS);
    cr_assert_eq(rec.line_no, 1);
    cr_assert_eq(rec.n_tokens, 17);
    cr_assert_eq(rec.tokens[16], 17);
    cr_assert_eq(rec.n_output_tokens, 3);
    cr_assert_eq(rec.output_tokens[2], 22);
    cr_assert_eq(rec.input_length, 17);
    cr_assert_eq(rec.output_length, 3);
    cr_assert_str_eq(rec.model, "m1");
    cr_assert_str_eq(rec.tenant, "t1");
    cr_assert_null(rec.adapter);
    cr_assert_null(rec.cache_salt);
    cr_assert(rec.has_timestamp);
    cr_assert_float_eq(rec.timestamp, 0.5, 1e-12);
    cr_assert_null(rec.hash_ids);

    cr_assert_eq(log_next(r, &rec), LOG_RECORD);
    cr_assert_eq(rec.line_no, 2);
    cr_assert_eq(rec.n_tokens, 8);
    cr_assert_null(rec.adapter, "null means absent");
    cr_assert_str_eq(rec.cache_salt, "s");
    cr_assert_eq(rec.output_length, 0);

    cr_assert_eq(log_next(r, &rec), LOG_RECORD);
    cr_assert_eq(rec.line_no, 4, "the blank line 3 is skipped but counted");
    cr_assert_eq(rec.tokens[0], UINT32_MAX);
    cr_assert_eq(log_next(r, &rec), LOG_END);
    cr_assert_eq(log_n_records(r), 3);
    log_close(r);
}

static void check_mooncake(const char *file)
{
    log_reader *r = NULL;
    char err[256];
    cr_assert_eq(log_open(data_path(file), NULL, &r, err, sizeof err), 0, "%s", err);
    log_record rec;
    uint64_t in[] = {1000, 512, 2000, 100}, out[] = {24, 0, 48, 4};
    size_t ids[] = {2, 1, 4, 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(log_next(r, &rec), LOG_RECORD, "%s", log_error(r));
        cr_assert_eq(rec.format, LOG_MOONCAKE);
        cr_assert_eq(rec.line_no, (uint64_t)i + 1);
        cr_assert_eq(rec.input_length, in[i]);
        cr_assert_eq(rec.output_length, out[i]);
        cr_assert_eq(rec.n_hash_ids, ids[i]);
        cr_assert_null(rec.tokens);
        cr_assert(rec.has_timestamp);
    }
    cr_assert_eq(rec.hash_ids[0], 5);
    cr_assert_eq(log_next(r, &rec), LOG_END);
    log_close(r);
}

Test(logread, mooncake_plain_and_gzip)
{
    check_mooncake("mooncake.jsonl");
    check_mooncake("mooncake.jsonl.gz");
}

/* Open file, read until the first error, and check its "FILE:LINE: ..." text. */
static void expect_error(const char *file, int code, const char *where, const char *what)
{
    log_reader *r = NULL;
    char err[256];
    cr_assert_eq(log_open(data_path(file), NULL, &r, err, sizeof err), 0, "%s", err);
    log_record rec;
    int rc;
    while ((rc = log_next(r, &rec)) == LOG_RECORD)
        ;
    cr_assert_eq(rc, code, "%s: rc %d: %s", file, rc, log_error(r));
    cr_assert(strstr(log_error(r), where) != NULL, "%s: %s", file, log_error(r));
    cr_assert(strstr(log_error(r), what) != NULL, "%s: %s", file, log_error(r));
    log_close(r);
}

Test(logread, malformed_lines)
{
    expect_error("bad_truncated.jsonl", LOG_EINPUT, "bad_truncated.jsonl:1:", "invalid JSON");
    expect_error("bad_type.jsonl", LOG_EINPUT, "bad_type.jsonl:2:", "must be an array");
    expect_error("bad_negative.jsonl", LOG_EINPUT, ":1:", "tokens[1] = -2");
    expect_error("bad_huge.jsonl", LOG_EINPUT, ":1:", "token id range");
    expect_error("bad_nonint.jsonl", LOG_EINPUT, ":1:", "hash_ids[1] must be an integer");
    expect_error("bad_missing.jsonl", LOG_EINPUT, ":1:", "output_length is missing");
    expect_error("bad_idcount.jsonl", LOG_EINPUT, ":1:", "do not match input_length");
    expect_error("bad_biglen.jsonl", LOG_EINPUT, ":1:", "input_length");
    expect_error("bad_neither.jsonl", LOG_EINPUT, ":1:", "neither");
    expect_error("truncated.jsonl.gz", LOG_EIO, "truncated.jsonl.gz", "gzip");
}

Test(logread, continues_after_a_bad_line)
{
    log_reader *r = NULL;
    char err[256];
    cr_assert_eq(log_open(data_path("bad_type.jsonl"), NULL, &r, err, sizeof err), 0);
    log_record rec;
    cr_assert_eq(log_next(r, &rec), LOG_RECORD);
    cr_assert_eq(log_next(r, &rec), LOG_EINPUT);
    cr_assert_eq(log_next(r, &rec), LOG_END);
    log_close(r);
}

Test(logread, empty_and_missing_files)
{
    log_reader *r = NULL;
    char err[256];
    log_record rec;
    const char *empties[] = {"empty.jsonl", "blank.jsonl"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(log_open(data_path(empties[i]), NULL, &r, err, sizeof err), 0);
        cr_assert_eq(log_next(r, &rec), LOG_END);
        cr_assert_eq(log_n_records(r), 0);
        log_close(r);
    }
    r = NULL;
    cr_assert_eq(log_open(data_path("nonexistent.jsonl"), NULL, &r, err, sizeof err), LOG_EIO);
    cr_assert_null(r);
    cr_assert(strstr(err, "nonexistent.jsonl: cannot open") != NULL, "%s", err);
    log_close(NULL);
}

Test(logread, long_line_and_limit)
{
    /* A 200000-token line crosses several buffer growths; a tiny limit refuses it. */
    char path[] = "/tmp/pl_longXXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"tokens\": [", f);
    for (int i = 0; i < 200000; i++)
        fprintf(f, "%s%d", i ? "," : "", i);
    fputs("]}\r\n{\"tokens\": [7]}", f); /* CRLF, and a last line without a newline */
    fclose(f);
    log_reader *r = NULL;
    char err[256];
    log_record rec;
    cr_assert_eq(log_open(path, NULL, &r, err, sizeof err), 0);
    cr_assert_eq(log_next(r, &rec), LOG_RECORD, "%s", log_error(r));
    cr_assert_eq(rec.n_tokens, 200000);
    cr_assert_eq(rec.tokens[199999], 199999);
    cr_assert_eq(log_next(r, &rec), LOG_RECORD, "%s", log_error(r));
    cr_assert_eq(rec.tokens[0], 7);
    cr_assert_eq(log_next(r, &rec), LOG_END);
    log_close(r);

    log_options opt;
    log_options_init(&opt);
    opt.max_line_bytes = 1000;
    cr_assert_eq(log_open(path, &opt, &r, err, sizeof err), 0);
    cr_assert_eq(log_next(r, &rec), LOG_ENOMEM);
    cr_assert(strstr(log_error(r), ":1: line longer than 1000 bytes") != NULL, "%s", log_error(r));
    cr_assert_eq(log_next(r, &rec), LOG_END);
    log_close(r);
    remove(path);
}

/* ---- the built binary ------------------------------------------------------------------ */

/* Run `$KVPREFIX_BIN plan ARGS`, return its exit status and its stderr (and stdout) text. */
static int run_plan(const char *args, char *err_out, size_t err_size, char *out, size_t out_size)
{
    return cli_run("plan", args, err_out, err_size, out, out_size);
}

static void expect_exit(const char *args, int code, const char *msg)
{
    static char err[8192], out[65536];
    int rc = run_plan(args, err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, code, "plan %s: exit %d, stderr: %s", args, rc, err);
    cr_assert(strstr(err, msg) != NULL, "plan %s: stderr lacks '%s': %s", args, msg, err);
}

Test(binary, errors_exit_status_and_message)
{
    expect_exit("", 2, "no model");
    expect_exit("--bogus", 2, "unknown option '--bogus'");
    expect_exit("--layers", 2, "--layers needs a value");
    expect_exit("--model Llama-3.1-8B --config x.json", 2, "not both");
    expect_exit("--layers 32 --kv-heads 8", 2, "--head-dim is missing");
    expect_exit("--layers 0 --kv-heads 8 --head-dim 128", 2,
                "--layers: '0' is not an integer in 1..");
    expect_exit("--layers -32 --kv-heads 8 --head-dim 128", 2, "--layers: '-32'");
    expect_exit("--layers 32 --heads 30 --kv-heads 8 --head-dim 128", 1, "multiple of the KV");
    expect_exit("--model Llama-3.1-8B --tp 3", 1, "--tp 3");
    expect_exit("--model NoSuchModel", 2, "unknown preset 'NoSuchModel'");
    expect_exit("--model Llama-3.1-8B --dtype fp4", 2, "--dtype: unknown dtype 'fp4'");
    expect_exit("--model Llama-3.1-8B --gpu-mem 80G", 2, "--gpu-mem: '80G' is not a size");
    expect_exit("--model Llama-3.1-8B --gpu-mem 80GiB --reserve 90GiB", 1, "--reserve");
    expect_exit("--model Llama-3.1-8B --gpu-mem 16GiB", 1, "no memory left for the KV cache");
    expect_exit("--model Llama-3.1-8B --util 1.5", 2, "--util");
    expect_exit("--layers 32 --kv-heads 8 --head-dim 128 --gpu-mem 80GiB", 2, "--weights-mem");
    expect_exit("--model Llama-3.1-8B --seq-len 4096 --max-len 100", 1, "--max-len 100");
    char args[4200];
    snprintf(args, sizeof args, "--model Llama-3.1-8B --trace '%s'", data_path("empty.jsonl"));
    expect_exit(args, 1, "no requests");
    snprintf(args, sizeof args, "--model Llama-3.1-8B --trace '%s'",
             data_path("bad_negative.jsonl"));
    expect_exit(args, 1, "bad_negative.jsonl:1: tokens[1] = -2");
    snprintf(args, sizeof args, "--config '%s'", data_path("config_bad.json"));
    expect_exit(args, 1, "config_bad.json");
}

Test(binary, forward_output)
{
    static char err[8192], out[65536];
    int rc = run_plan("--layers 32 --kv-heads 32 --head-dim 128 --dtype fp16 --seq-len 4096 "
                      "--json",
                      err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"seq_kv_bytes_per_gpu\": 2147483648") != NULL, "%s", out);
    rc = run_plan("--model Llama-3.1-70B --tp 8 --gpu-mem 80GiB --reserve 4GiB --seq-len 32768",
                  err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "1 KV head and 8 query heads per GPU") != NULL, "%s", out);
    cr_assert(strstr(out, "FlashAttention") != NULL);
    cr_assert(strstr(out, "not all the memory an engine uses") != NULL);
    cr_assert(strstr(out, "capacity estimates only") != NULL);
    char args[4200];
    snprintf(args, sizeof args, "--model Llama-3.1-8B --trace '%s' --concurrency 2 --json",
             data_path("mooncake.jsonl.gz"));
    rc = run_plan(args, err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"p50_len\": 512") != NULL, "%s", out);
    cr_assert(strstr(out, "\"worst_tokens\": 3072") != NULL, "%s", out);
    cr_assert(strstr(out, "\"expected_tokens\": 1844") != NULL, "%s", out); /* 2 x 922 */
}

Test(binary, per_layer_models)
{
    static char err[8192], out[65536];
    /* Mistral-7B at 32k: the window holds 4096 tokens (512 MiB); without it 4 GiB. */
    int rc = run_plan("--model Mistral-7B-v0.1 --seq-len 32768 --json", err, sizeof err, out,
                      sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"seq_kv_bytes_per_gpu\": 536870912") != NULL, "%s", out);
    cr_assert(strstr(out, "\"kind\": \"sliding\"") != NULL, "%s", out);
    rc = run_plan("--model Mistral-7B-v0.1 --seq-len 32768 --no-window --json", err, sizeof err,
                  out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"seq_kv_bytes_per_gpu\": 4294967296") != NULL, "%s", out);
    /* DeepSeek-V3 fp8 with per-token fp32 scales: 61 x (576 + 4) = 35380 per token. */
    rc = run_plan("--model DeepSeek-V3 --kv-dtype fp8 --kv-scales per-token --seq-len 1 --json",
                  err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"token_bytes_per_gpu\": 35380") != NULL, "%s", out);
    /* The table names the layers and counts the state of a hybrid. */
    rc = run_plan("--model Jamba-v0.1 --seq-len 1024 --gpu-mem 80GiB --tp 2", err, sizeof err, out,
                  sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "28 x recurrent state, 155648 bf16 elements") != NULL, "%s", out);
    cr_assert(strstr(out, "recurrent state per sequence") != NULL, "%s", out);
    rc = run_plan("--model Llama-3.1-8B --kv-dtype int4 --seq-len 4096", err, sizeof err, out,
                  sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "int4 (4 bits per element), per-tensor scales, fp32") != NULL, "%s", out);
    cr_assert(strstr(out, "numerical error") != NULL, "%s", out);
    /* 2 x 32 x 8 x 64 = 32768 per token, + 2 x 32 scales x 4 bytes fixed. */
    cr_assert(strstr(out, "32768  32 KiB") != NULL, "%s", out);
    cr_assert(strstr(out, "scales (fixed, not per token)") != NULL, "%s", out);
    char args[4200];
    snprintf(args, sizeof args, "--config '%s' --seq-len 100", data_path("config_gemma3.json"));
    rc = run_plan(args, err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "52 x sliding window of 1024 tokens") != NULL, "%s", out);

    expect_exit("--model Llama-3.1-8B --kv-scales per-head", 2, "apply to a quantized KV");
    expect_exit("--model Llama-3.1-8B --kv-dtype fp8 --kv-scales per-block:0", 2,
                "--kv-scales: 'per-block:0'");
    expect_exit("--model Llama-3.1-8B --kv-dtype fp8 --kv-scale-dtype int4", 2,
                "--kv-scale-dtype: 'int4'");
    expect_exit("--model Mistral-7B-v0.1 --window 10 --no-window", 2, "not both");
    expect_exit("--model Gemma-3-27B --layers 10", 2, "per-layer runs");
    expect_exit("--model Jamba-v0.1 --tp 3", 1, "--tp 3");
    snprintf(args, sizeof args, "--config '%s'", data_path("config_bad_types.json"));
    expect_exit(args, 1, "chunked_attention");
}

/* ---- slips a new user met (issue 21, item 4); each failed before its fix ------------------- */

/* Mistral 7B's versions differ in attention: v0.1 windows every layer to 4,096 tokens, v0.3
 * (the project's chat template) has no window. At 32k tokens on an 80 GiB GPU: v0.3 holds
 * 128 KiB a token, 4 GiB a request, and (72 - 13.5) GiB / 4 GiB = 14 fit; v0.1's window holds
 * 512 MiB a request and 117 fit. A bare "Mistral-7B" is refused with both names. */
Test(slips, mistral_presets_by_version)
{
    static char err[8192], out[65536];
    const cap_model_preset *v1 = cap_model_find("Mistral-7B-v0.1"),
                           *v3 = cap_model_find("mistralai/Mistral-7B-v0.3");
    cr_assert_not_null(v1);
    cr_assert_not_null(v3);
    cr_assert_null(cap_model_find("Mistral-7B"));
    cr_assert_eq(cap_model_versions("mistral-7b", NULL, 0), 2);
    cr_assert_eq(v1->shape.layers.run[0].kind, CAP_LAYER_SLIDING);
    cr_assert_eq(v3->shape.layers.n_runs, 0, "v0.3 has no window");
    cr_assert_eq(v3->shape.n_params, UINT64_C(7248023552));
    int rc = run_plan("--model Mistral-7B-v0.3 --seq-len 32768 --gpu-mem 80GiB --json", err,
                      sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"requests_of_seq_len\": 14\n") != NULL, "%s", out);
    rc = run_plan("--model Mistral-7B-v0.1 --seq-len 32768 --gpu-mem 80GiB --json", err, sizeof err,
                  out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"requests_of_seq_len\": 117\n") != NULL, "%s", out);
    expect_exit("--model Mistral-7B --seq-len 32768", 2, "Mistral-7B-v0.1, Mistral-7B-v0.3");
}

Test(slips, warns_past_the_context_length)
{
    static char err[8192], out[65536];
    int rc =
        run_plan("--model Gemma-2-9B --seq-len 32768 --json", err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "beyond Gemma-2-9B's context length (8192 tokens") != NULL, "%s", err);
    cr_assert(strstr(out, "\"beyond_context\": true") != NULL, "%s", out);
    rc = run_plan("--model Llama-3.1-8B --seq-len 1000000", err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "context length (131072 tokens") != NULL, "%s", err);
    rc = run_plan("--model Llama-3.1-8B --lens 1000,131072", err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "context length") == NULL, "at the limit: no warning: %s", err);
    rc = run_plan("--model Llama-3.1-8B --lens 1000,131073", err, sizeof err, out, sizeof out);
    cr_assert(strstr(err, "context length") != NULL, "one past it, in --lens: %s", err);
}

Test(slips, usage_names_no_positional_model)
{
    static char err[8192], out[65536];
    int rc = run_plan("--help", err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0);
    cr_assert(strncmp(out, "Usage: kvprefix plan (--model NAME", 34) == 0, "%s", out);
    cr_assert(strstr(out, "plan MODEL") == NULL, "%s", out);
    expect_exit("Llama-3.1-8B --seq-len 8", 2, "given as --model Llama-3.1-8B");
}

Test(slips, gpu_presets_in_binary_units)
{
    static char err[8192], out[65536];
    const cap_gpu_preset *h = cap_gpu_find("h100-80gb");
    cr_assert_not_null(h);
    cr_assert_eq(h->mem_bytes, UINT64_C(80) << 30);
    int rc = run_plan("--model Llama-3.1-8B --gpu H100-80GB --seq-len 8192 --json", err, sizeof err,
                      out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"gpu_mem_bytes\": 85899345920") != NULL, "%s", out);
    rc = run_plan("--model Llama-3.1-8B --gpu-mem 80GB --seq-len 8192", err, sizeof err, out,
                  sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(err, "80GB is 74.5 GiB") != NULL, "%s", err);
    rc = run_plan("--model Llama-3.1-8B --gpu-mem 80GiB --seq-len 8192", err, sizeof err, out,
                  sizeof out);
    cr_assert(strstr(err, "note") == NULL, "%s", err);
    expect_exit("--model Llama-3.1-8B --gpu Z80 --seq-len 8", 2, "no preset 'Z80'");
    expect_exit("--model Llama-3.1-8B --gpu H100-80GB --gpu-mem 80GiB", 2, "not both");
    expect_exit("--model Llama-3.1-8B --gpu-mem 80GiB --gpu H100-80GB", 2, "not both");
}

/* vLLM's MLA backends use 64-token blocks: DeepSeek-V3 (61 layers x 576 bf16 elements,
 * 70,272 bytes a token) is planned with blocks of 64 x 70,272 = 4,497,408 bytes unless
 * --block-size is given; a model without a latent keeps 16. */
Test(slips, mla_blocks_of_64)
{
    static char err[8192], out[65536];
    int rc =
        run_plan("--model DeepSeek-V3 --seq-len 4096 --json", err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "\"block_size\": 64") != NULL, "%s", out);
    cr_assert(strstr(out, "\"block_bytes_per_gpu\": 4497408") != NULL, "%s", out);
    rc = run_plan("--model DeepSeek-V3 --seq-len 4096 --block-size 16 --json", err, sizeof err, out,
                  sizeof out);
    cr_assert(strstr(out, "\"block_size\": 16") != NULL, "%s", out);
    rc = run_plan("--model Llama-3.1-8B --seq-len 4096 --json", err, sizeof err, out, sizeof out);
    cr_assert(strstr(out, "\"block_size\": 16") != NULL, "%s", out);
}
