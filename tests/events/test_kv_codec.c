/*
 * test_kv_codec.c - the vLLM KV-event codec (kvp_kv_encode, kvp_kv_decode).
 *
 * Byte-exact against the two examples of docs/kv-events.md (vLLM's wire format: one
 * BlockStored of 4 tokens, 188 bytes with map events, 48 with array events), in both
 * directions; random batches round-trip through every form and re-encode to the same
 * bytes; hashes as signed ints and bin digests normalise; unknown fields and trailing
 * elements are ignored and trailing optional fields may be omitted; every kind of malformed
 * input (each truncation of the examples, wrong types, ranges, duplicates, depth, 0xc1,
 * containers claiming 2^32 elements in a few bytes) is KVP_EFORMAT with nothing returned
 * and no large allocation; the encoder's ENOSPC/EINVAL contract.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <criterion/criterion.h>
#include <msgpack.h>

#include "events/codec.h"
#include "kvprefix_events.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Bytes from a spec of hex pairs and 'literal text' (copied as is), spaces ignored. Returns
 * the length; fails the test if out (cap bytes) is too small. */
static size_t spec_bytes(const char *spec, uint8_t *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = spec; *p;) {
        if (*p == ' ') {
            p++;
        } else if (*p == '\'') {
            const char *end = strchr(p + 1, '\'');
            cr_assert_not_null(end, "unterminated literal in spec");
            size_t k = (size_t)(end - p - 1);
            cr_assert_leq(n + k, cap);
            memcpy(out + n, p + 1, k);
            n += k;
            p = end + 1;
        } else {
            unsigned v;
            cr_assert_eq(sscanf(p, "%2x", &v), 1, "bad hex in spec at '%s'", p);
            cr_assert_lt(n, cap);
            out[n++] = (uint8_t)v;
            p += 2;
        }
    }
    return n;
}

