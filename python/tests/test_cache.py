"""Cache and Namespace: the request lifecycle, isolation, keys, stats, errors and codes."""

import pytest

import kvprefix
from conftest import prompt


def test_lifecycle(cache, ns):
    p = prompt(18)
    m = cache.acquire(1, ns, p, 24)
    assert (m.n_tokens, m.n_blocks_full, m.n_blocks_hit, m.n_tokens_hit) == (18, 4, 0, 0)
    assert m.block_ids is None
    blocks = cache.request_blocks(1)
    assert len(blocks) == 6 and len(set(blocks)) == 6  # ceil(24 / 4)
    assert cache.commit(1, p) == 4
    cache.grow(1, 30)
    assert len(cache.request_blocks(1)) == 8
    assert cache.request_blocks(1)[:6] == blocks
    s = cache.stats()
    assert s.n_requests_active == 1 and s.n_blocks_in_use == 8
    cache.release(1)
    m2 = cache.lookup(ns, p)
    assert m2.n_blocks_cached == 4 and m2.n_blocks_hit == 4 and m2.n_tokens_hit == 16
    assert m2.block_ids == blocks[:4]
    m3 = cache.acquire(2, ns, p)
    assert m3.n_tokens_hit == 16
    assert cache.request_blocks(2)[:4] == blocks[:4]
    cache.release(2)
    s = cache.stats()
    assert s.n_requests == 2 and s.n_lookups == 1 and s.n_tokens_hit == 16
    assert s.n_blocks_total == 256 == s.n_blocks_free + s.n_blocks_cached + s.n_blocks_in_use
    cache.check()


def test_at_least_one_token_is_computed(cache, ns):
    p = prompt(16)
    cache.access(ns, p)
    m = cache.lookup(ns, p)
    assert m.n_blocks_cached == 4 and m.n_blocks_hit == 3


def test_namespaces_isolated(cache):
    p = prompt(40)
    a = kvprefix.Namespace(model="m", tenant="a")
    b = kvprefix.Namespace(model="m", tenant="b")
    cache.access(a, p)
    assert cache.lookup(a, p).n_blocks_cached == 10
    assert cache.lookup(b, p).n_blocks_cached == 0
    assert cache.lookup(None, p).n_blocks_cached == 0
    assert cache.lookup(kvprefix.Namespace(model="m", tenant=""), p).n_blocks_cached == 0
    # str and its UTF-8 bytes are the same field.
    assert cache.lookup(kvprefix.Namespace(model=b"m", tenant=b"a"), p).n_blocks_cached == 10
    assert a.key() != b.key()
    assert a == kvprefix.Namespace(model=b"m", tenant="a") and hash(a) == hash(
        kvprefix.Namespace(model="m", tenant=b"a")
    )
    assert {a, b, kvprefix.Namespace(model="m", tenant="a")} == {a, b}
    assert a.model == "m" and a.adapter is None
    assert "tenant='a'" in repr(a)
    with pytest.raises(TypeError):
        kvprefix.Namespace(model=3)
    with pytest.raises(TypeError):
        cache.lookup("not a namespace", p)


def test_keys_match_hash_blocks(ns):
    c = kvprefix.Cache(64, 4, seed=7, hash_profile="xxh3")  # the module functions' profile
    p = prompt(20)
    root = ns.key(seed=7)
    assert root == kvprefix.namespace_key(ns, 7) == c.namespace_key(ns)
    keys = kvprefix.hash_blocks(p, 4, seed=7, parent=root)
    assert len(keys) == 5 and all(0 <= k < 1 << 128 for k in keys)
    assert keys == c.hash_blocks(ns, p)
    assert kvprefix.hash_blocks(p, 4, seed=8, parent=root) != keys
    # A chain: hashing the tail from the previous key gives the same keys.
    assert kvprefix.hash_blocks(p[8:], 4, seed=7, parent=keys[1]) == keys[2:]
    events = []
    c2 = kvprefix.Cache(64, 4, seed=7, hash_profile="xxh3", on_event=events.append)
    c2.access(ns, p)
    assert [e.key for e in events] == keys
    assert events[0].parent == root and events[0].parent_is_root
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.hash_blocks(p, 0)


