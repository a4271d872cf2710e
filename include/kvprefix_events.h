/*
 * kvprefix_events.h - the public API of libkvprefix-events, the component that speaks
 * vLLM's KV-event protocol and routes requests across a fleet of engines.
 *
 * It is a separate library (kvprefix-events.pc) beside libkvprefix: an engine that embeds
 * only the cache links nothing new. This component links libkvprefix, libzmq and msgpack-c.
 * docs/design.md draws the dependency arrows; docs/kv-events.md describes the wire format
 * (after ../shared/kv-events.md) and the publisher, docs/routing.md the router index and
 * its memory.
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
    size_t n_events;            /* number of entries at events */
    bool has_dp_rank;           /* data_parallel_rank present (not nil) */
    int64_t dp_rank;            /* the data-parallel rank when has_dp_rank */
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

/* A publisher turns a kvp_cache's events into vLLM KV-event batches on a ZeroMQ PUB socket,
 * one multipart message per batch: [topic, sequence number (8 bytes, big-endian, from 0),
 * msgpack payload]. With a replay endpoint it keeps the last buffer_steps batches and
 * answers [empty, start_seq (8 bytes)] on a ROUTER socket with [empty, seq, payload] for
 * each buffered batch from start_seq on, then [empty, ff x 8, empty]. Routers that speak
 * vLLM's protocol (llm-d, Dynamo, kvprefix's own) index the cache unchanged.
 *
 * Events. Attach the publisher to a cache's configuration (kvp_publisher_attach) before
 * kvp_cache_new. STORED events become BlockStored: block_hashes are the keys' event
 * integers (kvp_key.lo: with the vllm-* hash profiles exactly what vLLM publishes for the
 * same tokens), parent_block_hash is nil for a chain's first block, token_ids the blocks'
 * tokens (empty when the cache was given none: the _ids forms), block_size the cache's;
 * consecutive STORED events of one chain become one BlockStored, as vLLM sends them.
 * REMOVED become BlockRemoved (consecutive ones merged), CLEARED AllBlocksCleared. Every
 * event carries the configured medium, lora_name and group_idx: a publisher describes one
 * cache tier of one adapter (kvp_event carries no namespace).
 *
 * Threads. Every call may come from any thread; an internal mutex orders them. The event
 * callback runs under the cache's lock and takes the publisher's, so a publisher must not
 * call back into its cache (it never does). ZeroMQ sends never block (PUB drops at the
 * high-water mark, as vLLM's does). */
typedef struct kvp_publisher kvp_publisher;

/* Publisher parameters; fill with kvp_publisher_config_init, then set what you need. The
 * strings are copied by kvp_publisher_new. */
typedef struct kvp_publisher_config {
    const char
        *endpoint; /* PUB endpoint (default: tcp, every interface, port 5557); bound when it has
                      '*' or "::" or starts with ipc:// or inproc://, otherwise
                      connected (vLLM's rule) */
    const char *replay_endpoint; /* ROUTER endpoint, always bound; NULL (default): no replay */
    const char *topic;           /* first frame of every message (default ""; llm-d expects
                                    "kv@<pod>@<model>") */
    int form;                    /* KVP_KV_FORM_ARRAY (default) or KVP_KV_FORM_MAP, optionally
                                    | KVP_KV_BATCH_MAP (see kvp_kv_encode) */
    uint32_t batch_max_events;   /* publish automatically once this many cache events are
                                    pending; 0 (default): kvp_publisher_flush publishes, with
                                    an automatic flush at KVP_PUBLISHER_MAX_PENDING */
    uint32_t buffer_steps;       /* batches kept for replay (default 10000) */
    int hwm;                     /* PUB send high-water mark in messages (default 100000) */
    int64_t dp_rank;             /* data_parallel_rank of every batch (default 0); as vLLM,
                                    rank r > 0 adds r to a tcp endpoint's port (both
                                    endpoints) or appends "_dp<r>" to an inproc one */
    const char *medium;          /* every event's medium (default "GPU"; NULL: nil) */
    const char *lora_name;       /* every BlockStored's lora_name (default NULL: nil) */
    int32_t group_idx;           /* every event's group_idx; -1 (default): absent */
    int linger_ms;               /* ZMQ_LINGER of both sockets at kvp_publisher_free
                                    (default 0: unsent messages are dropped, as vLLM) */
    bool replay_thread;          /* serve replay requests from an internal thread (default
                                    false: the caller drives kvp_publisher_poll) */
    void *zmq_context;           /* ZeroMQ context to use (default NULL: the publisher makes
                                    and terminates its own); must outlive the publisher */
} kvp_publisher_config;

/* Largest number of cache events kept between two flushes: reaching it publishes. */
#define KVP_PUBLISHER_MAX_PENDING 65536u

