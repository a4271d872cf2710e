/*
 * kvprefix_events.h - the public API of libkvprefix-events, the component that speaks
 * vLLM's KV-event protocol and routes requests across a fleet of engines.
 *
 * It is a separate library (kvprefix-events.pc) beside libkvprefix: an engine that embeds
 * only the cache links nothing new. This component links libkvprefix, libzmq and msgpack-c.
 * docs/design.md draws the dependency arrows; docs/kv-events.md describes the wire format
 * (vLLM's, with the vLLM sources it was read from) and the publisher, docs/routing.md the
 * router index and its memory.
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
    const char *tier_medium[KVP_MAX_TIERS - 1]; /* the medium of the cache's lower tiers 1,
                                    2, 3 (kvp_cache_add_tier, kvp_event.tier), e.g. "CPU",
                                    copied; their events are published under it, and a tier
                                    left NULL (the default) is not published at all */
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

/* kvp_router indexes which worker holds which block, fed by the workers' event batches,
 * and scores a prompt against every worker: the longest run of consecutive blocks from
 * block 0 that the worker holds, and the same run weighted by storage tier. A worker is one
 * engine's data-parallel rank, named by (engine id, dp rank). Two index modes
 * (kvp_router_config.index_by): by engine hash (the default), where the router computes
 * each worker's block keys itself with the worker's hash profile (kvp_hasher), so keys must
 * equal the engine's: same profile, key, seeds, block size (a STORED event whose
 * block_size differs is refused; kvp_router_check_keys detects the rest), and blocks are
 * indexed by the event integer (kvp_chain.key.lo, vLLM's 64-bit block hash); or by tokens,
 * where the router keys each stored block by its own chained hash of the event's token_ids
 * (KVP_ROUTER_INDEX_TOKENS), whatever the engine's hash.
 *
 * Threads: every call may be made from any thread. Mutations (worker add/get/remove, apply,
 * mark_stale, resync) take the router's lock exclusively; score, stats, find and check
 * share it. Score hashes the prompt outside the lock, and a Redis store's round trips run
 * outside it too. docs/routing.md ("Router index") has
 * the data structure, its memory per (block, worker), consistency and the thread model. */
typedef struct kvp_router kvp_router;

#define KVP_ROUTER_MAX_WORKERS 32768u /* live workers per router (15-bit worker slots) */
#define KVP_ROUTER_MAX_MEDIA   6u     /* distinct storage tiers (GPU, CPU, ...) per router */
#define KVP_ROUTER_MAX_GROUPS  256u   /* distinct (hash configuration, model) pairs */
#define KVP_ROUTER_MEDIUM_MAX  31u    /* longest medium name, in bytes */

/* One storage tier and its weight in the score. The name is matched against events'
 * `medium` ignoring ASCII case; it is copied at kvp_router_new. */
typedef struct kvp_router_tier {
    const char *medium; /* e.g. "GPU"; NUL-terminated, 1..KVP_ROUTER_MEDIUM_MAX bytes */
    double weight;      /* score per block held in this tier, 0..1000 */
} kvp_router_tier;

/* The shared store of a router index (docs/routing.md, "Shared index on Redis"). With a
 * url, the router keeps its in-memory index as before (its local view, and the fallback)
 * and also applies every batch to a Redis database that several routers share; scores are
 * answered from Redis, in one round trip per call, while it answers within timeout_ms, and
 * from the local view when it does not (kvp_router_stats says which). Worker sequence
 * numbers live in Redis too, so a batch that another router already applied is a
 * DUPLICATE there. kvp_router_mark_stale, kvp_router_resync and kvp_router_worker_remove
 * act on the shared state too, for every router of the fleet; kvp_router_check and the
 * index figures of kvp_router_stats are about the local view. One connection per router,
 * under a mutex: calls serialize on it for their round trip. The store must be a
 * standalone Redis 7 (Functions; not a Cluster). Needs libkvprefix-events built with
 * hiredis (meson option `redis`); without it a url is KVP_ENOTSUP. */
