"""Hash profiles and the Hasher: vLLM's golden vectors (docs/test-vectors.md) reproduced from
Python, vLLM's definition recomputed independently with cbor2/hashlib/xxhash, keys computed
outside the lock and the *_keys forms, and the profile-related errors."""

import hashlib
import re

import pytest

import kvprefix
from conftest import REPO, prompt

VECTOR_ROW = re.compile(
    r"^\| (sha256_cbor|xxhash_cbor) \| `([^`]*)` \| ([^|]*) \| `([^`]*)` \| `([0-9a-f]+)` \| (\d+) \|$"
)


def golden_rows():
    rows = [VECTOR_ROW.match(line) for line in (REPO / "docs/test-vectors.md").read_text().splitlines()]
    rows = [r.groups() for r in rows if r]
    assert len(rows) == 28  # 7 rows per (profile, seed), 2 profiles, 2 seeds
    return rows


def row_chain(h, block, extra):
    """The Chain a vector row names: NONE_HASH, block 0 or block 1 (after a block 0 hashed
    with extra_keys None) of tokens 0..31, with extra_keys given as (LoRA name, salt)."""
    extra = () if extra in ("-", "None") else eval(extra)  # a tuple literal from the table
    lora = extra[0] if len(extra) == 2 or (extra and extra[0] == "my-lora") else None
    salt = extra[-1] if extra and extra[-1] == "tenant-a" else None
    plain, ns = kvprefix.Namespace(), kvprefix.Namespace(adapter=lora, salt=salt)
    toks = list(range(32))
    if block.startswith("NONE_HASH"):
        return h.root(plain)
    if block.startswith("block 0"):
        return h.blocks(ns, toks[:16])[0]
    (b0,) = h.blocks(plain, toks[:16])
    (b1,) = h.blocks(ns, toks[16:32], parent=b0)
    return b1


@pytest.mark.parametrize("row", golden_rows(), ids=lambda r: f"{r[0]}-{r[1]}-{r[2][:7]}-{r[3]}")
def test_vllm_golden_vectors(row):
    fn, seed, block, extra, digest, event = row
    profile = {"sha256_cbor": "vllm-sha256-cbor", "xxhash_cbor": "vllm-xxhash-cbor"}[fn]
    h = kvprefix.Hasher(profile, block_size=16, vllm_seed=seed)
    c = row_chain(h, block, extra)
    assert c.digest.hex() == digest
    assert c.event == int(event) == int.from_bytes(c.digest, "big") & (2**64 - 1)
    assert c.key & (2**64 - 1) == c.event


