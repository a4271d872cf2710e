"""Lower tiers from Python: add_tier, load and store orders, confirmation, lookup_tiers,
tier_stats, and Events that name their tier's medium."""

import pytest

import kvprefix

from conftest import prompt


def tiered(on_event=None, n_blocks=16, cpu=32):
    c = kvprefix.Cache(n_blocks, 4, hash_profile="xxh3", on_event=on_event)
    assert c.add_tier("CPU", cpu) == 1
    return c


def test_store_then_load(ns):
    events = []
    c = tiered(events.append)
    t = prompt(17)
    m, loads = c.acquire_tiers(1, ns, t)
    assert m.n_blocks_hit == 0 and loads == []
    assert c.commit(1, t) == 4
    stores = c.tier_orders()
    assert [o.kind for o in stores] == [kvprefix.ORDER_STORE] * 4
    assert [o.block_index for o in stores] == [0, 1, 2, 3]
    assert c.tier_orders() == []  # handed out once
    c.release(1)
    # Not hit-able in CPU before confirmation: evict the device copies first.
    assert c.stats().n_blocks_in_use == 4  # the stores pin their device blocks
    for o in stores:
        c.tier_confirm(o.id, True)
    cpu_events = [e for e in events if e.tier == 1]
    assert [(e.type, e.medium) for e in cpu_events] == [(kvprefix.EVENT_STORED, "CPU")] * 4
    assert all(e.medium is None for e in events if e.tier == 0)
    assert len(cpu_events[0]) == 7  # the tuple keeps its fields; tier, medium are attributes
    filler = prompt(15 * 4, seed=9)
    c.acquire(2, ns, filler)
    c.release(2)
    tm = c.lookup_tiers(ns, t)
    assert tm.n_blocks_prefix == 4 and tm.where == [1, 1, 1, 1]
    assert tm.blocks_per_tier[:2] == (0, 4)
    m, loads = c.acquire_tiers(3, ns, t)
    assert m.n_blocks_hit == 0 and [o.block_index for o in loads] == [0, 1, 2, 3]
    blocks = c.request_blocks(3)
    assert [o.device_block for o in loads] == blocks[:4]
    assert [o.tier_block for o in loads] == [o.tier_block for o in stores]
    for o in loads:
        c.tier_confirm(o.id, ok=o.block_index != 3)
    c.commit(3, t)
    c.release(3)
    st = c.tier_stats(1)
    assert (st.medium, st.n_hits, st.n_loads, st.n_loads_failed, st.n_stores) == ("CPU", 4, 3, 1, 4)
    assert [s.medium for s in c.tier_stats()] == ["GPU", "CPU"]
    c.check()
    c.close()


def test_failed_store_changes_nothing(ns):
    c = tiered()
    t = prompt(9)
    c.acquire_tiers(1, ns, t)
    c.commit(1, t)
    c.release(1)
    for o in c.tier_orders():
        c.tier_confirm(o.id, False)
    assert c.tier_stats(1).n_blocks_ready == 0
    assert c.stats().n_blocks_in_use == 0
    assert c.lookup_tiers(ns, t).blocks_per_tier[1] == 0
    c.check()


def test_errors(ns):
    c = tiered()
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.add_tier("CPU", 8)  # the medium is taken
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.add_tier("has space", 8)
    with pytest.raises(TypeError):
        c.add_tier(b"DISK", 8)
    with pytest.raises(kvprefix.NotFoundError):
        c.tier_confirm(12345)
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.tier_stats(2)
    assert c.add_tier("DISK", 8) == 2
    c.acquire(1, ns, prompt(8))
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.add_tier("REMOTE", 8)  # not while requests are active
    c.release(1)
    v = kvprefix.Cache(8, 4, verify_tokens=True)
    with pytest.raises(kvprefix.NotSupportedError):
        v.add_tier("CPU", 8)