typedef struct kvp_router_redis {
    const char *url;        /* NULL (default): in-memory only. "redis://HOST:PORT[/DB]",
                               "HOST:PORT" or "unix:PATH"; copied at kvp_router_new */
    const char *key_prefix; /* first bytes of every key, so fleets can share a database
                               (default "kvp"): 1..64 of [A-Za-z0-9_.:-]; copied */
    uint32_t timeout_ms;    /* connect and per-command timeout (default 250, 1..60000) */
    uint32_t retry_ms;      /* after a failure, calls use the local view without trying
                               Redis for this long (default 1000, 0..600000) */
    uint32_t worker_ttl_s;  /* a worker without a batch for this long stops counting in
                               scores, fleet-wide (Redis key expiry); 0 (default): never */
} kvp_router_redis;

/* Router parameters; fill with kvp_router_config_init() first, then set what you need. */
typedef struct kvp_router_config {
    kvp_router_tier tiers[KVP_ROUTER_MAX_MEDIA]; /* known tiers (default GPU 1.0, CPU 0.8) */
    size_t n_tiers;                              /* entries used in tiers (default 2) */
    double unknown_weight;      /* weight of a medium first seen in an event (default 0.5);
                                   such media are registered while room remains */
    const char *default_medium; /* tier of events whose medium is nil (default "GPU") */
    int32_t kv_group;           /* vLLM KV cache group indexed; events of other groups
                                   (group_idx >= 0 and != kv_group) are skipped (default 0) */
    kvp_config hash;            /* hash fields (kvp_hasher_new) of workers created by
                                   kvp_router_worker_get (default: kvp_config_init's, with
                                   hash_profile KVP_HASH_VLLM_SHA256, block_size 16) */
    uint64_t table_seed;        /* mixes block hashes into table positions; 0 (default): random */
    kvp_allocator alloc;        /* memory hooks for everything the router holds (not
                                   hiredis's buffers) */
    kvp_router_redis redis;     /* shared store; url NULL (default): none */
    /* Appended fields (callers that fill the struct with kvp_router_config_init get their
     * defaults): */
    int index_by;          /* KVP_ROUTER_INDEX_*: what blocks are indexed by (default
                              KVP_ROUTER_INDEX_ENGINE_HASH). TOKENS needs no Redis
                              (KVP_ENOTSUP with redis.url) */
    kvp_config token_hash; /* TOKENS: the router's own key function for the whole fleet:
                              hash_profile (KVP_HASH_XXH3, default; KVP_HASH_KEYED or
                              KVP_HASH_SIPHASH with a hash_key, or hash_key_len 0 for a key
                              of this router's own; not vllm-*), seed, hash_key. Block
                              size and vocab_size are each worker's (its hash config) */
} kvp_router_config;

/* What the router indexes blocks by (kvp_router_config.index_by); docs/routing.md, "Token
 * mode". */
enum {
    KVP_ROUTER_INDEX_ENGINE_HASH = 0, /* the engine's block hash (the event integer): score
                                         computes each worker's engine keys with its hash
                                         config, which must be the engine's (profile,
                                         seeds, key, block size) */
    KVP_ROUTER_INDEX_TOKENS = 1       /* the router's own chained key of each BlockStored's
                                         token_ids (kvp_router_config.token_hash), with a
                                         per-worker map from engine hashes to own keys for
                                         parents and removals: any engine hash algorithm
                                         and seed work, random roots included. Cannot see
                                         what events omit (cache_salt, multimodal inputs):
                                         blocks with extra_keys are not indexed, and a
                                         score whose namespace has a salt or tenant gives
                                         rows KVP_ROUTER_ROW_NOTSUP */
};

/* Fill *cfg with the defaults above. Cannot fail (does nothing if cfg is NULL). */
KVP_EXPORT void kvp_router_config_init(kvp_router_config *cfg);

