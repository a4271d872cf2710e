/*
 * test_profiles.c - hash profiles (keyed, xxh3, siphash, vllm-sha256-cbor,
 * vllm-xxhash-cbor), the kvp_hasher API, the canonical CBOR encoder, vocab_size and the
 * refusal of namespaces a profile cannot express.
 *
 * The vLLM rows of docs/test-vectors.md (vLLM's hash_block_tokens, computed in Python)
 * are reproduced bit for bit: digest hex and event integer. The keyed and siphash profiles
 * are rebuilt independently from their byte layout (libsodium BLAKE2b/SipHash and
 * XXH3_128bits_withSecret called here directly), and pinned by fixed vectors. Every profile
 * is also run through a cache (access, acquire/commit across the hit boundary, lookup,
 * external ids), whose STORED keys must equal the hasher's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <xxhash.h>

#include "cbor.h"
#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

static const int all_profiles[] = {KVP_HASH_KEYED, KVP_HASH_XXH3, KVP_HASH_SIPHASH,
                                   KVP_HASH_VLLM_SHA256, KVP_HASH_VLLM_XXHASH};
#define N_PROFILES (sizeof all_profiles / sizeof all_profiles[0])

/* Fixed keyed/siphash vectors, also in docs/test-vectors.md (canonical big-endian hex). */
#define KEYED_ROOT "6c6684fcccf7f1f63c7d743d06fc5acf"
#define KEYED_B0   "a7180d0e54d3261a6988f24e47aa2d69"
#define KEYED_B1   "ace02e0c24fce8f2097ff350606afec9"
#define SIP_B0     "3a0223bf939cb55d07355fbdf5776dba"
#define SIP_B1     "350d07a03d5bde7601bddbb4f157bbc5"

static const uint8_t fixed_key[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                      11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                      22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

static kvp_config profile_config(int profile, uint32_t block_size)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 64;
    cfg.block_size = block_size;
    cfg.hash_profile = profile;
    return cfg;
}

