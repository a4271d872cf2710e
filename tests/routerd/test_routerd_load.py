#!/usr/bin/python3
"""test_routerd_load.py - `kvprefix router`'s load-aware ranking and operability, end to end.

Three fake engines (fake_engine.c) hold 8, 4 and 0 blocks of one prompt. Each has a fake
vLLM /metrics endpoint (python http.server on its own port) whose running/waiting requests
and KV usage the test changes while the daemon scrapes them, then:

  1. scraped loads (--load-cap 1.5, cache first): for several load settings, the daemon's
     /score order equals an independent reference of the documented rule and its first
     worker is the one `kvprefix fleet`'s cache-aware-cap policy picks from the same cached
     blocks and loads (rank_probe: fleet's fl_rank_pick); rows carry the scraped load;
  2. a metrics endpoint that stops answering: logged once (level warn, logfmt), its load
     ages out after --load-ttl (null in the rows);
  3. a second daemon (--overlap-weight 0.5, Dynamo-style cost, no scraping, engine a from
     a config file written with vLLM's --kv-events-config keys): loads pushed to POST
     /load, loads given in the /score request, a candidate list ("workers"); each order
     checked against the reference and fleet's cache-aware pick with the same weight;
  4. operability: tcp://*:5557 refused with the fix named; a vLLM "publisher": "null"
     refused; --hash-key-file and KVPREFIX_HASH_KEY accepted (and a bad key file refused);
     --listen [::1] serving over IPv6, scoring an engine that publishes on tcp://[::1]:PORT
     (skipped when the machine has no IPv6 loopback);
     sd_notify: READY=1 after the daemon listens, STOPPING=1 at SIGTERM (NOTIFY_SOCKET).

    test_routerd_load.py KVPREFIX_BINARY FAKE_ENGINE_BINARY RANK_PROBE_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) without pyzmq.
"""
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import zmq  # noqa: F401 (the helpers below need it through test_routerd)
    from test_routerd import (DEADLINE, BLOCK, Daemon, Engine, Fail, expect, prompt,
                              wait_for)
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"test_routerd_load: SKIPPED: {e}")
    sys.exit(77)


class Metrics:
    """A fake engine's Prometheus endpoint: vLLM's series (and some it does not need)."""

    def __init__(self):
        self.running, self.waiting, self.kv = 0, 0, 0.0
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = outer.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, running, waiting=0, kv=0.0):
        with self.lock:
            self.running, self.waiting, self.kv = running, waiting, kv

    def text(self):
        with self.lock:
            r, w, k = self.running, self.waiting, self.kv
        lab = 'engine="0",model_name="m"'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{lab}}} {float(r)}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{lab}}} {float(w)}\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{lab}}} {k}\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.1"}} 3.0\n'
            "vllm:prompt_tokens_total{model_name=\"m\"} 12345.0\n")

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def stop_daemon(d):
    """SIGTERM: the daemon must exit 0."""
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
            raise Fail("the daemon did not stop on SIGTERM")
    d.log.close()
    d.proc.stdout.close()
    expect(d.proc.returncode == 0, f"daemon exit status {d.proc.returncode}")


def reference(rows, load_cap, weight, prompt_blocks):
    """The documented rule (docs/routing.md, "Load-aware ranking"), written independently:
    rows are (name, cached, load) in the index's order; returns the names, best first."""
    n = len(rows)
    loads = [r[2] for r in rows]
    least = loads.index(min(loads))
    limit = load_cap * sum(loads) / n if load_cap else float("inf")

    def key(i):
        name, cached, load = rows[i]
        over = load > limit and i != least
        if weight > 0:
            return (over, weight * max(0, prompt_blocks - cached) + load, -cached, i)
        return (over, -cached, load, i)
    return [rows[i][0] for i in sorted(range(n), key=key)]


def fleet_pick(probe, policy, load_cap, weight, prompt_blocks, rows):
    out = subprocess.run([probe, policy, str(load_cap), str(weight), str(prompt_blocks)] +
                         [f"{int(c)}:{l!r}" for _, c, l in rows],
                         capture_output=True, text=True, timeout=DEADLINE)
    expect(out.returncode == 0, f"rank_probe: {out.returncode} {out.stderr}")
    return rows[int(out.stdout)][0]


def index_rows(d, tokens, loads, extra=None):
    """The daemon's answer and its rows as (name, cached, load) in the index's order (score,
    blocks, engine id), with the loads the test set."""
    ans = d.score(tokens, **(extra or {}))["workers"]
    by_index = sorted(ans, key=lambda w: (-w["weighted"], -w["blocks"], w["engine"]))
    return ans, [(w["engine"], w["weighted"], loads[w["engine"]]) for w in by_index]