/* Create a router. On KVP_OK *out is owned by the caller (kvp_router_free). Returns
 * KVP_EINVAL (NULL pointer, n_tiers above KVP_ROUTER_MAX_MEDIA, a tier name empty, too long
 * or repeated, a weight outside 0..1000 or not a number, a hash config kvp_hasher_new
 * refuses, a redis field out of range or a url that does not parse), KVP_ENOMEM,
 * KVP_ENOTSUP (no random source for table_seed 0; a redis url in a build without hiredis).
 * An unreachable Redis is not an error here: the router starts on its local view and
 * connects when Redis answers (kvp_router_stats.redis_up). */
KVP_NODISCARD KVP_EXPORT int kvp_router_new(const kvp_router_config *cfg, kvp_router **out);

/* Free a router and everything it owns. Accepts NULL. Must not race with other calls. */
KVP_EXPORT void kvp_router_free(kvp_router *r);

/* One worker's identity and key function. */
typedef struct kvp_router_worker_config {
    const char *engine_id; /* NUL-terminated engine id (e.g. the pod name); copied */
    int64_t dp_rank;       /* data-parallel rank (default 0) */
    const char *model;     /* model served, NULL (default) for unspecified; copied. A request
                              whose namespace names another model does not score this
                              worker; for xxh3/keyed/siphash workers a request without a
                              model is hashed with this one (what the engine hashes); vllm-*
                              keys never contain the model */
    kvp_config hash;       /* the engine's hash fields (hash_profile, seed, hash_key,
                              hash_key_len, vllm_seed, block_size, vocab_size); default as
                              kvp_router_config.hash */
} kvp_router_worker_config;

/* Fill *wc with the defaults above (engine_id NULL). Cannot fail (NULL: nothing). */
KVP_EXPORT void kvp_router_worker_config_init(kvp_router_worker_config *wc);

/* Add a worker; *id receives its id (below KVP_ROUTER_MAX_WORKERS; the id of a removed
 * worker may be given again). A worker starts fresh and expects sequence number 0.
 * Workers with equal hash fields and model share one hasher (a prompt is hashed once per
 * such group). Returns KVP_OK; KVP_EINVAL (NULL pointer or engine_id, a hash config
 * kvp_hasher_new refuses, or a keyed/siphash profile with hash_key_len 0: a random key
 * cannot equal the engine's); KVP_EEXIST ((engine_id, dp_rank) present: *id receives the
 * existing id); KVP_ENOSPC (KVP_ROUTER_MAX_WORKERS or KVP_ROUTER_MAX_GROUPS reached);
 * KVP_ENOMEM. The router is unchanged on failure. */
KVP_NODISCARD KVP_EXPORT int
kvp_router_worker_add(kvp_router *r, const kvp_router_worker_config *wc, uint32_t *id);

/* The id of worker (engine_id, dp_rank): KVP_OK, KVP_ENOENT (no such worker), KVP_EINVAL
 * (NULL pointer). O(workers). */
KVP_NODISCARD KVP_EXPORT int kvp_router_worker_find(kvp_router *r, const char *engine_id,
                                                    int64_t dp_rank, uint32_t *id);

/* Find worker (engine_id, dp_rank), or add it with the router's default hash config and
 * no model (a worker first seen in an event). Returns as kvp_router_worker_add, never
 * KVP_EEXIST. */
KVP_NODISCARD KVP_EXPORT int kvp_router_worker_get(kvp_router *r, const char *engine_id,
                                                   int64_t dp_rank, uint32_t *id);

/* Remove worker id and every block it holds. Returns KVP_OK, KVP_ENOENT, KVP_EINVAL. */
KVP_NODISCARD KVP_EXPORT int kvp_router_worker_remove(kvp_router *r, uint32_t id);

/* What kvp_router_apply did with a batch (status). */
enum {
    KVP_ROUTER_APPLIED = 1,   /* seq was the expected one (or the stale worker's first
                                 batch): applied */
    KVP_ROUTER_RESTARTED = 2, /* seq 0 after a higher one: the publisher restarted; the
                                 worker was cleared, then the batch applied */
    KVP_ROUTER_DUPLICATE = 3, /* seq below the expected one: already applied, ignored */
    KVP_ROUTER_GAP = 4        /* seq above the expected one: batches were missed; nothing
                                 applied. Replay from `expected` (the publisher's replay
                                 socket) and apply those batches in order, or give up with
                                 kvp_router_mark_stale */
};

