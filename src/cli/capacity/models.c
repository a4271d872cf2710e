/*
 * models.c - model presets and the Hugging Face config.json reader for `kvprefix plan`.
 *
 * Each preset copies the attention shape from the model's published config.json on its
 * Hugging Face model card (num_hidden_layers, num_attention_heads, num_key_value_heads,
 * head_dim or hidden_size / num_attention_heads, torch_dtype) and its per-layer KV layout
 * (sliding_window and its layer pattern, kv_lora_rank + qk_rope_head_dim, the attention /
 * Mamba pattern). The parameter count is not in config.json: it is computed from the same
 * config's shapes (embeddings, untied LM head, attention with its biases and norms, the gated
 * MLP or its experts plus the router, Mamba mixers, RMSNorm weights, a vision tower where
 * the repository ships one), and agrees with the rounded figure on the model card.
 *
 *   preset         L  Hq Hkv   D  KV layout                          params (card)
 *   Llama-3.1-8B   32  32   8 128  32 full                            8,030,261,248 (8.03B)
 *   Llama-3.1-70B  80  64   8 128  80 full                           70,553,706,496 (70.6B)
 *   Llama-3.3-70B  80  64   8 128  80 full                           70,553,706,496 (70.6B)
 *   Llama-2-7B     32  32  32 128  32 full (MHA)                      6,738,415,616 (6.74B)
 *   Mistral-7B-v0.1 32 32   8 128  32 sliding, W 4096                 7,241,732,096 (7.24B)
 *   Mistral-7B-v0.3 32 32   8 128  32 full (sliding_window null)      7,248,023,552 (7.25B)
 *   Qwen2.5-7B     28  28   4 128  28 full                            7,615,616,512 (7.61B)
 *   Qwen2.5-72B    80  64   8 128  80 full                           72,706,203,648 (72.7B)
 *   Qwen3-8B       36  32   8 128  36 full (use_sliding_window false) 8,190,735,360 (8.19B)
 *   Qwen3-32B      64  64   8 128  64 full (use_sliding_window false) 32,762,123,264 (32.8B)
 *   Mixtral-8x7B   32  32   8 128  32 full                           46,702,792,704 (46.7B)
 *   Gemma-2-9B     42  16   8 256  21 sliding W 4096 + 21 full        9,241,705,984 (9.24B)
 *   Gemma-3-27B    62  32  16 128  52 sliding W 1024 + 10 full       27,432,406,640 (27.4B)
 *   DeepSeek-V3    61 128 128 192  61 latent, 512 + 64 elements     671,026,419,200 (671B)
 *   Jamba-v0.1     32  32   8 128  4 full + 28 Mamba states          51,570,323,328 (51.6B)
 *
 * Mistral 7B changed its attention between versions: v0.1 windows every layer to 4,096 tokens,
 * v0.2 and v0.3 have no window (and v0.3 a vocabulary of 32,768: 768 x 4096 x 2 more
 * embedding and head parameters). A bare "Mistral-7B" is refused with both names, since the
 * two differ eightfold in KV at 32k tokens. Each preset also carries max_position_embeddings,
 * the context it is built for, so that plan can warn beyond it.
 *
 * Layer patterns, as the transformers implementations define them: Gemma 2 alternates,
 * layer i sliding when i is even; Gemma 3 has sliding_window_pattern 6, layer i full when
 * (i + 1) % 6 == 0 (layers 5, 11, ..., 59); Jamba has an attention layer when
 * i % attn_layer_period == attn_layer_offset (8 and 4: layers 4, 12, 20, 28). A Jamba Mamba
 * layer keeps d_inner x (d_conv - 1) convolution and d_inner x d_state SSM elements with
 * d_inner = mamba_expand x hidden_size = 8192, d_conv 4, d_state 16: 155,648 per layer.
 * DeepSeek-V3's weights are fp8 (1 byte per parameter here; its block scales, embeddings and
 * norms in bf16 are a few GB more); its head_dim is qk_nope_head_dim + qk_rope_head_dim,
 * used only for the attention workspace. Gemma-3-27B's count includes the SigLIP vision
 * tower (416,866,032) and projector (6,194,304) of the repository; its text model is
 * 27,009,346,304. Values not read from a config.json we could see are marked unverified in
 * the preset's source string.
 */