static kvp_hasher *hasher_new(const kvp_config *cfg)
{
    kvp_hasher *h = NULL;
    int rc = kvp_hasher_new(cfg, &h);
    cr_assert_eq(rc, KVP_OK, "kvp_hasher_new: %s", kvp_strerror(rc));
    return h;
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

/* ------------------------------------------------------------------ CBOR */

Test(cbor, example_encoding_from_the_vectors_file)
{
    /* (NONE_HASH, (0, 1, 2), None) for sha256_cbor and seed "vllm-none-hash". */
    static const uint8_t none[32] = {0x9b, 0xd9, 0x6a, 0x48, 0x5a, 0xd8, 0x4e, 0xfd,
                                     0xaf, 0xb7, 0x2e, 0xe4, 0x8a, 0x1d, 0x7a, 0x69,
                                     0xbc, 0xea, 0xd0, 0xf8, 0xf0, 0x43, 0x31, 0x73,
                                     0x94, 0x1b, 0x27, 0x6b, 0x95, 0x81, 0xee, 0xf0};
    unsigned char buf[64];
    kvp__cbor_out o = {buf, 0, sizeof buf, NULL, NULL};
    const uint32_t toks[3] = {0, 1, 2};
    kvp__cbor_head(&o, KVP__CBOR_ARRAY, 3);
    kvp__cbor_string(&o, KVP__CBOR_BYTES, none, 32);
    kvp__cbor_uint_array(&o, toks, 3);
    unsigned char null = KVP__CBOR_NULL;
    kvp__cbor_raw(&o, &null, 1);
    char got[129];
    hex(buf, o.n, got);
    cr_assert_str_eq(got, "8358209bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
                          "83000102f6");
    cr_assert_eq(kvp__cbor_uint_array_len(toks, 3), 4);
}

Test(cbor, shortest_heads)
{
    static const struct {
        uint64_t v;
        const char *hex;
    } cases[] = {
        {0, "00"},
        {23, "17"},
        {24, "1818"},
        {255, "18ff"},
        {256, "190100"},
        {65535, "19ffff"},
        {65536, "1a00010000"},
        {UINT32_MAX, "1affffffff"},
        {UINT64_C(1) << 32, "1b0000000100000000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char buf[16];
        char got[40];
        kvp__cbor_out o = {buf, 0, sizeof buf, NULL, NULL};
        kvp__cbor_head(&o, KVP__CBOR_UINT, cases[i].v);
        hex(buf, o.n, got);
        cr_assert_str_eq(got, cases[i].hex, "uint %llu", (unsigned long long)cases[i].v);
        cr_assert_eq(kvp__cbor_head_len(cases[i].v), o.n);
    }
    unsigned char buf[16];
    char got[40];
    kvp__cbor_out o = {buf, 0, sizeof buf, NULL, NULL};
    kvp__cbor_string(&o, KVP__CBOR_TEXT, "abc", 3);
    kvp__cbor_head(&o, KVP__CBOR_ARRAY, 24);
    hex(buf, o.n, got);
    cr_assert_str_eq(got, "636162639818");
}

typedef struct sink {
    unsigned char all[4096];
    size_t n;
    int n_flushes;
} sink;

static void sink_flush(void *ud, const unsigned char *p, size_t n)
{
    sink *s = ud;
    memcpy(s->all + s->n, p, n);
    s->n += n;
    s->n_flushes++;
}

Test(cbor, streaming_writer_equals_one_buffer)
{
    uint32_t toks[300];
    for (size_t i = 0; i < 300; i++)
        toks[i] = (uint32_t)(i * 7919u * (i % 3 ? 1u : 65537u));
    unsigned char big[4096], small[16];
    kvp__cbor_out a = {big, 0, sizeof big, NULL, NULL};
    sink s = {.n = 0};
    kvp__cbor_out b = {small, 0, sizeof small, sink_flush, &s};
    for (kvp__cbor_out *o = &a;; o = &b) {
        kvp__cbor_uint_array(o, toks, 300);
        kvp__cbor_string(o, KVP__CBOR_TEXT, "a-long-lora-name-of-more-than-16", 32);
        if (o == &b)
            break;
    }
    kvp__cbor_finish(&b);
    cr_assert_eq(s.n, a.n);
    cr_assert(s.n_flushes > 10);
    cr_assert_eq(memcmp(s.all, big, a.n), 0);
}

Test(cbor, utf8_validation)
{
    cr_assert(kvp__utf8_valid((const unsigned char *)"my-lora \xc3\xa9\xe2\x82\xac", 13));
    cr_assert(kvp__utf8_valid((const unsigned char *)"\xf0\x9f\x98\x80", 4));
    cr_assert(!kvp__utf8_valid((const unsigned char *)"\xff", 1));
    cr_assert(!kvp__utf8_valid((const unsigned char *)"\xc0\xaf", 2));         /* overlong */
    cr_assert(!kvp__utf8_valid((const unsigned char *)"\xed\xa0\x80", 3));     /* surrogate */
    cr_assert(!kvp__utf8_valid((const unsigned char *)"\xe2\x82", 2));         /* truncated */
    cr_assert(!kvp__utf8_valid((const unsigned char *)"\xf4\x90\x80\x80", 4)); /* > 10FFFF */
}

/* ------------------------------------------------------------------ vLLM golden vectors */

/* One row of docs/test-vectors.md's vLLM table. block: -1 NONE_HASH, 0 block 0, 1 block 1
 * whose parent is block 0 with extra_keys None. lora/salt: the extra keys (NULL = absent). */
typedef struct vrow {
    int profile;
    const char *seed;
    int block;
    const char *lora;
    const char *salt;
    const char *digest;
    uint64_t event;
} vrow;

#define S256 KVP_HASH_VLLM_SHA256
#define XXH  KVP_HASH_VLLM_XXHASH
#define NH   "vllm-none-hash"
static const vrow vrows[] = {
    {S256, NH, -1, NULL, NULL, "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
     UINT64_C(10672167085007826672)},
    {S256, NH, 0, NULL, NULL, "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749",
     UINT64_C(2233398808101521225)},
    {S256, NH, 1, NULL, NULL, "c300ec275d7bf08af8fc63e76cdc0086911bbc7091e03c5cf892553bef84ef0c",
     UINT64_C(17911472383915781900)},
    {S256, NH, 0, NULL, "tenant-a",
     "6cb0a72bb1d5fcd9e8edc0a7c0d918f6545a8d98f4370ef894cac0191c41787a",
     UINT64_C(10721593076989655162)},
    {S256, NH, 0, "my-lora", "tenant-a",
     "da5d5cddc9c34a04723d452cf1392a52f74857f914f9fa1dc281fd118778376d",
     UINT64_C(14015761767082768237)},
    {S256, NH, 0, "my-lora", NULL,
     "88672dfb59bd2dde5bb2e77cc8480c8fe96ad64f863daef93d5684c85bdb1555",
     UINT64_C(4419866080380130645)},
    {S256, NH, 1, "my-lora", NULL,
     "c04c51f6b3ef17560fd0373d89118359be4c2d0d15e841a22a76d1960e0fe7f1",
     UINT64_C(3059863439256053745)},
    {S256, "0", -1, NULL, NULL, "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
     UINT64_C(17921330210090130494)},
    {S256, "0", 0, NULL, NULL, "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
     UINT64_C(12687895063098490012)},
    {S256, "0", 1, NULL, NULL, "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac",
     UINT64_C(1814341696565857452)},
    {S256, "0", 0, NULL, "tenant-a",
     "a31aa6d7bd52d1db44c2e2c50ce6687164f2a198c45e6f9c6f5025e7d8dff1f7",
     UINT64_C(8020952614053081591)},
    {S256, "0", 0, "my-lora", "tenant-a",
     "71fd8692651aff062468df82c75ad4eef8026fda2da7dc5ac45b894a0cb1534f",
     UINT64_C(14149053605448078159)},
    {S256, "0", 0, "my-lora", NULL,
     "8b4227ad680a61cde1060f9e82d7d2994ea655458dd28e17c756e32d62e77a73",
     UINT64_C(14363917845617146483)},
    {S256, "0", 1, "my-lora", NULL,
     "92b01d17be6609d57f2af13cc06058ffe0ff10f596da452b94c1bb60dd1025bc",
     UINT64_C(10719054612818568636)},
    {XXH, NH, -1, NULL, NULL, "a4e364baa0791a6f63bbf917db9b700d", UINT64_C(7186611511263719437)},
    {XXH, NH, 0, NULL, NULL, "f2313f4548e185b1a011187a342021cc", UINT64_C(11534027033812148684)},
    {XXH, NH, 1, NULL, NULL, "74ee692fcce0684e02de354d6ca364b4", UINT64_C(206661239557022900)},
    {XXH, NH, 0, NULL, "tenant-a", "6e854257370760f2ac4a5c9f02dbd0ba",
     UINT64_C(12414837160817709242)},
    {XXH, NH, 0, "my-lora", "tenant-a", "79c307652e2325520aa29154cbee3740",
     UINT64_C(766334679991072576)},
    {XXH, NH, 0, "my-lora", NULL, "38e01367bbfe1eabf775f5eaf7c65c7a",
     UINT64_C(17831428689171471482)},
    {XXH, NH, 1, "my-lora", NULL, "44185b81b8d774e4ce846e3173a4cf67",
     UINT64_C(14881140227411595111)},
    {XXH, "0", -1, NULL, NULL, "1ebe36576dcb573f26b99533a20aaeca", UINT64_C(2790425493127212746)},
    {XXH, "0", 0, NULL, NULL, "209f5d549fc07c8e39d823615ede61ce", UINT64_C(4168120356241826254)},
    {XXH, "0", 1, NULL, NULL, "03888914ee75b87e89df867a21beb72b", UINT64_C(9934807162112882475)},
    {XXH, "0", 0, NULL, "tenant-a", "bfbfafff3fa6ee68c398534127fa2299",
     UINT64_C(14094106573164651161)},
    {XXH, "0", 0, "my-lora", "tenant-a", "1b4e54e847cfaff556be45eafadd1a7c",
     UINT64_C(6250510208370285180)},
    {XXH, "0", 0, "my-lora", NULL, "66799572ccab2aac18fb0e4b6cf15017",
     UINT64_C(1800048193177735191)},
    {XXH, "0", 1, "my-lora", NULL, "578418559b89ed43643ddc969a4d8438",
     UINT64_C(7223171916764120120)},
};

/* The chain state a vector row names, computed with the public hasher API. */
static kvp_chain vrow_chain(const kvp_hasher *h, const vrow *r)
{
    uint32_t toks[32];
    for (uint32_t i = 0; i < 32; i++)
        toks[i] = i;
    kvp_namespace plain, ns;
    th_ns(&plain, NULL, NULL, NULL, NULL);
    th_ns(&ns, NULL, r->lora, NULL, r->salt);
    kvp_chain c, out[1];
    size_t n;
    cr_assert_eq(kvp_hasher_root(h, &plain, &c), KVP_OK);
    if (r->block < 0)
        return c;
    if (r->block == 1) /* block 0 with extra_keys None, then block 1 with the row's keys */
        cr_assert_eq(kvp_hasher_blocks(h, &plain, &c, toks, 16, out, 1, &n), KVP_OK);
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, toks + 16 * r->block, 16, out, 1, &n), KVP_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(c.n_blocks, (uint64_t)r->block + 1);
    return out[0];
}

Test(vllm, golden_vectors_bit_for_bit)
{
    for (size_t i = 0; i < sizeof vrows / sizeof vrows[0]; i++) {
        const vrow *r = &vrows[i];
        kvp_config cfg = profile_config(r->profile, 16);
        cfg.vllm_seed = r->seed;
        kvp_hasher *h = hasher_new(&cfg);
        kvp_chain c = vrow_chain(h, r);
        uint8_t d[32];
        char got[65];
        size_t len = kvp_chain_digest(h, &c, d);
        cr_assert_eq(len, r->profile == S256 ? 32u : 16u);
        hex(d, len, got);
        cr_assert_str_eq(got, r->digest, "row %zu", i);
        cr_assert_eq(c.key.lo, r->event, "row %zu: event int", i);
        kvp_hasher_free(h);
    }
}

Test(vllm, default_seed_is_vllm_none_hash)
{
    kvp_config cfg = profile_config(KVP_HASH_VLLM_SHA256, 16);
    kvp_hasher *h = hasher_new(&cfg);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_chain c;
    cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
    cr_assert_eq(c.key.lo, vrows[0].event);
    kvp_hasher_free(h);
}

/* ------------------------------------------------------------------ caches under profiles */

/* The STORED event with this key after index from, or NULL. */
static const kvp_event *stored_with(const th_events *ev, size_t from, kvp_key key)
{
    for (size_t i = from; i < ev->n; i++)
        if (ev->ev[i].type == KVP_EVENT_STORED && th_key_eq(ev->ev[i].key, key))
            return &ev->ev[i];
    return NULL;
}

/* Run a cache of this profile through access, acquire/commit (the commit continues a chain
 * whose first blocks were hits) and lookup; every key it stores must be the hasher's. */
static void cache_matches_hasher(int profile, uint32_t bs, const kvp_namespace *ns, bool verify)
{
    kvp_config cfg = profile_config(profile, bs);
    cfg.verify_tokens = verify;
    th_events ev = {.n = 0};
    cfg.on_event = th_events_fn;
    cfg.event_ud = &ev;
    cfg.vllm_seed = "0";
    kvp_cache *c = th_cache_new(&cfg);
    const kvp_hasher *h = kvp_cache_hasher(c);
    size_t n_tok = (size_t)bs * 5 + 1;
    uint32_t *t = malloc(n_tok * sizeof *t);
    for (size_t i = 0; i < n_tok; i++)
        t[i] = (uint32_t)(i * 2654435761u % 150000u);
    kvp_chain chain, out[5];
    size_t n;
    cr_assert_eq(kvp_hasher_root(h, ns, &chain), KVP_OK);
    cr_assert_eq(kvp_hasher_blocks(h, ns, &chain, t, n_tok, out, 5, &n), KVP_OK);
    cr_assert_eq(n, 5);

    kvp_match m;
    cr_assert_eq(kvp_access(c, ns, t, 2 * bs, &m), KVP_OK);
    cr_assert_eq(kvp_acquire(c, 7, ns, t, n_tok, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_hit, 2, "profile %d: acquire hit %u blocks", profile, m.n_blocks_hit);
    cr_assert_eq(kvp_commit(c, 7, t, n_tok, NULL), KVP_OK);
    for (size_t i = 0; i < 5; i++) {
        const kvp_event *e = stored_with(&ev, 0, out[i].key);
        cr_assert_not_null(e, "profile %d bs %u: block %zu not stored under the hasher's key",
                           profile, bs, i);
        kvp_key parent = i ? out[i - 1].key : (kvp_key){0, 0};
        if (i)
            cr_assert(th_key_eq(e->parent, parent));
    }
    cr_assert_eq(kvp_release(c, 7), KVP_OK);
    cr_assert_eq(kvp_lookup(c, ns, t, n_tok, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, n_tok / bs, "profile %d bs %u: lookup after commit", profile,
                 bs);
    TH_CHECK(c);
    free(t);
    kvp_cache_free(c);
}

Test(profiles, cache_keys_equal_hasher_keys)
{
    kvp_namespace plain, vns;
    th_ns(&plain, "m", "lora", "tenant", "salt");
    th_ns(&vns, NULL, "my-lora", NULL, "tenant-a");
    static const uint32_t sizes[] = {16, 1, 3, 1100};
    for (size_t p = 0; p < N_PROFILES; p++) {
        bool vllm = all_profiles[p] >= KVP_HASH_VLLM_SHA256;
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int verify = 0; verify < 2; verify++)
                cache_matches_hasher(all_profiles[p], sizes[s], vllm ? &vns : &plain, verify);
    }
}

Test(profiles, vllm_cache_reproduces_golden_block_keys)
{
    /* ("my-lora", "tenant-a") at block 0 with seed "0": the cache's STORED key. */
    kvp_config cfg = profile_config(KVP_HASH_VLLM_SHA256, 16);
    th_events ev = {.n = 0};
    cfg.on_event = th_events_fn;
    cfg.event_ud = &ev;
    cfg.vllm_seed = "0";
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, NULL, "my-lora", NULL, "tenant-a");
    uint32_t t[17];
    for (uint32_t i = 0; i < 17; i++)
        t[i] = i;
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, t, 17, &m), KVP_OK);
    cr_assert_eq(ev.n, 1);
    cr_assert_eq(ev.ev[0].key.lo, UINT64_C(14149053605448078159));
    kvp_cache_free(c);
}

