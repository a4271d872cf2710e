#!/usr/bin/python3
"""test_routerd_tokens.py - `kvprefix router --index-by tokens|engine-hash` end to end.

A fleet of three fake engines (tests/routerd/fake_engine.c) whose hash configurations no
single router setting reproduces:

  vllm-rand   vllm-sha256-cbor with a random NONE_HASH seed (vLLM without PYTHONHASHSEED)
  vllm-fixed  vllm-sha256-cbor with a fixed seed (the one the engine-hash router is given)
  keyed       keyed with a random 256-bit key (SGLang-like: a scheme of its own)

and two daemons subscribed to all three:

  1. --index-by tokens: every engine's prompts are scored exactly (the daemon's blocks equal
     each engine's own lookup, for every prompt, evictions included), one hash group for
     the fleet; a request with a salt scores 'notsup'; /healthz says "index": "tokens";
     the token map's metrics are there, nothing unresolved;
  2. --index-by engine-hash with the fixed seed: vllm-fixed is scored exactly; the other two
     score 0 and their mismatches are counted per engine
     (kvprefix_router_key_mismatch_total{engine}), logged once per worker with the likely
     cause (the seed for vllm-rand) and listed in /healthz; vllm-fixed has checked keys and
     no mismatch;
  3. option errors (exit 2); SIGTERM -> exit 0; no process left.

    test_routerd_tokens.py KVPREFIX_BINARY FAKE_ENGINE_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) without pyzmq or prometheus_client.
"""
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_routerd as base  # noqa: E402  (exits 77 without its modules)
from test_routerd import DEADLINE, Fail, expect, read_line, wait_for  # noqa: E402