/* The outcome of kvp_router_apply. */
typedef struct kvp_router_apply_result {
    int status;        /* KVP_ROUTER_*; 0 when the call failed */
    uint64_t expected; /* the sequence number the worker expects next (after the call;
                          after a gap: the first missing one) */
    bool stale;        /* the worker is stale after the call (ignored by score) */
    size_t n_stored;   /* BlockStored events applied */
    size_t n_removed;  /* BlockRemoved events applied */
    size_t n_cleared;  /* AllBlocksCleared events applied */
    size_t n_skipped;  /* events of another KV cache group (kv_group), not applied */
    size_t bad_event;  /* KVP_EINVAL: index of the offending event; SIZE_MAX: the batch */
    const char *why;   /* KVP_EINVAL: static description of what is wrong; else NULL */
} kvp_router_apply_result;

/* Apply batch b, numbered seq by its publisher, from worker id. The batch is validated
 * first and applied all or nothing. Events: BlockStored adds (hash -> worker, medium) for
 * each hash (medium nil: the default medium); BlockRemoved removes each hash's medium from
 * this worker (a hash it does not hold is ignored); AllBlocksCleared removes every block
 * of the worker. Sequence numbers, with `expected` the worker's next:
 *   seq == expected            applied (APPLIED);
 *   seq == 0 after a higher    the publisher restarted: cleared, applied (RESTARTED); a
 *                              second seq 0 is a restart only if its ts differs;
 *   seq < expected             DUPLICATE, nothing applied;
 *   seq > expected             GAP, nothing applied.
 * A stale worker (kvp_router_mark_stale) takes its next batch whatever its number; it turns
 * fresh again at a batch numbered 0, after an AllBlocksCleared, or by kvp_router_resync.
 * res may be NULL. Returns KVP_OK (see res->status); KVP_EINVAL (NULL r or b, or a
 * malformed batch: unknown event type, NULL arrays with counts, a BlockStored whose
 * block_size differs from the worker's or whose token count is not n_hashes * block_size,
 * a batch whose data_parallel_rank differs from the worker's, an unknown medium when all
 * KVP_ROUTER_MAX_MEDIA are taken, a medium name longer than KVP_ROUTER_MEDIUM_MAX:
 * res->why and res->bad_event say which); KVP_ENOENT (no worker id); KVP_ENOMEM. On
 * failure nothing changes, the worker's sequence included: the next batch reports a GAP,
 * and since a replay returns the same bad batch, the caller should mark the worker stale. */
KVP_NODISCARD KVP_EXPORT int kvp_router_apply(kvp_router *r, uint32_t id, uint64_t seq,
                                              const kvp_kv_batch *b, kvp_router_apply_result *res);

/* One batch for kvp_router_apply_many: the inputs of kvp_router_apply, and its outputs. */
typedef struct kvp_router_item {
    uint32_t worker;             /* worker id */
    uint64_t seq;                /* the batch's sequence number */
    const kvp_kv_batch *batch;   /* the decoded batch; only read during the call */
    int rc;                      /* out: what kvp_router_apply returned for it */
    kvp_router_apply_result res; /* out: its result */
} kvp_router_item;

/* Apply items[0 .. n) in order, each exactly as kvp_router_apply (each batch all or nothing,
 * a failing item does not stop the others), under one hold of the lock: an event thread
 * that drains several messages at once takes the lock once, and no score sees some of the
 * items without the others (on the 2-core test machine bench_router (c) shows no
 * throughput difference from kvp_router_apply). Returns KVP_OK when every item's rc is
 * KVP_OK, else the first failing item's rc; KVP_EINVAL for NULL r, or NULL items with
 * n > 0 (then nothing is applied). */
KVP_NODISCARD KVP_EXPORT int kvp_router_apply_many(kvp_router *r, kvp_router_item *items, size_t n);