Test(profiles, xxh3_profile_is_the_old_chain)
{
    kvp_config cfg = profile_config(KVP_HASH_XXH3, 16);
    cfg.seed = 42;
    kvp_hasher *h = hasher_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[64];
    for (uint32_t i = 0; i < 64; i++)
        t[i] = i * 31u;
    kvp_chain c, out[4];
    kvp_key root, keys[4];
    size_t n, nk;
    cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
    cr_assert_eq(kvp_namespace_key(42, &ns, &root), KVP_OK);
    cr_assert(th_key_eq(c.root, root) && th_key_eq(c.key, root));
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 64, out, 4, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(42, root, t, 64, 16, keys, 4, &nk), KVP_OK);
    for (size_t i = 0; i < 4; i++)
        cr_assert(th_key_eq(out[i].key, keys[i]), "block %zu", i);
    kvp_key id = {1, 2};
    cr_assert(th_key_eq(kvp_hasher_external_key(h, root, id), kvp_external_key(42, root, id)));
    kvp_hasher_free(h);
}

/* ------------------------------------------------------------------ keyed profiles */

/* The keyed profile rebuilt from its specification (hash_profile.c's header). */
static void keyed_reference(const uint8_t *key, size_t key_len, const kvp_namespace *ns,
                            const uint32_t *t, size_t bs, kvp_key *root, kvp_key *blk,
                            kvp_key *blk_sip)
{
    unsigned char secret[192], sip_key[16], out[16];
    for (unsigned char i = 0; i < 3; i++) {
        unsigned char in[19];
        memcpy(in, "KVP-XXH3-SECRET-v1", 18);
        in[18] = i;
        crypto_generichash(secret + 64 * i, 64, in, 19, key, key_len);
    }
    crypto_generichash(sip_key, 16, (const unsigned char *)"KVP-SIPHASH-KEY-v1", 18, key, key_len);
    /* Root: BLAKE2b-128 over "KVPNS1\0\0" then model and tenant present, others absent. */
    unsigned char enc[256];
    size_t n = 0;
    memcpy(enc, "KVPNS1\0\0", 8);
    n = 8;
    const kvp_field *f[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    for (int k = 0; k < 4; k++) {
        enc[n++] = (unsigned char)(k + 1);
        enc[n++] = f[k]->ptr != NULL;
        if (!f[k]->ptr)
            continue;
        for (int b = 0; b < 8; b++)
            enc[n++] = (unsigned char)((uint64_t)f[k]->len >> (8 * b));
        memcpy(enc + n, f[k]->ptr, f[k]->len);
        n += f[k]->len;
    }
    crypto_generichash(out, 16, enc, n, key, key_len);
    memcpy(&root->lo, out, 8); /* little-endian host assumed by this test */
    memcpy(&root->hi, out + 8, 8);
    unsigned char *buf = malloc(16 + 4 * bs);
    memcpy(buf, &root->lo, 8);
    memcpy(buf + 8, &root->hi, 8);
    memcpy(buf + 16, t, 4 * bs);
    XXH128_hash_t x = XXH3_128bits_withSecret(buf, 16 + 4 * bs, secret, sizeof secret);
    blk->lo = x.low64;
    blk->hi = x.high64;
    if (bs <= 1020) {
        crypto_shorthash_siphashx24(out, buf, 16 + 4 * bs, sip_key);
        memcpy(&blk_sip->lo, out, 8);
        memcpy(&blk_sip->hi, out + 8, 8);
    }
    free(buf);
}

Test(keyed, matches_independent_rebuild)
{
    kvp_namespace ns;
    th_ns(&ns, "llama", NULL, "acme", NULL);
    static const uint32_t sizes[] = {16, 1, 1020, 1021, 4096};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t bs = sizes[s];
        uint32_t *t = malloc(bs * sizeof *t);
        for (uint32_t i = 0; i < bs; i++)
            t[i] = i * 2654435761u;
        kvp_key root, blk, sip = {0, 0};
        keyed_reference(fixed_key, 32, &ns, t, bs, &root, &blk, &sip);
        for (int p = 0; p < 2; p++) {
            kvp_config cfg = profile_config(p ? KVP_HASH_SIPHASH : KVP_HASH_KEYED, bs);
            memcpy(cfg.hash_key, fixed_key, 32);
            cfg.hash_key_len = 32;
            kvp_hasher *h = hasher_new(&cfg);
            kvp_chain c, out[1];
            size_t n;
            cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
            cr_assert(th_key_eq(c.root, root), "root");
            cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, bs, out, 1, &n), KVP_OK);
            if (p == 0)
                cr_assert(th_key_eq(out[0].key, blk), "keyed, block size %u", bs);
            else if (bs <= 1020)
                cr_assert(th_key_eq(out[0].key, sip), "siphash, block size %u", bs);
            kvp_hasher_free(h);
        }
        free(t);
    }
}

