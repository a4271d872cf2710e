/*
 * hash_profile.c - the five hash profiles behind one hasher (docs/hash-profiles.md has the
 * byte layouts, the measurements and the argument for the default).
 *
 *   profile     namespace root (scope)         block key i                    external key
 *   xxh3        XXH3-128(seed, framed ns)      XXH3-128(seed, parent || toks) XXH3-128(seed, ext)
 *   keyed       BLAKE2b-128(K, framed ns)      XXH3-128(secret(K), parent||t) XXH3-128(secret, ext)
 *   siphash     BLAKE2b-128(K, framed ns)      SipHash-2-4-128(k_sip, parent||t) SipHash(ext)
 *   vllm-*      XXH3-128(seed, framed ns)      H(cbor([parent digest, [toks], extra]))  as xxh3
 *
 * "framed ns" is keys.c's encoding ("KVPNS1\0\0", then per field: number, presence, u64
 * length, bytes); "ext" is "KVPEXT1\0" || root || id; parent and root are the 16 key bytes,
 * lo then hi, little-endian; tokens are u32 little-endian. secret(K) is 192 bytes:
 * BLAKE2b-512(K, "KVP-XXH3-SECRET-v1" || i) for i = 0, 1, 2; k_sip = BLAKE2b-128(K,
 * "KVP-SIPHASH-KEY-v1"). For vllm-* the block chain starts at NONE_HASH = H(cbor(seed
 * string)) instead of the root, and H is SHA-256 (OpenSSL) or XXH3-128 with seed 0; the
 * root there only scopes external ids and verify-mode namespaces.
 *
 * Digest bytes and kvp_key: a 128-bit digest d[0..16) read as a big-endian integer gives
 * key.hi = d[0..8), key.lo = d[8..16) (XXH3's canonical form; vLLM's event integer is
 * key.lo). BLAKE2b/SipHash outputs are read little-endian (lo = first 8 bytes) and shown
 * in the canonical big-endian form. SHA-256's 32 bytes split into high (d[0..16)) and key
 * (d[16..32)), both big-endian.
 *
 * Invariant (kvp__hasher_check): profile known; block_size in range; key_len 16..32 for
 * the keyed profiles. A hasher never changes after kvp__hasher_init, so it may be shared
 * between threads.
 */
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_CTX: a stack context, see vllm_stream() */
#include <errno.h>
#include <openssl/sha.h>
#include <sodium.h>
#include <string.h>
#include <sys/random.h>

#include "blockhash.h"
#include "cbor.h"

#define SIP_CHUNK_TOKENS 1020u /* tokens per SipHash call (stack buffer of 4096 bytes) */
#define VLLM_STACK_BYTES 2048u /* vLLM encodings up to this size are hashed in one shot */

static const char *const profile_names[] = {
    NULL, "keyed", "xxh3", "siphash", "vllm-sha256-cbor", "vllm-xxhash-cbor",
};

static inline bool profile_known(int p)
{
    return p >= KVP_HASH_KEYED && p <= KVP_HASH_VLLM_XXHASH;
}

static inline bool profile_is_vllm(int p)
{
    return p == KVP_HASH_VLLM_SHA256 || p == KVP_HASH_VLLM_XXHASH;
}

static inline bool profile_is_keyed(int p)
{
    return p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH;
}

KVP_EXPORT const char *kvp_hash_profile_name(int profile)
{
    return profile_known(profile) ? profile_names[profile] : NULL;
}

static int profile_parse(const char *name, int *out)
{
    if (!name)
        return kvp__fail(KVP_EINVAL, "name is NULL");
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    for (int p = KVP_HASH_KEYED; p <= KVP_HASH_VLLM_XXHASH; p++) {
        if (strcmp(name, profile_names[p]) == 0) {
            *out = p;
            return KVP_OK;
        }
    }
    return kvp__fail(KVP_EINVAL,
                     "unknown hash profile '%.64s': keyed, xxh3, siphash, vllm-sha256-cbor or "
                     "vllm-xxhash-cbor",
                     name);
}

