/*
 * models.c - model presets and the Hugging Face config.json reader for `kvprefix plan`.
 *
 * Each preset copies the attention shape from the model's published config.json on its
 * Hugging Face model card (num_hidden_layers, num_attention_heads, num_key_value_heads,
 * hidden_size / num_attention_heads = head_dim, torch_dtype). The parameter count is not in
 * config.json: it is computed from the same config's shapes (embeddings, untied LM head,
 * attention with its biases where the model has them, the gated MLP or its experts plus the
 * router, RMSNorm weights), and agrees with the rounded figure on the model card.
 *
 *   preset         HF repository                    L  Hq Hkv  D  dtype  parameters (card)
 *   Llama-3.1-8B   meta-llama/Llama-3.1-8B         32  32   8 128 bf16   8,030,261,248 (8.03B)
 *   Llama-3.1-70B  meta-llama/Llama-3.1-70B        80  64   8 128 bf16  70,553,706,496 (70.6B)
 *   Llama-2-7B     meta-llama/Llama-2-7b-hf        32  32  32 128 fp16   6,738,415,616 (6.74B)
 *   Mistral-7B     mistralai/Mistral-7B-v0.1       32  32   8 128 bf16   7,241,732,096 (7.24B)
 *   Qwen2.5-7B     Qwen/Qwen2.5-7B                 28  28   4 128 bf16   7,615,616,512 (7.61B)
 *   Qwen2.5-72B    Qwen/Qwen2.5-72B                80  64   8 128 bf16  72,706,203,648 (72.7B)
 *   Mixtral-8x7B   mistralai/Mixtral-8x7B-v0.1     32  32   8 128 bf16  46,702,792,704 (46.7B)
 *
 * Llama-2-7B is the MHA example (Hkv = Hq); the others use grouped-query attention.
 * Mistral-7B v0.1 has a 4096-token sliding window, which a KV-cache-aware engine can use
 * to bound the cache; the planner does not model it and counts every token.
 */
#include "cli.h"
#include "models.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CARD(repo) "https://huggingface.co/" repo "/blob/main/config.json"

static const pl_model_preset presets[] = {
    {"Llama-3.1-8B",
     "meta-llama/Llama-3.1-8B",
     {32, 32, 8, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(8030261248)},
     CARD("meta-llama/Llama-3.1-8B") " (hidden_size 4096, intermediate_size 14336, "
                                     "vocab_size 128256)"},
    {"Llama-3.1-70B",
     "meta-llama/Llama-3.1-70B",
     {80, 64, 8, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(70553706496)},
     CARD("meta-llama/Llama-3.1-70B") " (hidden_size 8192, intermediate_size 28672, "
                                      "vocab_size 128256)"},
    {"Llama-2-7B",
     "meta-llama/Llama-2-7b-hf",
     {32, 32, 32, 128, PL_DTYPE_FP16, PL_DTYPE_FP16, UINT64_C(6738415616)},
     CARD("meta-llama/Llama-2-7b-hf") " (hidden_size 4096, intermediate_size 11008, "
                                      "vocab_size 32000)"},
    {"Mistral-7B",
     "mistralai/Mistral-7B-v0.1",
     {32, 32, 8, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(7241732096)},
     CARD("mistralai/Mistral-7B-v0.1") " (hidden_size 4096, intermediate_size 14336, "
                                       "vocab_size 32000, sliding_window 4096)"},
    {"Qwen2.5-7B",
     "Qwen/Qwen2.5-7B",
     {28, 28, 4, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(7615616512)},
     CARD("Qwen/Qwen2.5-7B") " (hidden_size 3584, intermediate_size 18944, "
                             "vocab_size 152064)"},
    {"Qwen2.5-72B",
     "Qwen/Qwen2.5-72B",
     {80, 64, 8, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(72706203648)},
     CARD("Qwen/Qwen2.5-72B") " (hidden_size 8192, intermediate_size 29568, "
                              "vocab_size 152064)"},
    {"Mixtral-8x7B",
     "mistralai/Mixtral-8x7B-v0.1",
     {32, 32, 8, 128, PL_DTYPE_BF16, PL_DTYPE_BF16, UINT64_C(46702792704)},
     CARD("mistralai/Mixtral-8x7B-v0.1") " (hidden_size 4096, intermediate_size 14336, "
                                         "8 local experts, vocab_size 32000)"},
};

size_t pl_model_count(void)
{
    return sizeof presets / sizeof presets[0];
}

const pl_model_preset *pl_model_at(size_t i)
{
    return i < pl_model_count() ? &presets[i] : NULL;
}

const pl_model_preset *pl_model_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < pl_model_count(); i++)
        if (strcasecmp(name, presets[i].name) == 0 || strcasecmp(name, presets[i].hf_repo) == 0)
            return &presets[i];
    return NULL;
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

/* The shape fields of a config.json object (layers, heads, KV heads, head dim, falling back
 * to hidden_size / heads) into *m. Returns 0, or -1 with the message in err. */
static int read_shape(const json_t *cfg, pl_model_shape *m, const char *path, char *err,
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
static int read_dtype(const json_t *cfg, pl_model_shape *m, const char *path, char *err,
                      size_t err_size)
{
    json_t *dt = json_object_get(cfg, "torch_dtype");
    if (dt == NULL || json_is_null(dt))
        dt = json_object_get(cfg, "dtype");
    if (dt != NULL && !json_is_null(dt)) {
        pl_dtype d;
        if (!json_is_string(dt) || pl_dtype_parse(json_string_value(dt), &d) != 0) {
            cli_errf(err, err_size, "%s: torch_dtype must be one of float32, float16, bfloat16",
                     path);
            return -1;
        }
        m->kv_dtype = d;
        m->w_dtype = d;
    }
    return 0;
}

int pl_model_from_config(const char *path, pl_model_shape *out, char *err, size_t err_size)
{
    json_error_t jerr;
    if (path == NULL || out == NULL) {
        cli_errf(err, err_size, "no config path");
        return PL_EINVAL;
    }
    /* A config.json is small; refuse anything that is not a JSON object. */
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (jerr.line > 0)
            cli_errf(err, err_size, "%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
        else
            cli_errf(err, err_size, "%s: %s", path, jerr.text);
        return PL_EINVAL;
    }
    int rc = PL_EINVAL;
    pl_model_shape m = *out;
    const json_t *cfg = root;
    if (!json_is_object(root)) {
        cli_errf(err, err_size, "%s: the top level must be a JSON object", path);
        goto done;
    }
    if (json_object_get(root, "num_hidden_layers") == NULL &&
        json_is_object(json_object_get(root, "text_config")))
        cfg = json_object_get(root, "text_config");

    if (read_shape(cfg, &m, path, err, err_size) != 0 ||
        read_dtype(cfg, &m, path, err, err_size) != 0)
        goto done;
    const char *what = NULL;
    if (pl_model_shape_check(&m, &what) != PL_OK) {
        cli_errf(err, err_size, "%s: %s (num_attention_heads %u, num_key_value_heads %u)", path,
                 what, m.n_heads, m.n_kv_heads);
        goto done;
    }
    *out = m;
    rc = PL_OK;
done:
    json_decref(root);
    return rc;
}
