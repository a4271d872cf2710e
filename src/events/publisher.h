/*
 * publisher.h - the publisher's private state, shared by publisher.c (configuration,
 * event intake, batches) and publisher_net.c (endpoints, sockets, sends, the replay buffer
 * and its ROUTER socket).
 * Nothing here is installed or exported.
 *
 *   kvp_publisher
 *    |- pending: pev[0 .. n_pev)   wire events being built, each a range of ph[] (hashes)
 *    |           and of pt[] (tokens); n_pending counts the cache events behind them
 *    |- ring: slots[(head + i) % cap] for i < n, oldest first: published batches kept for
 *    |        replay, sequence numbers strictly increasing and below next_seq
 *    `- sockets: pub (PUB), replay (ROUTER, optional)
 *
 * Locks: mu guards everything except the replay socket, which only the replay server
 * touches, under replay_mu (taken before mu when both are needed). Functions named
 * _locked expect mu held.
 */
#ifndef KVP_EVENTS_PUBLISHER_H
#define KVP_EVENTS_PUBLISHER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvprefix_events.h"

/* One wire event being built from cache events. */
typedef struct kvp__pev {
    int type;         /* KVP_EVENT_* */
    size_t hash_off;  /* its hashes: ph[hash_off .. hash_off + n_hashes) */
    size_t n_hashes;  /* blocks in it */
    size_t tok_off;   /* its tokens: pt[tok_off .. tok_off + n_tokens) */
    size_t n_tokens;  /* 0 when the cache gave no tokens */
    bool has_parent;  /* STORED: the first block is not a chain's first */
    uint64_t parent;  /* STORED: the parent's event integer */
    kvp_key last_key; /* STORED: the full key of its last block, to extend the chain */
    bool has_tokens;  /* STORED: its blocks came with tokens */
    uint32_t bsize;   /* STORED: the cache's block size */
    uint8_t tier;     /* the cache tier of its blocks (kvp_event.tier): names its medium */
} kvp__pev;

/* One published batch kept for replay. */
typedef struct kvp__slot {
    uint64_t seq;  /* its sequence number */
    uint8_t *data; /* the payload (owned) */
    size_t len;    /* payload bytes */
    size_t cap;    /* bytes allocated at data (reused by later batches) */
} kvp__slot;

struct kvp_publisher {
    pthread_mutex_t mu;        /* guards all but the replay socket */
    pthread_mutex_t replay_mu; /* guards the replay socket: one server at a time */
    void *ctx;                 /* ZeroMQ context */
    bool own_ctx;              /* the publisher made ctx and terminates it */
    void *pub;                 /* PUB socket */
    void *replay;              /* ROUTER socket, or NULL */

    char *topic;                          /* first frame (owned copy) */
    size_t topic_len;                     /* its bytes */
    char *medium;                         /* every tier-0 event's medium (owned copy), NULL: nil */
    char *tier_medium[KVP_MAX_TIERS - 1]; /* lower tiers' media (owned), NULL: not published */
    char *lora_name;    /* every BlockStored's lora_name (owned copy), NULL: nil */
    int form;           /* encoder form */
    int32_t group_idx;  /* every event's group_idx, -1: absent */
    int64_t dp_rank;    /* every batch's data_parallel_rank */
    uint32_t flush_at;  /* publish when n_pending reaches it */
    uint32_t n_pending; /* cache events behind pev[] */

    kvp__pev *pev;     /* pending wire events */
    size_t n_pev;      /* how many */
    size_t cap_pev;    /* entries allocated at pev */
    uint64_t *ph;      /* pending hashes */
    size_t n_ph;       /* how many */
    size_t cap_ph;     /* entries allocated at ph */
    uint32_t *pt;      /* pending tokens */
    size_t n_pt;       /* how many */
    size_t cap_pt;     /* entries allocated at pt */
    kvp_kv_event *evs; /* flush scratch: the batch's events */
    size_t cap_evs;    /* entries allocated at evs */
    uint8_t *enc;      /* flush scratch: the payload */
    size_t cap_enc;    /* bytes allocated at enc */

    kvp__slot *slots;   /* replay ring (buffer_steps slots; NULL without replay) */
    uint32_t ring_cap;  /* slots */
    uint32_t ring_head; /* index of the oldest batch */
    uint32_t ring_n;    /* batches held */
    uint64_t next_seq;  /* the next batch's sequence number */
    bool lost;          /* events were dropped: skip a sequence number */
    int sticky;         /* KVP_ENOMEM to report once from flush, else KVP_OK */

    kvp_publisher_stats st; /* counters (n_pending, n_buffered filled on read) */
    pthread_t thread;       /* the replay thread, when has_thread */
    bool has_thread;        /* replay_thread was asked for and started */
    atomic_bool stop;       /* tells the replay thread to return */
};

/* Open the sockets of cfg (the endpoints offset for cfg->dp_rank) in pub->ctx. Returns
 * KVP_OK, KVP_EINVAL (an endpoint the rank offset cannot apply to), KVP_EIO (ZeroMQ
 * refused a socket, option, bind or connect). Sockets opened before a failure stay in pub
 * for the caller to close. */
int kvp__pub_open(kvp_publisher *pub, const kvp_publisher_config *cfg);

/* Close both sockets (NULL-safe) and terminate the context when the publisher owns it. */
void kvp__pub_close(kvp_publisher *pub);

/* Send one message [topic, seq as 8 bytes big-endian, payload] on the PUB socket. Returns
 * KVP_OK or KVP_EIO. */
int kvp__pub_send_locked(kvp_publisher *pub, uint64_t seq, const uint8_t *payload, size_t len);

/* Keep a copy of payload[0 .. len) as batch seq in the ring, dropping the oldest when
 * full. Returns KVP_OK or KVP_ENOMEM (the ring unchanged). Does nothing without replay. */
int kvp__ring_push_locked(kvp_publisher *pub, uint64_t seq, const uint8_t *payload, size_t len);

/* Free the ring's payloads and slots. */
void kvp__ring_free(kvp_publisher *pub);

/* Serve replay requests for up to timeout_ms (see kvp_publisher_poll). */
int kvp__replay_serve(kvp_publisher *pub, int timeout_ms);

/* Start and stop the replay thread. Start returns KVP_OK or KVP_ENOMEM. */
int kvp__replay_thread_start(kvp_publisher *pub);
void kvp__replay_thread_stop(kvp_publisher *pub);

/* The endpoint for data-parallel rank: vLLM's offset (a tcp port + rank, an inproc name +
 * "_dp<rank>"), written to out[0 .. cap). Returns KVP_OK, KVP_EINVAL (negative rank, an
 * ipc or other endpoint with rank > 0, a port that is not a number or overflows),
 * KVP_ENOSPC (cap too small). */
int kvp__endpoint_for_rank(const char *ep, int64_t rank, char *out, size_t cap);

/* True when vLLM binds ep (rather than connecting): '*', "::", ipc:// or inproc://. */
bool kvp__endpoint_binds(const char *ep);

/* Check the publisher's invariants (pending ranges, ring order). Returns KVP_OK or
 * KVP_ECORRUPT. Takes mu. */
int kvp__publisher_check(kvp_publisher *pub);

#endif /* KVP_EVENTS_PUBLISHER_H */