def _serve(c, req, ns, t):
    """One request as an engine runs it: loads confirmed, prefill committed, stores confirmed."""
    _, loads = c.acquire_tiers(req, ns, t)
    for o in loads:
        c.tier_confirm(o.id, True)
    c.commit(req, t)
    c.release(req)
    for o in c.tier_orders():
        c.tier_confirm(o.id, True)


@pytest.mark.parametrize("eviction,kept", [("lru", 0), ("slru", 2), ("s3fifo", 2)])
def test_tier_policy_keeps_a_reloaded_prefix_through_a_scan(ns, eviction, kept):
    """A tier's own policy: a prefix loaded back once survives a scan of one-time prompts in
    an SLRU or S3-FIFO CPU tier, and is flushed from an LRU one."""
    c = kvprefix.Cache(16, 4, hash_profile="xxh3")
    assert c.add_tier("CPU", 8, eviction=eviction) == 1
    hot, filler = prompt(9), prompt(15 * 4, seed=9)
    _serve(c, 1, ns, hot)
    c.acquire(2, ns, filler)  # not committed: the device copies go, nothing is stored
    c.release(2)
    _, loads = c.acquire_tiers(3, ns, hot)
    assert len(loads) == 2
    for o in loads:  # loaded back: a hit in the tier
        c.tier_confirm(o.id, True)
    c.commit(3, hot)
    c.release(3)
    for k in range(6):  # a scan: 12 blocks stored once each into the 8-block tier
        _serve(c, 10 + k, ns, prompt(9, seed=100 + k))
    c.acquire(20, ns, filler)  # the device copies go again
    c.release(20)
    assert c.lookup_tiers(ns, hot).blocks_per_tier[1] == kept
    c.check()


def test_tier_policy_errors():
    c = kvprefix.Cache(16, 4)
    with pytest.raises(ValueError):
        c.add_tier("CPU", 8, eviction="mru")
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.add_tier("CPU", 8, eviction="s3fifo", s3fifo_small_pct=0)
    assert c.add_tier("CPU", 8, eviction="cdecay", cdecay_tau=1000) == 1


def test_tiers_example_runs():
    """examples/python/tiers.py: its own checks (loaded KV equals computed KV) hold."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ)
    r = subprocess.run([sys.executable, str(REPO / "examples" / "python" / "tiers.py")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "turn 2" in r.stdout and "loaded from CPU" in r.stdout


def test_tier_metrics_parse(ns):
    """The tier families parse with prometheus_client and carry the medium label."""
    parser = pytest.importorskip("prometheus_client.parser")
    c = tiered()
    t = prompt(9)
    c.acquire_tiers(1, ns, t)
    c.commit(1, t)
    c.release(1)
    for o in c.tier_orders():
        c.tier_confirm(o.id)
    fams = {f.name: f for f in parser.text_string_to_metric_families(c.metrics({"engine": "e"}))}
    stores = fams["kvprefix_tier_stores"].samples
    assert [(s.labels, s.value) for s in stores] == [({"engine": "e", "medium": "CPU"}, 2.0)]
    with pytest.raises(kvprefix.InvalidArgumentError):
        c.metrics({"medium": "x"})
    assert "kvprefix_tier" not in kvprefix.Cache(8, 4).metrics()


@pytest.mark.parametrize("block_bytes", [0, 4096])
def test_block_bytes_scales_the_bytes_counters(ns, block_bytes):
    c = kvprefix.Cache(16, 4, hash_profile="xxh3", block_bytes=block_bytes)
    assert c.add_tier("CPU", 32) == 1
    t = prompt(12)
    c.acquire_tiers(1, ns, t)
    c.commit(1, t)
    c.release(1)
    stores = c.tier_orders()
    assert len(stores) == 3
    for o in stores:
        c.tier_confirm(o.id, True)
    st = c.tier_stats(1)
    assert st.n_stores == 3
    assert st.n_bytes_stored == 3 * (block_bytes or 1)
    c.check()
