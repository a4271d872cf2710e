"""Events delivered to a Python callable, and callbacks that raise or call back."""

import pytest

import kvprefix
from conftest import prompt


def test_events_delivered_in_order(ns):
    events = []
    c = kvprefix.Cache(4, 4, on_event=events.append)
    assert c.on_event is not None
    p = prompt(16)
    c.access(ns, p)
    assert [e.type for e in events] == [kvprefix.EVENT_STORED] * 4
    assert [e.block_id for e in events] == sorted(e.block_id for e in events)
    assert all(e.n_tokens == 4 and e.reason == 0 for e in events)
    assert [e.parent for e in events[1:]] == [e.key for e in events[:-1]]
    events.clear()
    c.access(ns, prompt(16, seed=9))  # the pool is full: evictions
    removed = [e for e in events if e.type == kvprefix.EVENT_REMOVED]
    assert removed and all(e.reason == kvprefix.REMOVED_EVICTED for e in removed)
    assert c.stats().n_evictions == len(removed)
    events.clear()
    c.reset()
    assert events[-1].type == kvprefix.EVENT_CLEARED
    assert all(e.reason == kvprefix.REMOVED_RESET for e in events[:-1])
    c.check()


def test_raising_callback(ns):
    seen = []

    def cb(ev):
        seen.append(ev)
        if len(seen) == 1:
            raise RuntimeError("boom")

    c = kvprefix.Cache(64, 4, on_event=cb)
    p = prompt(16)
    m = c.acquire(1, ns, p)  # no event: nothing to deliver
    assert m.n_tokens == 16 and seen == []
    with pytest.raises(kvprefix.EventCallbackError) as e:
        c.commit(1, p)  # the first event raises; events 2..4 are still delivered
    # The commit completed: its result is on the exception.
    assert isinstance(e.value.__cause__, RuntimeError)
    assert e.value.result == 4 and e.value.code == kvprefix.OK
    assert len(seen) == 4 and [ev.block_id for ev in seen] == c.request_blocks(1)
    c.check()
    assert c.stats().n_requests_active == 1
    c.release(1)
    assert c.lookup(ns, p).n_blocks_cached == 4
    c.check()


def test_every_raise_keeps_cache_consistent(ns):
    def cb(ev):
        raise ValueError("always")

    c = kvprefix.Cache(8, 4, on_event=cb)
    for i in range(20):
        with pytest.raises(kvprefix.EventCallbackError):
            c.access(ns, prompt(16, seed=i))
        c.check()
    assert c.stats().n_requests == 20


def test_callback_may_call_the_cache(ns):
    holder = {}
    snapshots = []

    def cb(ev):
        snapshots.append(holder["c"].stats().n_blocks_stored)

    c = holder["c"] = kvprefix.Cache(64, 4, on_event=cb)
    c.access(ns, prompt(16))
    # Delivered after the call: every snapshot sees the finished call.
    assert snapshots == [4, 4, 4, 4]


def test_failed_call_emits_no_event(ns):
    events = []
    c = kvprefix.Cache(4, 4, on_event=events.append)
    with pytest.raises(kvprefix.RequestTooBigError):
        c.acquire(1, ns, prompt(8), 100)
    c.acquire(2, ns, prompt(8), 16)  # the whole pool: pinned
    with pytest.raises(kvprefix.NoSpaceError):
        c.acquire(3, ns, prompt(4))
    assert events == []


def test_callback_cycle_collected(ns):
    import gc
    import weakref

    class Holder:
        pass

    h = Holder()
    h.cache = kvprefix.Cache(8, 4, on_event=lambda ev: h)
    r = weakref.ref(h)
    del h
    gc.collect()
    assert r() is None