/* Give up on worker id's history (a gap that replay could not fill): remove its blocks and
 * ignore it in scores until it is fresh again (see kvp_router_apply). Returns KVP_OK,
 * KVP_ENOENT, KVP_EINVAL. */
KVP_NODISCARD KVP_EXPORT int kvp_router_mark_stale(kvp_router *r, uint32_t id);

/* Accept stale worker id's partial view (the blocks stored since it went stale: never a
 * block it does not hold, if no batch was missed since) and score it again. Returns KVP_OK
 * (also for a fresh worker), KVP_ENOENT, KVP_EINVAL. */
KVP_NODISCARD KVP_EXPORT int kvp_router_resync(kvp_router *r, uint32_t id);

/* Why a score row is zero (kvp_router_row.state). */
enum {
    KVP_ROUTER_ROW_SCORED = 0, /* scored */
    KVP_ROUTER_ROW_STALE = 1,  /* the worker is stale: not scored */
    KVP_ROUTER_ROW_MODEL = 2,  /* the request names another model than the worker's */
    KVP_ROUTER_ROW_NOTSUP = 3, /* the worker's profile cannot express the namespace */
    KVP_ROUTER_ROW_TOKEN = 4   /* a token id is at or above the worker's vocab_size */
};

/* One worker's score. */
typedef struct kvp_router_row {
    uint32_t worker;   /* worker id */
    int state;         /* KVP_ROUTER_ROW_* */
    int64_t dp_rank;   /* the worker's data-parallel rank */
    uint32_t n_blocks; /* consecutive blocks from block 0 the worker holds (any tier) */
    uint64_t n_tokens; /* n_blocks * the worker's block size */
    double score;      /* the same blocks, each weighted by the best tier holding it */
} kvp_router_row;

/* Score tokens[0 .. n_tokens) in namespace ns (the request's; see
 * kvp_router_worker_config.model) against every worker: rows[0 .. n_workers) in worker id
 * order, *n_rows = n_workers. Keys are computed once per group of workers sharing a hash
 * configuration and model, outside the lock, and never past 4 times the group's longest
 * cached run (at least 32 blocks). Each group's rows come from one consistent state of the
 * index. rows are owned by the caller and written only by this call.
 * Returns KVP_OK; KVP_EINVAL (NULL r, ns or n_rows, NULL tokens with n_tokens > 0, rows
 * NULL with cap > 0, a namespace field with ptr NULL and len != 0); KVP_ENOSPC (cap below
 * the number of workers: *n_rows = the number needed); KVP_ENOMEM (key scratch for prompts
 * above 1024 blocks). On failure the rows' contents are unspecified. */
KVP_NODISCARD KVP_EXPORT int kvp_router_score(kvp_router *r, const kvp_namespace *ns,
                                              const uint32_t *tokens, size_t n_tokens,
                                              kvp_router_row *rows, size_t cap, size_t *n_rows);

/* Score block hashes hashes[0 .. n_hashes) (event integers as the engines computed them,
 * block 0 first) against every worker, as kvp_router_score does once it has a group's
 * keys: for callers that get a prompt's block hashes elsewhere (a trace of hash ids, an
 * external tokenizer service). The hashes are taken as every worker's own, whatever its
 * hash group or model: rows are SCORED or STALE only. Same rows, ordering, consistency and
 * return codes as kvp_router_score (KVP_EINVAL also for NULL hashes with n_hashes > 0). */
KVP_NODISCARD KVP_EXPORT int kvp_router_score_hashes(kvp_router *r, const uint64_t *hashes,
                                                     size_t n_hashes, kvp_router_row *rows,
                                                     size_t cap, size_t *n_rows);

/* Which view of the index answered a score (kvp_router_score_result.view). */
enum {
    KVP_ROUTER_VIEW_LOCAL = 1,   /* the router's in-memory index (a router without Redis) */
    KVP_ROUTER_VIEW_REDIS = 2,   /* the shared store on Redis */
    KVP_ROUTER_VIEW_FALLBACK = 3 /* the in-memory index (the local view) because Redis failed
                                    during the call or was in its retry pause */
};