def test_ids_forms(cache, ns):
    ids = [11, 12, 13, (1 << 128) - 1]
    m = cache.access_ids(ns, ids)
    assert m.n_blocks_full == 4 and m.n_blocks_hit == 0
    m = cache.lookup_ids(ns, ids)
    assert m.n_blocks_cached == 4 and m.n_blocks_hit == 3 and len(m.block_ids) == 3
    m = cache.lookup_ids(ns, ids, n_tokens=17)  # a partial fifth block is computed
    assert m.n_blocks_hit == 4
    assert cache.lookup_ids(kvprefix.Namespace(model="x"), ids).n_blocks_cached == 0
    # The same ids as a buffer of (lo, hi) uint64 pairs and as raw bytes.
    np = pytest.importorskip("numpy")
    arr = np.array([[k & (2**64 - 1), k >> 64] for k in ids], dtype=np.uint64)
    assert cache.lookup_ids(ns, arr).block_ids == m.block_ids[:3]
    assert cache.lookup_ids(ns, arr.tobytes()).n_blocks_cached == 4
    with pytest.raises(kvprefix.InvalidArgumentError):
        cache.lookup_ids(ns, [1 << 128])
    with pytest.raises(kvprefix.InvalidArgumentError):
        cache.lookup_ids(ns, [-1])
    with pytest.raises(kvprefix.InvalidArgumentError):
        cache.lookup_ids(ns, b"x" * 17)
    # External ids cannot be verified: refused in collision-proof mode.
    v = kvprefix.Cache(16, 4, verify_tokens=True)
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        v.lookup_ids(ns, ids)
    assert e.value.code == kvprefix.EINVAL and e.value.function == "kvp_lookup_ids"


def test_external_key_scoped(ns):
    root = ns.key()
    other = kvprefix.Namespace(model="other").key()
    assert kvprefix.external_key(root, 5) != kvprefix.external_key(other, 5)
    assert kvprefix.external_key(root, 5) == kvprefix.external_key(root, 5, 0)


@pytest.mark.parametrize(
    "call, cls, code, function",
    [
        (lambda c, ns: c.release(99), kvprefix.NotFoundError, kvprefix.ENOENT, "kvp_release"),
        (lambda c, ns: c.grow(99, 4), kvprefix.NotFoundError, kvprefix.ENOENT, "kvp_grow"),
        (lambda c, ns: c.request_blocks(99), kvprefix.NotFoundError, kvprefix.ENOENT,
         "kvp_request_blocks"),
        (lambda c, ns: c.acquire(1, ns, []), kvprefix.InvalidArgumentError, kvprefix.EINVAL,
         "kvp_acquire"),
        (lambda c, ns: c.lookup(ns, []), kvprefix.InvalidArgumentError, kvprefix.EINVAL,
         "kvp_lookup"),
        (lambda c, ns: c.acquire(1, ns, prompt(8), 10_000), kvprefix.RequestTooBigError,
         kvprefix.ETOOBIG, "kvp_acquire"),
    ],
)
def test_errors_carry_codes(cache, ns, call, cls, code, function):
    before = cache.stats()
    with pytest.raises(cls) as e:
        call(cache, ns)
    assert isinstance(e.value, kvprefix.KvprefixError)
    assert e.value.code == code and e.value.function == function
    assert kvprefix.strerror(code) in str(e.value) and str(code) in str(e.value)
    assert cache.stats() == before  # a failed call changes nothing


def test_error_hierarchy(cache, ns):
    p = prompt(8)
    cache.acquire(1, ns, p)
    with pytest.raises(kvprefix.AlreadyExistsError) as e:
        cache.acquire(1, ns, p)
    assert e.value.code == kvprefix.EEXIST
    with pytest.raises(kvprefix.OutOfRangeError):
        cache.commit(1, p + prompt(8))  # beyond the blocks the request holds
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        cache.commit(1, p[:4] + [1 << 32])
    with pytest.raises(LookupError):  # NotFoundError is a LookupError
        cache.release(2)
    cache.release(1)
    assert issubclass(kvprefix.OutOfMemoryError, MemoryError)
    assert kvprefix.strerror(kvprefix.OK) == "success"
    assert kvprefix.strerror(12345) == "unknown error"


