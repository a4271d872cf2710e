/*
 * models.h - model shapes for `kvprefix plan`: built-in presets of well-known open models
 * and a reader for a Hugging Face config.json.
 */
#ifndef CLI_MODELS_H
#define CLI_MODELS_H

#include <stddef.h>

#include "kvplan.h"

/* One preset: the published shape of an open model. */
typedef struct cap_model_preset {
    const char *name;      /* preset name given to --model, e.g. "Llama-3.1-8B" */
    const char *hf_repo;   /* Hugging Face repository whose config.json the shape comes from */
    cap_model_shape shape; /* layers, heads, KV heads, head dim, dtype, parameter count */
    const char *source;    /* where the values were checked: config.json URL and model card */
    uint64_t max_context;  /* max_position_embeddings of that config.json: the longest context
                              the model is built for, in tokens */
} cap_model_preset;

/* Number of presets. Cannot fail. */
size_t cap_model_count(void);

/* Preset i (0 .. cap_model_count() - 1), a static object, or NULL when out of range. */
const cap_model_preset *cap_model_at(size_t i);

/* Find a preset by name or by Hugging Face repository id, case-insensitively
 * ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"). Returns a static object, or NULL. */
const cap_model_preset *cap_model_find(const char *name);

/* The presets whose name is `name` followed by a version ("Mistral-7B" ->
 * "Mistral-7B-v0.1", "Mistral-7B-v0.3"), case-insensitively, for the message when a name
 * without its version is given: up to max of them into out. Returns how many there are.
 * Cannot fail. */
size_t cap_model_versions(const char *name, const cap_model_preset **out, size_t max);

/* Read the shape of a model from a Hugging Face config.json at path ("-" is not accepted):
 * num_hidden_layers, num_attention_heads, num_key_value_heads (absent or null: equal to the
 * query heads, MHA), head_dim (absent or null: hidden_size / num_attention_heads, which must
 * divide), torch_dtype or dtype (absent: *out's dtypes are kept). When the top level has no
 * num_hidden_layers but a "text_config" object, that object is read instead (multimodal
 * configs). Fields that *out already has are overwritten; n_params is left as it is (a
 * config.json does not state it).
 * Returns CAP_OK, or CAP_EINVAL with a "FILE: what is wrong" message in err
 * (truncated to err_size); *out is untouched on failure. */
int cap_model_from_config(const char *path, cap_model_shape *out, char *err, size_t err_size);

#endif /* CLI_MODELS_H */
