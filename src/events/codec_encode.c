/*
 * codec_encode.c - a kvp_kv_batch as a vLLM KV-event msgpack payload (kvp_kv_encode,
 * kvp_kv_encode_alloc), written with msgpack-c's packer.
 *
 * Output, array form (vLLM's msgspec array_like structs, omit_defaults):
 *
 *   [ts, [event, ...], data_parallel_rank or nil]
 *   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *    lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
 *   ["BlockRemoved", block_hashes, medium, group_idx]
 *   ["AllBlocksCleared"]
 *
 * The fields vLLM declares without a default (through lora_name, or medium) are always
 * written; the optional ones only up to the last one present, nil standing for any absent
 * one before it. Map form writes {"type": tag, name: value, ...} with the same always-written
 * fields and the optional ones only when present (msgspec's omit_defaults on a map struct);
 * KVP_KV_BATCH_MAP writes the batch as {"ts", "events", "data_parallel_rank" when present}.
 * docs/kv-events.md has the byte-exact examples the tests check (188 and 48 bytes).
 *
 * Writing goes through a kvp__mpw (codec.h): one pass fills the caller's buffer and
 * measures the size needed, so kvp_kv_encode never allocates; kvp_kv_encode_alloc measures
 * into a NULL buffer, then packs again into an exact allocation. Validation happens before
 * the first byte, so KVP_EINVAL leaves the buffer untouched. Cost: O(output bytes).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* The optional BlockStored fields, in wire order after lora_name. */
enum { OPT_EXTRA_KEYS, OPT_GROUP_IDX, OPT_SPEC_KIND, OPT_SLIDING_WINDOW, N_OPT };

int kvp__mpw_write(void *data, const char *buf, size_t len)
{
    kvp__mpw *w = data;
    if (w->len < w->cap) {
        size_t room = w->cap - w->len;
        memcpy(w->buf + w->len, buf, len < room ? len : room);
    }
    w->len += len;
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_opt_str(msgpack_packer *pk, const char *s)
{
    if (s)
        pack_cstr(pk, s);
    else
        msgpack_pack_nil(pk);
}

static void pack_hashes(msgpack_packer *pk, const uint64_t *h, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, h[i]);
}

static void pack_group_idx(msgpack_packer *pk, int32_t g)
{
    if (g >= 0)
        msgpack_pack_int64(pk, g);
    else
        msgpack_pack_nil(pk);
}

/* Which optional BlockStored fields ev has. */
static void stored_optionals(const kvp_kv_event *ev, bool has[N_OPT])
{
    has[OPT_EXTRA_KEYS] = ev->extra_keys != NULL;
    has[OPT_GROUP_IDX] = ev->group_idx >= 0;
    has[OPT_SPEC_KIND] = ev->spec_kind != NULL;
    has[OPT_SLIDING_WINDOW] = ev->has_sliding_window;
}

/* Write optional field f of ev (nil when absent). */
static void pack_optional(msgpack_packer *pk, const kvp_kv_event *ev, int f)
{
    switch (f) {
    case OPT_EXTRA_KEYS:
        if (ev->extra_keys)
            pk->callback(pk->data, (const char *)ev->extra_keys, ev->extra_keys_bytes);
        else
            msgpack_pack_nil(pk);
        break;
    case OPT_GROUP_IDX:
        pack_group_idx(pk, ev->group_idx);
        break;
    case OPT_SPEC_KIND:
        pack_opt_str(pk, ev->spec_kind);
        break;
    default:
        if (ev->has_sliding_window)
            msgpack_pack_int64(pk, ev->sliding_window);
        else
            msgpack_pack_nil(pk);
        break;
    }
}

static const char *const opt_names[N_OPT] = {"extra_keys", "group_idx", "kv_cache_spec_kind",
                                             "kv_cache_spec_sliding_window"};