KVP_EXPORT int kvp_hash_profile_parse(const char *name, int *out)
{
    return kvp__public(profile_parse(name, out));
}

/* ------------------------------------------------------------------ digests and keys */

static uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 8; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

static kvp_key key_from_le(const unsigned char *p)
{
    kvp_key k = {get_le64(p), get_le64(p + 8)};
    return k;
}

/* The digest bytes of chain value (key, high) under profile p; returns their count. */
static size_t chain_digest(int p, kvp_key key, kvp_key high, unsigned char *d)
{
    size_t off = 0;
    if (p == KVP_HASH_VLLM_SHA256) {
        put_be64(d, high.hi);
        put_be64(d + 8, high.lo);
        off = 16;
    }
    put_be64(d + off, key.hi);
    put_be64(d + off + 8, key.lo);
    return off + 16;
}

static void digest_to_chain(int p, const unsigned char *d, kvp_key *key, kvp_key *high)
{
    size_t off = p == KVP_HASH_VLLM_SHA256 ? 16 : 0;
    high->hi = off ? get_be64(d) : 0;
    high->lo = off ? get_be64(d + 8) : 0;
    key->hi = get_be64(d + off);
    key->lo = get_be64(d + off + 8);
}

/* ------------------------------------------------------------------ keyed derivations */

/* BLAKE2b keyed with the master key over tag || suffix, out_len bytes (16..64). */
static void derive(const kvp_hasher *h, const char *tag, const unsigned char *suffix,
                   size_t suffix_len, unsigned char *out, size_t out_len)
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, h->key, h->key_len, out_len);
    crypto_generichash_update(&st, (const unsigned char *)tag, strlen(tag));
    crypto_generichash_update(&st, suffix, suffix_len);
    crypto_generichash_final(&st, out, out_len);
}