/* Fixed vectors (docs/test-vectors.md): key 00 01 .. 1f, namespace model "llama" tenant
 * "acme", block size 16, tokens 0..15 then 16..31. */
Test(keyed, fixed_vectors)
{
    static const struct {
        int profile;
        const char *root, *b0, *b1;
    } vec[] = {
        {KVP_HASH_KEYED, KEYED_ROOT, KEYED_B0, KEYED_B1},
        {KVP_HASH_SIPHASH, KEYED_ROOT, SIP_B0, SIP_B1},
    };
    kvp_namespace ns;
    th_ns(&ns, "llama", NULL, "acme", NULL);
    uint32_t t[32];
    for (uint32_t i = 0; i < 32; i++)
        t[i] = i;
    for (size_t v = 0; v < 2; v++) {
        kvp_config cfg = profile_config(vec[v].profile, 16);
        memcpy(cfg.hash_key, fixed_key, 32);
        cfg.hash_key_len = 32;
        kvp_hasher *h = hasher_new(&cfg);
        kvp_chain c, out[2];
        size_t n;
        uint8_t d[32];
        char got[65];
        cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
        hex(d, kvp_chain_digest(h, &c, d), got);
        printf("# %s root %s\n", kvp_hash_profile_name(vec[v].profile), got);
        cr_assert_str_eq(got, vec[v].root);
        cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 32, out, 2, &n), KVP_OK);
        hex(d, kvp_chain_digest(h, &out[0], d), got);
        printf("# %s block0 %s\n", kvp_hash_profile_name(vec[v].profile), got);
        cr_assert_str_eq(got, vec[v].b0);
        hex(d, kvp_chain_digest(h, &out[1], d), got);
        printf("# %s block1 %s\n", kvp_hash_profile_name(vec[v].profile), got);
        cr_assert_str_eq(got, vec[v].b1);
        kvp_hasher_free(h);
    }
}