/* What kvp_router_score_v2 and kvp_router_score_hashes_v2 report besides the rows, for
 * that call alone (whatever other threads' calls did meanwhile). Fill with
 * kvp_router_score_result_init() first, then set the inputs you need. */
typedef struct kvp_router_score_result {
    const char **engine_ids; /* in: NULL (default), or room for cap pointers. On KVP_OK,
                                engine_ids[i] is rows[i]'s engine id: NUL-terminated, owned
                                by the router, valid until kvp_router_free, even after that
                                worker is removed by another thread meanwhile (the router
                                keeps every engine id it was given until it is freed; a
                                worker added again under the same id shares the copy) */
    int view;                /* out: KVP_ROUTER_VIEW_* that answered this call; 0 when the
                                call failed */
} kvp_router_score_result;

/* Fill *res with the defaults above. Cannot fail (does nothing if res is NULL). */
KVP_EXPORT void kvp_router_score_result_init(kvp_router_score_result *res);

/* kvp_router_score, also reporting into *res (may be NULL: then exactly kvp_router_score)
 * which view answered this call and each row's engine id. Same arguments, rows and return
 * codes as kvp_router_score; res->view is set on every return. */
KVP_NODISCARD KVP_EXPORT int kvp_router_score_v2(kvp_router *r, const kvp_namespace *ns,
                                                 const uint32_t *tokens, size_t n_tokens,
                                                 kvp_router_row *rows, size_t cap, size_t *n_rows,
                                                 kvp_router_score_result *res);

/* kvp_router_score_hashes with *res as kvp_router_score_v2 fills it. */
KVP_NODISCARD KVP_EXPORT int kvp_router_score_hashes_v2(kvp_router *r, const uint64_t *hashes,
                                                        size_t n_hashes, kvp_router_row *rows,
                                                        size_t cap, size_t *n_rows,
                                                        kvp_router_score_result *res);

/* A view's name: "local", "redis", "fallback"; NULL for anything else. Cannot fail. */
KVP_EXPORT const char *kvp_router_view_name(int view);

/* Index size, memory and counters. */
typedef struct kvp_router_stats {
    uint32_t n_workers;        /* live workers */
    uint32_t n_stale;          /* of which stale */
    uint32_t n_groups;         /* hash groups (distinct hash configuration and model) */
    uint32_t n_media;          /* registered tiers */
    uint64_t n_blocks;         /* distinct block hashes indexed */
    uint64_t n_holders;        /* (block, worker) pairs */
    uint64_t n_holder_media;   /* (block, worker, medium) triples */
    uint64_t n_slots;          /* hash table slots (16 bytes each) */
    uint64_t index_bytes;      /* table slots + spill records, as allocated */
    uint64_t total_bytes;      /* every byte the router holds through its allocator */
    double bytes_per_holder;   /* total_bytes / n_holders; 0 when nothing is indexed */
    uint64_t n_batches;        /* batches applied (APPLIED or RESTARTED) */
    uint64_t n_events_stored;  /* BlockStored events applied */
    uint64_t n_events_removed; /* BlockRemoved events applied */
    uint64_t n_events_cleared; /* AllBlocksCleared events applied */
    uint64_t n_events_skipped; /* events of other KV cache groups */
    uint64_t n_duplicates;     /* batches ignored as DUPLICATE */
    uint64_t n_gaps;           /* batches refused as GAP */
    uint64_t n_restarts;       /* RESTARTED batches */
    uint64_t n_malformed;      /* batches refused with KVP_EINVAL */
    uint64_t n_scores;         /* kvp_router_score calls that succeeded */
    /* Shared store (all 0 / false without kvp_router_config.redis.url): */
    bool redis;                  /* a Redis store is configured */
    bool redis_up;               /* the last call that tried Redis succeeded */
    uint64_t n_redis_calls;      /* round trips to Redis (a pipeline counts once) */
    uint64_t n_redis_errors;     /* calls that failed: refused, timed out, server error */
    uint64_t n_redis_connects;   /* connections made (the first, then reconnections) */
    uint64_t n_fallback_scores;  /* scores answered from the local view (Redis failed or
                                    was in its retry pause) */
    uint64_t n_fallback_applies; /* batches applied to the local view only */
    uint64_t n_redis_lost;       /* workers whose shared state was found missing while
                                    this router knew them (Redis restarted or flushed) */
    uint64_t n_redis_duplicates; /* batches another router had already applied */
    uint64_t n_redis_reseeds;    /* lost workers whose shared view this router put back from
                                    its local view (exact at the batch that found the loss) */
} kvp_router_stats;