def test_req_id_range(cache, ns):
    p = prompt(8)
    cache.acquire(2**64 - 1, ns, p)
    cache.release(2**64 - 1)
    for bad in (-1, 2**64):
        with pytest.raises(kvprefix.InvalidArgumentError):
            cache.acquire(bad, ns, p)
    with pytest.raises(TypeError):
        cache.release("1")


def test_config_errors():
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        kvprefix.Cache(0)
    assert e.value.code == kvprefix.EINVAL and e.value.function == "kvp_cache_new"
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(16, kvprefix.MAX_BLOCK_SIZE + 1)
    with pytest.raises(TypeError):
        kvprefix.Cache(16, on_event=3)
    c = kvprefix.Cache(16, 8, seed=3, verify_tokens=True)
    assert (c.n_blocks, c.block_size, c.seed, c.verify_tokens) == (16, 8, 3, True)


def test_close_and_context_manager(ns):
    with kvprefix.Cache(16, 4) as c:
        c.access(ns, prompt(8))
        assert not c.closed
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.stats()
    with pytest.raises(ValueError, match="closed"):
        c.lookup(ns, prompt(8))
    c.close()  # idempotent


def test_stats_dataclass_like(cache, ns):
    cache.access(ns, prompt(12))
    s = cache.stats()
    assert s.n_requests == 1 and s.n_blocks_stored == 3
    d = kvprefix.stats_dict(s)
    assert d["n_blocks_stored"] == 3 and len(d) == 16  # n_blocks_orphaned appended
    assert "n_blocks_stored=3" in repr(s)
    assert s == cache.stats()
    with pytest.raises(AttributeError):
        s.n_requests = 5
    assert kvprefix.stats_dict(cache.lookup(ns, prompt(12)))["n_blocks_cached"] == 3


def test_reset_and_verify_mode(ns):
    c = kvprefix.Cache(32, 4, verify_tokens=True)
    p = prompt(16)
    c.access(ns, p)
    assert c.lookup(ns, p).n_blocks_cached == 4
    c.reset()
    assert c.lookup(ns, p).n_blocks_cached == 0
    assert c.stats().n_blocks_cached == 0
    c.check()


def test_version():
    assert kvprefix.version() == kvprefix.__version__
    assert kvprefix.version().count(".") == 2


def test_eviction_policies(ns):
    """A scan of one-time prompts keeps SLRU's protected blocks; LRU loses them."""
    kept = {}
    for policy in ("lru", "slru", "s3fifo"):
        c = kvprefix.Cache(10, 1, eviction=policy, slru_protected_pct=50, s3fifo_small_pct=20)
        assert c.eviction == policy
        for hot in range(1, 5):
            c.access(ns, [hot])
            c.access(ns, [hot])
        for cold in range(100, 130):
            c.access(ns, [cold])
        c.check()
        kept[policy] = sum(c.lookup(ns, [hot, 0]).n_blocks_cached for hot in range(1, 5))
    assert kept == {"lru": 0, "slru": 4, "s3fifo": 4}
    assert kvprefix.Cache(4, eviction=2).eviction == "s3fifo"
    assert kvprefix.Cache(4, eviction=3).eviction == "cdecay"
    c = kvprefix.Cache(6, 1, eviction="cdecay", cdecay_tau=50, count_orphans=True)
    assert c.eviction == "cdecay"
    for t in range(40):
        c.access(ns, [t % 3, t % 5, t])
    c.check()
    assert 0 <= c.stats().n_blocks_orphaned <= c.stats().n_blocks_cached
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(4, eviction="cdecay", cdecay_ghost_pct=10001)
    with pytest.raises(ValueError):
        kvprefix.Cache(4, eviction="lfu")
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(4, eviction=7)
    with pytest.raises(kvprefix.InvalidArgumentError):
        kvprefix.Cache(4, slru_protected_pct=101)