/* The examples' ts: float64 bits 41 da a8 db e0 35 9f e7. */
static double example_ts(void)
{
    uint64_t bits = UINT64_C(0x41daa8dbe0359fe7);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static const char example_map_spec[] = "93 cb 41 da a8 db e0 35 9f e7 91 8b"
                                       " a4 'type' ab 'BlockStored'"
                                       " ac 'block_hashes' 91 cf da b8 9b aa 7b 58 57 c0"
                                       " b1 'parent_block_hash' c0"
                                       " a9 'token_ids' 94 01 02 03 04"
                                       " aa 'block_size' 04"
                                       " a7 'lora_id' c0"
                                       " a6 'medium' a3 'GPU'"
                                       " a9 'lora_name' c0"
                                       " aa 'extra_keys' 91 c0"
                                       " a9 'group_idx' 00"
                                       " b2 'kv_cache_spec_kind' ae 'full_attention'"
                                       " 00";

static const char example_array_spec[] = "93 cb 41 da a8 db e0 35 9f e7 91 98 ab 'BlockStored'"
                                         " 91 cf da b8 9b aa 7b 58 57 c0 c0 94 01 02 03 04 04"
                                         " c0 a3 'GPU' c0 00";

static const uint64_t example_hash = UINT64_C(0xdab89baa7b5857c0);
static const uint32_t example_tokens[4] = {1, 2, 3, 4};
static const uint8_t extra_one_nil[2] = {0x91, 0xc0};

/* The example event: with_optionals adds extra_keys [nil], group_idx 0 and
 * kv_cache_spec_kind "full_attention" (the map example's fields). */
static kvp_kv_event example_event(bool with_optionals)
{
    kvp_kv_event ev = {0};
    ev.type = KVP_EVENT_STORED;
    ev.hashes = &example_hash;
    ev.n_hashes = 1;
    ev.tokens = example_tokens;
    ev.n_tokens = 4;
    ev.block_size = 4;
    ev.medium = "GPU";
    ev.group_idx = -1;
    if (with_optionals) {
        ev.extra_keys = extra_one_nil;
        ev.extra_keys_bytes = sizeof extra_one_nil;
        ev.group_idx = 0;
        ev.spec_kind = "full_attention";
    }
    return ev;
}

static kvp_kv_batch one_event_batch(const kvp_kv_event *ev)
{
    kvp_kv_batch b = {0};
    b.ts = example_ts();
    b.events = ev;
    b.n_events = 1;
    b.has_dp_rank = true;
    b.dp_rank = 0;
    return b;
}

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Fail unless two events carry the same fields. */
static void assert_event_eq(const kvp_kv_event *a, const kvp_kv_event *b, size_t i)
{
    cr_assert_eq(a->type, b->type, "event %zu: type", i);
    cr_assert_eq(a->n_hashes, b->n_hashes, "event %zu: n_hashes", i);
    if (a->n_hashes)
        cr_assert_arr_eq(a->hashes, b->hashes, a->n_hashes * sizeof(uint64_t), "event %zu", i);
    if (a->type == KVP_EVENT_STORED) {
        cr_assert_eq(a->has_parent, b->has_parent, "event %zu: has_parent", i);
        if (a->has_parent)
            cr_assert_eq(a->parent, b->parent, "event %zu: parent", i);
        cr_assert_eq(a->n_tokens, b->n_tokens, "event %zu: n_tokens", i);
        if (a->n_tokens)
            cr_assert_arr_eq(a->tokens, b->tokens, a->n_tokens * sizeof(uint32_t));
        cr_assert_eq(a->block_size, b->block_size, "event %zu: block_size", i);
        cr_assert_eq(a->has_lora_id, b->has_lora_id, "event %zu: has_lora_id", i);
        if (a->has_lora_id)
            cr_assert_eq(a->lora_id, b->lora_id);
        cr_assert(str_eq(a->lora_name, b->lora_name), "event %zu: lora_name", i);
        cr_assert(str_eq(a->spec_kind, b->spec_kind), "event %zu: spec_kind", i);
        cr_assert_eq(a->extra_keys_bytes, b->extra_keys_bytes, "event %zu: extra_keys", i);
        cr_assert_eq(a->extra_keys == NULL, b->extra_keys == NULL, "event %zu: extra_keys", i);
        if (a->extra_keys_bytes)
            cr_assert_arr_eq(a->extra_keys, b->extra_keys, a->extra_keys_bytes);
        cr_assert_eq(a->has_sliding_window, b->has_sliding_window, "event %zu", i);
        if (a->has_sliding_window)
            cr_assert_eq(a->sliding_window, b->sliding_window);
    }
    if (a->type != KVP_EVENT_CLEARED) {
        cr_assert(str_eq(a->medium, b->medium), "event %zu: medium", i);
        cr_assert_eq(a->group_idx, b->group_idx, "event %zu: group_idx", i);
    }
}

static void assert_batch_eq(const kvp_kv_batch *a, const kvp_kv_batch *b)
{
    cr_assert_eq(memcmp(&a->ts, &b->ts, sizeof a->ts), 0, "ts %.17g != %.17g", a->ts, b->ts);
    cr_assert_eq(a->has_dp_rank, b->has_dp_rank);
    if (a->has_dp_rank)
        cr_assert_eq(a->dp_rank, b->dp_rank);
    cr_assert_eq(a->n_events, b->n_events);
    for (size_t i = 0; i < a->n_events; i++)
        assert_event_eq(&a->events[i], &b->events[i], i);
}

/* Decode expecting KVP_EFORMAT; *out must stay untouched. */
static void assert_bad(const void *p, size_t n, const char *what)
{
    kvp_kv_batch *sentinel = (kvp_kv_batch *)&sentinel, *out = sentinel;
    int rc = kvp_kv_decode(p, n, &out);
    cr_assert_eq(rc, KVP_EFORMAT, "%s: got %d (%s)", what, rc, kvp_strerror(rc));
    cr_assert_eq(out, sentinel, "%s: *out written on failure", what);
}

static kvp_kv_batch *decode_ok(const void *p, size_t n, const char *what)
{
    kvp_kv_batch *out = NULL;
    int rc = kvp_kv_decode(p, n, &out);
    cr_assert_eq(rc, KVP_OK, "%s: decode returned %d (%s)", what, rc, kvp_strerror(rc));
    cr_assert_not_null(out);
    return out;
}

/* A packer over a growable msgpack_sbuffer for hand-made inputs. */
typedef struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mp;

static void mp_init(mp *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mp_str(mp *m, const char *s)
{
    msgpack_pack_str_with_body(&m->pk, s, strlen(s));
}

/* ---------------------------------------------------------------------------------------- */
/* The examples                                                                             */
/* ---------------------------------------------------------------------------------------- */

Test(kv_codec, example_map_form_is_188_bytes)
{
    uint8_t want[256], got[256];
    size_t n_want = spec_bytes(example_map_spec, want, sizeof want);
    cr_assert_eq(n_want, 188, "the spec itself has %zu bytes", n_want);
    cr_assert_eq(example_ts(), 1789095808.8378847, "the example's ts literal");
    kvp_kv_event ev = example_event(true);
    kvp_kv_batch b = one_event_batch(&ev);
    size_t n = 0;
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_MAP, got, sizeof got, &n), KVP_OK);
    cr_assert_eq(n, 188);
    cr_assert_arr_eq(got, want, 188, "map-form bytes differ from the example");
}