def vllm_reference(fn, seed, tokens, block_size, lora=None, salt=None):
    """vLLM's block hashes from its definition (docs/hash-profiles.md): NONE_HASH = H(seed),
    block i = H((parent digest, tuple(tokens), extra_keys)) over canonical CBOR."""
    cbor2 = pytest.importorskip("cbor2")
    if fn == "sha256":
        hf = lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
    else:
        xxhash = pytest.importorskip("xxhash")
        hf = lambda x: xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))
    parent, out = hf(seed), []
    for i in range(len(tokens) // block_size):
        extra = tuple(k for k in (lora, salt if i == 0 else None) if k is not None) or None
        parent = hf((parent, tuple(tokens[i * block_size : (i + 1) * block_size]), extra))
        out.append(parent)
    return out


@pytest.mark.parametrize("fn", ["sha256", "xxhash"])
@pytest.mark.parametrize("lora,salt", [(None, None), ("lora-7", None), (None, "s1"), ("é-lora", "s2")])
def test_hasher_matches_vllm_definition(fn, lora, salt):
    tokens = prompt(16 * 5 + 3, seed=11) + [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]
    h = kvprefix.Hasher(f"vllm-{fn}-cbor", block_size=16, vllm_seed="1234")
    ns = kvprefix.Namespace(adapter=lora, salt=salt)
    got = h.blocks(ns, tokens)
    assert [c.digest for c in got] == vllm_reference(fn, "1234", tokens, 16, lora, salt)
    assert [c.n_blocks for c in got] == list(range(1, len(got) + 1))
    # Continuing a chain gives the same states as one call.
    assert h.blocks(ns, tokens[48:], parent=got[2]) == got[3:]


def test_vllm_cache_keys_are_the_hasher_keys():
    c = kvprefix.Cache(64, 16, hash_profile="vllm-sha256-cbor")
    assert c.hash_profile == "vllm-sha256-cbor"
    ns = kvprefix.Namespace(salt="tenant-a")
    p = list(range(40))
    root, keys = c.keys(ns, p)
    h = kvprefix.Hasher("vllm-sha256-cbor", block_size=16)
    assert root == h.root(ns).root and keys == [x.key for x in h.blocks(ns, p)]
    assert [x.key for x in c.hasher().blocks(ns, p)] == keys
    # vLLM keys cannot express a tenant or an empty salt: refused, never dropped.
    with pytest.raises(kvprefix.NotSupportedError) as e:
        c.lookup(kvprefix.Namespace(tenant="t"), p)
    assert e.value.code == kvprefix.ENOTSUP
    with pytest.raises(kvprefix.NotSupportedError):
        h.root(kvprefix.Namespace(salt=""))


def test_profiles_and_keys():
    assert kvprefix.hash_profile_parse("siphash") == kvprefix.HASH_SIPHASH
    assert kvprefix.hash_profile_name(kvprefix.HASH_KEYED) == "keyed"
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(8, hash_profile="md5")
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(8, hash_key=b"short")
    ns, p = kvprefix.Namespace(model="m"), prompt(64)
    # The default profile is keyed, with a random key per cache: caches disagree...
    a, b = kvprefix.Cache(8, 16), kvprefix.Cache(8, 16)
    assert a.hash_profile == "keyed" and a.keys(ns, p) != b.keys(ns, p)
    # ...unless they share a key; then a Hasher with that key agrees too.
    key = bytes(range(32))
    for prof in ("keyed", "siphash"):
        c1 = kvprefix.Cache(8, 16, hash_profile=prof, hash_key=key)
        c2 = kvprefix.Cache(8, 16, hash_profile=prof, hash_key=key)
        h = kvprefix.Hasher(prof, block_size=16, key=key)
        root, keys = c1.keys(ns, p)
        assert (root, keys) == c2.keys(ns, p) and len(keys) == 4
        assert [x.key for x in h.blocks(ns, p)] == keys and h.root(ns).root == root
        assert len(h.blocks(ns, p)[0].digest) == 16
    # The xxh3 profile is the module functions' chain.
    x = kvprefix.Cache(8, 16, hash_profile=kvprefix.HASH_XXH3, seed=5)
    root, keys = x.keys(ns, p)
    assert root == ns.key(seed=5) and keys == kvprefix.hash_blocks(p, 16, seed=5, parent=root)
    assert x.hasher().external_key(root, 9) == kvprefix.external_key(root, 9, 5)
    # raw=True: the same keys as bytes, (lo, hi) uint64 pairs.
    _, raw = x.keys(ns, p, raw=True)
    assert raw == b"".join(k.to_bytes(16, "little") for k in keys)


def test_keys_forms_match_token_forms():
    ns, p = kvprefix.Namespace(tenant="t"), prompt(16 * 6 + 5)
    for verify in (False, True):
        a = kvprefix.Cache(64, 16, verify_tokens=verify, hash_key=b"k" * 16)
        b = kvprefix.Cache(64, 16, verify_tokens=verify, hash_key=b"k" * 16)
        root, keys = a.keys(ns, p)
        tok = p if verify else None  # collision-proof mode verifies the tokens
        assert a.access(ns, p) == b.access_keys(ns, root, keys, tok, n_tokens=len(p))
        assert a.lookup(ns, p) == b.lookup_keys(ns, root, keys, p)
        q = p[:48] + prompt(40, seed=3)
        rq, kq = a.keys(ns, q)
        assert a.acquire(1, ns, q, 128) == b.acquire_keys(1, ns, rq, kq, q, 128)
        assert a.commit(1, q) == b.commit_keys(1, kq, q) == 2
        a.release(1)
        b.release(1)
        assert a.stats() == b.stats()
        a.check()
        b.check()
    # One key per full block, checked by the binding (the library reads that many).
    c = kvprefix.Cache(64, 16)
    root, keys = c.keys(ns, p)
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.lookup_keys(ns, root, keys[:-1], p)
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.lookup_keys(ns, root, keys, n_tokens=len(p) + 16)
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.lookup_keys(ns, root, keys, p, n_tokens=3)
    c.acquire(5, ns, p)
    assert c.commit_keys(5, None, p) == 6  # None: hashed by the library
    # Verify mode needs the tokens.
    v = kvprefix.Cache(64, 16, verify_tokens=True)
    r, k = v.keys(ns, p)
    with pytest.raises(kvprefix.InvalidArgumentError):
        v.lookup_keys(ns, r, k)


def test_vocab_size_and_errors():
    c = kvprefix.Cache(16, 4, vocab_size=1000)
    ns = kvprefix.Namespace()
    assert c.vocab_size == 1000
    with pytest.raises(kvprefix.TokenError) as e:
        c.access(ns, [1, 2, 3, 1000])
    assert e.value.code == kvprefix.ETOKEN and isinstance(e.value, ValueError)
    assert c.stats().n_requests == 0
    with pytest.raises(kvprefix.TokenError):
        kvprefix.Hasher("xxh3", block_size=4, vocab_size=10).blocks(ns, [1, 2, 3, 10])
    with pytest.raises(kvprefix.RequestTooBigError) as e:
        c.acquire(1, ns, list(range(8)), 17 * 4)
    assert e.value.code == kvprefix.ETOOBIG and not isinstance(e.value, kvprefix.NoSpaceError)
    assert kvprefix.strerror(kvprefix.ETOOBIG) != kvprefix.strerror(kvprefix.ENOSPC)


def test_requests_and_release_all(ns):
    c = kvprefix.Cache(64, 4)
    assert c.requests() == [] and c.release_all() == 0
    p = prompt(16)
    for r in (3, 1 << 63, 7):
        c.acquire(r, ns, p)
    c.commit(3, p)
    assert sorted(c.requests()) == [3, 7, 1 << 63]
    assert c.release_all() == 3
    s = c.stats()
    assert c.requests() == [] and s.n_requests_active == 0 and s.n_blocks_in_use == 0
    assert c.lookup(ns, p).n_blocks_cached == 4  # committed blocks stay cached
    c.check()


def test_quotas():
    a, b = kvprefix.Namespace(tenant="a"), kvprefix.Namespace(tenant="b")
    c = kvprefix.Cache(64, 4, ns_quota=3)
    assert c.ns_quota == 3
    c.access(a, prompt(40, seed=1))
    assert c.stats().n_blocks_cached == 3
    c.set_quota(b, None)  # unlimited
    c.access(b, prompt(40, seed=2))
    assert c.stats().n_blocks_cached == 3 + 10
    c.set_quota(b, 1)  # evicts b's excess now
    assert c.stats().n_blocks_cached == 3 + 1
    c.check()
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(8).set_quota(a, 1)  # quotas off
    assert c.quota_scope == "namespace"


def test_quota_scope_tenant():
    """Under the tenant scope a tenant's salts and adapters share one quota."""
    c = kvprefix.Cache(64, 4, ns_quota=3, quota_scope="tenant")
    assert c.quota_scope == "tenant"
    for i in range(10):
        c.access(kvprefix.Namespace(tenant="a", salt="s%d" % i), prompt(8, seed=i))
    assert c.stats().n_blocks_cached == 3
    c.set_quota(kvprefix.Namespace(tenant="a", adapter="x"), 1)  # the same quota
    assert c.stats().n_blocks_cached == 1
    c.check()
    m = kvprefix.Cache(8, ns_quota=1, quota_scope=kvprefix.QUOTA_SCOPE_MODEL)
    assert m.quota_scope == "model"
    with pytest.raises(ValueError):
        kvprefix.Cache(8, ns_quota=1, quota_scope="salt")
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(8, quota_scope="tenant")  # quotas off
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(8, ns_quota=1, quota_scope=7)


def test_access_reports_blocks_stored(ns):
    c = kvprefix.Cache(4, 4)
    m = c.access(ns, prompt(40))  # 10 full blocks, a pool of 4: its first 4 are kept
    assert m.n_blocks_full == 10 and m.n_blocks_stored == 4
    assert c.access(ns, prompt(40)).n_blocks_stored == 0
    assert c.lookup(ns, prompt(8)).n_blocks_stored == 0


def test_cache_hasher_after_close(ns):
    c = kvprefix.Cache(8, 4)
    h = c.hasher()
    assert h.profile == "keyed" and h.block_size == 4
    keys = [x.key for x in h.blocks(ns, prompt(8))]
    assert keys == c.keys(ns, prompt(8))[1]
    c.close()
    with pytest.raises(ValueError):
        h.blocks(ns, prompt(8))
    with pytest.raises(ValueError):
        c.keys(ns, prompt(8))
    with pytest.raises(ValueError):
        c.hasher()