/* Fill the master key: the caller's bytes, or random ones. KVP_OK or KVP_ENOTSUP. */
static int load_key(kvp_hasher *h, const kvp_config *cfg)
{
    if (cfg->hash_key_len) {
        memcpy(h->key, cfg->hash_key, cfg->hash_key_len);
        h->key_len = cfg->hash_key_len;
        return KVP_OK;
    }
    size_t got = 0;
    while (got < KVP_HASH_KEY_MAX) {
        ssize_t n = getrandom(h->key + got, KVP_HASH_KEY_MAX - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return kvp__fail(KVP_ENOTSUP,
                             "no random source for the hash key (getrandom failed, errno %d): "
                             "set hash_key and hash_key_len",
                             n < 0 ? errno : 0);
        got += (size_t)n;
    }
    h->key_len = KVP_HASH_KEY_MAX;
    return KVP_OK;
}

/* ------------------------------------------------------------------ vLLM encoding */

/* A hash state for the streaming path of vllm_hash. */
typedef struct vstream {
    int profile;       /* vllm-sha256 or vllm-xxhash */
    SHA256_CTX sha;    /* vllm-sha256 */
    XXH3_state_t *xxh; /* vllm-xxhash (aligned storage on the caller's stack) */
} vstream;

static void vstream_update(void *ud, const unsigned char *p, size_t n)
{
    vstream *s = ud;
    if (s->profile == KVP_HASH_VLLM_SHA256)
        SHA256_Update(&s->sha, p, n);
    else
        XXH3_128bits_update(s->xxh, p, n);
}

/* One vLLM hash input: the tuple (parent digest, tokens, extra keys), or, when text is set,
 * the seed string alone (NONE_HASH). */
typedef struct vinput {
    const unsigned char *parent; /* parent digest bytes (tuple form) */
    size_t parent_len;           /* 32 or 16 */
    const uint32_t *tokens;      /* the block's token ids */
    size_t n_tokens;             /* block size */
    const kvp__vctx *vx;         /* LoRA name and cache_salt */
    bool first;                  /* block 0: cache_salt is included */
    const char *text;            /* NONE_HASH form: the seed string, else NULL */
    size_t text_len;             /* bytes of text */
} vinput;

/* Encode in's CBOR into o. Cannot fail. */
static void vllm_encode(kvp__cbor_out *o, const vinput *in)
{
    if (in->text) {
        kvp__cbor_string(o, KVP__CBOR_TEXT, in->text, in->text_len);
        return;
    }
    const kvp__vctx *vx = in->vx;
    kvp__cbor_head(o, KVP__CBOR_ARRAY, 3);
    kvp__cbor_string(o, KVP__CBOR_BYTES, in->parent, in->parent_len);
    kvp__cbor_uint_array(o, in->tokens, in->n_tokens);
    size_t n_extra = (size_t)vx->has_adapter + (size_t)(in->first && vx->has_salt);
    if (n_extra == 0) {
        unsigned char null = KVP__CBOR_NULL;
        kvp__cbor_raw(o, &null, 1);
        return;
    }
    kvp__cbor_head(o, KVP__CBOR_ARRAY, n_extra);
    if (vx->has_adapter)
        kvp__cbor_string(o, KVP__CBOR_TEXT, vx->adapter, vx->adapter_len);
    if (in->first && vx->has_salt)
        kvp__cbor_string(o, KVP__CBOR_TEXT, vx->salt, vx->salt_len);
}

/* An upper bound of in's encoded size (every token id taken at 5 bytes). */
static size_t vllm_encoded_bound(const vinput *in)
{
    if (in->text)
        return 9 + in->text_len;
    size_t len = 1 + kvp__cbor_head_len(in->parent_len) + in->parent_len;
    len += kvp__cbor_head_len(in->n_tokens) + 5 * in->n_tokens + 9;
    if (in->vx->has_adapter)
        len += kvp__cbor_head_len(in->vx->adapter_len) + in->vx->adapter_len;
    if (in->first && in->vx->has_salt)
        len += kvp__cbor_head_len(in->vx->salt_len) + in->vx->salt_len;
    return len;
}

/* One-shot hash of buf under a vLLM profile; d receives 32 or 16 bytes. */
static void vllm_digest_buf(int p, const unsigned char *buf, size_t n, unsigned char *d)
{
    if (p == KVP_HASH_VLLM_SHA256) {
        /* Not SHA256(): in OpenSSL 3 it fetches the algorithm on every call (EVP_Q_digest),
         * which took about 1 us per block here; the context API runs the same SHA-NI code. */
        SHA256_CTX ctx;
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, buf, n);
        SHA256_Final(d, &ctx);
    } else {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(buf, n));
        memcpy(d, c.digest, 16);
    }
}

/* Large inputs (big blocks, long names): encode in chunks into a streaming state. The
 * low-level SHA256_CTX (deprecated in OpenSSL 3 in favour of EVP) is used because its
 * context lives on the stack: EVP's must be heap-allocated, which would make hashing
 * fallible and allocate in the lookup loop. */
static void vllm_stream(int p, const vinput *in, unsigned char *d)
{
    XXH_ALIGN(64) XXH3_state_t xstate;
    unsigned char buf[512];
    vstream s;
    memset(&s, 0, sizeof s);
    memset(&xstate, 0, sizeof xstate);
    s.profile = p;
    s.xxh = &xstate;
    if (p == KVP_HASH_VLLM_SHA256)
        SHA256_Init(&s.sha);
    else
        XXH3_128bits_reset(&xstate);
    kvp__cbor_out o = {buf, 0, sizeof buf, vstream_update, &s};
    vllm_encode(&o, in);
    kvp__cbor_finish(&o);
    if (p == KVP_HASH_VLLM_SHA256) {
        SHA256_Final(d, &s.sha);
    } else {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&xstate));
        memcpy(d, c.digest, 16);
    }
}

