#!/usr/bin/env python3
"""bench_python.py - workload (c) of bench/bench_core.c driven from Python, and the binding's
per-call overhead.

    python3 bench/bench_python.py [--requests N] [--warmup N] [--reps N] [--quick]
            [--ext-dir DIR]

(c) has the shape of bench_core.c's: lengths uniform 512..8192 tokens, each prompt starting
with one of 1,000 shared system prompts (256..2048 tokens, Zipf popularity s=0.4) followed
by random tokens (uniform below 2^17); a 200k-block pool of 16-token blocks; 32 requests in
flight. Each request does Cache.acquire, Cache.commit of the whole prompt, then the request
32 places older is released. Prompts are generated with numpy in batches of 256 outside the
timed region (numpy's PRNG, so the prompts are not bench_core's bytes, but the same
distribution). The timed region is the Python loop over the batch's three calls; the tokens
are numpy uint32 rows, passed without a copy.

For the ratio, the same batches (the same prompts, on a second cache) are also run through
the C loop of _kvprefix_bench.Loop.run_batch, which makes the same three library calls per
request: the difference is the whole cost of the Python layer (argument parsing, releasing
the GIL, collecting events, building the Match).

_kvprefix_bench (bench/bench_python_ext.c) is not part of the package: python/meson.build
builds it beside the extension and never installs it, so the wheel does not hold it. This
script imports it from the build directory that pip's build kept, build-py/build/python by
default (scripts/test.sh and docs/python.md install with --config-settings
builddir=build-py/build); --ext-dir names another. Its cache is its own kvp_cache, made with
the Python caches' configuration from the same library objects. A third cache runs the same prompts through the
hash-outside-the-lock forms (Cache.keys(raw=True), acquire_keys, commit_keys with the same
keys): what a multi-threaded frontend would call. --profile picks the caches' hash profile
(default keyed, the library's default); --single-threaded makes them single-threaded (the
library skips its lock and the binding keeps the GIL). The requests are split into --reps chunks (default 5); each
figure is the median over the chunks, after --warmup untimed requests that fill the pool.

Per-call overhead: Cache.stats() timed in a Python loop against kvp_cache_stats timed in a C
loop (Loop.time_stats, on a cache of the same shape), and Cache.release of an unknown id (raises NotFoundError) and
Cache.grow of a request that already holds its capacity (no-op calls).

Every time is the thread's CPU time (time.thread_time(), CLOCK_THREAD_CPUTIME_ID in the C
loops), not wall time: the benchmark machine is shared, and CPU time does not count the
time the process waits for a core. Both sides use the same clock.

The last line, SUMMARY, is for scripts.
"""

import argparse
import importlib
import pathlib
import statistics
import sys
import time

import numpy as np

import kvprefix

REPO = pathlib.Path(__file__).resolve().parents[1]
BS = 16
RING = 32
BATCH = 256
MAX_TOKENS = 8192


class Workload:
    """The request stream: system prompts with Zipf popularity, random suffixes."""

    def __init__(self, seed, zipf):
        self.rng = np.random.default_rng(seed)
        self.sys_len = self.rng.integers(256, 2049, size=1000)
        self.sys = [self.rng.integers(0, 1 << 17, size=n, dtype=np.uint32) for n in self.sys_len]
        w = 1.0 / np.power(np.arange(1, 1001, dtype=np.float64), zipf)
        self.cdf = np.cumsum(w / w.sum())
        self.cdf[-1] = 1.0

    def batch(self, n):
        """n prompts as rows of a (n, MAX_TOKENS) uint32 array, and their lengths."""
        buf = self.rng.integers(0, 1 << 17, size=(n, MAX_TOKENS), dtype=np.uint32)
        lens = self.rng.integers(512, MAX_TOKENS + 1, size=n).astype(np.uint32)
        picks = np.searchsorted(self.cdf, self.rng.random(n))
        for k in range(n):
            pre = min(int(self.sys_len[picks[k]]), int(lens[k]))
            buf[k, :pre] = self.sys[picks[k]][:pre]
        return buf, lens