def check_order(d, probe, tokens, loads, load_cap, weight, extra=None):
    """Wait until the daemon ranks with the loads given, then compare with the reference and
    with fleet's pick."""
    policy = "cache-aware-cap" if load_cap else "cache-aware"
    blocks = len(tokens) // BLOCK

    def settled():
        ans, rows = index_rows(d, tokens, loads, extra)
        got = {w["engine"]: w["load"] for w in ans}
        return (ans, rows) if all(got[k] == loads[k] for k in got) else None
    ans, rows = wait_for(settled, f"the daemon to see loads {loads}")
    want = reference(rows, load_cap, weight, blocks)
    got = [w["engine"] for w in ans]
    expect(got == want, f"loads {loads}: daemon ranks {got}, the rule says {want}")
    pick = fleet_pick(probe, policy, load_cap, weight, blocks, rows)
    expect(got[0] == pick, f"loads {loads}: daemon picks {got[0]}, fleet's {policy} {pick}")
    over = [w["engine"] for w in ans if w["over_cap"]]
    return got, over


def scraped(exe, fake, probe, tmp, engines, mets, p):
    log = os.path.join(tmp, "d1.log")
    args = ["--block-size", str(BLOCK), "--load-cap", "1.5", "--scrape-interval", "100",
            "--load-ttl", "1500", "--log-format", "logfmt"]
    for e, m in zip(engines, mets):
        args += ["--engine", f"{e.name}={e.pub},replay={e.replay},metrics={m.url}"]
    d = Daemon(exe, args, log)
    try:
        for e in engines:
            e.wait_subscribed()
        engines[0].access(p)
        engines[1].access(p[:4 * BLOCK])
        engines[2].access(prompt(90000, 2))
        wait_for(lambda: {w["engine"]: w["blocks"] for w in d.score(p)["workers"]} ==
                 {"a": 8, "b": 4, "c": 0}, "the index to hold 8, 4, 0 blocks")
        # Step 1: loads vary; each ranking is the rule's and fleet's.
        cases = [((0, 0), (0, 0), (0, 0), ["a", "b", "c"], []),
                 ((10, 2), (1, 0), (2, 0), ["b", "c", "a"], ["a"]),
                 ((3, 0), (4, 2), (0, 0), ["a", "c", "b"], ["b"]),
                 ((1, 1), (0, 1), (1, 0), ["a", "b", "c"], [])]
        for la, lb, lc, want, want_over in cases:
            for m, (r, w) in zip(mets, (la, lb, lc)):
                m.set(r, w, kv=0.25)
            loads = {"a": float(sum(la)), "b": float(sum(lb)), "c": float(sum(lc))}
            got, over = check_order(d, probe, p, loads, 1.5, 0.0)
            expect(got == want, f"loads {loads}: {got}, expected {want} (by hand)")
            expect(over == want_over, f"loads {loads}: over the cap {over}, not {want_over}")
        wait_for(lambda: d.metric("kvprefix_router_worker_load", engine="a", dp_rank=0) == 2.0,
                 "/metrics: a's load")
        expect(d.metric("kvprefix_router_load_updates_total", source="scrape") >= 12,
               "scrapes counted")
        # Step 2: c's endpoint stops answering: one warning, its load ages out.
        mets[2].stop()
        wait_for(lambda: next(w for w in d.score(p)["workers"] if w["engine"] == "c")["load"]
                 is None, "c's load to age out")
        lines = open(log).read().splitlines()
        warn = [ln for ln in lines if "level=warn" in ln and "engine c" in ln]
        expect(len(warn) == 1, f"one warning for c's endpoint: {warn}")
        bad = [ln for ln in lines if not re.fullmatch(
            r'ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warn|error) '
            r'msg="([^"\\]|\\.)*"', ln)]
        expect(not bad, f"lines that are not logfmt: {bad[:3]}")
    finally:
        stop_daemon(d)


