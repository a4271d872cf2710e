/*
 * fleet_index.h - the state of fleet_index.c's router index, shared with its test only
 * (tests/cli/test_fleet.c corrupts it to show that fl_index_check catches each kind). Everything
 * else uses the opaque fl_index of fleet.h. The layout and invariants are described at the
 * top of fleet_index.c.
 */
#ifndef CLI_FLEET_INDEX_H
#define CLI_FLEET_INDEX_H

#include "kvprefix_events.h"
#include "fleet.h"

/* One wire event being collected. */
typedef struct ix_rec {
    int type;        /* KVP_EVENT_* */
    bool has_parent; /* STORED: a parent hash (false: the namespace's first block) */
    uint64_t parent; /* STORED: the parent's event integer when has_parent */
    size_t n_hashes; /* blocks it names */
} ix_rec;

/* One replica's events since the last step. */
typedef struct ix_rep {
    struct fl_index *x; /* the index (for the block size and the loss flag) */
    uint32_t worker;    /* its router worker id */
    uint64_t seq;       /* sequence number of its next batch */
    ix_rec *recs;       /* the step's wire events, in order */
    size_t n_recs, cap_recs;
    uint64_t *hashes; /* their block hashes, concatenated */
    size_t n_hashes, cap_hashes;
    uint32_t *lens;   /* per hash: its block's kept tokens (0 for REMOVED); cap_hashes */
    uint32_t *tokens; /* the stored blocks' kept tokens, concatenated */
    size_t n_tokens, cap_tokens;
    kvp_key last_key; /* the last block of the open BlockStored (when recs ends with one) */
    bool listed;      /* in the index's list of replicas with events */
} ix_rep;

/* One batch waiting for its due time. Owns its arrays. */
typedef struct ix_batch {
    fl_time due;          /* when the router may apply it */
    uint32_t replica;     /* whose */
    uint64_t seq;         /* its sequence number */
    kvp_kv_batch b;       /* the batch; events and hashes below, tokens set at apply */
    kvp_kv_event *events; /* b.n_events events */
    uint64_t *hashes;     /* their hashes */
    uint32_t *lens;       /* per hash: kept tokens */
    uint32_t *tokens;     /* the kept tokens */
} ix_batch;

/* The index of one simulation. */
struct fl_index {
    fl_index_config cfg; /* as given (key_prefix: not owned, used at creation only) */
    kvp_router *router;  /* the router, one worker per replica */
    uint32_t n;          /* replicas */
    uint32_t bs;         /* tokens per block */
    ix_rep *reps;        /* n collectors */
    uint32_t *dirty;     /* replicas with events this step */
    uint32_t n_dirty;    /* entries used in dirty */
    uint32_t *replica;   /* worker id -> replica (n_map entries) */
    uint32_t n_map;      /* 1 + the largest worker id */
    uint32_t n_added;    /* replicas whose worker was added (all, once made) */
    ix_batch *queue;     /* batches, [head, n_queue) pending, due times non-decreasing */
    size_t head, n_queue, cap_queue; /* first pending, end, allocated */
    kvp_router_row *rows;            /* n score rows */
    uint64_t *hashes;                /* a request's hashes for the score (grown) */
    size_t cap_hashes;
    uint32_t *pad; /* the applied batch's token_ids, padded (grown) */
    size_t cap_pad;
    bool lost; /* a callback ran out of memory: events were dropped */
    uint64_t n_applies, apply_ns, n_events, n_blocks; /* applies, their wall ns, wire events
                                                         and block hashes applied */
    uint64_t score_calls, apply_calls; /* Redis round trips made by scores, by applies */
};

#endif /* CLI_FLEET_INDEX_H */
