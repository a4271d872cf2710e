"""Threads: the GIL is released around hashing and lookups, and a shared Cache stays
consistent (its mutex serialises library calls) without deadlocks, callbacks included."""

import threading
import time

import pytest

import kvprefix
from conftest import prompt

np = pytest.importorskip("numpy")


def test_threads_share_a_cache_exactly(ns):
    n_threads, per_thread = 4, 300
    events = []
    holder = {}

    def on_event(ev):
        events.append(ev.type)
        if len(events) % 97 == 0:
            holder["c"].stats()  # calling back into the cache from a callback

    c = holder["c"] = kvprefix.Cache(512, 16, on_event=on_event)
    shared = np.array(prompt(256), dtype=np.uint32)
    errors = []

    def worker(t):
        try:
            for i in range(per_thread):
                req = t * per_thread + i
                p = np.concatenate([shared, np.array(prompt(64, seed=req), dtype=np.uint32)])
                c.lookup(ns, p)
                c.acquire(req, ns, p, len(p) + 16)
                c.commit(req, p)
                c.grow(req, len(p) + 32)
                c.release(req)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "deadlock"
    assert errors == []
    s = c.stats()
    assert s.n_requests == n_threads * per_thread == s.n_lookups
    assert s.n_requests_active == 0
    assert events.count(kvprefix.EVENT_STORED) == s.n_blocks_stored
    assert events.count(kvprefix.EVENT_REMOVED) == s.n_evictions
    c.check()


def test_gil_released_during_hashing(ns):
    big = np.arange(8 << 20, dtype=np.uint32)  # 32 MB of tokens
    c = kvprefix.Cache(16, 16)
    t0 = time.perf_counter()
    c.hash_blocks(ns, big)
    one_call = time.perf_counter() - t0
    if one_call < 0.01:
        pytest.skip(f"hashing too fast to observe ({one_call * 1e3:.1f} ms)")
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    # With the GIL held for a whole call, the spinning thread could not record a tick in
    # the middle half of it; released, it ticks there as soon as the OS gives it a core
    # (the machine may be busy, so try up to 40 calls).
    found = False
    th = threading.Thread(target=spin)
    th.start()
    try:
        time.sleep(0.01)
        for _ in range(40):
            n0 = len(ticks)
            s = time.perf_counter()
            kvprefix.hash_blocks(big, 16)
            e = time.perf_counter()
            q = (e - s) / 4
            if any(s + q < t < e - q for t in ticks[max(0, n0 - 10):]):
                found = True
                break
    finally:
        stop.set()
        th.join()
    assert found, f"no tick inside any call; {len(ticks)} ticks in all"


def test_lookup_while_another_thread_holds_the_mutex(ns):
    """Two threads each running long calls on one cache both finish (no lock inversion)."""
    c = kvprefix.Cache((1 << 16) + 1024, 16)  # room for the writer: no eviction
    big = np.arange(1 << 20, dtype=np.uint32)
    c.access(ns, big)
    done = []

    def reader():
        for _ in range(10):
            assert c.lookup(ns, big).n_blocks_cached == (1 << 20) // 16
        done.append("r")

    def writer():
        for i in range(200):
            c.stats()
            c.access(ns, prompt(64, seed=i))
        done.append("w")

    ts = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
        assert not t.is_alive(), "deadlock"
    assert sorted(done) == ["r", "w"]
    c.check()
