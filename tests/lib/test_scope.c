/*
 * test_scope.c - quota scopes (kvp_config.quota_scope): quotas that a tenant cannot slip
 * out of by choosing its cache salt, adapter or model (docs/security.md section 5, attack
 * table rows A13 and A14).
 *
 * The attack: per-namespace quotas give every namespace a quota of its own, and the threat
 * model lets a tenant choose its salt (often its adapter). A 256-block pool with a quota of
 * 8 fits 32 namespaces; an attacker that spreads its traffic over 50 salts holds 400
 * blocks' worth of quota, the pool falls back to its shared LRU order, and the victim's 8
 * blocks are evicted: the eviction lever and prime+probe of section 5 are open again. With
 * KVP_QUOTA_SCOPE_TENANT every salt, adapter and model of one tenant shares one quota, so
 * the quotas are counted per tenant, which the deployment controls. The figures (victim's
 * blocks kept, of 8):
 *
 *                        1 salt   50 salts   50 salts x 5 adapters x 2 models
 *   scope NAMESPACE         8         0         0      (the leak: the reason for scopes)
 *   scope TENANT            8         8         8
 *
 * Also: the scope key ignores the fields outside the scope (kvp_cache_set_quota through any
 * of a tenant's namespaces sets the one quota), the model scope, the configuration checks,
 * and kvp__quota_check catching each corruption of the per-scope counts.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

#define POOL  256
#define QUOTA 8

static kvp_cache *scope_cache(uint32_t n_blocks, uint32_t ns_quota, int scope, bool verify)
{
    kvp_config cfg = th_config(n_blocks, 1, verify, NULL, NULL);
    cfg.ns_quota = ns_quota;
    cfg.quota_scope = (uint8_t)scope;
    return th_cache_new(&cfg);
}

/* The attacker's namespace number i of a campaign over n_salts salts, n_adapters adapters
 * and n_models models (its tenant is fixed: the server sets it). */
static void attacker_ns(kvp_namespace *ns, char (*buf)[3][16], uint32_t i, uint32_t n_adapters,
                        uint32_t n_models)
{
    snprintf((*buf)[0], sizeof(*buf)[0], "m%u", (unsigned)(i % n_models));
    snprintf((*buf)[1], sizeof(*buf)[1], "lora%u", (unsigned)(i % n_adapters));
    snprintf((*buf)[2], sizeof(*buf)[2], "salt%u", (unsigned)i);
    th_ns(ns, n_models > 1 ? (*buf)[0] : "m0", n_adapters > 1 ? (*buf)[1] : NULL, "mallory",
          (*buf)[2]);
}

/* The victim caches QUOTA one-token blocks; the attacker then fills QUOTA blocks in each
 * of n_salts namespaces (salt i, adapter i mod n_adapters, model i mod n_models), twice
 * over with fresh blocks. Returns how many of the victim's blocks are still cached. */
static uint32_t salt_attack(int scope, uint32_t n_salts, uint32_t n_adapters, uint32_t n_models,
                            bool verify)
{
    kvp_cache *c = scope_cache(POOL, QUOTA, scope, verify);
    kvp_namespace victim;
    th_ns(&victim, "m0", NULL, "alice", "alice-salt");
    uint32_t t[1];
    for (uint32_t k = 0; k < QUOTA; k++) {
        t[0] = 100 + k;
        th_access_ok(c, &victim, t, 1);
    }
    for (uint32_t round = 0; round < 2; round++) {
        for (uint32_t i = 0; i < n_salts; i++) {
            kvp_namespace ns;
            char buf[3][16];
            attacker_ns(&ns, &buf, i, n_adapters, n_models);
            for (uint32_t k = 0; k < QUOTA; k++) {
                t[0] = 10000 + round * 1000 + k;
                th_access_ok(c, &ns, t, 1);
            }
        }
    }
    TH_CHECK(c);
    uint32_t kept = 0;
    for (uint32_t k = 0; k < QUOTA; k++) {
        t[0] = 100 + k;
        kept += th_lookup_ok(c, &victim, t, 1).n_blocks_cached;
    }
    kvp_cache_free(c);
    return kept;
}

Test(scope, fifty_salts_leak_per_namespace_not_per_tenant)
{
    uint32_t ns1 = salt_attack(KVP_QUOTA_SCOPE_NAMESPACE, 1, 1, 1, false);
    uint32_t ns50 = salt_attack(KVP_QUOTA_SCOPE_NAMESPACE, 50, 1, 1, false);
    uint32_t t1 = salt_attack(KVP_QUOTA_SCOPE_TENANT, 1, 1, 1, false);
    uint32_t t50 = salt_attack(KVP_QUOTA_SCOPE_TENANT, 50, 1, 1, false);
    cr_log_info("victim keeps, of %u: scope namespace 1 salt %u, 50 salts %u; scope tenant "
                "1 salt %u, 50 salts %u",
                QUOTA, ns1, ns50, t1, t50);
    cr_assert_eq(ns1, QUOTA, "one salt: per-namespace quotas hold (%u of %u)", ns1, QUOTA);
    cr_assert_eq(ns50, 0, "50 salts: per-namespace quotas are expected to leak (%u of %u)", ns50,
                 QUOTA);
    cr_assert_eq(t1, QUOTA, "tenant scope, one salt: %u of %u", t1, QUOTA);
    cr_assert_eq(t50, QUOTA, "tenant scope, 50 salts: %u of %u", t50, QUOTA);
}