Test(keyed, different_keys_give_different_keys)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[16] = {1, 2, 3};
    for (int p = 0; p < 2; p++) {
        kvp_key seen[4];
        for (int k = 0; k < 4; k++) {
            kvp_config cfg = profile_config(p ? KVP_HASH_SIPHASH : KVP_HASH_KEYED, 16);
            memcpy(cfg.hash_key, fixed_key, 32);
            cfg.hash_key_len = k == 3 ? 16 : 32;
            cfg.hash_key[0] ^= (uint8_t)(k == 1); /* k 0 and 2: same key; 1: one bit off */
            kvp_hasher *h = hasher_new(&cfg);
            kvp_chain c, out[1];
            size_t n;
            cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
            cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 16, out, 1, &n), KVP_OK);
            seen[k] = out[0].key;
            kvp_hasher_free(h);
        }
        cr_assert(th_key_eq(seen[0], seen[2]), "the same key must give the same keys");
        cr_assert(!th_key_eq(seen[0], seen[1]), "a one-bit key change kept the block key");
        cr_assert(!th_key_eq(seen[0], seen[3]), "a 16-byte prefix of the key kept the block key");
    }
}

Test(keyed, random_key_per_cache_and_cache_hasher)
{
    kvp_config cfg = profile_config(KVP_HASH_KEYED, 16);
    cr_assert_eq(cfg.hash_profile, KVP_HASH_KEYED, "keyed is the default profile");
    kvp_cache *a = th_cache_new(&cfg), *b = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_chain ca, cb;
    cr_assert_eq(kvp_hasher_root(kvp_cache_hasher(a), &ns, &ca), KVP_OK);
    cr_assert_eq(kvp_hasher_root(kvp_cache_hasher(b), &ns, &cb), KVP_OK);
    cr_assert(!th_key_eq(ca.root, cb.root), "two random-key caches share a root");
    /* The cache's own hasher predicts its keys (external ids too). */
    th_events ev = {.n = 0};
    kvp_cache_free(a);
    cfg.on_event = th_events_fn;
    cfg.event_ud = &ev;
    a = th_cache_new(&cfg);
    cr_assert_eq(kvp_hasher_root(kvp_cache_hasher(a), &ns, &ca), KVP_OK);
    kvp_key ids[2] = {{1, 1}, {2, 2}};
    kvp_match m;
    cr_assert_eq(kvp_access_ids(a, &ns, ids, 2, 32, &m), KVP_OK);
    cr_assert_eq(ev.n, 2);
    cr_assert(
        th_key_eq(ev.ev[0].key, kvp_hasher_external_key(kvp_cache_hasher(a), ca.root, ids[0])));
    cr_assert_null(kvp_cache_hasher(NULL));
    kvp_cache_free(a);
    kvp_cache_free(b);
}

