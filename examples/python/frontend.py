#!/usr/bin/env python3
"""frontend.py - a toy serving scheduler driven by kvprefix, over a request log.

    python3 examples/python/frontend.py LOG.jsonl [--blocks N] [--block-size N]
            [--max-running N] [--metrics]

LOG is JSON Lines in kvprefix's token format (what examples/gen_chatlog writes): one request
per line with "tokens", optional "output_tokens", "model", "adapter", "tenant",
"cache_salt". The loop is the shape of a continuous-batching engine's scheduler:

  each step
    1. admit waiting requests in arrival order while the pool can take them:
       Cache.acquire pins the cached prefix and allocates the rest; only the prompt tokens
       after Match.n_tokens_hit would be prefilled; the whole prompt is then committed;
       NoSpaceError means "wait for a release"; RequestTooBigError means the request needs
       more blocks than the whole pool and can never fit: it is rejected at once;
    2. decode one token for every running request: Cache.grow makes room for it (blocks
       are allocated as decode goes, as vLLM does); when the pool is full the newest running
       request is preempted (released and queued again: on re-admission its prefix, generated
       tokens included, is found in the cache); Cache.commit registers each block that
       fills, so generated blocks become reusable too;
    3. release the requests that produced all their output tokens.

The model is not run: a request's "output" is its logged output_tokens (or 16 filler tokens).
The summary shows prefill tokens skipped and the cache's own counters; --metrics prints the
Prometheus exposition at the end.
"""

import argparse
import array
import collections
import json
import sys
import time

import kvprefix


class Request:
    """One request of the log and its progress."""

    __slots__ = ("req_id", "ns", "seq", "n_prompt", "output", "n_out")

    def __init__(self, req_id, ns, prompt, output):
        self.req_id = req_id
        self.ns = ns
        self.seq = array.array("I", prompt)  # prompt, then generated tokens (a uint32 buffer)
        self.n_prompt = len(prompt)
        self.output = output
        self.n_out = 0


def read_log(path):
    """Yield (namespace, prompt, output) for each request line of a token log."""
    namespaces = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            key = (r.get("model"), r.get("adapter"), r.get("tenant"), r.get("cache_salt"))
            ns = namespaces.get(key)
            if ns is None:
                ns = namespaces[key] = kvprefix.Namespace(*key)
            prompt = r.get("tokens") or []
            if not prompt:
                continue
            output = r.get("output_tokens") or [0] * 16
            yield ns, prompt, output


def run(path, n_blocks, block_size, max_running, out=sys.stdout):
    """Run the scheduler over the log; return a dict of the figures it printed."""
    cache = kvprefix.Cache(n_blocks, block_size)
    waiting = collections.deque(
        Request(i, ns, p, o) for i, (ns, p, o) in enumerate(read_log(path))
    )
    running = []
    n_requests = len(waiting)
    prefill_total = prefill_skipped = rejected = steps = max_seen = preemptions = 0
    t0 = time.perf_counter()
    while waiting or running:
        steps += 1
        # Step 1: admit.
        while waiting and len(running) < max_running:
            r = waiting[0]
            try:
                m = cache.acquire(r.req_id, r.ns, r.seq, len(r.seq) + 1)
            except kvprefix.RequestTooBigError:  # larger than the pool: retrying never helps
                waiting.popleft()
                rejected += 1
                continue
            except kvprefix.NoSpaceError:
                break
            waiting.popleft()
            prefill_total += len(r.seq)
            prefill_skipped += m.n_tokens_hit
            cache.commit(r.req_id, r.seq)
            running.append(r)
        max_seen = max(max_seen, len(running))
        # Step 2: decode one token each, preempting the newest request when the pool is full.
        for r in list(running):
            if r not in running:
                continue  # preempted by an older request of this step
            while True:
                try:
                    cache.grow(r.req_id, len(r.seq) + 1)
                    break
                except kvprefix.RequestTooBigError:  # its decode outgrew the whole pool
                    running.remove(r)
                    cache.release(r.req_id)
                    rejected += 1
                    break
                except kvprefix.NoSpaceError:
                    victim = running.pop()
                    cache.release(victim.req_id)
                    waiting.appendleft(victim)
                    preemptions += 1
                    if victim is r:
                        break
            if r not in running:
                continue
            r.seq.append(r.output[r.n_out])
            r.n_out += 1
            if len(r.seq) % block_size == 0:
                cache.commit(r.req_id, r.seq)
        # Step 3: finish.
        still = []
        for r in running:
            if r.n_out == len(r.output):
                cache.release(r.req_id)
            else:
                still.append(r)
        running = still
    elapsed = time.perf_counter() - t0
    cache.check()
    s = cache.stats()
    res = {
        "requests": n_requests,
        "rejected": rejected,
        "steps": steps,
        "max_running": max_seen,
        "preemptions": preemptions,
        "prefill_tokens": prefill_total,
        "prefill_skipped": prefill_skipped,
        "stats": s,
        "seconds": elapsed,
    }
    rate = prefill_skipped / prefill_total if prefill_total else 0.0
    print(
        f"frontend: {n_requests} requests ({rejected} rejected as larger than the pool), "
        f"{steps} steps, up to {max_seen} running, {preemptions} preemptions, {elapsed:.2f} s",
        file=out,
    )
    print(
        f"prefill: {prefill_total} prompt tokens, {prefill_skipped} skipped ({rate:.1%}); "
        f"cache: {s.n_blocks_stored} blocks stored, {s.n_evictions} evictions, "
        f"{s.n_blocks_deduped} deduplicated",
        file=out,
    )
    res["cache"] = cache
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="token-format request log (JSON Lines)")
    ap.add_argument("--blocks", type=int, default=4096, help="KV pool size in blocks")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block")
    ap.add_argument("--max-running", type=int, default=32, help="batch size")
    ap.add_argument("--metrics", action="store_true", help="print Prometheus metrics")
    a = ap.parse_args(argv)
    res = run(a.log, a.blocks, a.block_size, a.max_running)
    if a.metrics:
        sys.stdout.write(res["cache"].metrics({"engine": "frontend.py"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