/* H(cbor(in)) under profile p into d: one shot from a stack buffer when the encoding fits
 * (every 16-token block with names under about 1.9 KB), else streamed. Cannot fail. */
static void vllm_hash(int p, const vinput *in, unsigned char *d)
{
    if (vllm_encoded_bound(in) > VLLM_STACK_BYTES) {
        vllm_stream(p, in, d);
        return;
    }
    unsigned char buf[VLLM_STACK_BYTES];
    kvp__cbor_out o = {buf, 0, sizeof buf, NULL, NULL};
    vllm_encode(&o, in);
    vllm_digest_buf(p, buf, o.n, d);
}

/* vLLM's hash_block_tokens: the chain value (key, high) becomes the block's. */
static void vllm_next(const kvp_hasher *h, const kvp__vctx *vx, kvp_key *key, kvp_key *high,
                      const uint32_t *tokens, uint64_t index)
{
    unsigned char parent[32], d[32];
    vinput in = {parent, chain_digest(h->profile, *key, *high, parent),
                 tokens, h->block_size,
                 vx,     index == 0,
                 NULL,   0};
    vllm_hash(h->profile, &in, d);
    digest_to_chain(h->profile, d, key, high);
}

/* NONE_HASH = H(cbor(seed as a text string)). */
static void vllm_none_hash(kvp_hasher *h, const char *seed)
{
    unsigned char d[32];
    vinput in = {NULL, 0, NULL, 0, NULL, false, seed, strlen(seed)};
    vllm_hash(h->profile, &in, d);
    digest_to_chain(h->profile, d, &h->none_key, &h->none_high);
}

/* ------------------------------------------------------------------ SipHash blocks */

static kvp_key sip(const kvp_hasher *h, const unsigned char *p, size_t n)
{
    unsigned char out[16];
    crypto_shorthash_siphashx24(out, p, n, h->sip_key);
    return key_from_le(out);
}

/* SipHash-2-4-128(k_sip, parent || tokens); blocks over 1020 tokens are a cascade:
 * c = parent, then c = SipHash(c || next 1020 tokens) until the tokens run out. Every input
 * of one cache has the same length, so the cascade is a PRF on them (prefix-free inputs). */
static kvp_key sip_block(const kvp_hasher *h, kvp_key parent, const uint32_t *tokens, size_t n)
{
    unsigned char buf[16 + 4 * SIP_CHUNK_TOKENS];
    do {
        size_t k = n < SIP_CHUNK_TOKENS ? n : SIP_CHUNK_TOKENS;
        kvp__put_key(buf, parent);
        kvp__put_tokens(buf + 16, tokens, k);
        parent = sip(h, buf, 16 + 4 * k);
        tokens += k;
        n -= k;
    } while (n > 0);
    return parent;
}

/* ------------------------------------------------------------------ the hasher */

int kvp__hasher_init(kvp_hasher *h, const kvp_config *cfg)
{
    if (!profile_known(cfg->hash_profile))
        return kvp__fail(KVP_EINVAL, "hash_profile is %d, not a KVP_HASH_* profile (1..5)",
                         cfg->hash_profile);
    if (cfg->block_size == 0 || cfg->block_size > KVP_MAX_BLOCK_SIZE)
        return kvp__fail(KVP_EINVAL, "block_size is %" PRIu32 ", outside 1..%u", cfg->block_size,
                         KVP_MAX_BLOCK_SIZE);
    if (cfg->hash_key_len &&
        (cfg->hash_key_len < KVP_HASH_KEY_MIN || cfg->hash_key_len > KVP_HASH_KEY_MAX))
        return kvp__fail(KVP_EINVAL,
                         "hash_key_len is %" PRIu32 ": 0 (a random key) or %u..%u bytes",
                         cfg->hash_key_len, KVP_HASH_KEY_MIN, KVP_HASH_KEY_MAX);
    memset(h, 0, sizeof *h);
    h->profile = cfg->hash_profile;
    h->seed = cfg->seed;
    h->block_size = cfg->block_size;
    h->vocab_size = cfg->vocab_size;
    h->alloc = cfg->alloc;
    if (profile_is_vllm(h->profile))
        vllm_none_hash(h, cfg->vllm_seed ? cfg->vllm_seed : KVP_VLLM_SEED_DEFAULT);
    if (!profile_is_keyed(h->profile))
        return KVP_OK;
    if (sodium_init() < 0)
        return kvp__fail(KVP_ENOTSUP, "libsodium cannot be initialised (no random source)");
    int rc = load_key(h, cfg);
    if (rc != KVP_OK)
        return rc;
    for (unsigned char i = 0; i < KVP__SECRET_BYTES / 64; i++)
        derive(h, "KVP-XXH3-SECRET-v1", &i, 1, h->secret + 64 * i, 64);
    derive(h, "KVP-SIPHASH-KEY-v1", NULL, 0, h->sip_key, sizeof h->sip_key);
    return KVP_OK;
}