/* Copy the figures to *out. Returns KVP_OK, KVP_EINVAL (NULL). */
KVP_NODISCARD KVP_EXPORT int kvp_router_stats_get(kvp_router *r, kvp_router_stats *out);

/* One worker's state. */
typedef struct kvp_router_worker_stats {
    int64_t dp_rank;      /* data-parallel rank */
    uint32_t group;       /* hash group index (workers with equal hash config and model) */
    bool stale;           /* ignored by score */
    bool seq_known;       /* expected is known (false just after mark_stale) */
    uint64_t expected;    /* next sequence number expected, when seq_known */
    uint64_t n_blocks;    /* blocks held, any tier */
    uint64_t n_batches;   /* batches applied */
    uint64_t n_gaps;      /* batches refused as GAP */
    uint64_t n_restarts;  /* publisher restarts seen */
    uint64_t n_malformed; /* batches refused with KVP_EINVAL */
} kvp_router_worker_stats;

/* Copy worker id's state to *out. Returns KVP_OK, KVP_ENOENT, KVP_EINVAL (NULL). */
KVP_NODISCARD KVP_EXPORT int kvp_router_worker_stats_get(kvp_router *r, uint32_t id,
                                                         kvp_router_worker_stats *out);

/* Token mode figures (kvp_router_token_stats_get); all 0 in engine-hash mode. */
typedef struct kvp_router_token_stats {
    uint64_t n_map_entries;     /* (engine hash, worker) entries in the maps */
    uint64_t map_bytes;         /* bytes the maps hold (entries and reference maps, as
                                   allocated; also counted in kvp_router_stats.total_bytes) */
    uint64_t n_keyed;           /* stored blocks indexed under the router's own key */
    uint64_t n_unresolved;      /* stored blocks not indexed: the parent's own key is not
                                   known (its BlockStored was never seen: a view started
                                   late, after a gap or a clear) */
    uint64_t n_unkeyable;       /* stored blocks not indexed: extra_keys (salt, multimodal),
                                   a lora_id without lora_name, a token id >= vocab_size */
    uint64_t n_unknown_removed; /* removed engine hashes the map did not hold */
} kvp_router_token_stats;

#define KVP_ROUTER_ALL_WORKERS UINT32_MAX /* kvp_router_token_stats_get: the sum */

/* Copy the token mode figures of worker id, or their sum over the live workers for id
 * KVP_ROUTER_ALL_WORKERS, to *out. Returns KVP_OK, KVP_ENOENT (no worker id), KVP_EINVAL
 * (NULL). */
KVP_NODISCARD KVP_EXPORT int kvp_router_token_stats_get(kvp_router *r, uint32_t id,
                                                        kvp_router_token_stats *out);

/* What kvp_router_check_keys found in one batch. */
typedef struct kvp_router_key_check {
    size_t n_checked;     /* blocks whose engine key the router computed and compared */
    size_t n_mismatch;    /* of those, blocks whose event hash differs */
    uint64_t engine_hash; /* the first mismatch: the engine's block hash */
    uint64_t router_hash; /* the first mismatch: the router's computation of it */
    const char *likely;   /* the first mismatch: a static sentence naming the likely cause
                             (hash algorithm, seed, cache_salt or LoRA); NULL without one */
} kvp_router_key_check;

