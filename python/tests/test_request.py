"""Cache.request(): the context manager that acquires on entry and releases on exit."""

import sys
import threading

import pytest

import kvprefix
from conftest import prompt


def test_normal_exit_releases(cache, ns):
    p = prompt(10)
    with cache.request(1, ns, p, capacity=16) as req:
        assert isinstance(req, kvprefix.Request) and req.active and req.req_id == 1
        assert req.match.n_tokens == 10 and req.match.block_ids is None
        assert req.blocks == cache.request_blocks(1) and len(req.blocks) == 4
        assert cache.requests() == [1] and cache.stats().n_requests_active == 1
        assert req.commit(p) == 2
        req.grow(20)
        assert len(req.blocks) == 5
    assert cache.requests() == [] and cache.stats().n_requests_active == 0
    assert not req.active
    # What was committed stays cached for the next request.
    with cache.request(2, ns, p) as req2:
        assert req2.match.n_tokens_hit == 8


def test_exception_exit_releases(cache, ns):
    with pytest.raises(RuntimeError, match="body"):
        with cache.request(1, ns, prompt(8)) as req:
            req.commit(prompt(8))
            raise RuntimeError("body")
    assert cache.requests() == [] and not req.active
    assert cache.stats().n_blocks_in_use == 0


def test_release_failure_does_not_mask_the_body(cache, ns):
    with pytest.raises(KeyError) as e:
        with cache.request(1, ns, prompt(8)):
            cache.release_all()  # the exit's release now fails with NotFoundError
            raise KeyError("body")
    if sys.version_info >= (3, 11):
        assert any("releasing request 1" in n for n in e.value.__notes__)
    # Without an exception in the body, the release error is what the with statement raises.
    with pytest.raises(kvprefix.NotFoundError):
        with cache.request(2, ns, prompt(8)):
            cache.release(2)


def test_double_release_is_impossible(cache, ns):
    with cache.request(1, ns, prompt(8)) as req:
        pass
    # A new request takes the same id; the old Request must never release it.
    cache.acquire(1, ns, prompt(8))
    assert req.__exit__(None, None, None) is False
    with pytest.raises(ValueError, match="entered already"):
        with req:
            pass
    assert cache.requests() == [1]
    cache.release(1)


def test_use_after_exit_raises(cache, ns):
    p = prompt(8)
    req = cache.request(1, ns, p)
    with pytest.raises(ValueError, match="not active"):
        req.blocks  # noqa: B018 (not entered: nothing was acquired)
    assert cache.requests() == []
    with req:
        m = req.match
    for use in (lambda: req.blocks, lambda: req.commit(p), lambda: req.grow(16)):
        with pytest.raises(ValueError, match="request 1 has ended"):
            use()
    assert req.match == m  # the record of what acquire found stays readable
    assert "ended" in repr(req)


def test_failed_entry_holds_nothing(ns):
    c = kvprefix.Cache(4, 4)
    c.acquire(1, ns, prompt(16))  # pins the whole pool
    req = c.request(2, ns, prompt(8, seed=2))
    with pytest.raises(kvprefix.NoSpaceError):
        with req:
            pass
    assert c.requests() == [1] and not req.active
    c.release(1)
    with req:  # nothing was held, so entering again may succeed
        assert c.requests() == [2]
    assert c.requests() == []
    with pytest.raises(TypeError, match=r"request\(\): ns"):
        c.request(3, "not a namespace", prompt(8))
    with pytest.raises(kvprefix.InvalidArgumentError, match=r"request\(\): tokens\[0\]"):
        with c.request(3, ns, [-1]):
            pass
    assert c.requests() == []


def test_callback_error_on_entry_releases(ns):
    armed = []

    def on_event(ev):
        if armed:
            raise RuntimeError("callback")

    c = kvprefix.Cache(4, 4, on_event=on_event)
    c.access(ns, prompt(16))  # four cached blocks: the next request evicts them
    armed.append(True)
    with pytest.raises(kvprefix.EventCallbackError):
        with c.request(1, ns, prompt(16, seed=5)):
            pytest.fail("the body must not run")
    assert c.requests() == []  # acquired, then released at once: no __exit__ follows
    c.check()


def test_closed_cache_exit_is_quiet(ns):
    c = kvprefix.Cache(16, 4)
    with c.request(1, ns, prompt(8)) as req:
        c.close()
    assert not req.active
    with pytest.raises(ValueError, match="closed"):
        with c.request(2, ns, prompt(8)):
            pass


def test_requests_under_threads(ns):
    c = kvprefix.Cache(512, 4)
    errors = []

    def worker(t):
        try:
            for i in range(200):
                rid = t * 1000 + i
                p = prompt(24, seed=i % 7)
                with c.request(rid, ns, p) as req:
                    req.commit(p)
                    assert len(req.blocks) == 6
        except Exception as e:  # pragma: no cover: reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    s = c.stats()
    assert c.requests() == [] and s.n_requests == 800 and s.n_requests_active == 0
    c.check()