Test(kv_codec, example_array_form_is_48_bytes)
{
    uint8_t want[64], got[64];
    size_t n_want = spec_bytes(example_array_spec, want, sizeof want);
    cr_assert_eq(n_want, 48);
    kvp_kv_event ev = example_event(false);
    kvp_kv_batch b = one_event_batch(&ev);
    size_t n = 0;
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_ARRAY, got, sizeof got, &n), KVP_OK);
    cr_assert_eq(n, 48);
    cr_assert_arr_eq(got, want, 48, "array-form bytes differ from the example");
}

Test(kv_codec, examples_decode_to_their_fields)
{
    uint8_t bytes[256];
    size_t n = spec_bytes(example_map_spec, bytes, sizeof bytes);
    kvp_kv_batch *b = decode_ok(bytes, n, "map example");
    kvp_kv_event ev = example_event(true);
    kvp_kv_batch want = one_event_batch(&ev);
    assert_batch_eq(b, &want);
    cr_assert_eq(b->events[0].hashes[0], example_hash);
    cr_assert_str_eq(b->events[0].medium, "GPU");
    cr_assert_eq(b->events[0].group_idx, 0);
    kvp_kv_batch_free(b);

    n = spec_bytes(example_array_spec, bytes, sizeof bytes);
    b = decode_ok(bytes, n, "array example");
    kvp_kv_event ev2 = example_event(false);
    want = one_event_batch(&ev2);
    assert_batch_eq(b, &want);
    cr_assert_eq(b->events[0].group_idx, -1);
    cr_assert_null(b->events[0].extra_keys);
    kvp_kv_batch_free(b);
}

