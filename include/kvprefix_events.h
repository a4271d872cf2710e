/*
 * kvprefix_events.h - the public API of libkvprefix-events, the component that speaks
 * vLLM's KV-event protocol and routes requests across a fleet of engines.
 *
 * It is a separate library (kvprefix-events.pc) beside libkvprefix: an engine that embeds
 * only the cache links nothing new. This component links libkvprefix, libzmq and msgpack-c.
 * docs/design.md draws the dependency arrows; docs/routing.md describes the wire format
 * (after ../shared/kv-events.md), the router index and its memory.
 *
 * Sections: the decoded event model and codec (src/events/codec*.c); the publisher
 * (src/events/publisher*.c); the router index (src/events/router*.c).
 *
 * Conventions are libkvprefix's: int status codes (KVP_OK or a negative KVP_E* code from
 * kvprefix.h, described by kvp_strerror), out-parameters untouched on failure, opaque
 * handles, the owner of every pointer stated.
 */
#ifndef KVPREFIX_EVENTS_H
#define KVPREFIX_EVENTS_H

#include "kvprefix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Decoded event model and codec                                                            */
/* ---------------------------------------------------------------------------------------- */

/* The two msgpack encodings of an event (both levels: batch and event). */
enum {
    KVP_KV_FORM_ARRAY = 1, /* ["BlockStored", f1, f2, ...]: vLLM up to mid-2026 */
    KVP_KV_FORM_MAP = 2    /* {"type": "BlockStored", ...}: newer vLLM and SGLang */
};

/* One KV event as carried on the wire. type uses kvprefix.h's values: KVP_EVENT_STORED
 * (BlockStored), KVP_EVENT_REMOVED (BlockRemoved), KVP_EVENT_CLEARED (AllBlocksCleared).
 * Hashes are the event integers: a uint64, or the last 8 bytes (big-endian) of a raw
 * digest sent as bin. Pointers are owned by whoever built the event (the decoder's batch,
 * or the caller when encoding). */
typedef struct kvp_kv_event {
    int type;               /* KVP_EVENT_STORED, KVP_EVENT_REMOVED or KVP_EVENT_CLEARED */
    const uint64_t *hashes; /* STORED/REMOVED: block hashes, first to last; else NULL */
    size_t n_hashes;        /* number of entries at hashes */
    bool has_parent;        /* STORED: parent_block_hash present (false: nil, a root block) */
    uint64_t parent;        /* STORED: the parent's hash when has_parent */
    const uint32_t *tokens; /* STORED: the tokens of all stored blocks, concatenated */
    size_t n_tokens;        /* number of entries at tokens */
    uint32_t block_size;    /* STORED: tokens per block */
    const char *medium;     /* NUL-terminated tier name ("GPU", "CPU"...), NULL for nil */
    const char *lora_name;  /* STORED: NUL-terminated adapter name, NULL for nil */
    bool has_lora_id;       /* STORED: lora_id present (deprecated by vLLM) */
    int64_t lora_id;        /* STORED: the lora_id when has_lora_id */
    int32_t group_idx;      /* KV cache group index, -1 when absent */

    /* BlockStored's newer optional fields (absent: omitted or nil on the wire). */
    const uint8_t *extra_keys; /* the extra_keys list (one entry per block: nil or a list of
                                  items) as one msgpack object, NULL when absent; the
                                  decoder re-packs what it read with msgpack-c */
    size_t extra_keys_bytes;   /* bytes at extra_keys */
    const char *spec_kind;     /* kv_cache_spec_kind ("full_attention"...), NULL: absent */
    bool has_sliding_window;   /* kv_cache_spec_sliding_window present */
    int64_t sliding_window;    /* kv_cache_spec_sliding_window when present */
} kvp_kv_event;

/* One batch: what one ZeroMQ message's payload holds. */
typedef struct kvp_kv_batch {
    double ts;                  /* seconds since the epoch, as the publisher stamped it */
    const kvp_kv_event *events; /* n_events events, in order */
    size_t n_events;
    bool has_dp_rank; /* data_parallel_rank present (not nil) */
    int64_t dp_rank;  /* the data-parallel rank when has_dp_rank */
} kvp_kv_batch;

/* The encoder's form argument: KVP_KV_FORM_ARRAY or KVP_KV_FORM_MAP for the events, plus
 * optionally this flag to write the batch itself as a map {"ts", "events",
 * "data_parallel_rank"} instead of vLLM's [ts, events, data_parallel_rank]. */
#define KVP_KV_BATCH_MAP 4