/* Write one map key, or nothing in array form. */
static void pack_key(msgpack_packer *pk, bool map, const char *name)
{
    if (map)
        pack_cstr(pk, name);
}

/* BlockStored: the seven leading fields, then the optional ones (see the file comment). */
static void pack_stored(msgpack_packer *pk, const kvp_kv_event *ev, bool map)
{
    bool has[N_OPT];
    stored_optionals(ev, has);
    size_t n_opt = 0, n_present = 0;
    for (size_t f = 0; f < N_OPT; f++)
        if (has[f]) {
            n_opt = f + 1;
            n_present++;
        }
    if (map)
        msgpack_pack_map(pk, 8 + n_present);
    else
        msgpack_pack_array(pk, 8 + n_opt);
    pack_key(pk, map, "type");
    pack_cstr(pk, "BlockStored");
    pack_key(pk, map, "block_hashes");
    pack_hashes(pk, ev->hashes, ev->n_hashes);
    pack_key(pk, map, "parent_block_hash");
    if (ev->has_parent)
        msgpack_pack_uint64(pk, ev->parent);
    else
        msgpack_pack_nil(pk);
    pack_key(pk, map, "token_ids");
    msgpack_pack_array(pk, ev->n_tokens);
    for (size_t i = 0; i < ev->n_tokens; i++)
        msgpack_pack_uint32(pk, ev->tokens[i]);
    pack_key(pk, map, "block_size");
    msgpack_pack_uint32(pk, ev->block_size);
    pack_key(pk, map, "lora_id");
    if (ev->has_lora_id)
        msgpack_pack_int64(pk, ev->lora_id);
    else
        msgpack_pack_nil(pk);
    pack_key(pk, map, "medium");
    pack_opt_str(pk, ev->medium);
    pack_key(pk, map, "lora_name");
    pack_opt_str(pk, ev->lora_name);
    for (size_t f = 0; f < n_opt; f++) {
        if (map && !has[f])
            continue;
        pack_key(pk, map, opt_names[f]);
        pack_optional(pk, ev, (int)f);
    }
}

/* BlockRemoved: block_hashes, medium, then group_idx when present. */
static void pack_removed(msgpack_packer *pk, const kvp_kv_event *ev, bool map)
{
    size_t n = ev->group_idx >= 0 ? 4 : 3;
    if (map)
        msgpack_pack_map(pk, n);
    else
        msgpack_pack_array(pk, n);
    pack_key(pk, map, "type");
    pack_cstr(pk, "BlockRemoved");
    pack_key(pk, map, "block_hashes");
    pack_hashes(pk, ev->hashes, ev->n_hashes);
    pack_key(pk, map, "medium");
    pack_opt_str(pk, ev->medium);
    if (ev->group_idx >= 0) {
        pack_key(pk, map, "group_idx");
        pack_group_idx(pk, ev->group_idx);
    }
}

static void pack_event(msgpack_packer *pk, const kvp_kv_event *ev, bool map)
{
    switch (ev->type) {
    case KVP_EVENT_STORED:
        pack_stored(pk, ev, map);
        break;
    case KVP_EVENT_REMOVED:
        pack_removed(pk, ev, map);
        break;
    default:
        if (map)
            msgpack_pack_map(pk, 1);
        else
            msgpack_pack_array(pk, 1);
        pack_key(pk, map, "type");
        pack_cstr(pk, "AllBlocksCleared");
        break;
    }
}

void kvp__kv_pack_batch(msgpack_packer *pk, const kvp_kv_batch *batch, int form)
{
    bool map_events = (form & 3) == KVP_KV_FORM_MAP;
    bool map_batch = (form & KVP_KV_BATCH_MAP) != 0;
    if (map_batch) {
        msgpack_pack_map(pk, batch->has_dp_rank ? 3 : 2);
        pack_cstr(pk, "ts");
    } else {
        msgpack_pack_array(pk, 3);
    }
    msgpack_pack_double(pk, batch->ts);
    if (map_batch)
        pack_cstr(pk, "events");
    msgpack_pack_array(pk, batch->n_events);
    for (size_t i = 0; i < batch->n_events; i++)
        pack_event(pk, &batch->events[i], map_events);
    if (map_batch && batch->has_dp_rank)
        pack_cstr(pk, "data_parallel_rank");
    if (batch->has_dp_rank)
        msgpack_pack_int64(pk, batch->dp_rank);
    else if (!map_batch)
        msgpack_pack_nil(pk);
}