/* Every proper prefix of each example, and each example with one byte more, is refused. */
Test(kv_codec, truncations_and_trailing_bytes_are_refused)
{
    const char *specs[2] = {example_map_spec, example_array_spec};
    for (int s = 0; s < 2; s++) {
        uint8_t bytes[257];
        size_t n = spec_bytes(specs[s], bytes, 256);
        for (size_t k = 0; k < n; k++) {
            uint8_t *copy = malloc(k ? k : 1);
            memcpy(copy, bytes, k);
            assert_bad(k ? copy : NULL, k, "a truncated example");
            free(copy);
        }
        bytes[n] = 0xc0;
        assert_bad(bytes, n + 1, "an example with a trailing nil");
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Round trips                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Storage for a random batch. */
typedef struct rbatch {
    kvp_kv_batch b;
    kvp_kv_event ev[8];
    uint64_t hashes[8][6];
    uint32_t tokens[8][24];
    uint8_t extra[8][16];
} rbatch;

static const char *pick(uint64_t *st, const char *const *names, size_t n)
{
    uint64_t r = th_rand(st) % (n + 1);
    return r == n ? NULL : names[r];
}

static void random_stored(uint64_t *st, rbatch *r, size_t i)
{
    static const char *const media[] = {"GPU", "CPU", "disk", ""};
    static const char *const loras[] = {"my-lora", "sql-adapter"};
    kvp_kv_event *ev = &r->ev[i];
    ev->block_size = 1 + (uint32_t)(th_rand(st) % 4);
    ev->n_tokens = ev->n_hashes * ev->block_size;
    ev->tokens = r->tokens[i];
    for (size_t t = 0; t < ev->n_tokens; t++)
        r->tokens[i][t] = (uint32_t)(th_rand(st) >> (th_rand(st) % 64 > 32 ? 0 : 40));
    ev->has_parent = th_rand(st) % 2;
    ev->parent = th_rand(st);
    ev->has_lora_id = th_rand(st) % 3 == 0;
    ev->lora_id = (int64_t)(th_rand(st) % 5) - 2;
    ev->medium = pick(st, media, 4);
    ev->lora_name = pick(st, loras, 2);
    if (th_rand(st) % 2) { /* [nil, ["my-lora", 7]] */
        static const uint8_t ek[] = {0x92, 0xc0, 0x92, 0xa7, 'm', 'y', '-', 'l', 'o', 'r', 'a', 7};
        memcpy(r->extra[i], ek, sizeof ek);
        ev->extra_keys = r->extra[i];
        ev->extra_keys_bytes = sizeof ek;
    }
    ev->group_idx = th_rand(st) % 2 ? -1 : (int32_t)(th_rand(st) % 3);
    ev->spec_kind = th_rand(st) % 2 ? NULL : "sliding_window";
    ev->has_sliding_window = th_rand(st) % 3 == 0;
    ev->sliding_window = (int64_t)(th_rand(st) % 5000);
}

static void random_batch(uint64_t *st, rbatch *r)
{
    memset(r, 0, sizeof *r);
    r->b.ts = (double)(th_rand(st) % 4000000000u) / 3.0;
    r->b.has_dp_rank = th_rand(st) % 2;
    r->b.dp_rank = (int64_t)(th_rand(st) % 8);
    r->b.n_events = th_rand(st) % 9;
    r->b.events = r->ev;
    for (size_t i = 0; i < r->b.n_events; i++) {
        kvp_kv_event *ev = &r->ev[i];
        ev->type = 1 + (int)(th_rand(st) % 3);
        ev->group_idx = -1;
        if (ev->type == KVP_EVENT_CLEARED)
            continue;
        ev->n_hashes = th_rand(st) % 7;
        for (size_t h = 0; h < ev->n_hashes; h++)
            r->hashes[i][h] = th_rand(st) >> (th_rand(st) % 64);
        ev->hashes = r->hashes[i];
        if (ev->type == KVP_EVENT_STORED) {
            random_stored(st, r, i);
        } else {
            ev->medium = th_rand(st) % 2 ? "CPU" : NULL;
            ev->group_idx = th_rand(st) % 2 ? -1 : 1;
        }
    }
}

Test(kv_codec, random_batches_round_trip_in_every_form)
{
    static const int forms[4] = {KVP_KV_FORM_ARRAY, KVP_KV_FORM_MAP,
                                 KVP_KV_FORM_ARRAY | KVP_KV_BATCH_MAP,
                                 KVP_KV_FORM_MAP | KVP_KV_BATCH_MAP};
    uint64_t st = 14;
    static rbatch r;
    for (int iter = 0; iter < 2000; iter++) {
        random_batch(&st, &r);
        int form = forms[iter % 4];
        uint8_t *buf = NULL;
        size_t n = 0;
        cr_assert_eq(kvp_kv_encode_alloc(&r.b, form, &buf, &n), KVP_OK);
        kvp_kv_batch *d = decode_ok(buf, n, "a random batch");
        assert_batch_eq(&r.b, d);
        uint8_t *again = NULL;
        size_t n2 = 0;
        cr_assert_eq(kvp_kv_encode_alloc(d, form, &again, &n2), KVP_OK);
        cr_assert_eq(n2, n, "iteration %d: re-encoded length", iter);
        cr_assert_arr_eq(again, buf, n, "iteration %d: re-encoded bytes differ", iter);
        kvp_kv_buf_free(again);
        kvp_kv_buf_free(buf);
        kvp_kv_batch_free(d);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Tolerance                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Hashes as a negative int, a 32-byte digest, a 16-byte digest, a 3-byte bin. */
Test(kv_codec, signed_ints_and_bin_digests_normalise)
{
    uint8_t digest[32];
    for (int i = 0; i < 32; i++)
        digest[i] = (uint8_t)(0xa0 + i);
    mp m;
    mp_init(&m);
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_double(&m.pk, 1.5);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 5);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 4);
    msgpack_pack_int64(&m.pk, -2);
    msgpack_pack_bin_with_body(&m.pk, digest, 32);
    msgpack_pack_bin_with_body(&m.pk, digest, 16);
    msgpack_pack_bin_with_body(&m.pk, digest, 3);
    msgpack_pack_bin_with_body(&m.pk, digest + 24, 8); /* parent */
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_int(&m.pk, 16);
    msgpack_pack_nil(&m.pk);
    kvp_kv_batch *b = decode_ok(m.sb.data, m.sb.size, "signed and bin hashes");
    const kvp_kv_event *ev = &b->events[0];
    cr_assert_eq(ev->n_hashes, 4);
    cr_assert_eq(ev->hashes[0], UINT64_MAX - 1);
    cr_assert_eq(ev->hashes[1], UINT64_C(0xb8b9babbbcbdbebf));
    cr_assert_eq(ev->hashes[2], UINT64_C(0xa8a9aaabacadaeaf));
    cr_assert_eq(ev->hashes[3], UINT64_C(0xa0a1a2));
    cr_assert(ev->has_parent);
    cr_assert_eq(ev->parent, UINT64_C(0xb8b9babbbcbdbebf));
    cr_assert_eq(ev->n_tokens, 0);
    cr_assert_eq(ev->block_size, 16);
    cr_assert_null(ev->medium, "omitted medium reads as nil");
    cr_assert_null(ev->lora_name);
    cr_assert_not(ev->has_lora_id);
    cr_assert_eq(ev->group_idx, -1);
    cr_assert_not(b->has_dp_rank);
    kvp_kv_batch_free(b);
    msgpack_sbuffer_destroy(&m.sb);
}

/* A map batch with unknown keys, a map event with a "locality" field and an unknown nested
 * value, an array event with elements past the last known field, a BlockRemoved cut after
 * block_hashes, a 4-element batch array. */
Test(kv_codec, unknown_fields_and_omitted_trailing_fields)
{
    mp m;
    mp_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mp_str(&m, "producer");
    mp_str(&m, "sglang");
    mp_str(&m, "events");
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_map(&m.pk, 6);
    mp_str(&m, "locality");
    msgpack_pack_map(&m.pk, 1);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_array(&m.pk, 0);
    mp_str(&m, "block_size");
    msgpack_pack_int(&m.pk, 2);
    mp_str(&m, "token_ids");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 7);
    msgpack_pack_int(&m.pk, 8);
    mp_str(&m, "block_hashes");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 99);
    mp_str(&m, "type");
    mp_str(&m, "BlockStored");
    msgpack_pack_int(&m.pk, 5); /* a non-string key */
    msgpack_pack_true(&m.pk);
    msgpack_pack_array(&m.pk, 14);
    mp_str(&m, "BlockStored");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 100);
    msgpack_pack_uint64(&m.pk, 99);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 9);
    msgpack_pack_int(&m.pk, 10);
    msgpack_pack_int(&m.pk, 2);
    msgpack_pack_int(&m.pk, 3);
    mp_str(&m, "CPU");
    mp_str(&m, "a");
    msgpack_pack_nil(&m.pk);
    msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "full_attention");
    msgpack_pack_int(&m.pk, 128);
    mp_str(&m, "future field");
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_array(&m.pk, 2);
    mp_str(&m, "BlockRemoved");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_uint64(&m.pk, 100);
    mp_str(&m, "ts");
    msgpack_pack_int(&m.pk, 12);
    mp_str(&m, "data_parallel_rank");
    msgpack_pack_int(&m.pk, 3);
    kvp_kv_batch *b = decode_ok(m.sb.data, m.sb.size, "unknown fields");
    cr_assert_eq(b->ts, 12.0);
    cr_assert(b->has_dp_rank);
    cr_assert_eq(b->dp_rank, 3);
    cr_assert_eq(b->n_events, 3);
    const kvp_kv_event *e = b->events;
    cr_assert_eq(e[0].type, KVP_EVENT_STORED);
    cr_assert_eq(e[0].hashes[0], 99);
    cr_assert_not(e[0].has_parent);
    cr_assert_eq(e[0].n_tokens, 2);
    cr_assert_eq(e[0].tokens[1], 8);
    cr_assert_eq(e[1].parent, 99);
    cr_assert(e[1].has_lora_id);
    cr_assert_eq(e[1].lora_id, 3);
    cr_assert_str_eq(e[1].medium, "CPU");
    cr_assert_str_eq(e[1].lora_name, "a");
    cr_assert_null(e[1].extra_keys);
    cr_assert_eq(e[1].group_idx, 1);
    cr_assert_str_eq(e[1].spec_kind, "full_attention");
    cr_assert(e[1].has_sliding_window);
    cr_assert_eq(e[1].sliding_window, 128);
    cr_assert_eq(e[2].type, KVP_EVENT_REMOVED);
    cr_assert_null(e[2].medium);
    kvp_kv_batch_free(b);
    msgpack_sbuffer_destroy(&m.sb);

    static const uint8_t four[] = {0x94, 0x01, 0x91, 0x91, 0xb0, 'A',  'l',  'l',
                                   'B',  'l',  'o',  'c',  'k',  's',  'C',  'l',
                                   'e',  'a',  'r',  'e',  'd',  0xc0, 0xa1, 'x'};
    b = decode_ok(four, sizeof four, "a 4-element batch");
    cr_assert_eq(b->n_events, 1);
    cr_assert_eq(b->events[0].type, KVP_EVENT_CLEARED);
    cr_assert_not(b->has_dp_rank);
    kvp_kv_batch_free(b);
}