Test(keyed, bad_key_lengths_and_profiles)
{
    kvp_config cfg = profile_config(KVP_HASH_KEYED, 16);
    kvp_hasher *h = NULL;
    kvp_cache *c = NULL;
    cfg.hash_key_len = 15;
    cr_assert_eq(kvp_hasher_new(&cfg, &h), KVP_EINVAL);
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.hash_key_len = 33;
    cr_assert_eq(kvp_hasher_new(&cfg, &h), KVP_EINVAL);
    cfg.hash_key_len = 0;
    cfg.hash_profile = 0;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.hash_profile = 6;
    cr_assert_eq(kvp_hasher_new(&cfg, &h), KVP_EINVAL);
    cr_assert_null(h);
    cr_assert_null(c);
    cr_assert_eq(kvp_hasher_new(NULL, &h), KVP_EINVAL);
    kvp_hasher_free(NULL);
    for (size_t p = 0; p < N_PROFILES; p++) {
        int back = 0;
        const char *name = kvp_hash_profile_name(all_profiles[p]);
        cr_assert_not_null(name);
        cr_assert_eq(kvp_hash_profile_parse(name, &back), KVP_OK);
        cr_assert_eq(back, all_profiles[p]);
    }
    int x = -1;
    cr_assert_eq(kvp_hash_profile_parse("sha256", &x), KVP_EINVAL);
    cr_assert_eq(x, -1);
    cr_assert_null(kvp_hash_profile_name(0));
}

/* ------------------------------------------------------------------ namespaces, vocab, ids */

Test(vllm, refuses_namespaces_it_cannot_express)
{
    kvp_config cfg = profile_config(KVP_HASH_VLLM_SHA256, 4);
    kvp_cache *c = th_cache_new(&cfg);
    const kvp_hasher *h = kvp_cache_hasher(c);
    kvp_namespace bad[5];
    th_ns(&bad[0], "llama", NULL, NULL, NULL);
    th_ns(&bad[1], NULL, NULL, "tenant-a", NULL);
    th_ns(&bad[2], NULL, "lora", NULL, "");
    th_ns(&bad[3], NULL, "\xff", NULL, NULL);
    th_ns(&bad[4], NULL, NULL, NULL, "\xc3");
    uint32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvp_key ids[2] = {{1, 0}, {2, 0}};
    for (size_t i = 0; i < 5; i++) {
        kvp_match m;
        kvp_chain ch;
        cr_assert_eq(kvp_hasher_root(h, &bad[i], &ch), KVP_ENOTSUP, "namespace %zu", i);
        cr_assert_eq(kvp_lookup(c, &bad[i], t, 9, NULL, 0, &m), KVP_ENOTSUP);
        cr_assert_eq(kvp_acquire(c, 1, &bad[i], t, 9, 0, &m), KVP_ENOTSUP);
        cr_assert_eq(kvp_access(c, &bad[i], t, 9, &m), KVP_ENOTSUP);
        cr_assert_eq(kvp_access_ids(c, &bad[i], ids, 2, 8, &m), KVP_ENOTSUP);
        cr_assert_eq(kvp_lookup_ids(c, &bad[i], ids, 2, 8, NULL, 0, &m), KVP_ENOTSUP);
    }
    kvp_stats st = th_stats(c);
    cr_assert_eq(st.n_blocks_stored + st.n_requests + st.n_lookups, 0);
    /* Every other profile takes these namespaces. */
    for (size_t p = 0; p < 3; p++) {
        kvp_config ok = profile_config(all_profiles[p], 4);
        kvp_cache *d = th_cache_new(&ok);
        kvp_match m;
        for (size_t i = 0; i < 5; i++)
            cr_assert_eq(kvp_access(d, &bad[i], t, 9, &m), KVP_OK);
        kvp_cache_free(d);
    }
    kvp_cache_free(c);
}