static bool field_utf8(const kvp_field *f)
{
    return !f->ptr || kvp__utf8_valid(f->ptr, f->len);
}

/* Why the vllm-* profile h cannot express ns (kvp__hasher_ns_check refused it). */
static KVP__COLD int ns_refused(const kvp_hasher *h, const kvp_namespace *ns)
{
    const char *name = profile_names[h->profile];
    if (ns->model.ptr)
        return kvp__fail(KVP_ENOTSUP, "ns->model is set: %s keys carry no model name", name);
    if (ns->tenant.ptr)
        return kvp__fail(KVP_ENOTSUP, "ns->tenant is set: %s keys carry no tenant", name);
    if (ns->salt.ptr && ns->salt.len == 0)
        return kvp__fail(KVP_ENOTSUP,
                         "ns->salt is empty: vLLM drops an empty cache_salt, so %s keys cannot "
                         "tell it from an absent one",
                         name);
    return kvp__fail(KVP_ENOTSUP, "ns->%s is not UTF-8: %s keys encode it as text",
                     field_utf8(&ns->adapter) ? "salt" : "adapter", name);
}

int kvp__hasher_ns_check(const kvp_hasher *h, const kvp_namespace *ns)
{
    if (!profile_is_vllm(h->profile))
        return KVP_OK;
    /* vLLM keys carry no model or tenant; an empty salt is falsy there and dropped. */
    if (ns->model.ptr || ns->tenant.ptr || (ns->salt.ptr && ns->salt.len == 0))
        return ns_refused(h, ns);
    if (!field_utf8(&ns->adapter) || !field_utf8(&ns->salt))
        return ns_refused(h, ns);
    return KVP_OK;
}

/* Name the first token at or above vocab_size (kvp__hasher_tokens_check found one). */
static KVP__COLD int token_refused(const kvp_hasher *h, const uint32_t *tokens, size_t n)
{
    size_t i = 0;
    while (i < n - 1 && tokens[i] < h->vocab_size)
        i++;
    return kvp__fail(KVP_ETOKEN, "tokens[%zu] is %" PRIu32 ", not below vocab_size %" PRIu32, i,
                     tokens[i], h->vocab_size);
}

int kvp__hasher_tokens_check(const kvp_hasher *h, const uint32_t *tokens, size_t n)
{
    if (h->vocab_size == 0)
        return KVP_OK;
    uint32_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = tokens[i] > max ? tokens[i] : max;
    return n && max >= h->vocab_size ? token_refused(h, tokens, n) : KVP_OK;
}

typedef struct blake_sink {
    crypto_generichash_state st; /* BLAKE2b keyed with the master key */
} blake_sink;

static void blake_field(blake_sink *s, unsigned char number, const kvp_field *f)
{
    unsigned char head[10] = {number, f->ptr != NULL};
    if (!f->ptr) {
        crypto_generichash_update(&s->st, head, 2);
        return;
    }
    kvp__put_u64le(head + 2, (uint64_t)f->len);
    crypto_generichash_update(&s->st, head, 10);
    if (f->len)
        crypto_generichash_update(&s->st, f->ptr, f->len);
}