/* ---------------------------------------------------------------------------------------- */
/* Malformed input                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* A batch around one array-form BlockStored whose fields are given as a spec (after the
 * array header and tag): [1.0 as int, [["BlockStored", <fields>]], nil]. */
static void assert_bad_stored(const char *hdr, const char *fields, const char *what)
{
    char spec[512];
    snprintf(spec, sizeof spec, "93 01 91 %s ab 'BlockStored' %s c0", hdr, fields);
    uint8_t bytes[256];
    size_t n = spec_bytes(spec, bytes, sizeof bytes);
    assert_bad(bytes, n, what);
}

Test(kv_codec, wrong_types_and_ranges_are_refused)
{
    /* The valid baseline: hashes [1], parent nil, tokens [5], block_size 1. */
    char ok_spec[] = "93 01 91 95 ab 'BlockStored' 91 01 c0 91 05 01 c0";
    uint8_t bytes[64];
    size_t n = spec_bytes(ok_spec, bytes, sizeof bytes);
    kvp_kv_batch_free(decode_ok(bytes, n, "baseline"));

    assert_bad_stored("95", "01 c0 91 05 01", "block_hashes not a list");
    assert_bad_stored("95", "91 c3 c0 91 05 01", "a boolean hash");
    assert_bad_stored("95", "91 a1 'x' c0 91 05 01", "a string hash");
    assert_bad_stored("95", "91 c4 00 c0 91 05 01", "an empty bin hash");
    assert_bad_stored("95", "91 01 a1 'x' 91 05 01", "a string parent");
    assert_bad_stored("95", "91 01 c0 91 ff 01", "a negative token");
    assert_bad_stored("95", "91 01 c0 91 cf 00 00 00 01 00 00 00 00 01", "a token above 2^32");
    assert_bad_stored("95", "91 01 c0 91 ca 3f 80 00 00 01", "a float token");
    assert_bad_stored("95", "91 01 c0 c0 01", "nil token_ids");
    assert_bad_stored("95", "91 01 c0 91 05 00", "block_size 0");
    assert_bad_stored("95", "91 01 c0 91 05 c0", "nil block_size");
    assert_bad_stored("95", "91 01 c0 91 05 cf 00 00 00 01 00 00 00 00", "block_size 2^32");
    assert_bad_stored("94", "91 01 c0 91 05", "block_size missing");
    assert_bad_stored("96", "91 01 c0 91 05 01 cf 80 00 00 00 00 00 00 00", "lora_id > INT64_MAX");
    assert_bad_stored("97", "91 01 c0 91 05 01 c0 05", "an int medium");
    assert_bad_stored("97", "91 01 c0 91 05 01 c0 a3 'G' 00 'U'", "a medium holding NUL");
    assert_bad_stored("98", "91 01 c0 91 05 01 c0 c0 c2", "a boolean lora_name");
    assert_bad_stored("99", "91 01 c0 91 05 01 c0 c0 c0 a1 'x'", "extra_keys a string");
    assert_bad_stored("99", "91 01 c0 91 05 01 c0 c0 c0 91 05", "an extra_keys entry an int");
    assert_bad_stored("9a", "91 01 c0 91 05 01 c0 c0 c0 c0 ff", "group_idx -1");
    assert_bad_stored("9a", "91 01 c0 91 05 01 c0 c0 c0 c0 ce 80 00 00 00", "group_idx 2^31");
    assert_bad_stored("9b", "91 01 c0 91 05 01 c0 c0 c0 c0 00 01", "an int spec kind");
    assert_bad_stored("9c", "91 01 c0 91 05 01 c0 c0 c0 c0 00 c0 a1 'x'", "a string window");

    static const char *const bad[] = {
        "",                                   /* nothing */
        "c0",                                 /* nil */
        "c1",                                 /* the never-used byte */
        "93 a1 'x' 90 c0",                    /* ts a string */
        "91 01",                              /* batch of 1 */
        "93 01 c0 c0",                        /* events nil */
        "93 01 91 c0 c0",                     /* an event nil */
        "93 01 91 90 c0",                     /* an event [] */
        "93 01 91 91 a5 'Block' c0",          /* an unknown tag */
        "93 01 91 91 01 c0",                  /* an int tag */
        "93 01 91 81 a4 'type' a4 'Nope' c0", /* an unknown map tag */
        "93 01 91 81 a1 'x' 01 c0",           /* a map event without type */
        "93 01 91 82 a4 'type' b0 'AllBlocksCleared' a4 'type' b0 'AllBlocksCleared' c0",
        "93 01 91 82 a4 'type' ac 'BlockRemoved' a6 'medium' c0 c0", /* no block_hashes */
        "93 01 91 83 a4 'type' ac 'BlockRemoved' ac 'block_hashes' 90"
        " ac 'block_hashes' 90 c0",            /* a field twice */
        "93 01 90 a1 'x'",                     /* dp rank a string */
        "93 01 90 cf 80 00 00 00 00 00 00 00", /* dp rank > INT64_MAX */
        "81 a2 'ts' 01",                       /* map batch without events */
        "82 a6 'events' 90 a6 'events' 90",    /* map batch, events twice */
        "dd ff ff ff ff",                      /* 2^32 - 1 elements, 0 given */
        "dd ff ff ff ff 01 02 03 04 05",       /* ... 5 given */
        "93 01 dd ff ff ff ff 01 02 c0",       /* events claiming 2^32 - 1 */
        "df ff ff ff ff 01 02",                /* a map claiming 2^32 - 1 pairs */
        "93 01 91 dc ff ff c0",                /* an event claiming 65535 */
        "93 01 90 c6 ff ff ff ff",             /* a bin claiming 4 GiB */
        "93 01 90 db 00 00 00 10 'abc'",       /* a str claiming 16 bytes */
        "93 01 90 c9 00 00 00 01",             /* an ext without its type byte */
        "93 01 90 d8 01 02",                   /* a fixext 16 cut short */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t b[128];
        size_t k = spec_bytes(bad[i], b, sizeof b);
        assert_bad(k ? b : NULL, k, bad[i]);
    }
}