class Engine(base.Engine):
    """A fake engine with its own hash profile and seed."""

    def __init__(self, exe, tmp, name, profile, seed):
        super().__init__(exe, tmp, name, f"kv@{name}@m")
        self.profile, self.seed = profile, seed

    def start(self):
        self.proc = subprocess.Popen(
            [self.exe, self.pub, self.replay, self.topic, self.profile, self.seed],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        expect(read_line(self.proc, self.name) == "READY", f"{self.name}: not READY")


def prompts():
    """Prompts sharing prefixes, as (engines that serve it, tokens)."""
    out = []
    for i in range(6):
        head = list(range(100 * (i % 3), 100 * (i % 3) + 2 * base.BLOCK))
        tail = [7000 + 37 * i + k for k in range((1 + i % 3) * base.BLOCK + 5)]
        out.append(([i % 3, (i + 1) % 3], head + tail))
    return out


def check_tokens(d, engines, ps):
    for _, p in ps:
        for e in engines:
            base.exact(d, e, e.name, [p])
    st = d.score(ps[0][1], salt="s1")
    expect(all(w["state"] == "notsup" and w["blocks"] == 0 for w in st["workers"]),
           f"a salted request in token mode: {st}")
    status, body = d.request("GET", "/healthz")
    h = json.loads(body)
    expect(status == 200 and h["index"] == "tokens" and "key_mismatch" not in h,
           f"healthz: {h}")
    expect(d.metric("kvprefix_router_index_mode", mode="tokens") == 1, "index mode metric")
    expect(d.metric("kvprefix_router_token_map_entries") > 0, "token map entries")
    expect(d.metric("kvprefix_router_token_map_bytes") > 0, "token map bytes")
    expect(d.metric("kvprefix_router_token_unresolved_blocks_total") == 0, "unresolved blocks")
    expect(d.metric("kvprefix_router_key_mismatch_total") == 0, "no key check in token mode")


def check_engine_hash(d, engines, ps, log_path):
    rand, fixed, keyed = engines
    for _, p in ps:
        base.exact(d, fixed, fixed.name, [p])
    for e in (rand, keyed):
        wait_for(lambda: d.metric("kvprefix_router_key_mismatch_total", engine=e.name) > 0,
                 f"{e.name}'s key mismatches counted")
    expect(d.metric("kvprefix_router_key_mismatch_total", engine=fixed.name) == 0,
           "vllm-fixed's keys are the router's")
    expect(d.metric("kvprefix_router_key_checked_total", engine=fixed.name) > 0,
           "vllm-fixed's keys were checked")
    for _, p in ps:
        for e in (rand, keyed):
            want = e.lookup(p)
            got = d.blocks(p)[e.name]
            expect(got == (0, "scored"), f"{e.name}: engine holds {want}, daemon {got}")
    status, body = d.request("GET", "/healthz")
    h = json.loads(body)
    mm = h.get("key_mismatch", {})
    expect(status == 200 and h["index"] == "engine-hash", f"healthz: {h}")
    expect(set(mm) == {f"{rand.name}/0", f"{keyed.name}/0"}, f"healthz key_mismatch: {mm}")
    expect("seed" in mm[f"{rand.name}/0"]["likely"], f"likely cause: {mm}")
    d.log.flush()
    with open(log_path) as f:
        log = f.read()
    for e in (rand, keyed):
        n = log.count(f"worker '{e.name}' dp 0: block keys differ")
        expect(n == 1, f"{e.name}: logged {n} times:\n{log}")
    expect(f"worker '{fixed.name}' dp 0: block keys differ" not in log, "vllm-fixed logged")


def sync(daemons, engines):
    """Until both daemons know every engine: wait-sub sees only the first subscriber, and a
    daemon subscribed later learns of earlier batches at the next one (a gap, replayed)."""
    kick = [30000]

    def known():
        for e in engines:
            e.access(list(range(kick[0], kick[0] + base.BLOCK)))
            kick[0] += base.BLOCK
        for d in daemons:
            status, body = d.request("GET", "/healthz")
            if json.loads(body)["workers"] != len(engines):
                return False
        return True
    wait_for(known, "both daemons to see every engine")


def check_cli_errors(kvprefix, tmp):
    ep = f"ipc://{tmp}/none.pub"
    for args, msg in [(["--index-by", "hashes"], "is not tokens or engine-hash"),
                      (["--index-by", "tokens", "--redis", "127.0.0.1:1"], "cannot be used"),
                      (["--index-by", "engine-hash", "--token-seed", "3"], "--token-seed")]:
        p = subprocess.run([kvprefix, "router", "--engine", f"a={ep}"] + args,
                           capture_output=True, text=True, timeout=DEADLINE)
        expect(p.returncode == 2 and msg in p.stderr, f"{args}: exit {p.returncode}, {p.stderr!r}")


def main():
    kvprefix, fake = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="routerd-tok-") as tmp:
        fixed_seed = "fleet-seed-42"
        engines = [Engine(fake, tmp, "vllm-rand", "vllm-sha256-cbor", secrets.token_hex(8)),
                   Engine(fake, tmp, "vllm-fixed", "vllm-sha256-cbor", fixed_seed),
                   Engine(fake, tmp, "keyed", "keyed", secrets.token_hex(32))]
        daemons = []
        try:
            check_cli_errors(kvprefix, tmp)
            for e in engines:
                e.start()
            specs = []
            for e in engines:
                specs += ["--engine", f"{e.name}={e.pub},replay={e.replay}"]
            tok_log, eh_log = os.path.join(tmp, "tokens.log"), os.path.join(tmp, "hash.log")
            daemons.append(base.Daemon(kvprefix, specs + ["--index-by", "tokens",
                                                          "--token-seed", "12345"], tok_log))
            daemons.append(base.Daemon(kvprefix, specs + [
                "--index-by", "engine-hash", "--hash", "vllm-sha256-cbor",
                "--vllm-seed", fixed_seed, "--replay-timeout", "8000"], eh_log))
            for e in engines:
                e.wait_subscribed()
            sync(daemons, engines)
            ps = prompts()
            for served, p in ps:
                for k in served:
                    engines[k].access(p)
            # More than the engines' 64 blocks in all: evictions reach the map too.
            for i in range(8):
                engines[i % 3].access([20000 + 50 * i + k for k in range(4 * base.BLOCK)])
            check_tokens(daemons[0], engines, ps)
            check_engine_hash(daemons[1], engines, ps, eh_log)
            for d in daemons:
                d.proc.send_signal(signal.SIGTERM)
                expect(d.proc.wait(timeout=DEADLINE) == 0, f"daemon exit {d.proc.returncode}")
        except Fail:
            for d, name in zip(daemons, ("tokens", "hash")):
                d.log.flush()
                with open(os.path.join(tmp, f"{name}.log")) as f:
                    sys.stderr.write(f"daemon log ({name}):\n" + f.read())
            raise
        finally:
            for e in engines:
                e.stop()
            for d in daemons:
                if d.proc.poll() is None:
                    d.proc.kill()
                    d.proc.wait()
                d.log.close()
        for p in [e.proc for e in engines] + [d.proc for d in daemons]:
            expect(p.poll() is not None, "a process is still running")
    print("test_routerd_tokens: ok")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"test_routerd_tokens: FAIL: {e}")
        sys.exit(1)