def pushed(exe, probe, tmp, engines, p):
    cfg = os.path.join(tmp, "vllm.json")
    a = engines[0]
    with open(cfg, "w") as f:  # vLLM's --kv-events-config, plus the engine's id
        json.dump({"engines": [{"id": "a", "enable_kv_cache_events": True, "publisher": "zmq",
                                "endpoint": a.pub, "replay_endpoint": a.replay, "topic": "",
                                "buffer_steps": 10000, "hwm": 100000,
                                "max_queue_size": 100000}]}, f)
    args = ["--block-size", str(BLOCK), "--overlap-weight", "0.5", "--config", cfg]
    for e in engines[1:]:
        args += ["--engine", f"{e.name}={e.pub},replay={e.replay}"]
    d = Daemon(exe, args, os.path.join(tmp, "d2.log"))
    try:
        for e in engines:
            e.wait_subscribed()
        for e in engines:  # re-publish: this daemon subscribed after the first accesses
            e.cmd("restart")
        for e in engines:
            e.wait_subscribed()
        engines[0].access(p)
        engines[1].access(p[:4 * BLOCK])
        engines[2].access(prompt(90000, 2))
        wait_for(lambda: {w["engine"]: w["blocks"] for w in d.score(p)["workers"]} ==
                 {"a": 8, "b": 4, "c": 0}, "the second daemon's index")
        status, body = d.request("POST", "/load", json.dumps({"loads": [
            {"engine": "a", "dp_rank": 0, "running": 3, "waiting": 1, "kv_usage": 0.5},
            {"engine": "b", "running": 0}, {"engine": "c", "running": 0}]}).encode())
        expect(status == 200, f"POST /load: {status} {body}")
        loads = {"a": 4.0, "b": 0.0, "c": 0.0}
        got, _ = check_order(d, probe, p, loads, 0, 0.5)
        expect(got == ["b", "a", "c"], f"cost ranking {got}")
        # Loads given with the request override the pushed ones (ENGINE/RANK over ENGINE).
        loads = {"a": 4.0, "b": 10.0, "c": 0.0}
        got, _ = check_order(d, probe, p, loads, 0, 0.5, {"loads": {"b": 7, "b/0": 10}})
        expect(got == ["a", "c", "b"], f"request loads: {got}")
        # Candidates.
        ans = d.score(p, workers=["c", "b/0"])["workers"]
        expect([w["engine"] for w in ans] == ["b", "c"], f"candidates: {ans}")
        expect(d.score(p, workers=["b/1"])["workers"] == [], "no such rank: no rows")
        for body, what in [(b'{"engine": "a"}', "no running"),
                           (b'{"engine": "a", "running": -1}', "negative"),
                           (b'{"engine": "a", "running": 1, "queue": 2}', "unknown member"),
                           (b'{"engine": "a", "running": 1, "kv_usage": 2}', "kv above 1"),
                           (b'[1]', "not an object")]:
            status, _ = d.request("POST", "/load", body)
            expect(status == 400, f"POST /load {what}: {status}")
        for extra in [{"workers": "a"}, {"loads": {"a": -1}}, {"loads": [1]}]:
            status, _ = d.request("POST", "/score",
                                  json.dumps(dict(tokens=p, **extra)).encode())
            expect(status == 400, f"/score {extra}: {status}")
    finally:
        stop_daemon(d)


def run_cli(exe, args, env=None):
    return subprocess.run([exe, "router"] + args, capture_output=True, text=True,
                          timeout=DEADLINE, env=env)


