/*
 * test_errmsg.c - kvp_errmsg, the detail of the calling thread's last failed call.
 *
 * The three texts the API documents as examples, exactly: a commit whose tokens do not begin
 * with the acquired prompt names the first differing block's token range, n_blocks 0, the
 * reserved metric label. Then every argument check of the library, one failing call each:
 * the call's code and a detail that names the argument (most are compared exactly, which
 * also pins the wording) and is never the generic kvp_strerror text. Then the rules of the
 * buffer: "" before a thread's first failure; a success leaves the last detail alone; a
 * second, different failure replaces it (no stale text); a path with no detail of its own
 * gets its code's kvp_strerror text, not the previous failure's; two threads failing
 * differently on one shared cache each read their own.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

/* The call returns code and leaves exactly text as the detail. */
#define EXPECT_MSG(call, code, text)                                                               \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, (code), "%s returned %d (%s), expected %d", #call, rc_, kvp_errmsg(),    \
                     (code));                                                                      \
        cr_assert_str_eq(kvp_errmsg(), (text), "%s", #call);                                       \
    } while (0)

/* The call returns code and leaves a detail that starts with prefix (for values that
 * depend on the platform, such as structure sizes). */
#define EXPECT_PREFIX(call, code, prefix)                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        cr_assert_eq(rc_, (code), "%s returned %d (%s), expected %d", #call, rc_, kvp_errmsg(),    \
                     (code));                                                                      \
        cr_assert(strncmp(kvp_errmsg(), (prefix), strlen(prefix)) == 0,                            \
                  "%s: detail \"%s\" does not start with \"%s\"", #call, kvp_errmsg(), (prefix));  \
        cr_assert_str_neq(kvp_errmsg(), kvp_strerror(code), "%s: generic detail", #call);          \
    } while (0)

static const uint32_t toks[64] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                  17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                                  33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48,
                                  49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64};

/* ------------------------------------------------------------------ the documented examples */

Test(errmsg, commit_names_the_differing_block)
{
    kvp_cache *c = th_cache(16, 16, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[48];
    memcpy(t, toks, sizeof t);
    th_acquire_ok(c, 1, &ns, t, 48, 0);
    t[20] = 999; /* block 1 = tokens[16..32) */
    size_t stored = 77;
    EXPECT_MSG(kvp_commit(c, 1, t, 48, &stored), KVP_EINVAL,
               "tokens[16..32) differ from the acquired prompt");
    cr_assert_eq(stored, 77);
    /* The first differing block is named, also when a later one differs too. */
    t[40] = 999;
    EXPECT_MSG(kvp_commit(c, 1, t, 48, &stored), KVP_EINVAL,
               "tokens[16..32) differ from the acquired prompt");
    /* After a chunked commit of block 0, the next differing block is counted from 0 too. */
    t[20] = toks[20];
    cr_assert_eq(kvp_commit(c, 1, t, 16, &stored), KVP_OK);
    EXPECT_MSG(kvp_commit(c, 1, t, 48, &stored), KVP_EINVAL,
               "tokens[32..48) differ from the acquired prompt");
    TH_CHECK(c);

    /* The prompt's partial last block: its own range, up to the prompt's end. */
    uint32_t u[40];
    memcpy(u, toks, sizeof u);
    th_acquire_ok(c, 2, &ns, u, 40, 48);
    u[35] = 999;
    EXPECT_MSG(kvp_commit(c, 2, u, 40, &stored), KVP_EINVAL,
               "tokens[32..40) differ from the acquired prompt");
    kvp_cache_free(c);
}

Test(errmsg, cache_new_n_blocks_zero)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    kvp_cache *c = NULL;
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL, "n_blocks must be at least 1");
    cr_assert_null(c);
}

Test(errmsg, metrics_reserved_label)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    char buf[4096];
    size_t n = 5;
    kvp_label l[] = {{"model", "m"}, {"state", "x"}};
    EXPECT_MSG(kvp_cache_metrics(c, l, 2, buf, sizeof buf, &n), KVP_EINVAL,
               "label name 'state' is reserved");
    cr_assert_eq(n, 5);
    kvp_cache_free(c);
}