/* KVP_OK when ev can be encoded, else KVP_EINVAL. */
static int event_valid(const kvp_kv_event *ev)
{
    if (ev->type == KVP_EVENT_CLEARED)
        return KVP_OK;
    if (ev->type != KVP_EVENT_STORED && ev->type != KVP_EVENT_REMOVED)
        return KVP_EINVAL;
    if ((!ev->hashes && ev->n_hashes) || ev->n_hashes > UINT32_MAX)
        return KVP_EINVAL;
    if (ev->medium && strlen(ev->medium) > UINT32_MAX)
        return KVP_EINVAL;
    if (ev->type == KVP_EVENT_REMOVED)
        return KVP_OK;
    if ((!ev->tokens && ev->n_tokens) || ev->n_tokens > UINT32_MAX)
        return KVP_EINVAL;
    if ((ev->lora_name && strlen(ev->lora_name) > UINT32_MAX) ||
        (ev->spec_kind && strlen(ev->spec_kind) > UINT32_MAX))
        return KVP_EINVAL;
    if (ev->extra_keys) {
        size_t used;
        if (kvp__mp_walk(ev->extra_keys, ev->extra_keys_bytes, &used) != KVP_OK ||
            used != ev->extra_keys_bytes)
            return KVP_EINVAL;
    }
    return KVP_OK;
}

int kvp__kv_batch_valid(const kvp_kv_batch *batch, int form)
{
    int ev_form = form & 3;
    if ((ev_form != KVP_KV_FORM_ARRAY && ev_form != KVP_KV_FORM_MAP) ||
        (form & ~(3 | KVP_KV_BATCH_MAP)) != 0)
        return KVP_EINVAL;
    if ((!batch->events && batch->n_events) || batch->n_events > UINT32_MAX)
        return KVP_EINVAL;
    for (size_t i = 0; i < batch->n_events; i++)
        if (event_valid(&batch->events[i]) != KVP_OK)
            return KVP_EINVAL;
    return KVP_OK;
}

KVP_EXPORT int kvp_kv_encode(const kvp_kv_batch *batch, int form, void *buf, size_t cap,
                             size_t *n_out)
{
    if (!batch || !n_out || (!buf && cap))
        return KVP_EINVAL;
    int rc = kvp__kv_batch_valid(batch, form);
    if (rc != KVP_OK)
        return rc;
    kvp__mpw w = {buf, cap, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, kvp__mpw_write);
    kvp__kv_pack_batch(&pk, batch, form);
    *n_out = w.len;
    return w.len <= cap ? KVP_OK : KVP_ENOSPC;
}

KVP_EXPORT int kvp_kv_encode_alloc(const kvp_kv_batch *batch, int form, uint8_t **out,
                                   size_t *n_out)
{
    if (!out)
        return KVP_EINVAL;
    size_t need;
    int rc = kvp_kv_encode(batch, form, NULL, 0, &need);
    if (rc != KVP_OK && rc != KVP_ENOSPC)
        return rc;
    uint8_t *p = malloc(need ? need : 1);
    if (!p)
        return KVP_ENOMEM;
    size_t n;
    rc = kvp_kv_encode(batch, form, p, need, &n);
    assert(rc == KVP_OK && n == need);
    *out = p;
    *n_out = n;
    return KVP_OK;
}

KVP_EXPORT void kvp_kv_buf_free(uint8_t *buf)
{
    free(buf);
}
