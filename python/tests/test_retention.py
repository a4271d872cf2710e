"""Retention priorities from Python: Cache.set_retention, access(retention=...),
access_ids(retention=...), block_retention, and the errors of bad options."""

import pytest

import kvprefix


def scan(cache, ns, start, n, length=16):
    for q in range(n):
        cache.access(ns, list(range(start + q * length, start + (q + 1) * length)))


@pytest.mark.parametrize("eviction", ["lru", "slru", "s3fifo"])
def test_system_prompt_survives_scan(ns, eviction):
    system = list(range(1, 17))  # 4 blocks of 4 tokens
    hits = {}
    for prio in (35, 90):
        cache = kvprefix.Cache(32, 4, eviction=eviction)
        retention = {"ranges": [(0, 16, prio)]}
        m = cache.access(ns, system + [1000, 1001, 1002, 1003], retention=retention)
        assert m.n_blocks_stored == 5
        scan(cache, ns, 5000, 20)
        hits[prio] = cache.lookup(ns, system + [7]).n_blocks_cached
        cache.check()
    assert hits == {35: 0, 90: 4}


def test_set_retention_and_block_retention(cache, ns):
    p = list(range(1, 13))
    cache.acquire(1, ns, p, 12)
    cache.commit(1, p)
    cache.set_retention(1, {"priority": 20, "ranges": [(0, 4, 80, 0)]})
    blocks = cache.request_blocks(1)
    cache.release(1)
    assert [cache.block_retention(b) for b in blocks] == [80, 20, 20]
    cache.check()
    # access_ids with a duration: set when the clock (requests so far) reads 1, at this
    # access's release, it lapses when the clock reads 1 + 2.
    assert cache.stats().n_requests == 1
    ids = [11, 12]
    cache.access_ids(ns, ids, retention={"priority": 0, "duration": 2})
    hit = cache.lookup_ids(ns, ids)
    assert cache.stats().n_requests == 2
    assert cache.block_retention(hit.block_ids[0]) == 0
    cache.access(ns, [99, 98, 97, 96])
    assert cache.block_retention(hit.block_ids[0]) == 35
    cache.check()


def test_errors(cache, ns):
    p = list(range(1, 9))
    cache.acquire(1, ns, p)
    with pytest.raises(kvprefix.InvalidArgumentError, match="past the prompt"):
        cache.set_retention(1, {"ranges": [(0, 9, 50)]})
    with pytest.raises(kvprefix.InvalidArgumentError, match="above 100"):
        cache.set_retention(1, {"priority": 101})
    with pytest.raises(kvprefix.InvalidArgumentError, match="unknown key"):
        cache.set_retention(1, {"prio": 10})
    with pytest.raises(TypeError):
        cache.set_retention(1, [("priority", 10)])
    with pytest.raises(kvprefix.InvalidArgumentError):
        cache.set_retention(1, {"ranges": [(0, 4)]})
    with pytest.raises(kvprefix.InvalidArgumentError, match="more than 64"):
        cache.set_retention(1, {"ranges": [(0, 4, 1)] * 65})
    with pytest.raises(kvprefix.KvprefixError):
        cache.set_retention(2, {})
    with pytest.raises(kvprefix.InvalidArgumentError, match="past the prompt"):
        cache.access(ns, p, retention={"ranges": [(4, 12, 90)]})
    cache.release(1)
    cache.check()