#include "cli.h"
#include "models.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CARD(repo) "https://huggingface.co/" repo "/blob/main/config.json"

/* Designated initializers for the presets' shapes and runs. */
#define SHAPE(l, hq, hkv, d, kvt, wt, params)                                                      \
    .n_layers = (l), .n_heads = (hq), .n_kv_heads = (hkv), .head_dim = (d), .kv_dtype = (kvt),     \
    .w_dtype = (wt), .n_params = UINT64_C(params), .state_dtype = (kvt),                           \
    .kv_quant = {CAP_SCALES_NONE, 0, CAP_DTYPE_FP32}
#define RUN_FULL(n, h, d)                                                                          \
    {                                                                                              \
        CAP_LAYER_FULL, (n), (h), (d), 0, 0, 0                                                     \
    }
#define RUN_SLIDING(n, h, d, w)                                                                    \
    {                                                                                              \
        CAP_LAYER_SLIDING, (n), (h), (d), (w), 0, 0                                                \
    }
#define RUN_LATENT(n, e)                                                                           \
    {                                                                                              \
        CAP_LAYER_LATENT, (n), 0, 0, 0, (e), 0                                                     \
    }
#define RUN_STATE(n, e)                                                                            \
    {                                                                                              \
        CAP_LAYER_STATE, (n), 0, 0, 0, 0, (e)                                                      \
    }
#define BF16 CAP_DTYPE_BF16