/* ------------------------------------------------------------------ every argument check */

Test(errmsg, cache_new_arguments)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 8;
    kvp_cache *c = NULL;
    EXPECT_MSG(kvp_cache_new(NULL, &c), KVP_EINVAL, "cfg is NULL");
    EXPECT_MSG(kvp_cache_new(&cfg, NULL), KVP_EINVAL, "out is NULL");
    cfg.n_blocks = UINT32_C(0x40000001);
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL,
               "n_blocks is 1073741825, above the largest pool, 2^30");
    cfg.n_blocks = 8;
    cfg.block_size = 0;
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL, "block_size is 0, outside 1..65536");
    cfg.block_size = KVP_MAX_BLOCK_SIZE + 1;
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL, "block_size is 65537, outside 1..65536");
    cfg.block_size = 16;
    cfg.hash_profile = 9;
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL,
               "hash_profile is 9, not a KVP_HASH_* profile (1..5)");
    cfg.hash_profile = KVP_HASH_KEYED;
    cfg.hash_key_len = 8;
    EXPECT_MSG(kvp_cache_new(&cfg, &c), KVP_EINVAL,
               "hash_key_len is 8: 0 (a random key) or 16..32 bytes");
    cr_assert_null(c);
}

Test(errmsg, cache_new_out_of_memory)
{
    th_alloc a;
    th_alloc_init(&a);
    kvp_config cfg = th_config(8, 4, false, NULL, NULL);
    cfg.alloc = th_alloc_hooks(&a);
    kvp_cache *c = NULL;
    th_alloc_arm(&a, 0);
    EXPECT_PREFIX(kvp_cache_new(&cfg, &c), KVP_ENOMEM, "out of memory: the cache record (");
    th_alloc_arm(&a, 1);
    EXPECT_PREFIX(kvp_cache_new(&cfg, &c), KVP_ENOMEM, "out of memory: the pool of 8 blocks");
    cr_assert_null(c);
}

Test(errmsg, null_cache_and_busy)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_match m;
    kvp_stats s;
    EXPECT_MSG(kvp_lookup(NULL, &ns, toks, 4, NULL, 0, &m), KVP_EINVAL, "cache is NULL");
    EXPECT_MSG(kvp_cache_stats(NULL, &s), KVP_EINVAL, "cache is NULL");
    EXPECT_MSG(kvp_release(NULL, 1), KVP_EINVAL, "cache is NULL");
    kvp_key root, keys[4];
    size_t n;
    EXPECT_MSG(kvp_cache_keys(NULL, &ns, toks, 4, &root, keys, 4, &n), KVP_EINVAL, "cache is NULL");
}

/* A callback that calls its own cache and keeps the detail it saw. */
typedef struct busy_probe {
    kvp_cache *self; /* the cache whose callback this is */
    int rc;          /* what kvp_cache_stats returned inside the callback */
    char msg[256];   /* kvp_errmsg() right after it */
} busy_probe;

static void busy_cb(void *ud, const kvp_event *ev)
{
    busy_probe *p = ud;
    (void)ev;
    kvp_stats s;
    p->rc = kvp_cache_stats(p->self, &s);
    snprintf(p->msg, sizeof p->msg, "%s", kvp_errmsg());
}

Test(errmsg, busy_inside_callback)
{
    busy_probe p = {0};
    kvp_cache *c = th_cache(8, 4, false, busy_cb, &p);
    p.self = c;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_access_ok(c, &ns, toks, 8);
    cr_assert_eq(p.rc, KVP_EBUSY);
    cr_assert_str_eq(p.msg, "called from inside this cache's own event callback");
    kvp_cache_free(c);
}

