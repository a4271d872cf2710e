/*
 * testutil.h - helpers shared by the Criterion tests (th_*).
 *
 * A counting allocator with failure injection, an event recorder, a namespace builder, cache
 * factories, a deterministic PRNG, and checked wrappers of the public calls the tests make
 * over and over. Helpers that check something fail the running test through Criterion's
 * cr_assert, with a message naming the call that failed; wrappers that change the cache also
 * run kvp_cache_check on it. Only Criterion test programs link testutil.c (tests/lib/soak.c is
 * standalone). The reference model is separate: refmodel.h.
 */
#ifndef KVP_TESTS_TESTUTIL_H
#define KVP_TESTS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "kvprefix.h"

/* Fail the test unless the cache's internal consistency check passes. A macro, so that a
 * failure is reported at the line of the test that checks. */
#define TH_CHECK(c) cr_assert_eq(kvp_cache_check(c), KVP_OK, "kvp_cache_check failed")

/* ---------------------------------------------------------------------------------------- */
/* Counting allocator                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* A kvp_allocator that counts calls and live bytes, checks that free() receives the size
 * given to alloc(), and can be told to fail one chosen call. */
typedef struct th_alloc {
    uint64_t n_calls;     /* alloc calls since the last th_alloc_arm */
    int64_t fail_at;      /* fail the alloc call with this index (0-based); -1: never;
                             TH_FAIL_ALL: every call */
    uint64_t n_failed;    /* alloc calls that were failed on purpose */
    int64_t live_bytes;   /* bytes allocated and not yet freed */
    uint64_t n_live;      /* allocations not yet freed */
    uint64_t n_bad_frees; /* frees whose size did not match, or of unknown pointers */
} th_alloc;

#define TH_FAIL_ALL INT64_C(-2)

void th_alloc_init(th_alloc *a);
/* Count calls from now; fail the call with index fail_at (-1: none). */
void th_alloc_arm(th_alloc *a, int64_t fail_at);
kvp_allocator th_alloc_hooks(th_alloc *a);

/* ---------------------------------------------------------------------------------------- */
/* Event recorder                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Records every event of a cache (up to TH_MAX_EVENTS). */
#define TH_MAX_EVENTS 4096
typedef struct th_events {
    kvp_event ev[TH_MAX_EVENTS];
    size_t n;
} th_events;

void th_events_fn(void *ud, const kvp_event *ev);
/* Recorded events of this type and reason (reason < 0: any reason). */
size_t th_events_count(const th_events *e, int type, int reason);

/* ---------------------------------------------------------------------------------------- */
/* Namespaces, keys and caches                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Fill ns with a namespace built from C strings; NULL means absent. */
void th_ns(kvp_namespace *ns, const char *model, const char *adapter, const char *tenant,
           const char *salt);

/* True when two keys are equal. */
bool th_key_eq(kvp_key a, kvp_key b);

/* A default configuration with these fields set; on_event/ud may be NULL. */
kvp_config th_config(uint32_t n_blocks, uint32_t block_size, bool verify, kvp_event_fn on_event,
                     void *ud);

/* Create a cache from cfg or fail the test. */
kvp_cache *th_cache_new(const kvp_config *cfg);

/* Create a cache or fail the test. on_event/ud may be NULL. */
kvp_cache *th_cache(uint32_t n_blocks, uint32_t block_size, bool verify, kvp_event_fn on_event,
                    void *ud);

/* Deterministic pseudo-random numbers (splitmix64). */
uint64_t th_rand(uint64_t *state);

/* ---------------------------------------------------------------------------------------- */
/* Checked calls                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* The cache's statistics, or fail the test; also fails unless the free, cached and in-use
 * block counts add up to the total. */
kvp_stats th_stats(const kvp_cache *c);

/* Fail the test unless every counter of got equals the one of expected; what names the
 * situation in the message. */
void th_assert_stats_equal(const kvp_stats *expected, const kvp_stats *got, const char *what);

/* kvp_lookup without ids, or fail the test. The match is filled with garbage first, so that
 * a field the call does not write shows. */
kvp_match th_lookup_ok(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n);

/* kvp_access, or fail the test; then TH_CHECK. */
kvp_match th_access_ok(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n);

/* kvp_acquire of request id, or fail the test; then TH_CHECK. */
kvp_match th_acquire_ok(kvp_cache *c, uint64_t id, const kvp_namespace *ns, const uint32_t *t,
                        size_t n, size_t cap);

#endif /* KVP_TESTS_TESTUTIL_H */