static const cap_model_preset presets[] = {
    {"Llama-3.1-8B",
     "meta-llama/Llama-3.1-8B",
     {SHAPE(32, 32, 8, 128, BF16, BF16, 8030261248)},
     CARD("meta-llama/Llama-3.1-8B") " (hidden_size 4096, intermediate_size 14336, "
                                     "vocab_size 128256)",
     131072},
    {"Llama-3.1-70B",
     "meta-llama/Llama-3.1-70B",
     {SHAPE(80, 64, 8, 128, BF16, BF16, 70553706496)},
     CARD("meta-llama/Llama-3.1-70B") " (hidden_size 8192, intermediate_size 28672, "
                                      "vocab_size 128256)",
     131072},
    {"Llama-2-7B",
     "meta-llama/Llama-2-7b-hf",
     {SHAPE(32, 32, 32, 128, CAP_DTYPE_FP16, CAP_DTYPE_FP16, 6738415616)},
     CARD("meta-llama/Llama-2-7b-hf") " (hidden_size 4096, intermediate_size 11008, "
                                      "vocab_size 32000)",
     4096},
    {"Mistral-7B-v0.1",
     "mistralai/Mistral-7B-v0.1",
     {SHAPE(32, 32, 8, 128, BF16, BF16, 7241732096),
      .layers = {1, {RUN_SLIDING(32, 8, 128, 4096)}}},
     CARD("mistralai/Mistral-7B-v0.1") " (hidden_size 4096, intermediate_size 14336, "
                                       "vocab_size 32000, sliding_window 4096 on every "
                                       "layer)",
     32768},
    {"Mistral-7B-v0.3",
     "mistralai/Mistral-7B-v0.3",
     {SHAPE(32, 32, 8, 128, BF16, BF16, 7248023552)},
     CARD("mistralai/Mistral-7B-v0.3") " (hidden_size 4096, intermediate_size 14336, "
                                       "vocab_size 32768, sliding_window null)",
     32768},
    {"Qwen2.5-7B",
     "Qwen/Qwen2.5-7B",
     {SHAPE(28, 28, 4, 128, BF16, BF16, 7615616512)},
     CARD("Qwen/Qwen2.5-7B") " (hidden_size 3584, intermediate_size 18944, "
                             "vocab_size 152064)",
     131072},
    {"Qwen2.5-72B",
     "Qwen/Qwen2.5-72B",
     {SHAPE(80, 64, 8, 128, BF16, BF16, 72706203648)},
     CARD("Qwen/Qwen2.5-72B") " (hidden_size 8192, intermediate_size 29568, "
                              "vocab_size 152064)",
     131072},
    {"Mixtral-8x7B",
     "mistralai/Mixtral-8x7B-v0.1",
     {SHAPE(32, 32, 8, 128, BF16, BF16, 46702792704)},
     CARD("mistralai/Mixtral-8x7B-v0.1") " (hidden_size 4096, intermediate_size 14336, "
                                         "8 local experts, vocab_size 32000)",
     32768},
    {"Llama-3.3-70B",
     "meta-llama/Llama-3.3-70B-Instruct",
     {SHAPE(80, 64, 8, 128, BF16, BF16, 70553706496)},
     CARD("meta-llama/Llama-3.3-70B-Instruct") " (hidden_size 8192, intermediate_size 28672, "
                                               "vocab_size 128256; the Llama-3.1-70B shape, "
                                               "unverified against the file itself)",
     131072},
    {"Qwen3-8B",
     "Qwen/Qwen3-8B",
     {SHAPE(36, 32, 8, 128, BF16, BF16, 8190735360)},
     CARD("Qwen/Qwen3-8B") " (head_dim 128, hidden_size 4096, intermediate_size 12288, "
                           "vocab_size 151936, untied, q/k norms; sliding_window null, "
                           "use_sliding_window false)",
     40960},
    {"Qwen3-32B",
     "Qwen/Qwen3-32B",
     {SHAPE(64, 64, 8, 128, BF16, BF16, 32762123264)},
     CARD("Qwen/Qwen3-32B") " (head_dim 128, hidden_size 5120, intermediate_size 25600, "
                            "vocab_size 151936, untied, q/k norms; sliding_window null, "
                            "use_sliding_window false; read from a copy of the file)",
     40960},
    {"Gemma-2-9B",
     "google/gemma-2-9b",
     {SHAPE(42, 16, 8, 256, BF16, BF16, 9241705984),
      .layers = {2, {RUN_SLIDING(21, 8, 256, 4096), RUN_FULL(21, 8, 256)}}},
     CARD("google/gemma-2-9b") " (head_dim 256, hidden_size 3584, intermediate_size 14336, "
                               "vocab_size 256000, tied; sliding_window 4096 on even layers; "
                               "read from a fine-tune's copy of the -it file, torch_dtype "
                               "unverified)",
     8192},
    {"Gemma-3-27B",
     "google/gemma-3-27b-it",
     {SHAPE(62, 32, 16, 128, BF16, BF16, 27432406640),
      .layers = {2, {RUN_SLIDING(52, 16, 128, 1024), RUN_FULL(10, 16, 128)}}},
     CARD("google/gemma-3-27b-it") " text_config (head_dim 128, hidden_size 5376, "
                                   "intermediate_size 21504, vocab_size 262208, "
                                   "sliding_window 1024, sliding_window_pattern 6)",
     131072},
    {"DeepSeek-V3",
     "deepseek-ai/DeepSeek-V3",
     {SHAPE(61, 128, 128, 192, BF16, CAP_DTYPE_FP8, 671026419200),
      .layers = {1, {RUN_LATENT(61, 576)}}},
     CARD("deepseek-ai/DeepSeek-V3") " (kv_lora_rank 512, qk_rope_head_dim 64, "
                                     "qk_nope_head_dim 128, v_head_dim 128, q_lora_rank 1536, "
                                     "hidden_size 7168, 256 routed + 1 shared experts of 2048, "
                                     "first_k_dense_replace 3, vocab_size 129280; fp8 "
                                     "weights)",
     163840},
    {"Jamba-v0.1",
     "ai21labs/Jamba-v0.1",
     {SHAPE(32, 32, 8, 128, BF16, BF16, 51570323328),
      .layers = {2, {RUN_FULL(4, 8, 128), RUN_STATE(28, 155648)}}},
     CARD("ai21labs/Jamba-v0.1") " (hidden_size 4096, attn_layer_period 8, "
                                 "attn_layer_offset 4, mamba_d_state 16, mamba_d_conv 4, "
                                 "mamba_expand 2, 16 experts every 2nd layer, "
                                 "vocab_size 65536)",
     262144},
};