/* In engine-hash mode, check that worker id's hash config reproduces the engine's keys:
 * for each BlockStored of batch b with no parent (a chain's first blocks, which need no
 * state the event omits), compute the engine key of its first block from its token_ids
 * with the worker's hash config and compare it with the event's hash. Blocks with
 * extra_keys, a LoRA or another KV cache group are not checked. Hashes outside the router's
 * lock (read-only: the index is unchanged); may allocate a second hasher on a mismatch, to
 * name the cause. In token mode nothing is checked (the router's keys are its own). Returns
 * KVP_OK (see *out), KVP_ENOENT (no worker id), KVP_EINVAL (NULL pointer), KVP_ENOMEM. */
KVP_NODISCARD KVP_EXPORT int
kvp_router_check_keys(kvp_router *r, uint32_t id, const kvp_kv_batch *b, kvp_router_key_check *out);

/* Walk the whole index and check every invariant: each slot's key at its probe distance
 * (robin hood order), holder sets well formed (no empty set, no worker twice, live workers
 * only, media registered, spill records on no free list), counts of blocks, holders and
 * holder-media, each worker's block count, groups and rows. Returns KVP_OK, KVP_ECORRUPT,
 * KVP_EINVAL (NULL), KVP_ENOMEM (its scratch, taken with malloc). O(slots + holders). */
KVP_NODISCARD KVP_EXPORT int kvp_router_check(kvp_router *r);

/* ---- Load-aware ranking (router_rank.c; docs/routing.md, "Load-aware ranking") -------- */

/* How kvp_router_rank orders candidates. Fill with kvp_router_rank_config_init() first. */
typedef struct kvp_router_rank_config {
    double overlap_weight; /* 0 (default): cache first -- most cached blocks, then least
                              load. > 0: cost = overlap_weight x blocks to prefill
                              (prompt_blocks - cached) + load, smallest first (Dynamo's
                              overlap weight; load in the same unit as one block of cost) */
    double load_cap;       /* 0 (default): no cap. >= 1: a candidate whose load is above
                              load_cap x the mean load of all candidates ranks after every
                              candidate within the cap (the least-loaded one, the first of
                              equals, is always within) */
    size_t start;          /* ties left after cost and load go to the first candidate at or
                              after index start (mod n), so equal candidates take turns */
} kvp_router_rank_config;

/* One candidate's inputs. */
typedef struct kvp_router_rank_input {
    double cached; /* blocks of the prompt it holds (a prefix; may be tier-weighted), >= 0 */
    double load;   /* its load, >= 0, finite (the caller's unit: outstanding work, requests) */
} kvp_router_rank_input;

/* Fill *cfg with the defaults above. Cannot fail (does nothing if cfg is NULL). */
KVP_EXPORT void kvp_router_rank_config_init(kvp_router_rank_config *cfg);

/* Rank candidates in[0 .. n) for a prompt of prompt_blocks full blocks: write the indexes
 * of the best min(n, cap) candidates, best first, to order[] (owned by the caller; with
 * cap 1 this is one O(n) scan, else O(n log n)), their count to *n_order and how many
 * candidates are within the load cap to *n_within (may be NULL; n without a cap). The one
 * ranking of `kvprefix router` and of `kvprefix fleet`'s cache-aware policies, so the
 * fleet simulation's figures describe the daemon's choices. Allocates a scratch array when
 * cap > 1 and n > 64. Returns KVP_OK; KVP_EINVAL (NULL cfg, in with n > 0, order with
 * cap > 0 or n_order; a negative or non-finite input; overlap_weight < 0 or not finite;
 * load_cap not 0 and below 1 or NaN); KVP_ENOMEM. On failure the outputs are untouched. */
KVP_NODISCARD KVP_EXPORT int kvp_router_rank(const kvp_router_rank_config *cfg,
                                             double prompt_blocks, const kvp_router_rank_input *in,
                                             size_t n, uint32_t *order, size_t cap, size_t *n_order,
                                             size_t *n_within);

#ifdef __cplusplus
}
#endif

#endif /* KVPREFIX_EVENTS_H */