/* Encode a batch as a vLLM KV-event msgpack payload, the third frame of a message.
 * form: KVP_KV_FORM_ARRAY (each event ["BlockStored", f1, ...]: the seven leading fields
 * always, the optional ones up to the last present one, nil for absent ones before it) or
 * KVP_KV_FORM_MAP ({"type": ..., ...}: the leading fields always, optional ones only when
 * present), optionally | KVP_KV_BATCH_MAP (the batch as a map, data_parallel_rank omitted
 * when absent; otherwise a 3-array with nil). BlockRemoved carries block_hashes, medium and
 * group_idx when present; AllBlocksCleared no field. Hashes are written as uint64 (the
 * smallest msgpack width: 0xcf from 2^63), ts as float64, every other int in the smallest
 * width, as msgspec does.
 *
 * Writes the payload to buf[0 .. cap) (buf may be NULL when cap is 0; caller-owned).
 * Returns KVP_OK with *n_out = its length; KVP_ENOSPC when it does not fit: *n_out = the
 * capacity needed and buf holds a prefix (call again with that size); KVP_EINVAL (NULL batch
 * or n_out, unknown form or event type, NULL arrays with a non-zero count, counts above
 * UINT32_MAX, extra_keys that are not exactly one complete msgpack object), with buf and
 * *n_out untouched. Allocates nothing. */
KVP_NODISCARD KVP_EXPORT int kvp_kv_encode(const kvp_kv_batch *batch, int form, void *buf,
                                           size_t cap, size_t *n_out);

/* kvp_kv_encode into a buffer the library allocates: on KVP_OK *out (owned by the caller,
 * freed with kvp_kv_buf_free) holds *n_out bytes. Returns as kvp_kv_encode, with KVP_ENOMEM
 * instead of KVP_ENOSPC; *out and *n_out untouched on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_kv_encode_alloc(const kvp_kv_batch *batch, int form, uint8_t **out,
                                                 size_t *n_out);

/* Free a buffer from kvp_kv_encode_alloc. Accepts NULL. */
KVP_EXPORT void kvp_kv_buf_free(uint8_t *buf);

/* Largest nesting depth of msgpack containers kvp_kv_decode accepts (a vLLM batch nests 6
 * deep with extra_keys items); deeper input is KVP_EFORMAT. */
#define KVP_KV_MAX_DEPTH 16

/* Decode one msgpack payload (the third frame of a message) into a batch. Accepts the batch
 * as [ts, events, data_parallel_rank?, ...] or as a map with "ts", "events" and optional
 * "data_parallel_rank"; each event in array form (leading fields may be cut after
 * block_size for BlockStored, after block_hashes for BlockRemoved: absent ones are nil) or
 * map form ("type" plus fields; BlockStored needs block_hashes, token_ids and block_size,
 * BlockRemoved block_hashes). Unknown map keys and extra trailing array elements are
 * ignored. Hashes may be ints (negative ones are taken as their two's-complement uint64)
 * or bin (the last 8 bytes big-endian; shorter ones as a big-endian number, empty ones are
 * refused). ts may be a float or an int; nil fields read as absent.
 *
 * Refused as KVP_EFORMAT, with nothing returned: anything but exactly one complete msgpack
 * object of len bytes; nesting deeper than KVP_KV_MAX_DEPTH; an unknown event type; a
 * missing required field or a key given twice; a field of the wrong type or out of range
 * (token ids and block_size must fit uint32, block_size >= 1, group_idx 0 .. INT32_MAX,
 * lora_id an int64); strings with a NUL byte; extra_keys other than nil or a list of nil or
 * lists. The decoder does not check that token_ids holds block_size tokens per hash: that
 * is the consumer's business (vLLM sends exactly that).
 *
 * Memory is bounded by the input: every container's claimed size is checked against the
 * bytes left before msgpack-c allocates for it (msgpack-c allocates a container's claimed
 * elements up front), so the decoder never holds more than about 33 bytes per input byte
 * (plus 8 KiB).
 * On KVP_OK *out is a batch owned by the caller, freed with kvp_kv_batch_free; every pointer
 * in it points into the same allocation and lives as long. Returns KVP_OK, KVP_EINVAL (NULL
 * out, NULL payload with len != 0), KVP_EFORMAT, KVP_ENOMEM; *out untouched on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_kv_decode(const void *payload, size_t len, kvp_kv_batch **out);

/* Free a batch from kvp_kv_decode. Accepts NULL. */
KVP_EXPORT void kvp_kv_batch_free(kvp_kv_batch *batch);

/* ---------------------------------------------------------------------------------------- */
/* Publisher                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------- */
/* Router index                                                                             */
/* ---------------------------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* KVPREFIX_EVENTS_H */