/* KVP_KV_MAX_DEPTH nested containers are accepted by the walk, one more is refused. */
Test(kv_codec, nesting_depth_is_bounded)
{
    uint8_t b[64];
    size_t used = 0;
    for (size_t d = 1; d <= KVP_KV_MAX_DEPTH + 1; d++) {
        memset(b, 0x91, d);
        b[d] = 0xc0;
        int rc = kvp__mp_walk(b, d + 1, &used);
        cr_assert_eq(rc, d <= KVP_KV_MAX_DEPTH ? KVP_OK : KVP_EFORMAT, "depth %zu", d);
        if (rc == KVP_OK)
            cr_assert_eq(used, d + 1);
    }
    /* Deep extra_keys inside a real batch: refused as a whole. */
    char spec[256] = "93 01 91 99 ab 'BlockStored' 91 01 c0 91 05 01 c0 c0 c0 91";
    for (int i = 0; i < KVP_KV_MAX_DEPTH; i++)
        strcat(spec, " 91");
    strcat(spec, " c0 c0");
    size_t n = spec_bytes(spec, b, sizeof b);
    assert_bad(b, n, "extra_keys nested too deep");
}

/* Claims of 2^32 elements in a few bytes must fail fast without allocating: under a 1 GiB
 * address-space limit (not in sanitizer builds, whose shadow memory needs more), and under
 * ASan, which aborts on any allocation of that size. */