/* Fill *cfg with the defaults above. Cannot fail (does nothing if cfg is NULL). */
KVP_EXPORT void kvp_publisher_config_init(kvp_publisher_config *cfg);

/* Create a publisher: copy the strings, open and bind/connect the sockets, start the
 * replay thread if asked. On KVP_OK *out is owned by the caller (kvp_publisher_free).
 * Returns KVP_EINVAL (NULL pointer or endpoint, bad form, hwm < 0, buffer_steps 0 with a
 * replay endpoint, a dp_rank offset that cannot be applied: negative rank, an ipc endpoint
 * or a port that is not a number), KVP_ENOMEM, KVP_EIO (ZeroMQ refused the endpoint or the
 * bind failed, e.g. the address is in use); *out untouched on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_publisher_new(const kvp_publisher_config *cfg,
                                               kvp_publisher **out);

/* Publish what is pending (kvp_publisher_flush), stop the replay thread, close the sockets
 * (waiting up to linger_ms for unsent messages) and free everything. Accepts NULL. The
 * caches it is attached to must not emit events any more (free them first). */
KVP_EXPORT void kvp_publisher_free(kvp_publisher *pub);

/* The kvp_event_fn to set as kvp_config.on_event with the publisher as event_ud: queues the
 * event (and publishes when batch_max_events are pending). Cannot fail; if memory runs out
 * the event is lost, counted in n_dropped, and the next batch skips one sequence number so
 * that subscribers see a gap no replay can fill (and resynchronise), while
 * kvp_publisher_flush reports KVP_ENOMEM once. */
KVP_EXPORT void kvp_publisher_on_event(void *pub, const kvp_event *ev);

/* Set cfg->on_event and cfg->event_ud so that the cache made from cfg publishes through
 * pub. Returns KVP_OK or KVP_EINVAL (NULL pointer). */
KVP_EXPORT int kvp_publisher_attach(kvp_publisher *pub, kvp_config *cfg);

/* Publish the pending events as one batch (nothing when none are pending): stamp it with
 * the current time, encode it, send it with the next sequence number and keep it for
 * replay. Returns KVP_OK; KVP_EINVAL (NULL); KVP_ENOMEM (the batch stays pending; or,
 * once, events were lost earlier: see kvp_publisher_on_event); KVP_EIO (ZeroMQ refused the
 * send: the batch still took its sequence number and is kept for replay). */
KVP_NODISCARD KVP_EXPORT int kvp_publisher_flush(kvp_publisher *pub);

/* Serve replay requests for up to timeout_ms milliseconds (0: only those already waiting;
 * -1: until one arrives): every request that arrives is answered before returning. Calls
 * from several threads take turns. Returns KVP_OK, KVP_EINVAL (NULL, no replay endpoint,
 * or replay_thread set: the thread serves them), KVP_EIO (zmq_poll failed). Malformed
 * requests (not [empty, 8 bytes]) are ignored and counted. */
KVP_NODISCARD KVP_EXPORT int kvp_publisher_poll(kvp_publisher *pub, int timeout_ms);

/* Copy the endpoint a socket actually uses (ZMQ_LAST_ENDPOINT: a wildcard port resolved)
 * to buf, NUL-terminated: which 0 is the PUB socket, 1 the replay socket. Returns KVP_OK,
 * KVP_EINVAL (NULL, bad which, no replay socket), KVP_ENOSPC (cap too small), KVP_EIO
 * (ZeroMQ refused the query). */
KVP_EXPORT int kvp_publisher_endpoint(kvp_publisher *pub, int which, char *buf, size_t cap);

/* Counters since creation. */
typedef struct kvp_publisher_stats {
    uint64_t next_seq;          /* sequence number the next batch gets */
    uint64_t n_batches;         /* batches published */
    uint64_t n_events;          /* wire events in them (after merging) */
    uint64_t n_cache_events;    /* cache events taken in */
    uint64_t n_bytes;           /* payload bytes published */
    uint64_t n_send_errors;     /* batches whose send failed (kept for replay) */
    uint64_t n_dropped;         /* cache events lost to memory exhaustion */
    uint64_t n_replay_requests; /* replay requests answered */
    uint64_t n_replay_batches;  /* batches re-sent to them */
    uint64_t n_bad_requests;    /* malformed replay requests ignored */
    uint32_t n_pending;         /* cache events waiting for the next batch */
    uint32_t n_buffered;        /* batches in the replay buffer */
} kvp_publisher_stats;

/* Copy the counters to *out. Returns KVP_OK or KVP_EINVAL (NULL pointer). */
KVP_EXPORT int kvp_publisher_stats_get(kvp_publisher *pub, kvp_publisher_stats *out);

/* ---------------------------------------------------------------------------------------- */
/* Router index                                                                             */
/* ---------------------------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* KVPREFIX_EVENTS_H */