def run_py(cache, ns, buf, lens, first):
    """The timed Python loop of one batch; returns seconds."""
    acquire, commit, release = cache.acquire, cache.commit, cache.release
    rows = [buf[k, : lens[k]] for k in range(len(lens))]  # views, not copies
    t0 = time.thread_time()
    for k, tok in enumerate(rows):
        rid = first + k
        acquire(rid, ns, tok)
        commit(rid, tok)
        if rid >= RING:
            release(rid - RING)
    return time.thread_time() - t0


def run_py_keys(cache, ns, buf, lens, first):
    """run_py with the keys computed first (outside the cache's lock); returns seconds."""
    keys, acquire, commit, release = cache.keys, cache.acquire_keys, cache.commit_keys, cache.release
    rows = [buf[k, : lens[k]] for k in range(len(lens))]
    t0 = time.thread_time()
    for k, tok in enumerate(rows):
        rid = first + k
        root, kk = keys(ns, tok, raw=True)
        acquire(rid, ns, root, kk, tok)
        commit(rid, kk, tok)
        if rid >= RING:
            release(rid - RING)
    return time.thread_time() - t0


def load_ext(ext_dir):
    """The module _kvprefix_bench from the build directory (it is never installed)."""
    sys.path.insert(0, str(ext_dir))
    try:
        return importlib.import_module("_kvprefix_bench")
    except ImportError as e:
        sys.exit(
            f"bench_python.py: no _kvprefix_bench in {ext_dir} ({e}); build the package with "
            "pip's --config-settings builddir=build-py/build, or pass --ext-dir"
        )
    finally:
        sys.path.pop(0)


def workload(a, ext):
    w = Workload(a.seed, 0.4)
    ns = kvprefix.Namespace(model="bench-model", tenant="bench")
    opts = dict(hash_profile=a.profile, single_threaded=a.single_threaded)
    if a.profile in ("keyed", "siphash"):
        opts["hash_key"] = bytes(range(32))  # one key: the three caches compute equal keys
    py_cache = kvprefix.Cache(a.pool, BS, **opts)
    c_loop = ext.Loop(a.pool, BS, **opts)
    k_cache = kvprefix.Cache(a.pool, BS, **opts)
    rid = 0
    done = 0
    while done < a.warmup:
        n = min(BATCH, a.warmup - done)
        buf, lens = w.batch(n)
        run_py(py_cache, ns, buf, lens, rid)
        run_py_keys(k_cache, ns, buf, lens, rid)
        c_loop.run_batch(ns, buf, lens, rid, RING)
        rid += n
        done += n
    s0 = py_cache.stats()
    py_rps, c_rps, k_rps = [], [], []
    for c in range(a.reps):
        chunk = a.requests // a.reps + (c < a.requests % a.reps)
        t_py = t_c = t_k = 0.0
        done = 0
        while done < chunk:
            n = min(BATCH, chunk - done)
            buf, lens = w.batch(n)
            t_py += run_py(py_cache, ns, buf, lens, rid)
            t_k += run_py_keys(k_cache, ns, buf, lens, rid)
            t_c += c_loop.run_batch(ns, buf, lens, rid, RING) / 1e9
            rid += n
            done += n
        py_rps.append(chunk / t_py)
        c_rps.append(chunk / t_c)
        k_rps.append(chunk / t_k)
    s1 = py_cache.stats()
    py_cache.check()
    c_loop.check()
    k_cache.check()
    assert tuple(py_cache.stats())[:10] == c_loop.stats()[:10], "both saw the same requests"
    assert py_cache.stats()[:10] == k_cache.stats()[:10], "the keys forms did the same"
    hit = (s1.n_tokens_hit - s0.n_tokens_hit) / (s1.n_tokens_queried - s0.n_tokens_queried)
    med = statistics.median
    return med(py_rps), med(c_rps), med(k_rps), hit, s1.n_evictions