Test(kv_codec, huge_claims_do_not_allocate)
{
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
    struct rlimit lim = {UINT64_C(1) << 30, UINT64_C(1) << 30};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
#endif
    uint8_t b[64];
    for (int nest = 1; nest < 12; nest++) {
        size_t n = 0;
        for (int i = 0; i < nest; i++) {
            b[n++] = 0xdd;
            b[n++] = 0x02; /* 2^25 elements: 768 MiB of msgpack_object each */
            b[n++] = 0x00;
            b[n++] = 0x00;
            b[n++] = 0x00;
        }
        assert_bad(b, n, "nested claims");
    }
    static const uint8_t max_claim[] = {0x93, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90, 0xc0};
    assert_bad(max_claim, sizeof max_claim, "events claiming 2^32 - 1");
}

/* ---------------------------------------------------------------------------------------- */
/* The encoder's contract                                                                   */
/* ---------------------------------------------------------------------------------------- */

Test(kv_codec, encode_enospc_measures_and_einval_writes_nothing)
{
    kvp_kv_event ev = example_event(true);
    kvp_kv_batch b = one_event_batch(&ev);
    uint8_t buf[200];
    memset(buf, 0xee, sizeof buf);
    size_t n = 0;
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_MAP, buf, 100, &n), KVP_ENOSPC);
    cr_assert_eq(n, 188, "ENOSPC reports the size needed");
    cr_assert_eq(buf[100], 0xee, "nothing written past cap");
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_MAP, NULL, 0, &n), KVP_ENOSPC);
    cr_assert_eq(n, 188);

    memset(buf, 0xee, sizeof buf);
    n = 12345;
    kvp_kv_batch bad = b;
    cr_assert_eq(kvp_kv_encode(&bad, 3, buf, sizeof buf, &n), KVP_EINVAL, "form 3");
    cr_assert_eq(kvp_kv_encode(&bad, 0, buf, sizeof buf, &n), KVP_EINVAL, "form 0");
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP | 8, buf, sizeof buf, &n), KVP_EINVAL);
    cr_assert_eq(kvp_kv_encode(NULL, KVP_KV_FORM_MAP, buf, sizeof buf, &n), KVP_EINVAL);
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP, buf, sizeof buf, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP, NULL, 5, &n), KVP_EINVAL);
    kvp_kv_event e2 = ev;
    bad.events = &e2;
    e2.type = 7;
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP, buf, sizeof buf, &n), KVP_EINVAL);
    e2 = ev;
    e2.hashes = NULL;
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP, buf, sizeof buf, &n), KVP_EINVAL);
    e2 = ev;
    e2.tokens = NULL;
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_MAP, buf, sizeof buf, &n), KVP_EINVAL);
    e2 = ev;
    e2.extra_keys_bytes = 1; /* 0x91 alone: truncated */
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_ARRAY, buf, sizeof buf, &n), KVP_EINVAL);
    static const uint8_t two_objects[] = {0xc0, 0xc0};
    e2.extra_keys = two_objects;
    e2.extra_keys_bytes = 2;
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_ARRAY, buf, sizeof buf, &n), KVP_EINVAL);
    bad.events = NULL;
    cr_assert_eq(kvp_kv_encode(&bad, KVP_KV_FORM_ARRAY, buf, sizeof buf, &n), KVP_EINVAL);
    cr_assert_eq(n, 12345, "n_out untouched on EINVAL");
    cr_assert_eq(buf[0], 0xee, "buffer untouched on EINVAL");

    uint8_t *out = (uint8_t *)buf;
    cr_assert_eq(kvp_kv_encode_alloc(&bad, KVP_KV_FORM_ARRAY, &out, &n), KVP_EINVAL);
    cr_assert_eq(out, buf);
    cr_assert_eq(kvp_kv_encode_alloc(&b, KVP_KV_FORM_ARRAY, NULL, &n), KVP_EINVAL);
    kvp_kv_buf_free(NULL);
    kvp_kv_batch_free(NULL);
    kvp_kv_batch *none = NULL;
    cr_assert_eq(kvp_kv_decode(NULL, 3, &none), KVP_EINVAL);
    cr_assert_eq(kvp_kv_decode(buf, 3, NULL), KVP_EINVAL);
}

