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
} kvp_kv_event;

/* One batch: what one ZeroMQ message's payload holds. */
typedef struct kvp_kv_batch {
    double ts;                  /* seconds since the epoch, as the publisher stamped it */
    const kvp_kv_event *events; /* n_events events, in order */
    size_t n_events;
    bool has_dp_rank; /* data_parallel_rank present (not nil) */
    int64_t dp_rank;  /* the data-parallel rank when has_dp_rank */
} kvp_kv_batch;

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