kvp_key kvp__hasher_root(const kvp_hasher *h, const kvp_namespace *ns)
{
    if (!profile_is_keyed(h->profile))
        return kvp__ns_root_xxh3(h->seed, ns);
    static const unsigned char tag[8] = {'K', 'V', 'P', 'N', 'S', '1', 0, 0};
    blake_sink s;
    unsigned char out[16];
    crypto_generichash_init(&s.st, h->key, h->key_len, sizeof out);
    crypto_generichash_update(&s.st, tag, sizeof tag);
    blake_field(&s, 1, &ns->model);
    blake_field(&s, 2, &ns->adapter);
    blake_field(&s, 3, &ns->tenant);
    blake_field(&s, 4, &ns->salt);
    crypto_generichash_final(&s.st, out, sizeof out);
    return key_from_le(out);
}

void kvp__hasher_start(const kvp_hasher *h, kvp_key root, kvp_key *key, kvp_key *high)
{
    static const kvp_key zero = {0, 0};
    *key = profile_is_vllm(h->profile) ? h->none_key : root;
    *high = profile_is_vllm(h->profile) ? h->none_high : zero;
}

kvp__vctx kvp__hasher_vctx(const kvp_namespace *ns)
{
    kvp__vctx vx = {ns->adapter.ptr,         ns->salt.ptr,
                    ns->adapter.len,         ns->salt.len,
                    ns->adapter.ptr != NULL, ns->salt.ptr != NULL && ns->salt.len > 0};
    return vx;
}

void kvp__hasher_next(const kvp_hasher *h, const kvp__vctx *vx, kvp_key *key, kvp_key *high,
                      const uint32_t *tokens, uint64_t index)
{
    switch (h->profile) {
    case KVP_HASH_XXH3:
        *key = kvp__hash_block(h->seed, *key, tokens, h->block_size);
        break;
    case KVP_HASH_KEYED:
        *key = kvp__hash_block_secret(h->secret, *key, tokens, h->block_size);
        break;
    case KVP_HASH_SIPHASH:
        *key = sip_block(h, *key, tokens, h->block_size);
        break;
    default:
        vllm_next(h, vx, key, high, tokens, index);
        break;
    }
}

kvp_key kvp__hasher_external(const kvp_hasher *h, kvp_key root, kvp_key id)
{
    if (h->profile == KVP_HASH_KEYED)
        return kvp__external_key_secret(h->secret, root, id);
    if (h->profile == KVP_HASH_SIPHASH) {
        unsigned char buf[40] = {'K', 'V', 'P', 'E', 'X', 'T', '1', 0};
        kvp__put_key(buf + 8, root);
        kvp__put_key(buf + 24, id);
        return sip(h, buf, sizeof buf);
    }
    return kvp__external_key_seed(h->seed, root, id);
}

void kvp__hasher_wipe(kvp_hasher *h)
{
    sodium_memzero(h, sizeof *h);
}

int kvp__hasher_check(const kvp_hasher *h)
{
    if (!profile_known(h->profile) || h->block_size == 0 || h->block_size > KVP_MAX_BLOCK_SIZE)
        return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: profile %d, block_size %" PRIu32,
                         __func__, h->profile, h->block_size);
    if (profile_is_keyed(h->profile) &&
        (h->key_len < KVP_HASH_KEY_MIN || h->key_len > KVP_HASH_KEY_MAX))
        return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: key_len %zu", __func__,
                         (size_t)h->key_len);
    return KVP_OK;
}

/* ------------------------------------------------------------------ public hasher API */

