/*
 * fuzz_kv_decode.c - libFuzzer harness: the vLLM KV-event decoder (kvp_kv_decode) and its
 * encoder on whatever the decoder accepts.
 *
 * The input is a msgpack payload, as the third frame of a ZeroMQ message would carry it.
 * Asserted for every input:
 *   1. kvp_kv_decode returns KVP_OK or KVP_EFORMAT (never another code, a crash, an abort,
 *      a leak or an allocation the input cannot justify: ASan aborts on a huge one), and
 *      *out is untouched on failure;
 *   2. the header walk (kvp__mp_walk) agrees with msgpack-c: when the walk accepts the whole
 *      input, msgpack_unpack_next parses it completely (the walk is never looser);
 *   3. an accepted batch is well formed: every array as long as its count says, every
 *      string NUL-terminated, extra_keys exactly one msgpack object, group_idx >= -1,
 *      block_size >= 1 for BlockStored;
 *   4. it encodes in each of the four forms, each encoding decodes to an equal batch, and
 *      encoding that batch again gives the same bytes (the canonical form is a fixed
 *      point).
 * Inputs over 256 KiB are skipped so that every run stays fast.
 */
#include <stdint.h>
#include <string.h>

#include <msgpack.h>

#include "events/codec.h"
#include "fuzz_util.h"
#include "kvprefix_events.h"

#define MAX_FUZZ_INPUT (256u << 10)

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool bytes_eq(const void *a, const void *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}

static bool event_eq(const kvp_kv_event *a, const kvp_kv_event *b)
{
    if (a->type != b->type || a->n_hashes != b->n_hashes ||
        !bytes_eq(a->hashes, b->hashes, a->n_hashes * sizeof(uint64_t)))
        return false;
    if (a->type == KVP_EVENT_CLEARED)
        return true;
    if (!str_eq(a->medium, b->medium) || a->group_idx != b->group_idx)
        return false;
    if (a->type == KVP_EVENT_REMOVED)
        return true;
    return a->has_parent == b->has_parent && (!a->has_parent || a->parent == b->parent) &&
           a->n_tokens == b->n_tokens &&
           bytes_eq(a->tokens, b->tokens, a->n_tokens * sizeof(uint32_t)) &&
           a->block_size == b->block_size && a->has_lora_id == b->has_lora_id &&
           (!a->has_lora_id || a->lora_id == b->lora_id) && str_eq(a->lora_name, b->lora_name) &&
           str_eq(a->spec_kind, b->spec_kind) && a->has_sliding_window == b->has_sliding_window &&
           (!a->has_sliding_window || a->sliding_window == b->sliding_window) &&
           (a->extra_keys == NULL) == (b->extra_keys == NULL) &&
           a->extra_keys_bytes == b->extra_keys_bytes &&
           bytes_eq(a->extra_keys, b->extra_keys, a->extra_keys_bytes);
}

static bool batch_eq(const kvp_kv_batch *a, const kvp_kv_batch *b)
{
    if (memcmp(&a->ts, &b->ts, sizeof a->ts) != 0 && !(a->ts != a->ts && b->ts != b->ts))
        return false;
    if (a->n_events != b->n_events || a->has_dp_rank != b->has_dp_rank ||
        (a->has_dp_rank && a->dp_rank != b->dp_rank))
        return false;
    for (size_t i = 0; i < a->n_events; i++)
        if (!event_eq(&a->events[i], &b->events[i]))
            return false;
    return true;
}

/* Property 3: the batch's own consistency (reading every byte, so ASan sees each array). */
static void check_shape(const kvp_kv_batch *b)
{
    FZ_ASSERT(b->n_events == 0 || b->events, "events NULL with %zu events", b->n_events);
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        FZ_ASSERT(e->type >= KVP_EVENT_STORED && e->type <= KVP_EVENT_CLEARED, "type %d", e->type);
        FZ_ASSERT(e->group_idx >= -1, "group_idx %d", (int)e->group_idx);
        volatile uint64_t sink = 0;
        for (size_t k = 0; k < e->n_hashes; k++)
            sink += e->hashes[k];
        for (size_t k = 0; k < e->n_tokens; k++)
            sink += e->tokens[k];
        const char *strs[3] = {e->medium, e->lora_name, e->spec_kind};
        for (int k = 0; k < 3; k++)
            if (strs[k])
                sink += strlen(strs[k]);
        (void)sink;
        if (e->type == KVP_EVENT_STORED)
            FZ_ASSERT(e->block_size >= 1, "block_size 0 accepted");
        if (e->extra_keys) {
            size_t used = 0;
            FZ_ASSERT(kvp__mp_walk(e->extra_keys, e->extra_keys_bytes, &used) == KVP_OK &&
                          used == e->extra_keys_bytes,
                      "extra_keys of event %zu are not one msgpack object", i);
        }
    }
}

/* Property 4 for one form. */
static void check_round_trip(const kvp_kv_batch *b, int form)
{
    uint8_t *enc = NULL;
    size_t n = 0;
    int rc = kvp_kv_encode_alloc(b, form, &enc, &n);
    FZ_ASSERT(rc == KVP_OK, "form %d: a decoded batch does not encode: %s", form, kvp_strerror(rc));
    kvp_kv_batch *d = NULL;
    rc = kvp_kv_decode(enc, n, &d);
    FZ_ASSERT(rc == KVP_OK, "form %d: an encoding does not decode: %s", form, kvp_strerror(rc));
    FZ_ASSERT(batch_eq(b, d), "form %d: the round trip changed the batch", form);
    uint8_t *again = NULL;
    size_t n2 = 0;
    FZ_ASSERT(kvp_kv_encode_alloc(d, form, &again, &n2) == KVP_OK, "re-encode");
    FZ_ASSERT(n2 == n && memcmp(again, enc, n) == 0, "form %d: encoding is not a fixed point",
              form);
    kvp_kv_buf_free(again);
    kvp_kv_buf_free(enc);
    kvp_kv_batch_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_kv_decode";
    if (size > MAX_FUZZ_INPUT)
        return 0;
    /* Property 2: the walk is never looser than msgpack-c. */
    size_t used = 0;
    if (kvp__mp_walk(data, size, &used) == KVP_OK && used == size) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        msgpack_unpack_return ur = msgpack_unpack_next(&up, (const char *)data, size, &off);
        FZ_ASSERT(ur == MSGPACK_UNPACK_SUCCESS && off == size,
                  "the walk accepted what msgpack-c refuses (%d, %zu of %zu bytes)", (int)ur, off,
                  size);
        msgpack_unpacked_destroy(&up);
    }
    /* Property 1. */
    kvp_kv_batch *sentinel = (kvp_kv_batch *)&used, *b = sentinel;
    int rc = kvp_kv_decode(size ? data : NULL, size, &b);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_EFORMAT, "kvp_kv_decode returned %d (%s)", rc,
              kvp_strerror(rc));
    if (rc != KVP_OK) {
        FZ_ASSERT(b == sentinel, "*out written on failure");
        return 0;
    }
    /* Properties 3 and 4. */
    check_shape(b);
    static const int forms[4] = {KVP_KV_FORM_ARRAY, KVP_KV_FORM_MAP,
                                 KVP_KV_FORM_ARRAY | KVP_KV_BATCH_MAP,
                                 KVP_KV_FORM_MAP | KVP_KV_BATCH_MAP};
    for (int f = 0; f < 4; f++)
        check_round_trip(b, forms[f]);
    kvp_kv_batch_free(b);
    return 0;
}