Test(errmsg, prompt_arguments)
{
    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    kvp_namespace ns, bad;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t bid[4];
    kvp_match m;
    EXPECT_MSG(kvp_lookup(c, NULL, toks, 4, NULL, 0, &m), KVP_EINVAL, "ns is NULL");
    const char *names[] = {"model", "adapter", "tenant", "salt"};
    for (int f = 0; f < 4; f++) {
        kvp_namespace_init(&bad);
        kvp_field *bf = f == 0   ? &bad.model
                        : f == 1 ? &bad.adapter
                        : f == 2 ? &bad.tenant
                                 : &bad.salt;
        bf->len = 3;
        char want[128];
        snprintf(want, sizeof want, "ns->%s.ptr is NULL but ns->%s.len is 3", names[f], names[f]);
        EXPECT_MSG(kvp_lookup(c, &bad, toks, 4, NULL, 0, &m), KVP_EINVAL, want);
    }
    EXPECT_MSG(kvp_lookup(c, &ns, NULL, 4, NULL, 0, &m), KVP_EINVAL, "tokens is NULL");
    EXPECT_MSG(kvp_lookup(c, &ns, toks, 0, NULL, 0, &m), KVP_EINVAL,
               "n_tokens is 0: a prompt has at least one token");
    EXPECT_MSG(kvp_lookup(c, &ns, toks, 4, NULL, 2, &m), KVP_EINVAL,
               "block_ids is NULL but cap is 2");
    EXPECT_MSG(kvp_lookup(c, &ns, toks, 4, bid, 2, NULL), KVP_EINVAL, "out is NULL");

    EXPECT_MSG(kvp_acquire(c, 1, &ns, NULL, 4, 0, &m), KVP_EINVAL, "tokens is NULL");
    EXPECT_MSG(kvp_acquire(c, 1, &ns, toks, 0, 8, &m), KVP_EINVAL,
               "n_tokens is 0: a prompt has at least one token");
    EXPECT_MSG(kvp_acquire(c, 1, &ns, toks, 4, 0, NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_access(c, &ns, toks, 4, NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_access(c, &ns, NULL, 4, &m), KVP_EINVAL, "tokens is NULL");

    kvp_key ids[3] = {{1, 1}, {2, 2}, {3, 3}};
    EXPECT_MSG(kvp_lookup_ids(c, &ns, NULL, 2, 4, NULL, 0, &m), KVP_EINVAL, "ids is NULL");
    EXPECT_MSG(kvp_lookup_ids(c, &ns, ids, 1, 4, NULL, 0, &m), KVP_EINVAL,
               "n_ids is 1: n_tokens 4 in blocks of 2 takes 2 ids");
    EXPECT_MSG(kvp_access_ids(c, &ns, ids, 1, 5, &m), KVP_EINVAL,
               "n_ids is 1: n_tokens 5 in blocks of 2 takes 2 ids, or 3 with the partial last "
               "block");
    EXPECT_MSG(kvp_access_ids(c, &ns, ids, 2, 4, NULL), KVP_EINVAL, "out is NULL");

    /* The *_keys forms: keys required when there are full blocks. */
    kvp_key root = {0, 0};
    EXPECT_MSG(kvp_lookup_keys(c, &ns, root, NULL, toks, 4, NULL, 0, &m), KVP_EINVAL,
               "keys is NULL but the prompt has 2 full blocks");
    EXPECT_MSG(kvp_acquire_keys(c, 1, &ns, root, ids, NULL, 4, 0, &m), KVP_EINVAL,
               "tokens is NULL: the prompt is kept to check later commits");
    kvp_cache_free(c);
}

Test(errmsg, verify_cache_arguments)
{
    kvp_cache *c = th_cache(8, 2, true, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_key ids[2] = {{1, 1}, {2, 2}}, root = {0, 0};
    kvp_match m;
    EXPECT_MSG(kvp_lookup_ids(c, &ns, ids, 2, 4, NULL, 0, &m), KVP_EINVAL,
               "external ids cannot be verified: the cache has verify_tokens");
    EXPECT_MSG(kvp_access_ids(c, &ns, ids, 2, 4, &m), KVP_EINVAL,
               "external ids cannot be verified: the cache has verify_tokens");
    EXPECT_MSG(kvp_lookup_keys(c, &ns, root, ids, NULL, 4, NULL, 0, &m), KVP_EINVAL,
               "tokens is NULL: a verify_tokens cache verifies every match against them");
    kvp_cache_free(c);
}

Test(errmsg, request_arguments)
{
    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_match m;
    size_t n = 9;
    const uint32_t *tab;
    uint64_t ids[4];
    EXPECT_MSG(kvp_grow(c, 5, 10), KVP_ENOENT, "req_id 5 is not an active request");
    EXPECT_MSG(kvp_release(c, 6), KVP_ENOENT, "req_id 6 is not an active request");
    EXPECT_MSG(kvp_commit(c, 7, toks, 4, NULL), KVP_ENOENT, "req_id 7 is not an active request");
    EXPECT_MSG(kvp_request_blocks(c, 8, &tab, &n), KVP_ENOENT, "req_id 8 is not an active request");
    EXPECT_MSG(kvp_request_blocks(c, 1, NULL, &n), KVP_EINVAL, "ids is NULL");
    EXPECT_MSG(kvp_request_blocks(c, 1, &tab, NULL), KVP_EINVAL, "n is NULL");
    EXPECT_MSG(kvp_cache_requests(c, ids, 4, NULL), KVP_EINVAL, "n_active is NULL");
    EXPECT_MSG(kvp_cache_requests(c, NULL, 4, &n), KVP_EINVAL, "ids is NULL but cap is 4");
    EXPECT_MSG(kvp_cache_stats(c, NULL), KVP_EINVAL, "out is NULL");

    th_acquire_ok(c, 1, &ns, toks, 5, 0); /* 3 blocks of 2 */
    EXPECT_MSG(kvp_acquire(c, 1, &ns, toks, 5, 0, &m), KVP_EEXIST,
               "req_id 1 is already an active request");
    EXPECT_MSG(kvp_acquire(c, 2, &ns, toks, 4, 17, &m), KVP_ETOOBIG,
               "17 tokens take 9 blocks of 2, more than the pool's 8");
    EXPECT_MSG(kvp_acquire(c, 2, &ns, toks, 4, 12, &m), KVP_ENOSPC,
               "the request needs 6 fresh blocks; 5 of the pool's 8 are free or evictable, the "
               "rest are pinned");
    EXPECT_MSG(kvp_grow(c, 1, 17), KVP_ETOOBIG,
               "n_capacity 17 takes 9 blocks of 2, more than the pool's 8");
    th_acquire_ok(c, 2, &ns, toks, 4, 0); /* 2 more blocks pinned: 3 left */
    EXPECT_MSG(kvp_grow(c, 1, 16), KVP_ENOSPC,
               "n_capacity 16 needs 5 more blocks; 3 of the pool's 8 are free or evictable, the "
               "rest are pinned");

    EXPECT_MSG(kvp_commit(c, 1, NULL, 4, NULL), KVP_EINVAL, "tokens is NULL but n_tokens is 4");
    EXPECT_MSG(kvp_commit(c, 1, toks, 8, NULL), KVP_ERANGE,
               "n_tokens is 8: 4 full blocks, more than the 3 the request holds");
    cr_assert_eq(kvp_commit(c, 1, toks, 4, NULL), KVP_OK);
    EXPECT_MSG(kvp_commit(c, 1, toks, 3, NULL), KVP_EINVAL,
               "n_tokens is 3, fewer than the request's 2 committed blocks of 2 tokens");
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(errmsg, overflowing_counts)
{
    kvp_cache *c = th_cache(16, 1, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_acquire_ok(c, 1, &ns, toks, 4, 0);
    char want[160];
    snprintf(want, sizeof want, "n_capacity %zu takes 2^32 - 1 or more blocks of 1",
             (size_t)SIZE_MAX);
    EXPECT_MSG(kvp_grow(c, 1, SIZE_MAX), KVP_EOVERFLOW, want);
#if SIZE_MAX > UINT32_MAX
    kvp_match m;
    EXPECT_MSG(kvp_lookup(c, &ns, toks, (size_t)UINT32_MAX + 1, NULL, 0, &m), KVP_EOVERFLOW,
               "n_tokens is 4294967296: 4294967296 full blocks of 1, 2^32 - 1 or more");
    snprintf(want, sizeof want,
             "%zu tokens (n_capacity %zu, n_tokens 4) take 2^32 - 1 or more blocks of 1",
             (size_t)UINT32_MAX + 1, (size_t)UINT32_MAX + 1);
    EXPECT_MSG(kvp_acquire(c, 2, &ns, toks, 4, (size_t)UINT32_MAX + 1, &m), KVP_EOVERFLOW, want);
#endif
    kvp_cache_free(c);
}

Test(errmsg, token_and_profile_refusals)
{
    kvp_config cfg = th_config(8, 4, false, NULL, NULL);
    cfg.vocab_size = 100;
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[8] = {1, 2, 100, 3, 4, 500, 6, 7};
    kvp_match m;
    EXPECT_MSG(kvp_lookup(c, &ns, t, 8, NULL, 0, &m), KVP_ETOKEN,
               "tokens[2] is 100, not below vocab_size 100");
    kvp_cache_free(c);

    cfg = th_config(8, 4, false, NULL, NULL);
    cfg.hash_profile = KVP_HASH_VLLM_SHA256;
    c = th_cache_new(&cfg);
    EXPECT_MSG(kvp_lookup(c, &ns, toks, 8, NULL, 0, &m), KVP_ENOTSUP,
               "ns->model is set: vllm-sha256-cbor keys carry no model name");
    kvp_namespace vns;
    th_ns(&vns, NULL, NULL, NULL, NULL);
    vns.salt.ptr = "";
    EXPECT_MSG(kvp_access(c, &vns, toks, 8, &m), KVP_ENOTSUP,
               "ns->salt is empty: vLLM drops an empty cache_salt, so vllm-sha256-cbor keys "
               "cannot tell it from an absent one");
    th_ns(&vns, NULL, "\xff", NULL, NULL);
    EXPECT_MSG(kvp_access(c, &vns, toks, 8, &m), KVP_ENOTSUP,
               "ns->adapter is not UTF-8: vllm-sha256-cbor keys encode it as text");
    kvp_cache_free(c);
}

Test(errmsg, quota_arguments)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    EXPECT_MSG(kvp_cache_set_quota(c, &ns, 2), KVP_EINVAL,
               "quotas are off: the cache was made with ns_quota 0");
    EXPECT_MSG(kvp_cache_set_quota(c, NULL, 2), KVP_EINVAL, "ns is NULL");
    kvp_cache_free(c);
}

Test(errmsg, key_arguments)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_key k, keys[4], root = {0, 0};
    size_t n;
    EXPECT_MSG(kvp_namespace_key(0, &ns, NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_namespace_key(0, NULL, &k), KVP_EINVAL, "ns is NULL");
    EXPECT_MSG(kvp_hash_blocks(0, root, toks, 4, 2, keys, 4, NULL), KVP_EINVAL, "n_keys is NULL");
    EXPECT_MSG(kvp_hash_blocks(0, root, NULL, 4, 2, keys, 4, &n), KVP_EINVAL,
               "tokens is NULL but n_tokens is 4");
    EXPECT_MSG(kvp_hash_blocks(0, root, toks, 4, 2, NULL, 4, &n), KVP_EINVAL,
               "keys is NULL but cap is 4");
    EXPECT_MSG(kvp_hash_blocks(0, root, toks, 4, 0, keys, 4, &n), KVP_EINVAL,
               "block_size is 0, outside 1..65536");

    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    EXPECT_MSG(kvp_cache_keys(c, &ns, toks, 4, NULL, keys, 4, &n), KVP_EINVAL, "root is NULL");
    EXPECT_MSG(kvp_cache_keys(c, &ns, toks, 4, &root, keys, 4, NULL), KVP_EINVAL, "n_keys is NULL");
    EXPECT_MSG(kvp_cache_keys(c, &ns, NULL, 4, &root, keys, 4, &n), KVP_EINVAL,
               "tokens is NULL but n_tokens is 4");
    EXPECT_MSG(kvp_cache_keys(c, &ns, toks, 4, &root, NULL, 4, &n), KVP_EINVAL,
               "keys is NULL but cap is 4");
    EXPECT_MSG(kvp_cache_keys(c, NULL, toks, 4, &root, keys, 4, &n), KVP_EINVAL, "ns is NULL");
    kvp_cache_free(c);
}

Test(errmsg, hasher_arguments)
{
    int p;
    EXPECT_MSG(kvp_hash_profile_parse(NULL, &p), KVP_EINVAL, "name is NULL");
    EXPECT_MSG(kvp_hash_profile_parse("xxh3", NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_hash_profile_parse("md5", &p), KVP_EINVAL,
               "unknown hash profile 'md5': keyed, xxh3, siphash, vllm-sha256-cbor or "
               "vllm-xxhash-cbor");
    /* Caller bytes never break the one-line text. */
    EXPECT_MSG(kvp_hash_profile_parse("a\nb", &p), KVP_EINVAL,
               "unknown hash profile 'a?b': keyed, xxh3, siphash, vllm-sha256-cbor or "
               "vllm-xxhash-cbor");

    kvp_config cfg = th_config(8, 4, false, NULL, NULL);
    kvp_hasher *h = NULL;
    EXPECT_MSG(kvp_hasher_new(NULL, &h), KVP_EINVAL, "cfg is NULL");
    EXPECT_MSG(kvp_hasher_new(&cfg, NULL), KVP_EINVAL, "out is NULL");
    cfg.block_size = 0;
    EXPECT_MSG(kvp_hasher_new(&cfg, &h), KVP_EINVAL, "block_size is 0, outside 1..65536");
    cfg.block_size = 4;
    cr_assert_eq(kvp_hasher_new(&cfg, &h), KVP_OK);

    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_chain chain, out[4];
    size_t n;
    EXPECT_MSG(kvp_hasher_root(NULL, &ns, &chain), KVP_EINVAL, "h is NULL");
    EXPECT_MSG(kvp_hasher_root(h, &ns, NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_hasher_root(h, NULL, &chain), KVP_EINVAL, "ns is NULL");
    cr_assert_eq(kvp_hasher_root(h, &ns, &chain), KVP_OK);
    EXPECT_MSG(kvp_hasher_blocks(NULL, &ns, &chain, toks, 8, out, 4, &n), KVP_EINVAL, "h is NULL");
    EXPECT_MSG(kvp_hasher_blocks(h, &ns, NULL, toks, 8, out, 4, &n), KVP_EINVAL, "chain is NULL");
    EXPECT_MSG(kvp_hasher_blocks(h, &ns, &chain, toks, 8, out, 4, NULL), KVP_EINVAL,
               "n_out is NULL");
    EXPECT_MSG(kvp_hasher_blocks(h, &ns, &chain, NULL, 8, out, 4, &n), KVP_EINVAL,
               "tokens is NULL but n_tokens is 8");
    EXPECT_MSG(kvp_hasher_blocks(h, &ns, &chain, toks, 8, NULL, 4, &n), KVP_EINVAL,
               "out is NULL but cap is 4");
    kvp_hasher_free(h);
}

Test(errmsg, metrics_arguments)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    char buf[4096];
    size_t n;
    EXPECT_MSG(kvp_cache_metrics(NULL, NULL, 0, buf, sizeof buf, &n), KVP_EINVAL, "cache is NULL");
    EXPECT_MSG(kvp_cache_metrics(c, NULL, 0, buf, sizeof buf, NULL), KVP_EINVAL, "n_out is NULL");
    EXPECT_MSG(kvp_cache_metrics(c, NULL, 0, NULL, 10, &n), KVP_EINVAL,
               "buf is NULL but cap is 10");
    EXPECT_MSG(kvp_cache_metrics(c, NULL, 2, buf, sizeof buf, &n), KVP_EINVAL,
               "labels is NULL but n_labels is 2");
    struct {
        kvp_label l[2];
        const char *want;
    } cases[] = {
        {{{"a", "1"}, {NULL, "v"}}, "labels[1].name is NULL"},
        {{{"a", "1"}, {"b", NULL}}, "labels[1].value is NULL"},
        {{{"a", "1"}, {"", "v"}}, "labels[1].name is empty"},
        {{{"__x", "1"}, {"b", "v"}}, "labels[0].name begins with '__', reserved by Prometheus"},
        {{{"a-b", "1"}, {"b", "v"}},
         "labels[0].name has byte 0x2d at 1 (after 'a'): names match [a-zA-Z_][a-zA-Z0-9_]*"},
        {{{"1a", "1"}, {"b", "v"}},
         "labels[0].name has byte 0x31 at 0 (after ''): names match [a-zA-Z_][a-zA-Z0-9_]*"},
        {{{"a", "ok\xe2\x82"}, {"b", "v"}},
         "labels[0].value (label 'a') is not UTF-8: byte 0xe2 at 2"},
        {{{"a", "1"}, {"a", "2"}}, "label name 'a' appears twice: labels[0] and [1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        EXPECT_MSG(kvp_cache_metrics(c, cases[i].l, 2, buf, sizeof buf, &n), KVP_EINVAL,
                   cases[i].want);
    size_t need;
    cr_assert_eq(kvp_cache_metrics(c, NULL, 0, NULL, 0, &need), KVP_ENOSPC);
    char want[128];
    snprintf(want, sizeof want, "cap is 10 bytes; the text and its NUL take %zu", need);
    EXPECT_MSG(kvp_cache_metrics(c, NULL, 0, buf, 10, &n), KVP_ENOSPC, want);
    kvp_cache_free(c);
}

/* A nested public call's detail is the outer call's: kvp_cache_metrics inside a callback of
 * the same cache fails in its kvp_cache_stats, and says why. */
static void metrics_cb(void *ud, const kvp_event *ev)
{
    busy_probe *p = ud;
    (void)ev;
    char buf[64];
    size_t n;
    p->rc = kvp_cache_metrics(p->self, NULL, 0, buf, sizeof buf, &n);
    snprintf(p->msg, sizeof p->msg, "%s", kvp_errmsg());
}

Test(errmsg, metrics_keeps_the_nested_detail)
{
    busy_probe p = {0};
    kvp_cache *c = th_cache(8, 4, false, metrics_cb, &p);
    p.self = c;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_access_ok(c, &ns, toks, 8);
    cr_assert_eq(p.rc, KVP_EBUSY);
    cr_assert_str_eq(p.msg, "called from inside this cache's own event callback");
    kvp_cache_free(c);
}

Test(errmsg, check_names_the_invariant)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    c->pool.n_free--; /* the free list now holds one block more than the count says */
    EXPECT_PREFIX(kvp_cache_check(c), KVP_ECORRUPT, "invariant violated in kvp__pool_check: ");
    c->pool.n_free++;
    TH_CHECK(c);
    kvp_cache_free(c);
}

/* ------------------------------------------------------------------ the buffer's rules */

static void *first_errmsg(void *arg)
{
    (void)arg;
    return (void *)kvp_errmsg();
}

Test(errmsg, empty_before_the_first_failure)
{
    pthread_t t;
    void *msg;
    cr_assert_eq(pthread_create(&t, NULL, first_errmsg, NULL), 0);
    cr_assert_eq(pthread_join(t, &msg), 0);
    cr_assert_not_null(msg);
    cr_assert_eq(((const char *)msg)[0], '\0', "a new thread's detail is not empty");
}

Test(errmsg, no_stale_detail)
{
    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_match m;
    EXPECT_MSG(kvp_lookup(c, &ns, toks, 0, NULL, 0, &m), KVP_EINVAL,
               "n_tokens is 0: a prompt has at least one token");
    /* A success leaves the detail as it was (errno's rule)... */
    th_lookup_ok(c, &ns, toks, 4);
    th_acquire_ok(c, 3, &ns, toks, 4, 0);
    cr_assert_str_eq(kvp_errmsg(), "n_tokens is 0: a prompt has at least one token");
    /* ...and the next failure, of another kind or the same code, replaces it. */
    EXPECT_MSG(kvp_release(c, 4), KVP_ENOENT, "req_id 4 is not an active request");
    EXPECT_MSG(kvp_acquire(c, 1, &ns, toks, 4, 0, NULL), KVP_EINVAL, "out is NULL");
    EXPECT_MSG(kvp_acquire(c, 1, &ns, NULL, 4, 0, &m), KVP_EINVAL, "tokens is NULL");
    kvp_cache_free(c);
}

/* The fallback: a public exit whose path wrote no detail gets kvp_strerror(code), never the
 * previous failure's text. No library path lacks a detail (the tests above visit each), so
 * the internals are driven directly, as a public exit would. */
Test(errmsg, fallback_is_the_code_text)
{
    cr_assert_eq(kvp__fail_done(kvp__fail(KVP_EINVAL, "first detail %d", 1)), KVP_EINVAL);
    cr_assert_str_eq(kvp_errmsg(), "first detail 1");
    cr_assert_eq(kvp__fail_done(KVP_ENOMEM), KVP_ENOMEM);
    cr_assert_str_eq(kvp_errmsg(), kvp_strerror(KVP_ENOMEM));
    cr_assert_eq(kvp__fail_done(kvp__fail(KVP_EINVAL, "second")), KVP_EINVAL);
    cr_assert_eq(kvp__fail_done(KVP_EINVAL), KVP_EINVAL);
    cr_assert_str_eq(kvp_errmsg(), kvp_strerror(KVP_EINVAL));
    /* kvp__public passes successes through without touching the detail. */
    cr_assert_eq(kvp__public(KVP_OK), KVP_OK);
    cr_assert_eq(kvp__public(3), 3);
    cr_assert_str_eq(kvp_errmsg(), kvp_strerror(KVP_EINVAL));
    /* A detail longer than the buffer is cut, NUL-terminated. */
    char longname[600];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cr_assert_eq(kvp__fail_done(kvp__fail(KVP_EINVAL, "%s", longname)), KVP_EINVAL);
    cr_assert_eq(strlen(kvp_errmsg()), 255);
}

/* Two threads share one cache and fail differently, over and over, with successes in
 * between; each must read its own detail after every failure. */
typedef struct racer {
    kvp_cache *cache;         /* shared */
    pthread_barrier_t *start; /* both begin together */
    int kind;                 /* 0: unknown request ids; 1: kvp_cache_new with n_blocks 0 */
    int n_wrong;              /* failures whose detail was not this thread's */
    char wrong[256];          /* the first wrong detail seen */
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    pthread_barrier_wait(r->start);
    for (int i = 0; i < 2000; i++) {
        char want[64];
        int rc;
        if (r->kind == 0) {
            uint64_t id = 1000 + (uint64_t)i;
            snprintf(want, sizeof want, "req_id %llu is not an active request",
                     (unsigned long long)id);
            rc = kvp_release(r->cache, id);
        } else {
            kvp_config cfg;
            kvp_config_init(&cfg);
            kvp_cache *c = NULL;
            snprintf(want, sizeof want, "n_blocks must be at least 1");
            rc = kvp_cache_new(&cfg, &c);
        }
        if (rc >= 0 || strcmp(kvp_errmsg(), want) != 0) {
            if (r->n_wrong++ == 0)
                snprintf(r->wrong, sizeof r->wrong, "rc %d, \"%s\" for \"%s\"", rc, kvp_errmsg(),
                         want);
        }
        kvp_match m;
        if (kvp_lookup(r->cache, &ns, toks, 8, NULL, 0, &m) != KVP_OK) /* a success between */
            r->n_wrong++;
    }
    return NULL;
}

Test(errmsg, threads_each_see_their_own)
{
    kvp_cache *c = th_cache(64, 4, false, NULL, NULL);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    racer r[2] = {{c, &start, 0, 0, ""}, {c, &start, 1, 0, ""}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(r[i].n_wrong, 0, "thread %d: %d wrong details, first %s", i, r[i].n_wrong,
                     r[i].wrong);
    /* This thread (a fresh Criterion worker) failed nowhere: theirs did not reach it. */
    cr_assert_str_eq(kvp_errmsg(), "");
    kvp_cache_free(c);
}