size_t cap_model_count(void)
{
    return sizeof presets / sizeof presets[0];
}

const cap_model_preset *cap_model_at(size_t i)
{
    return i < cap_model_count() ? &presets[i] : NULL;
}

const cap_model_preset *cap_model_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < cap_model_count(); i++)
        if (strcasecmp(name, presets[i].name) == 0 || strcasecmp(name, presets[i].hf_repo) == 0)
            return &presets[i];
    return NULL;
}

size_t cap_model_versions(const char *name, const cap_model_preset **out, size_t max)
{
    size_t n = 0, len = name ? strlen(name) : 0;
    for (size_t i = 0; len > 0 && i < cap_model_count(); i++) {
        const char *p = presets[i].name;
        if (strncasecmp(p, name, len) == 0 && strncasecmp(p + len, "-v", 2) == 0) {
            if (n < max)
                out[n] = &presets[i];
            n++;
        }
    }
    return n;
}

/* Read a positive integer field no larger than 2^31. Returns 1 if present and valid, 0 if
 * absent or null, -1 on error (message set). */
static int get_count(const json_t *obj, const char *key, uint32_t *out, const char *path, char *err,
                     size_t err_size)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        cli_errf(err, err_size, "%s: %s must be an integer", path, key);
        return -1;
    }
    json_int_t i = json_integer_value(v);
    if (i <= 0 || i > (json_int_t)1 << 31) {
        cli_errf(err, err_size, "%s: %s must be between 1 and 2147483648, not %lld", path, key,
                 (long long)i);
        return -1;
    }
    *out = (uint32_t)i;
    return 1;
}

/* MLA (DeepSeek-V2/V3, Kimi-K2): the key head dimension qk_nope_head_dim + qk_rope_head_dim,
 * used for the attention workspace (the KV cache holds the latent). Returns 1 if both are
 * given, 0 if not, -1 on error (message set). */
static int mla_head_dim(const json_t *cfg, uint32_t *out, const char *path, char *err,
                        size_t err_size)
{
    uint32_t nope = 0, rope = 0;
    int a = get_count(cfg, "qk_nope_head_dim", &nope, path, err, err_size);
    int b = a < 0 ? -1 : get_count(cfg, "qk_rope_head_dim", &rope, path, err, err_size);
    if (a < 0 || b < 0)
        return -1;
    if (a == 0 || b == 0)
        return 0;
    *out = nope + rope;
    return 1;
}

/* The shape fields of a config.json object (layers, heads, KV heads, head dim, falling back
 * to hidden_size / heads) into *m. Returns 0, or -1 with the message in err. */
static int read_shape(const json_t *cfg, cap_model_shape *m, const char *path, char *err,
                      size_t err_size)
{
    uint32_t hidden = 0;
    int r;
    if ((r = get_count(cfg, "num_hidden_layers", &m->n_layers, path, err, err_size)) <= 0) {
        if (r == 0)
            cli_errf(err, err_size, "%s: num_hidden_layers is missing", path);
        return -1;
    }
    if ((r = get_count(cfg, "num_attention_heads", &m->n_heads, path, err, err_size)) <= 0) {
        if (r == 0)
            cli_errf(err, err_size, "%s: num_attention_heads is missing", path);
        return -1;
    }
    r = get_count(cfg, "num_key_value_heads", &m->n_kv_heads, path, err, err_size);
    if (r < 0)
        return -1;
    if (r == 0)
        m->n_kv_heads = m->n_heads; /* absent: multi-head attention */
    r = get_count(cfg, "head_dim", &m->head_dim, path, err, err_size);
    if (r == 0)
        r = mla_head_dim(cfg, &m->head_dim, path, err, err_size);
    if (r < 0)
        return -1;
    if (r == 0) {
        r = get_count(cfg, "hidden_size", &hidden, path, err, err_size);
        if (r < 0)
            return -1;
        if (r == 0) {
            cli_errf(err, err_size, "%s: neither head_dim nor hidden_size is given", path);
            return -1;
        }
        if (hidden % m->n_heads != 0) {
            cli_errf(err, err_size,
                     "%s: hidden_size %u is not a multiple of num_attention_heads %u", path, hidden,
                     m->n_heads);
            return -1;
        }
        m->head_dim = hidden / m->n_heads;
    }
    return 0;
}