static int hasher_new(const kvp_config *cfg, kvp_hasher **out)
{
    if (!cfg)
        return kvp__fail(KVP_EINVAL, "cfg is NULL");
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    kvp__mem mem;
    kvp__mem_init(&mem, &cfg->alloc);
    kvp_hasher *h = kvp__mem_alloc(&mem, sizeof *h);
    if (!h)
        return kvp__fail(KVP_ENOMEM, "out of memory: the hasher (%zu bytes)", sizeof *h);
    int rc = kvp__hasher_init(h, cfg);
    if (rc != KVP_OK) {
        kvp__mem_free(&mem, h, sizeof *h);
        return rc;
    }
    *out = h;
    return KVP_OK;
}

KVP_EXPORT int kvp_hasher_new(const kvp_config *cfg, kvp_hasher **out)
{
    return kvp__public(hasher_new(cfg, out));
}

KVP_EXPORT void kvp_hasher_free(kvp_hasher *h)
{
    if (!h)
        return;
    kvp__mem mem;
    kvp__mem_init(&mem, &h->alloc);
    mem.live_bytes = sizeof *h; /* a hasher is this one allocation */
    kvp__hasher_wipe(h);
    kvp__mem_free(&mem, h, sizeof *h);
}

KVP_EXPORT const kvp_hasher *kvp_cache_hasher(const kvp_cache *cache)
{
    return cache ? &cache->hasher : NULL;
}

static int hasher_root(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *out)
{
    if (!h)
        return kvp__fail(KVP_EINVAL, "h is NULL");
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    int rc = kvp__ns_valid(ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_ns_check(h, ns);
    if (rc != KVP_OK)
        return rc;
    kvp_chain c;
    c.root = kvp__hasher_root(h, ns);
    kvp__hasher_start(h, c.root, &c.key, &c.high);
    c.n_blocks = 0;
    *out = c;
    return KVP_OK;
}

KVP_EXPORT int kvp_hasher_root(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *out)
{
    return kvp__public(hasher_root(h, ns, out));
}

static int hasher_blocks(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *chain,
                         const uint32_t *tokens, size_t n_tokens, kvp_chain *out, size_t cap,
                         size_t *n_out)
{
    if (!h)
        return kvp__fail(KVP_EINVAL, "h is NULL");
    if (!chain)
        return kvp__fail(KVP_EINVAL, "chain is NULL");
    if (!n_out)
        return kvp__fail(KVP_EINVAL, "n_out is NULL");
    if (!tokens && n_tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL but n_tokens is %zu", n_tokens);
    if (!out && cap)
        return kvp__fail(KVP_EINVAL, "out is NULL but cap is %zu", cap);
    int rc = kvp__ns_valid(ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_ns_check(h, ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(h, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    size_t n = n_tokens / h->block_size;
    n = n < cap ? n : cap;
    kvp__vctx vx = kvp__hasher_vctx(ns);
    kvp_chain c = *chain;
    for (size_t i = 0; i < n; i++) {
        kvp__hasher_next(h, &vx, &c.key, &c.high, tokens + i * h->block_size, c.n_blocks);
        c.n_blocks++;
        out[i] = c;
    }
    *chain = c;
    *n_out = n;
    return KVP_OK;
}

KVP_EXPORT int kvp_hasher_blocks(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *chain,
                                 const uint32_t *tokens, size_t n_tokens, kvp_chain *out,
                                 size_t cap, size_t *n_out)
{
    return kvp__public(hasher_blocks(h, ns, chain, tokens, n_tokens, out, cap, n_out));
}

KVP_EXPORT kvp_key kvp_hasher_external_key(const kvp_hasher *h, kvp_key root, kvp_key external_id)
{
    static const kvp_key zero = {0, 0};
    return h ? kvp__hasher_external(h, root, external_id) : zero;
}

KVP_EXPORT size_t kvp_chain_digest(const kvp_hasher *h, const kvp_chain *chain, uint8_t out[32])
{
    if (!h || !chain || !out)
        return 0;
    return chain_digest(h->profile, chain->key, chain->high, out);
}
