"""Threads: the GIL is released around hashing and lookups, and a shared Cache stays
consistent (its mutex serialises library calls) without deadlocks, callbacks included."""

import sys
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
    """With a switch interval far longer than the test, a thread holding the GIL keeps it
    until it releases it itself. The spinning thread takes the GIL only when the other
    releases it (and gives it back at once with sleep(0)), so it can record a tick between
    a call's start and end only if the call released the GIL."""
    big = np.arange(4 << 20, dtype=np.uint32)  # 16 MB of tokens
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0)  # releases the GIL

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    th = threading.Thread(target=spin)
    try:
        th.start()
        time.sleep(0.01)
        c = kvprefix.Cache(len(big) // 16 + 16, 16)
        c.access(ns, big)  # so that the lookup hashes and probes every block
        inside = []
        for call in (lambda: kvprefix.hash_blocks(big, 16), lambda: c.lookup(ns, big)):
            # A busy machine may not schedule the spinning thread during one call: up to
            # 5 tries (a call that keeps the GIL never lets it tick, however often).
            n_in = 0
            for _ in range(5):
                n0 = len(ticks)
                s = time.perf_counter()
                call()
                e = time.perf_counter()
                n_in = sum(1 for t in ticks[n0:] if s < t < e)
                time.sleep(0.001)
                if n_in > 0:
                    break
            inside.append(n_in)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert all(n > 0 for n in inside), inside


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