Test(scope, salts_adapters_and_models_together)
{
    cr_assert_eq(salt_attack(KVP_QUOTA_SCOPE_NAMESPACE, 50, 5, 2, false), 0, "control");
    cr_assert_eq(salt_attack(KVP_QUOTA_SCOPE_TENANT, 50, 5, 2, false), QUOTA);
    cr_assert_eq(salt_attack(KVP_QUOTA_SCOPE_TENANT, 50, 5, 2, true), QUOTA, "verify on");
    /* The model scope is not tenant isolation: one model's tenants share its quota. */
    cr_assert_eq(salt_attack(KVP_QUOTA_SCOPE_MODEL, 50, 1, 1, false), 0);
}

/* Prime and probe over salts: the attacker primes QUOTA blocks under salt 0, fills n - 1
 * more salts so that the pool is exactly full, lets the victim run 40 accesses (or not),
 * and counts the hits of its primed blocks. */
static uint32_t prime_probe(int scope, bool victim_active)
{
    kvp_cache *c = scope_cache(POOL, QUOTA, scope, false);
    kvp_namespace victim;
    th_ns(&victim, "m0", NULL, "alice", NULL);
    uint32_t t[1];
    for (uint32_t i = 0; i < POOL / QUOTA; i++) {
        kvp_namespace ns;
        char buf[3][16];
        attacker_ns(&ns, &buf, i, 1, 1);
        for (uint32_t k = 0; k < QUOTA; k++) {
            t[0] = 10000 + i * QUOTA + k;
            th_access_ok(c, &ns, t, 1);
        }
    }
    for (uint32_t k = 0; victim_active && k < 40; k++) {
        t[0] = 500 + k;
        th_access_ok(c, &victim, t, 1);
    }
    uint32_t hits = 0;
    kvp_namespace ns0;
    char buf[3][16];
    attacker_ns(&ns0, &buf, 0, 1, 1);
    for (uint32_t k = 0; k < QUOTA; k++) {
        t[0] = 10000 + k;
        hits += th_lookup_ok(c, &ns0, t, 1).n_blocks_cached;
    }
    TH_CHECK(c);
    kvp_cache_free(c);
    return hits;
}

Test(scope, prime_and_probe_over_salts)
{
    cr_assert_neq(prime_probe(KVP_QUOTA_SCOPE_NAMESPACE, true),
                  prime_probe(KVP_QUOTA_SCOPE_NAMESPACE, false),
                  "control: per-namespace quotas over 32 salts should leak the victim's activity");
    cr_assert_eq(prime_probe(KVP_QUOTA_SCOPE_TENANT, true),
                 prime_probe(KVP_QUOTA_SCOPE_TENANT, false));
}

/* kvp_cache_set_quota through any namespace of a tenant sets the tenant's one quota, and
 * every namespace of the tenant counts against it. */