Test(vocab, ids_at_or_above_vocab_size_are_refused)
{
    for (size_t p = 0; p < N_PROFILES; p++) {
        kvp_config cfg = profile_config(all_profiles[p], 4);
        cfg.vocab_size = 1000;
        kvp_cache *c = th_cache_new(&cfg);
        kvp_namespace ns;
        kvp_namespace_init(&ns);
        uint32_t good[9] = {0, 1, 2, 3, 4, 5, 6, 7, 999};
        uint32_t bad[9] = {0, 1, 2, 3, 4, 5, 6, 7, 1000};
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &ns, bad, 9, NULL, 0, &m), KVP_ETOKEN);
        cr_assert_eq(kvp_acquire(c, 1, &ns, bad, 9, 0, &m), KVP_ETOKEN);
        cr_assert_eq(kvp_access(c, &ns, bad, 9, &m), KVP_ETOKEN);
        kvp_stats st = th_stats(c);
        cr_assert_eq(st.n_requests + st.n_lookups + st.n_blocks_stored, 0);
        cr_assert_eq(kvp_acquire(c, 1, &ns, good, 9, 0, &m), KVP_OK);
        cr_assert_eq(kvp_commit(c, 1, bad, 9, NULL), KVP_ETOKEN);
        cr_assert_eq(th_stats(c).n_blocks_stored, 0);
        cr_assert_eq(kvp_commit(c, 1, good, 9, NULL), KVP_OK);
        cr_assert_eq(th_stats(c).n_blocks_stored, 2);
        kvp_chain ch, out[2];
        size_t n = 77;
        const kvp_hasher *h = kvp_cache_hasher(c);
        cr_assert_eq(kvp_hasher_root(h, &ns, &ch), KVP_OK);
        cr_assert_eq(kvp_hasher_blocks(h, &ns, &ch, bad, 9, out, 2, &n), KVP_ETOKEN);
        cr_assert_eq(n, 77);
        cr_assert_eq(ch.n_blocks, 0);
        TH_CHECK(c);
        kvp_cache_free(c);
    }
    /* 0 means unchecked: the largest id passes. */
    kvp_config cfg = profile_config(KVP_HASH_KEYED, 1);
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    uint32_t big[2] = {UINT32_MAX, 0};
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, big, 2, &m), KVP_OK);
    kvp_cache_free(c);
}

Test(profiles, external_ids_are_scoped_under_every_profile)
{
    for (size_t p = 0; p < N_PROFILES; p++) {
        kvp_config cfg = profile_config(all_profiles[p], 4);
        kvp_cache *c = th_cache_new(&cfg);
        kvp_namespace a, b;
        th_ns(&a, NULL, "lora-a", NULL, NULL);
        th_ns(&b, NULL, "lora-b", NULL, NULL);
        kvp_key ids[3] = {{11, 1}, {12, 2}, {13, 3}};
        kvp_match m;
        cr_assert_eq(kvp_access_ids(c, &a, ids, 3, 12, &m), KVP_OK);
        cr_assert_eq(kvp_lookup_ids(c, &a, ids, 3, 13, NULL, 0, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 3, "profile %d", all_profiles[p]);
        cr_assert_eq(kvp_lookup_ids(c, &b, ids, 3, 13, NULL, 0, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 0, "profile %d: ids leaked across namespaces",
                     all_profiles[p]);
        kvp_cache_free(c);
    }
}

Test(profiles, namespaces_isolated_under_every_profile)
{
    for (size_t p = 0; p < N_PROFILES; p++) {
        kvp_config cfg = profile_config(all_profiles[p], 4);
        kvp_cache *c = th_cache_new(&cfg);
        kvp_namespace ns[4];
        th_ns(&ns[0], NULL, NULL, NULL, NULL);
        th_ns(&ns[1], NULL, "lora", NULL, NULL);
        th_ns(&ns[2], NULL, NULL, NULL, "salt");
        th_ns(&ns[3], NULL, "lora", NULL, "salt");
        uint32_t t[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
        kvp_match m;
        for (size_t i = 0; i < 4; i++) {
            cr_assert_eq(kvp_access(c, &ns[i], t, 9, &m), KVP_OK);
            cr_assert_eq(m.n_blocks_cached, 0, "profile %d ns %zu shares blocks", all_profiles[p],
                         i);
        }
        cr_assert_eq(kvp_access(c, &ns[3], t, 9, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 2);
        kvp_cache_free(c);
    }
}

/* The hasher's checker (kvp__hasher_check, part of kvp_cache_check) catches each kind of
 * corruption it looks for. */
Test(profiles, checker_catches_corrupt_hashers)
{
    kvp_config cfg = profile_config(KVP_HASH_KEYED, 16);
    kvp_cache *c = th_cache_new(&cfg);
    TH_CHECK(c);
    c->hasher.profile = 0;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "unknown profile");
    c->hasher.profile = KVP_HASH_KEYED;
    c->hasher.key_len = 8;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "short key");
    c->hasher.key_len = 32;
    c->hasher.block_size = 0;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "block size 0");
    c->hasher.block_size = 16;
    TH_CHECK(c);
    kvp_cache_free(c);
}

/* vllm-*: kvp_acquire copies the adapter and salt for later commits; every failure point of
 * that allocation leaves the cache unchanged and leaks nothing, and a later commit hashes
 * from the copy (the caller's strings are gone by then). */
Test(vllm, acquire_keeps_its_own_copy_of_the_extra_keys)
{
    for (int64_t n = 0;; n++) {
        cr_assert_lt(n, 100, "kvp_acquire never succeeded");
        th_alloc a;
        th_alloc_init(&a);
        kvp_config cfg = profile_config(KVP_HASH_VLLM_SHA256, 16);
        cfg.alloc = th_alloc_hooks(&a);
        cfg.vllm_seed = "0";
        kvp_cache *c = th_cache_new(&cfg);
        char lora[] = "my-lora", salt[] = "tenant-a";
        kvp_namespace ns;
        th_ns(&ns, NULL, lora, NULL, salt);
        uint32_t t[33];
        for (uint32_t i = 0; i < 33; i++)
            t[i] = i;
        kvp_match m;
        th_alloc_arm(&a, n);
        int rc = kvp_acquire(c, 1, &ns, t, 33, 0, &m);
        th_alloc_arm(&a, -1);
        if (rc == KVP_ENOMEM) {
            cr_assert_eq(th_stats(c).n_requests_active, 0);
            TH_CHECK(c);
            kvp_cache_free(c);
            cr_assert_eq(a.live_bytes, 0, "leak after a failed kvp_acquire");
            continue;
        }
        cr_assert_eq(rc, KVP_OK);
        memset(lora, 'x', strlen(lora));
        memset(salt, 'x', strlen(salt));
        cr_assert_eq(kvp_commit(c, 1, t, 33, NULL), KVP_OK);
        kvp_namespace again;
        th_ns(&again, NULL, "my-lora", NULL, "tenant-a");
        cr_assert_eq(kvp_release(c, 1), KVP_OK);
        cr_assert_eq(kvp_lookup(c, &again, t, 33, NULL, 0, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 2, "the commit did not hash with the copied extra keys");
        TH_CHECK(c);
        kvp_cache_free(c);
        cr_assert_eq(a.live_bytes, 0);
        cr_assert_gt(n, 0, "no allocation failure was ever injected");
        break;
    }
}

Test(profiles, hasher_api_arguments)
{
    kvp_config cfg = profile_config(KVP_HASH_XXH3, 4);
    kvp_hasher *h = hasher_new(&cfg);
    kvp_namespace ns, bad;
    kvp_namespace_init(&ns);
    th_ns(&bad, "m", NULL, NULL, NULL);
    bad.tenant.len = 3; /* ptr NULL with a length: invalid */
    uint32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kvp_chain c, out[2];
    size_t n = 99;
    cr_assert_eq(kvp_hasher_root(NULL, &ns, &c), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_root(h, NULL, &c), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_root(h, &ns, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_root(h, &bad, &c), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, NULL, 4, out, 2, &n), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 10, NULL, 2, &n), KVP_EINVAL);
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 10, out, 2, NULL), KVP_EINVAL);
    cr_assert_eq(n, 99);
    /* cap limits the states written; the chain advances over those only. */
    kvp_chain start = c;
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 10, out, 1, &n), KVP_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(c.n_blocks, 1);
    cr_assert(th_key_eq(c.key, out[0].key));
    /* Continuing the chain equals hashing both blocks at once. */
    kvp_chain both[2], s2 = start;
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t + 4, 6, out + 1, 1, &n), KVP_OK);
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &s2, t, 10, both, 2, &n), KVP_OK);
    cr_assert_eq(n, 2);
    cr_assert(th_key_eq(both[1].key, out[1].key));
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, NULL, 0, NULL, 0, &n), KVP_OK);
    cr_assert_eq(n, 0);
    uint8_t d[32];
    cr_assert_eq(kvp_chain_digest(NULL, &c, d), 0);
    cr_assert_eq(kvp_chain_digest(h, NULL, d), 0);
    cr_assert_eq(kvp_chain_digest(h, &c, d), 16);
    kvp_key zero = kvp_hasher_external_key(NULL, c.root, c.key);
    cr_assert(zero.lo == 0 && zero.hi == 0);
    kvp_hasher_free(h);
}