def operability(exe, fake, tmp, engine):
    out = run_cli(exe, ["--engine", "a=tcp://*:5557"])
    expect(out.returncode == 2 and "bind address" in out.stderr and
           "tcp://ENGINE-HOST:5557" in out.stderr, f"tcp://*: {out.returncode} {out.stderr}")
    out = run_cli(exe, ["--engine", "a=tcp://10.0.0.1:5557,replay=tcp://*:5558"])
    expect(out.returncode == 2 and "replay" in out.stderr, f"replay tcp://*: {out.stderr}")
    cfg = os.path.join(tmp, "null.json")
    with open(cfg, "w") as f:
        json.dump({"engines": [{"id": "a", "endpoint": "tcp://10.0.0.1:5557",
                                "publisher": "null"}]}, f)
    out = run_cli(exe, ["--config", cfg])
    expect(out.returncode == 1 and "publisher" in out.stderr, f"null publisher: {out.stderr}")
    key = "00112233445566778899aabbccddeeff"
    key_file = os.path.join(tmp, "key")
    with open(key_file, "w") as f:
        f.write(f"  {key}\n")
    base = ["--engine", f"a={engine.pub}", "--hash", "keyed", "--index-by", "engine-hash",
            "--port", "0"]
    for extra, env, what in [(["--hash-key-file", key_file], None, "key file"),
                             ([], dict(os.environ, KVPREFIX_HASH_KEY=key), "environment")]:
        p = subprocess.Popen([exe, "router"] + base + extra, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        line = p.stdout.readline()
        expect("listening on" in line, f"{what}: {line} {p.poll()}")
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            expect(key.encode() not in f.read(), f"{what}: the key is on the command line")
        p.send_signal(signal.SIGTERM)
        expect(p.wait(timeout=DEADLINE) == 0, f"{what}: exit status")
        p.stdout.close()
        p.stderr.close()
    out = run_cli(exe, base[:-2] + [])
    expect(out.returncode == 2 and "--hash-key" in out.stderr, f"no key: {out.stderr}")
    with open(key_file, "w") as f:
        f.write("not hex\n")
    out = run_cli(exe, base[:-2] + ["--hash-key-file", key_file])
    expect(out.returncode == 2 and key_file in out.stderr, f"bad key file: {out.stderr}")
    out = run_cli(exe, base[:-2] + ["--hash-key-file", key_file, "--hash-key", key])
    expect(out.returncode == 2, f"both key flags: {out.stderr}")
    out = run_cli(exe, ["--engine", f"a={engine.pub}", "--log-format", "json"])
    expect(out.returncode == 2 and "--log-format" in out.stderr, "bad --log-format")
    out = run_cli(exe, ["--engine", f"a={engine.pub}", "--load-cap", "0.5"])
    expect(out.returncode == 2 and "--load-cap" in out.stderr, "--load-cap below 1")
    # IPv6.
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
        s.close()
    except OSError:
        print("test_routerd_load: no IPv6 loopback: --listen [::1] not tested")
        return
    # An engine publishing on tcp://[::1]:PORT, the daemon listening on [::1] too.
    s6 = socket.socket(socket.AF_INET6)
    s6.bind(("::1", 0))
    port6 = s6.getsockname()[1]
    s6.close()
    e6 = Engine(fake, tmp, "v6", "")
    e6.pub = f"tcp://[::1]:{port6}"
    e6.start()
    p = subprocess.Popen([exe, "router", "--engine", f"v6={e6.pub},replay={e6.replay}",
                          "--listen", "[::1]:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    m = re.search(r"http://\[::1\]:(\d+)", line)
    expect(m is not None, f"--listen [::1]: {line}")
    c = socket.create_connection(("::1", int(m.group(1))), timeout=DEADLINE)
    c.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    reply = b""
    while chunk := c.recv(4096):
        reply += chunk
    c.close()
    expect(reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n")[0],
           f"/healthz over IPv6: {reply[:80]}")
    try:
        e6.wait_subscribed()
        e6.access(prompt(0, 3))
        d6 = type("D6", (), {})()  # the Daemon helpers' request/score over [::1]
        d6.url, d6.n_scores = f"http://[::1]:{m.group(1)}", 0
        d6.request = Daemon.request.__get__(d6)
        d6.score = Daemon.score.__get__(d6)
        wait_for(lambda: [(w["engine"], w["blocks"]) for w in d6.score(prompt(0, 3))["workers"]]
                 == [("v6", 3)], "the IPv6 engine's blocks scored")
    finally:
        e6.stop()
    p.send_signal(signal.SIGTERM)
    expect(p.wait(timeout=DEADLINE) == 0, "IPv6 daemon: exit status")
    p.stdout.close()


def notify(exe, tmp, engine):
    """Under systemd's protocol (NOTIFY_SOCKET, a datagram socket): READY=1 once listening,
    STOPPING=1 at SIGTERM. Skipped for a build without libsystemd."""
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    if "libsystemd" not in ldd:
        print("test_routerd_load: a build without libsystemd: sd_notify not tested")
        return
    path = os.path.join(tmp, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(DEADLINE)
    p = subprocess.Popen([exe, "router", "--engine", f"a={engine.pub}", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, NOTIFY_SOCKET=path))
    try:
        line = p.stdout.readline()
        expect("listening on" in line, f"notify: {line}")
        msg = sock.recv(4096).decode()
        expect("READY=1" in msg.split("\n"), f"notify: first message {msg!r}")
        p.send_signal(signal.SIGTERM)
        msg = sock.recv(4096).decode()
        expect("STOPPING=1" in msg.split("\n"), f"notify: at SIGTERM {msg!r}")
        expect(p.wait(timeout=DEADLINE) == 0, "notify: exit status")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        sock.close()


def main():
    exe, fake, probe = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        engines = [Engine(fake, tmp, n, "") for n in ("a", "b", "c")]
        mets = [Metrics() for _ in engines]
        try:
            for e in engines:
                e.start()
            p = prompt(0, 8)
            scraped(exe, fake, probe, tmp, engines, mets, p)
            pushed(exe, probe, tmp, engines, p)
            operability(exe, fake, tmp, engines[0])
            notify(exe, tmp, engines[0])
        finally:
            for e in engines:
                e.stop()
            for m in mets[:2]:
                m.stop()
    print("test_routerd_load: OK")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:
        print(f"test_routerd_load: FAILED: {e}")
        sys.exit(1)