Test(scope, set_quota_ignores_fields_outside_the_scope)
{
    kvp_cache *c = scope_cache(64, QUOTA, KVP_QUOTA_SCOPE_TENANT, false);
    kvp_namespace a1, a2, b;
    th_ns(&a1, "m", NULL, "alice", "s1");
    th_ns(&a2, "other-model", "lora", "alice", "s2");
    th_ns(&b, "m", NULL, "bob", "s1");
    cr_assert_eq(kvp_cache_set_quota(c, &a2, 3), KVP_OK);
    uint32_t t[1];
    for (uint32_t k = 0; k < 10; k++) {
        t[0] = 100 + k;
        th_access_ok(c, k % 2 ? &a1 : &a2, t, 1);
        th_access_ok(c, &b, t, 1);
        TH_CHECK(c);
    }
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 3 + QUOTA, "alice 3 (her quota), bob %u: %u cached", QUOTA,
                 s.n_blocks_cached);
    cr_assert_eq(HASH_COUNT(c->quota.by_root), 2, "one group per tenant");
    /* Lowering it through a third namespace of alice's evicts her least recent at once. */
    kvp_namespace a3;
    th_ns(&a3, NULL, NULL, "alice", NULL);
    cr_assert_eq(kvp_cache_set_quota(c, &a3, 1), KVP_OK);
    cr_assert_eq(th_stats(c).n_blocks_cached, 1 + QUOTA);
    t[0] = 109; /* the most recent, through a1 */
    cr_assert_eq(th_lookup_ok(c, &a1, t, 1).n_blocks_cached, 1);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(scope, model_scope_groups_by_model)
{
    kvp_cache *c = scope_cache(64, 4, KVP_QUOTA_SCOPE_MODEL, false);
    kvp_namespace m1a, m1b, m2;
    th_ns(&m1a, "m1", NULL, "alice", NULL);
    th_ns(&m1b, "m1", "lora", "bob", "s");
    th_ns(&m2, "m2", NULL, "alice", NULL);
    uint32_t t[1];
    for (uint32_t k = 0; k < 8; k++) {
        t[0] = 100 + k;
        th_access_ok(c, &m1a, t, 1);
        th_access_ok(c, &m1b, t, 1);
        th_access_ok(c, &m2, t, 1);
    }
    cr_assert_eq(th_stats(c).n_blocks_cached, 8, "4 for m1 (two tenants), 4 for m2");
    cr_assert_eq(HASH_COUNT(c->quota.by_root), 2);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(scope, config)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cr_assert_eq(cfg.quota_scope, KVP_QUOTA_SCOPE_NAMESPACE, "the default is today's behaviour");
    cfg.n_blocks = 8;
    kvp_cache *c = NULL;
    cfg.quota_scope = KVP_QUOTA_SCOPE_TENANT;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "a scope with quotas off");
    cr_assert_null(c);
    cfg.ns_quota = 2;
    cfg.quota_scope = KVP_QUOTA_SCOPE_MODEL + 1;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "an unknown scope");
    cr_assert_null(c);
    cr_assert(strstr(kvp_errmsg(), "quota_scope") != NULL, "%s", kvp_errmsg());
    for (int s = KVP_QUOTA_SCOPE_NAMESPACE; s <= KVP_QUOTA_SCOPE_MODEL; s++) {
        cfg.quota_scope = (uint8_t)s;
        cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK, "scope %d", s);
        kvp_cache_free(c);
        c = NULL;
    }
    cfg.ns_quota = 0;
    cfg.quota_scope = KVP_QUOTA_SCOPE_NAMESPACE;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK, "quotas off, default scope");
    kvp_cache_free(c);
}

/* Each corruption of the per-scope counts is caught by kvp_cache_check, and undoing it makes
 * the cache consistent again: a reference count (a block pinned by a request counts
 * without being on any list, which the list walk alone cannot see), a pinned block filed
 * under another scope's group, a group filed under another key, a cached count. */
Test(checker, per_scope_counts)
{
    kvp_cache *c = scope_cache(32, 4, KVP_QUOTA_SCOPE_TENANT, false);
    kvp_namespace a1, a2, b;
    th_ns(&a1, "m", NULL, "alice", "s1");
    th_ns(&a2, "m", "lora", "alice", "s2");
    th_ns(&b, "m", NULL, "bob", NULL);
    uint32_t t[3] = {1, 2, 3};
    th_access_ok(c, &a1, t, 3);
    th_access_ok(c, &a2, t, 3);
    th_access_ok(c, &b, t, 1);
    uint32_t u[3] = {7, 8, 9};
    th_acquire_ok(c, 1, &b, u, 3, 0);
    cr_assert_eq(kvp_commit(c, 1, u, 3, NULL), KVP_OK); /* three pinned blocks of bob's */
    TH_CHECK(c);
    cr_assert_eq(HASH_COUNT(c->quota.by_root), 2, "two tenants, two groups");
    kvp__qgroup *ga = NULL, *gb = NULL;
    kvp_key ka = kvp__quota_key(c, &a1), kb = kvp__quota_key(c, &b);
    cr_assert(th_key_eq(ka, kvp__quota_key(c, &a2)), "alice's salts share one scope key");
    HASH_FIND(hh, c->quota.by_root, &ka, sizeof ka, ga);
    HASH_FIND(hh, c->quota.by_root, &kb, sizeof kb, gb);
    cr_assert(ga && gb && ga != gb);
    cr_assert_eq(ga->n_cached, 4, "alice: 6 blocks over two salts, quota 4");

    ga->refs++;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "a reference too many");
    ga->refs -= 2;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "a reference too few");
    ga->refs++;
    TH_CHECK(c);

    const kvp__request *req = kvp__request_find(c, 1);
    uint32_t pinned = req->blocks[0];
    cr_assert_eq(c->quota.group[pinned], gb);
    c->quota.group[pinned] = ga; /* a pinned block of bob's counted as alice's */
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "a pinned block under another scope");
    c->quota.group[pinned] = gb;
    TH_CHECK(c);

    kvp_key saved = ga->root;
    ga->root.lo ^= 1; /* filed under a key that is not its own */
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "a group under another key");
    ga->root = saved;
    TH_CHECK(c);

    gb->n_cached++;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "a cached count");
    gb->n_cached--;
    TH_CHECK(c);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    kvp_cache_free(c);
}