/* torch_dtype (or dtype) into *m when given. Returns 0, or -1 with the message in err. */
static int read_dtype(const json_t *cfg, cap_model_shape *m, const char *path, char *err,
                      size_t err_size)
{
    json_t *dt = json_object_get(cfg, "torch_dtype");
    if (dt == NULL || json_is_null(dt))
        dt = json_object_get(cfg, "dtype");
    if (dt != NULL && !json_is_null(dt)) {
        cap_dtype d;
        if (!json_is_string(dt) || cap_dtype_parse(json_string_value(dt), &d) != 0) {
            cli_errf(err, err_size, "%s: torch_dtype must be one of float32, float16, bfloat16",
                     path);
            return -1;
        }
        m->kv_dtype = d;
        m->w_dtype = d;
        m->state_dtype = d;
    }
    return 0;
}

/* Read a non-negative integer field no larger than max. Returns 1 if present and valid, 0 if
 * absent or null, -1 on error (message set). */
static int get_uint(const json_t *obj, const char *key, uint32_t max, uint32_t *out,
                    const char *path, char *err, size_t err_size)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return 0;
    json_int_t i = json_is_integer(v) ? json_integer_value(v) : -1;
    if (i < 0 || (uint64_t)i > max) {
        cli_errf(err, err_size, "%s: %s must be an integer in 0..%u", path, key, max);
        return -1;
    }
    *out = (uint32_t)i;
    return 1;
}

/* How each layer of a config stores KV, from its family's fields (read_rules). */
typedef struct layer_rules {
    const json_t *types;    /* layer_types or layers_block_type (one string per layer) */
    const char *types_key;  /* which of the two, for messages */
    uint32_t attn_period;   /* Jamba: attention when i % period == offset (0: unused) */
    uint32_t attn_offset;   /* Jamba: see attn_period */
    uint32_t full_interval; /* Qwen3-Next: full attention when (i + 1) % interval == 0 */
    uint32_t window;        /* sliding_window in tokens (0: none) */
    uint32_t swa_pattern;   /* Gemma 3: sliding unless (i + 1) % pattern == 0 (0: unused) */
    bool swa_alternate;     /* Gemma 2: sliding when i is even */
    bool swa_qwen;          /* use_sliding_window true: sliding when i >= swa_from */
    uint32_t swa_from;      /* max_window_layers */
    bool swa_all;           /* a bare sliding_window (Mistral): every attention layer */
    uint32_t latent_dim;    /* MLA: kv_lora_rank + qk_rope_head_dim (0: not MLA) */
    uint32_t n_shared;      /* num_kv_shared_layers: the last n layers reuse KV */
    uint64_t state_elems;   /* elements of one state layer (0: unknown) */
} layer_rules;

#define MAX_PATTERN_LAYERS (1u << 20) /* layers evaluated one by one */

/* The config's recurrent-state fields (absent: 0). */
typedef struct state_fields {
    uint32_t n_heads, d_head, n_groups, d_state, d_conv, hidden, expand; /* mamba_* */
    uint32_t nk, nv, dk, dv, kernel; /* linear_* (Gated DeltaNet) */
} state_fields;

/* Read the state fields of c into *f. Returns 0, or -1 with the message in err. */
static int read_state_fields(const json_t *c, state_fields *f, const char *path, char *err,
                             size_t n)
{
    const struct {
        const char *key;
        uint32_t *out;
    } keys[] = {
        {"mamba_n_heads", &f->n_heads},     {"mamba_d_head", &f->d_head},
        {"mamba_n_groups", &f->n_groups},   {"mamba_d_state", &f->d_state},
        {"mamba_d_conv", &f->d_conv},       {"hidden_size", &f->hidden},
        {"mamba_expand", &f->expand},       {"linear_num_key_heads", &f->nk},
        {"linear_num_value_heads", &f->nv}, {"linear_key_head_dim", &f->dk},
        {"linear_value_head_dim", &f->dv},  {"linear_conv_kernel_dim", &f->kernel},
    };
    memset(f, 0, sizeof *f);
    f->n_groups = 1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (get_uint(c, keys[i].key, 1u << 24, keys[i].out, path, err, n) < 0)
            return -1;
    return 0;
}