def per_call(a, ext):
    """Median over reps of (Python stats us, C stats us, release-unknown us, grow no-op us)."""
    c = kvprefix.Cache(1024, BS, hash_profile=a.profile, single_threaded=a.single_threaded)
    ns = kvprefix.Namespace(model="m")
    c.acquire(1, ns, np.arange(64, dtype=np.uint32))
    loop = ext.Loop(1024, BS, hash_profile=a.profile, single_threaded=a.single_threaded)
    one = np.arange(64, dtype=np.uint32).reshape(1, 64)
    loop.run_batch(ns, one, np.array([64], dtype=np.uint32), 1, 1 << 63)  # the same shape
    n = 200_000 if not a.quick else 50_000
    stats, cstats, rel, grow = [], [], [], []
    release, stats_fn, grow_fn = c.release, c.stats, c.grow
    for _ in range(a.reps):
        t0 = time.thread_time()
        for _ in range(n):
            stats_fn()
        stats.append((time.thread_time() - t0) / n * 1e6)
        cstats.append(loop.time_stats(n) / 1e3)
        t0 = time.thread_time()
        for _ in range(n // 4):
            try:
                release(99)
            except kvprefix.NotFoundError:
                pass
        rel.append((time.thread_time() - t0) / (n // 4) * 1e6)
        t0 = time.thread_time()
        for _ in range(n):
            grow_fn(1, 64)
        grow.append((time.thread_time() - t0) / n * 1e6)
    med = statistics.median
    return med(stats), med(cstats), med(rel), med(grow)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="20k requests, 5k warm-up")
    ap.add_argument("--profile", default="keyed", help="hash profile (default keyed)")
    ap.add_argument("--single-threaded", action="store_true", help="single-threaded caches")
    ap.add_argument(
        "--ext-dir",
        default=REPO / "build-py" / "build" / "python",
        help="where _kvprefix_bench was built (default build-py/build/python)",
    )
    a = ap.parse_args(argv)
    if a.quick:
        a.requests, a.warmup = 20_000, 5_000
    print(f"kvprefix {kvprefix.version()}, Python {sys.version.split()[0]}, numpy {np.__version__}")
    print(
        f"(c) workload: {a.requests} requests (+{a.warmup} warm-up), lengths 512..8192, "
        f"1000 system prompts of 256..2048 (Zipf s=0.40), pool {a.pool} blocks, {RING} in "
        f"flight; medians of {a.reps} chunks; thread CPU time; profile {a.profile}"
        f"{', single-threaded' if a.single_threaded else ''}"
    )
    ext = load_ext(a.ext_dir)
    py, cc, kk, hit, ev = workload(a, ext)
    print(f"  Python loop (acquire+commit+release)  {py:10.0f} req/s")
    print(f"  Python loop, keys outside the lock    {kk:10.0f} req/s")
    print(f"  C loop, same prompts (run_batch)      {cc:10.0f} req/s")
    print(f"  Python / C                            {py / cc:10.3f}")
    print(f"  Python layer per request              {(1 / py - 1 / cc) * 1e6:10.2f} us")
    print(f"  token hit rate {hit:.4f}, evictions {ev}")
    st, cst, rel, grow = per_call(a, ext)
    print("per-call overhead (medians of %d runs):" % a.reps)
    print(f"  Cache.stats()                         {st:10.3f} us")
    print(f"  kvp_cache_stats in a C loop           {cst:10.3f} us")
    print(f"  Python overhead of a call             {st - cst:10.3f} us")
    print(f"  Cache.grow no-op                      {grow:10.3f} us")
    print(f"  Cache.release unknown id (raises)     {rel:10.3f} us")
    target = "PASS" if py >= 10_000 else "MISS"
    print(
        f"SUMMARY py_rps={py:.0f} keys_rps={kk:.0f} c_rps={cc:.0f} ratio={py / cc:.3f} hit={hit:.4f} "
        f"stats_us={st:.3f} c_stats_us={cst:.3f} overhead_us={st - cst:.3f} "
        f"target_10000={target}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