/* Removed and cleared events, and the batch map form, byte by byte. */
Test(kv_codec, removed_cleared_and_map_batch_bytes)
{
    uint64_t h[2] = {1, UINT64_C(0x8000000000000000)};
    kvp_kv_event ev[2] = {{0}, {0}};
    ev[0].type = KVP_EVENT_REMOVED;
    ev[0].hashes = h;
    ev[0].n_hashes = 2;
    ev[0].medium = "CPU";
    ev[0].group_idx = 2;
    ev[1].type = KVP_EVENT_CLEARED;
    ev[1].group_idx = -1;
    kvp_kv_batch b = {0};
    b.ts = 0.5;
    b.events = ev;
    b.n_events = 2;
    uint8_t want[128], got[128];
    size_t n;
    size_t nw = spec_bytes("93 cb 3f e0 00 00 00 00 00 00 92 94 ac 'BlockRemoved' 92 01 cf 80"
                           " 00 00 00 00 00 00 00 a3 'CPU' 02 91 b0 'AllBlocksCleared' c0",
                           want, sizeof want);
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_ARRAY, got, sizeof got, &n), KVP_OK);
    cr_assert_eq(n, nw);
    cr_assert_arr_eq(got, want, n);
    nw = spec_bytes("82 a2 'ts' cb 3f e0 00 00 00 00 00 00 a6 'events' 92 84 a4 'type'"
                    " ac 'BlockRemoved' ac 'block_hashes' 92 01 cf 80 00 00 00 00 00 00 00"
                    " a6 'medium' a3 'CPU' a9 'group_idx' 02 81 a4 'type' b0 'AllBlocksCleared'",
                    want, sizeof want);
    cr_assert_eq(kvp_kv_encode(&b, KVP_KV_FORM_MAP | KVP_KV_BATCH_MAP, got, sizeof got, &n),
                 KVP_OK);
    cr_assert_eq(n, nw);
    cr_assert_arr_eq(got, want, n);
}