/* Elements of one recurrent state layer per sequence: Mamba-2 (mamba_n_heads: convolution
 * over x, B and C, plus an SSM state per head), Mamba-1 (mamba_d_state and mamba_expand, as
 * Jamba: d_inner = expand x hidden_size, d_inner x (d_conv - 1) + d_inner x d_state), Gated
 * DeltaNet (linear_*, as Qwen3-Next: convolution over q, k and v, plus a dk x dv state per
 * value head); 0 when the config has none of them. Returns 0, or -1 with the message. */
static int read_state(const json_t *c, layer_rules *r, const char *path, char *err, size_t n)
{
    state_fields f;
    if (read_state_fields(c, &f, path, err, n) != 0)
        return -1;
    uint64_t x, y, e = 0;
    int bad = 0; /* an overflow of 64 bits: fields up to 2^24 can multiply past it */
    if (f.n_heads > 0 && f.d_head > 0 && f.d_state > 0 && f.d_conv > 0) {
        bad = cap_mul(f.n_heads, f.d_head, &x) ||
              cap_mul(f.n_groups, 2 * (uint64_t)f.d_state, &y) || cap_add(x, y, &y) ||
              cap_mul(y, f.d_conv - 1, &y) || cap_mul(x, f.d_state, &x) || cap_add(x, y, &e);
    } else if (f.d_state > 0 && f.d_conv > 0 && f.expand > 0 && f.hidden > 0) {
        x = (uint64_t)f.expand * f.hidden;
        bad = cap_mul(x, (uint64_t)f.d_conv - 1 + f.d_state, &e);
    } else if (f.nk > 0 && f.nv > 0 && f.dk > 0 && f.dv > 0 && f.kernel > 0) {
        bad = cap_mul(2 * (uint64_t)f.nk, f.dk, &x) || cap_mul(f.nv, f.dv, &y) ||
              cap_add(x, y, &x) || cap_mul(x, f.kernel - 1, &x) || cap_mul(f.nv, f.dk, &y) ||
              cap_mul(y, f.dv, &y) || cap_add(x, y, &e);
    }
    if (bad) {
        cli_errf(err, n, "%s: the recurrent state size does not fit 64 bits", path);
        return -1;
    }
    r->state_elems = e;
    return 0;
}

/* The sliding-window fields: sliding_window, use_sliding_window / max_window_layers (Qwen),
 * sliding_window_pattern (Gemma 3), model_type gemma2 (alternating). Returns 0 or -1. */
static int read_window(const json_t *c, uint32_t n_layers, layer_rules *r, const char *path,
                       char *err, size_t n)
{
    if (get_uint(c, "sliding_window", 1u << 31, &r->window, path, err, n) < 0)
        return -1;
    json_t *use = json_object_get(c, "use_sliding_window");
    if (use != NULL && !json_is_null(use) && !json_is_boolean(use)) {
        cli_errf(err, n, "%s: use_sliding_window must be true or false", path);
        return -1;
    }
    if (use != NULL && json_is_false(use))
        r->window = 0; /* Qwen: the window is configured but off */
    if (r->window == 0)
        return 0;
    if (use != NULL && json_is_true(use)) {
        r->swa_qwen = true;
        return get_uint(c, "max_window_layers", n_layers, &r->swa_from, path, err, n) < 0 ? -1 : 0;
    }
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    int got = get_uint(c, "sliding_window_pattern", 1u << 20, &r->swa_pattern, path, err, n);
    if (got == 0)
        got = get_uint(c, "_sliding_window_pattern", 1u << 20, &r->swa_pattern, path, err, n);
    if (got < 0)
        return -1;
    if (got == 0 && mt != NULL && strcmp(mt, "gemma3_text") == 0)
        r->swa_pattern = 6; /* transformers' Gemma3TextConfig default */
    r->swa_alternate = r->swa_pattern == 0 && mt != NULL && strcmp(mt, "gemma2") == 0;
    r->swa_all = r->swa_pattern == 0 && !r->swa_alternate;
    return 0;
}

