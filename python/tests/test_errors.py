"""The library's detail of a failure (kvp_errmsg) in Python exceptions: the message and
.detail say which argument and why, for the three misuses docs/python.md names."""

import threading

import pytest

import kvprefix

from conftest import prompt


def test_commit_of_other_tokens_names_the_range(cache, ns):
    p = prompt(40)
    cache.acquire(1, ns, p, capacity=48)
    other = list(p)
    other[20] += 1  # block 5 of 4 tokens: tokens[20..24)
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        cache.commit(1, other)
    assert e.value.detail == "tokens[20..24) differ from the acquired prompt"
    assert "tokens[20..24) differ from the acquired prompt" in str(e.value)
    assert e.value.function == "kvp_commit"
    assert e.value.code == kvprefix.EINVAL
    cache.release(1)


def test_zero_blocks_is_refused_with_its_reason():
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        kvprefix.Cache(0, 4)
    assert "n_blocks must be at least 1" in str(e.value)


def test_reserved_metric_label(cache):
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        cache.metrics({"state": "x"})
    assert e.value.detail == "label name 'state' is reserved"
    assert "label name 'state' is reserved" in str(e.value)


def test_each_thread_sees_its_own_detail(ns):
    c = kvprefix.Cache(64, 4)
    seen = {}

    def fail_commit(t):
        p = prompt(16, seed=t)
        c.acquire(t, ns, p)
        bad = list(p)
        bad[4 * t] += 1
        for _ in range(200):
            try:
                c.commit(t, bad)
            except kvprefix.InvalidArgumentError as e:
                seen.setdefault(t, set()).add(e.detail)
        c.release(t)

    threads = [threading.Thread(target=fail_commit, args=(t,)) for t in (1, 2, 3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in (1, 2, 3):
        assert seen[t] == {f"tokens[{4 * t}..{4 * t + 4}) differ from the acquired prompt"}
    c.close()