/* Encodings over the 2 KB stack buffer take the streaming path (a 3000-byte seed string and
 * LoRA name here); the digests must equal SHA-256 over the whole encoding built in one
 * buffer and hashed with OpenSSL's EVP interface. */
Test(vllm, long_names_take_the_streaming_path)
{
    static char big[3001];
    memset(big, 'a', 3000);
    kvp_config cfg = profile_config(KVP_HASH_VLLM_SHA256, 16);
    cfg.vllm_seed = big;
    kvp_hasher *h = hasher_new(&cfg);
    static unsigned char enc[8192];
    kvp__cbor_out o = {enc, 0, sizeof enc, NULL, NULL};
    kvp__cbor_string(&o, KVP__CBOR_TEXT, big, 3000);
    unsigned char none[32], want[32], got[32];
    unsigned int len;
    cr_assert(EVP_Digest(enc, o.n, none, &len, EVP_sha256(), NULL));
    kvp_namespace ns;
    th_ns(&ns, NULL, big, NULL, NULL);
    kvp_chain c, out[1];
    size_t n;
    cr_assert_eq(kvp_hasher_root(h, &ns, &c), KVP_OK);
    cr_assert_eq(kvp_chain_digest(h, &c, got), 32);
    cr_assert_eq(memcmp(got, none, 32), 0, "NONE_HASH of a long seed");
    uint32_t t[16];
    for (uint32_t i = 0; i < 16; i++)
        t[i] = i * 1000u;
    o.n = 0;
    kvp__cbor_head(&o, KVP__CBOR_ARRAY, 3);
    kvp__cbor_string(&o, KVP__CBOR_BYTES, none, 32);
    kvp__cbor_uint_array(&o, t, 16);
    kvp__cbor_head(&o, KVP__CBOR_ARRAY, 1);
    kvp__cbor_string(&o, KVP__CBOR_TEXT, big, 3000);
    cr_assert(EVP_Digest(enc, o.n, want, &len, EVP_sha256(), NULL));
    cr_assert_eq(kvp_hasher_blocks(h, &ns, &c, t, 16, out, 1, &n), KVP_OK);
    cr_assert_eq(kvp_chain_digest(h, &out[0], got), 32);
    cr_assert_eq(memcmp(got, want, 32), 0, "block 0 with a long LoRA name");
    kvp_hasher_free(h);
}