/* The per-layer type array, the hybrid periods, MLA and KV sharing. Returns 0 or -1. */
static int read_rules(const json_t *c, const cap_model_shape *m, layer_rules *r, const char *path,
                      char *err, size_t n)
{
    memset(r, 0, sizeof *r);
    r->types_key = "layer_types";
    r->types = json_object_get(c, "layer_types");
    if (r->types == NULL || json_is_null(r->types)) {
        r->types_key = "layers_block_type";
        r->types = json_object_get(c, "layers_block_type");
    }
    if (r->types != NULL && json_is_null(r->types))
        r->types = NULL;
    if (r->types != NULL &&
        (!json_is_array(r->types) || json_array_size(r->types) != m->n_layers)) {
        cli_errf(err, n, "%s: %s must be an array of %u strings, one per layer", path, r->types_key,
                 m->n_layers);
        return -1;
    }
    uint32_t rank = 0, rope = 0;
    if (get_uint(c, "attn_layer_period", 1u << 20, &r->attn_period, path, err, n) < 0 ||
        get_uint(c, "attn_layer_offset", 1u << 20, &r->attn_offset, path, err, n) < 0 ||
        get_uint(c, "full_attention_interval", 1u << 20, &r->full_interval, path, err, n) < 0 ||
        get_uint(c, "kv_lora_rank", 1u << 24, &rank, path, err, n) < 0 ||
        get_uint(c, "qk_rope_head_dim", 1u << 24, &rope, path, err, n) < 0 ||
        get_uint(c, "num_kv_shared_layers", m->n_layers, &r->n_shared, path, err, n) < 0 ||
        read_window(c, m->n_layers, r, path, err, n) < 0 || read_state(c, r, path, err, n) < 0)
        return -1;
    if (rank > 0)
        r->latent_dim = rank + rope;
    return 0;
}

enum { K_FULL, K_SLIDING, K_LATENT, K_STATE, K_SHARED, K_COUNT };

/* The kind of layer i (K_*). Returns 0, or -1 with the message in err. */
static int layer_kind(const layer_rules *r, uint32_t i, uint32_t n_layers, int *out,
                      const char *path, char *err, size_t n)
{
    int k = K_FULL;
    bool typed = r->types != NULL;
    if (typed) {
        const char *t = json_string_value(json_array_get(r->types, i));
        if (t != NULL && (strcmp(t, "full_attention") == 0 || strcmp(t, "attention") == 0))
            k = K_FULL;
        else if (t != NULL && strcmp(t, "sliding_attention") == 0 && r->window > 0)
            k = K_SLIDING;
        else if (t != NULL && (strcmp(t, "linear_attention") == 0 || strcmp(t, "mamba") == 0 ||
                               strcmp(t, "mamba2") == 0))
            k = K_STATE;
        else {
            cli_errf(err, n,
                     "%s: %s[%u] is %s%s%s, not full_attention, attention, "
                     "sliding_attention (with a sliding_window), linear_attention or mamba",
                     path, r->types_key, i, t ? "'" : "not a string", t ? t : "", t ? "'" : "");
            return -1;
        }
    } else if (r->attn_period > 0) {
        k = i % r->attn_period == r->attn_offset ? K_FULL : K_STATE;
    } else if (r->full_interval > 0) {
        k = (i + 1) % r->full_interval == 0 ? K_FULL : K_STATE;
    }
    if (k == K_FULL && !typed && r->window > 0 &&
        (r->swa_all || (r->swa_alternate && i % 2 == 0) ||
         (r->swa_pattern > 0 && (i + 1) % r->swa_pattern != 0) ||
         (r->swa_qwen && i >= r->swa_from)))
        k = K_SLIDING;
    if (k == K_FULL && r->latent_dim > 0)
        k = K_LATENT;
    if (k != K_STATE && i >= n_layers - r->n_shared)
        k = K_SHARED;
    *out = k;
    return 0;
}

/* Count the layers of each kind and turn them into m->layers (left uniform when every layer
 * is full attention). Returns 0, or -1 with the message in err. */
static int read_layers(const json_t *c, cap_model_shape *m, const char *path, char *err, size_t n)
{
    layer_rules r;
    uint32_t count[K_COUNT] = {0};
    if (read_rules(c, m, &r, path, err, n) != 0)
        return -1;
    bool plain = r.types == NULL && r.attn_period == 0 && r.full_interval == 0 && r.window == 0 &&
                 r.latent_dim == 0 && r.n_shared == 0;
    if (plain)
        return 0;
    if (m->n_layers > MAX_PATTERN_LAYERS) {
        cli_errf(err, n,
                 "%s: num_hidden_layers %u is too many for a per-layer model (at most "
                 "%u)",
                 path, m->n_layers, MAX_PATTERN_LAYERS);
        return -1;
    }
    for (uint32_t i = 0; i < m->n_layers; i++) {
        int k;
        if (layer_kind(&r, i, m->n_layers, &k, path, err, n) != 0)
            return -1;
        count[k]++;
    }
    if (count[K_STATE] > 0 && r.state_elems == 0) {
        cli_errf(err, n,
                 "%s: %u recurrent-state layers, but no mamba_* or linear_* fields give "
                 "the size of their state",
                 path, count[K_STATE]);
        return -1;
    }
    const cap_layer_run spec[K_COUNT] = {
        {CAP_LAYER_FULL, 0, m->n_kv_heads, m->head_dim, 0, 0, 0},
        {CAP_LAYER_SLIDING, 0, m->n_kv_heads, m->head_dim, r.window, 0, 0},
        {CAP_LAYER_LATENT, 0, 0, 0, 0, r.latent_dim, 0},
        {CAP_LAYER_STATE, 0, 0, 0, 0, 0, r.state_elems},
        {CAP_LAYER_SHARED, 0, 0, 0, 0, 0, 0},
    };
    cap_layers ls = {0};
    for (int k = 0; k < K_COUNT; k++)
        if (count[k] > 0 && cap_layers_add(&ls, &spec[k], count[k]) != CAP_OK) {
            cli_errf(err, n, "%s: invalid %s layers", path, cap_layer_kind_name(spec[k].kind));
            return -1;
        }
    if (!(ls.n_runs == 1 && ls.run[0].kind == CAP_LAYER_FULL))
        m->layers = ls;
    return 0;
}

int cap_model_from_config(const char *path, cap_model_shape *out, char *err, size_t err_size)
{
    json_error_t jerr;
    if (path == NULL || out == NULL) {
        cli_errf(err, err_size, "no config path");
        return CAP_EINVAL;
    }
    /* A config.json is small; refuse anything that is not a JSON object. */
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (jerr.line > 0)
            cli_errf(err, err_size, "%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
        else
            cli_errf(err, err_size, "%s: %s", path, jerr.text);
        return CAP_EINVAL;
    }
    int rc = CAP_EINVAL;
    cap_model_shape m = *out;
    const json_t *cfg = root;
    if (!json_is_object(root)) {
        cli_errf(err, err_size, "%s: the top level must be a JSON object", path);
        goto done;
    }
    if (json_object_get(root, "num_hidden_layers") == NULL &&
        json_is_object(json_object_get(root, "text_config")))
        cfg = json_object_get(root, "text_config");

    m.layers.n_runs = 0;
    if (read_shape(cfg, &m, path, err, err_size) != 0 ||
        read_dtype(cfg, &m, path, err, err_size) != 0 ||
        read_layers(cfg, &m, path, err, err_size) != 0)
        goto done;
    const char *what = NULL;
    if (cap_model_shape_check(&m, &what) != CAP_OK) {
        cli_errf(err, err_size, "%s: %s (num_attention_heads %u, num_key_value_heads %u)", path,
                 what, m.n_heads, m.n_kv_heads);
        goto done;
    }
    *out = m;
    rc = CAP_OK;
done:
    json_decref(root);
    return rc;
}
