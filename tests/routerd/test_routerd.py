#!/usr/bin/python3
"""test_routerd.py - `kvprefix router` end to end.

Starts two fake engines (tests/routerd/fake_engine.c: a kvp_cache with a kvp_publisher, commands
on stdin), a raw ZeroMQ peer that publishes only junk, and the daemon on a free port (it
prints the port), all on ipc:// endpoints in a temporary directory, then checks:

  1. ranking: each engine's prompts rank it first, with the blocks it holds;
  2. garbage in an engine's stream and from the junk peer: counted per reason, ignored;
  3. a dropped batch (the engine keeps it in its replay buffer) -> gap -> replay: the
     daemon's index equals the engine's cache exactly (evictions included);
  4. a publisher restart (a new process, sequence back to 0), and one whose batch 0 is lost
     (recognised by its later timestamp, refilled from replay): old blocks gone, new exact;
  5. a gap on an engine whose replay endpoint has no listener: the replay times out, the
     worker is stale until its publisher restarts (in-process) and is then scored again;
  6. HTTP errors (bad JSON, bad tokens, a body above --max-body, unknown path);
  7. /metrics parses with prometheus_client and its counters match what was done;
  8. bad command lines and config files exit 2 / 1 with their messages;
  9. SIGTERM stops the daemon (exit 0); every process is gone at the end.

Waits poll for a condition with a deadline (never a fixed sleep as correctness), so that
the test holds on a loaded 2-core machine.

    test_routerd.py KVPREFIX_BINARY FAKE_ENGINE_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) without pyzmq or prometheus_client.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import msgpack
    import zmq
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"test_routerd: SKIPPED: {e} (install python3-zmq python3-msgpack "
          "python3-prometheus-client)")
    sys.exit(77)

DEADLINE = 60.0  # seconds any single wait may take on a loaded machine
PROFILE = "vllm-sha256-cbor"
BLOCK = 16


class Fail(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Fail(what)


def wait_for(pred, what):
    end = time.monotonic() + DEADLINE
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise Fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def read_line(proc, what):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            line = proc.stdout.readline()
            if not line:
                raise Fail(f"{what}: process ended (status {proc.poll()})")
            return line.strip()
        if proc.poll() is not None:
            raise Fail(f"{what}: process ended (status {proc.returncode})")
    raise Fail(f"{what}: no answer")


class Engine:
    """A fake engine process on fixed ipc endpoints (restartable)."""

    def __init__(self, exe, tmp, name, topic):
        self.exe, self.name, self.topic = exe, name, topic
        self.pub = f"ipc://{tmp}/{name}.pub"
        self.replay = f"ipc://{tmp}/{name}.replay"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.exe, self.pub, self.replay, self.topic, PROFILE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        expect(read_line(self.proc, self.name) == "READY", f"{self.name}: not READY")

    def cmd(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = read_line(self.proc, f"{self.name} {line[:20]}")
        expect(not out.startswith("ERROR"), f"{self.name}: {line[:30]}: {out}")
        return out

    def wait_subscribed(self):
        expect(self.cmd(f"wait-sub {int(DEADLINE * 1000)}") == "SUBSCRIBED",
               f"{self.name}: the daemon never subscribed")

    def access(self, tokens):
        return self.cmd("access " + " ".join(map(str, tokens)))

    def lookup(self, tokens):
        return int(self.cmd("lookup " + " ".join(map(str, tokens))).split()[1])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.cmd("quit")
            except Fail:
                pass
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Daemon:
    def __init__(self, exe, args, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([exe, "router", "--port", "0"] + args,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = read_line(self.proc, "daemon")
        expect("listening on http://" in line, f"daemon: {line}")
        self.url = line.split("listening on ")[1].split()[0]
        self.n_scores = 0

    def request(self, method, path, body=None):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=DEADLINE) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def score(self, tokens, **ns):
        body = json.dumps(dict(tokens=tokens, **ns)).encode()
        status, out = self.request("POST", "/score", body)
        expect(status == 200, f"/score: {status} {out[:200]}")
        self.n_scores += 1
        return json.loads(out)

    def blocks(self, tokens):
        """{engine: (blocks, state)} for a prompt."""
        return {w["engine"]: (w["blocks"], w["state"]) for w in self.score(tokens)["workers"]}

    def metrics(self):
        status, out = self.request("GET", "/metrics")
        expect(status == 200, f"/metrics: {status}")
        fams = {}
        for fam in text_string_to_metric_families(out.decode()):
            for s in fam.samples:
                fams.setdefault(s.name, []).append((s.labels, s.value))
        return fams

    def metric(self, name, **labels):
        total = 0.0
        for lab, v in self.metrics().get(name, []):
            if all(lab.get(k) == str(x) for k, x in labels.items()):
                total += v
        return total


def prompt(start, n_blocks):
    return list(range(start, start + n_blocks * BLOCK))


def exact(d, eng, wid, prompts):
    """The daemon's blocks for worker wid equal the engine's own lookup, for every prompt."""
    def ok():
        for p in prompts:
            want = eng.lookup(p)
            got = d.blocks(p).get(wid, (0, "absent"))
            if got != (want, "scored"):
                exact.last = f"prompt at {p[0]}: engine {want}, daemon {got}"
                return False
        return True
    exact.last = ""
    try:
        wait_for(ok, f"{wid}'s index to equal its engine")
    except Fail as e:
        raise Fail(f"{e}: {exact.last}")


def send_junk(sock, topic):
    """Junk from a raw PUB peer: counted as frames x2, payload x1, batch x1."""
    t = topic.encode()
    sock.send_multipart([t])
    sock.send_multipart([t, b"\x00" * 7, b"\x90"])
    sock.send_multipart([t, (0).to_bytes(8, "big"), b"\xff\xfe"])
    # A well-formed vLLM batch the index refuses: block_size 8, the daemon's is 16.
    batch = [time.time(), [["BlockStored", [1], None, list(range(8)), 8, None, "GPU", None]],
             None]
    sock.send_multipart([t, (0).to_bytes(8, "big"), msgpack.packb(batch)])


def check_http_errors(d):
    status, _ = d.request("POST", "/score", b"{not json")
    expect(status == 400, f"bad JSON: {status}")
    status, _ = d.request("POST", "/score", b'{"tokens": [-1]}')
    expect(status == 400, f"negative token: {status}")
    status, _ = d.request("POST", "/score", b'{"tokens": [1], "colour": "red"}')
    expect(status == 400, f"unknown member: {status}")
    status, _ = d.request("POST", "/score", b"[" + b"1," * 700000 + b"1]")
    expect(status == 413, f"body above --max-body: {status}")
    status, _ = d.request("GET", "/nope")
    expect(status == 404, f"unknown path: {status}")
    status, body = d.request("GET", "/healthz")
    expect(status == 200 and json.loads(body)["status"] == "ok", "healthz")


def scenario(d, a, b, junk, junk_topic):
    # Step 1: ranking.
    pa, pb = prompt(0, 4), prompt(1000, 3)
    shared_a, shared_b = prompt(5000, 2), prompt(5000, 4)
    a.access(pa)
    b.access(pb)
    a.access(shared_a)
    b.access(shared_b)
    wait_for(lambda: d.blocks(pa) == {"a": (4, "scored"), "pod-b": (0, "scored")}, "a ranks pa")
    wait_for(lambda: d.blocks(pb) == {"a": (0, "scored"), "pod-b": (3, "scored")}, "b ranks pb")
    wait_for(lambda: d.blocks(shared_b)["pod-b"] == (4, "scored"), "b holds shared")
    ranked = d.score(shared_b)["workers"]
    expect([w["engine"] for w in ranked[:2]] == ["pod-b", "a"], f"ranking: {ranked}")
    expect(ranked[0]["weighted"] == 4.0 and ranked[1]["blocks"] == 2, f"rows: {ranked}")
    expect(ranked[0]["dp_rank"] == 0 and ranked[0]["tokens"] == 64, f"row: {ranked[0]}")

    # Step 2: garbage in A's stream and from the junk peer.
    a.cmd("junk")
    send_junk(junk, junk_topic)
    ep_a = a.pub
    wait_for(lambda: d.metric("kvprefix_router_malformed_messages_total", endpoint=ep_a) == 5,
             "A's junk counted")
    expect(d.metric("kvprefix_router_malformed_messages_total", endpoint=ep_a,
                    reason="frames") == 3, "A: frames")
    expect(d.metric("kvprefix_router_malformed_messages_total", endpoint=ep_a,
                    reason="payload") == 2, "A: payload")
    wait_for(lambda: d.metric("kvprefix_router_malformed_messages_total",
                              reason="batch") == 1, "junk peer's refused batch")
    expect(d.metric("kvprefix_router_malformed_messages_total", reason="frames") == 5, "frames")
    expect(d.metric("kvprefix_router_malformed_messages_total", reason="payload") == 3,
           "payload")

    # Step 3: a dropped batch with evictions in it -> gap -> replay -> exact index.
    prompts = [pa, shared_a] + [prompt(10000 * (k + 2), 15) for k in range(4)]
    a.cmd("drop-next")
    for p in prompts[2:]:
        a.access(p)
    exact(d, a, "a", prompts + [prompt(0, 2), prompt(77777, 3)])
    expect(d.metric("kvprefix_router_replays_total", engine="a", result="filled") == 1,
           "one replay filled the gap")
    expect(d.metric("kvprefix_router_batches_total", engine="a", status="gap") == 1, "one gap")

    # Step 4: restart as a new process, batch 0 received.
    a.stop()
    a.start()
    a.wait_subscribed()
    p3 = prompt(40000, 3)
    a.access(p3)
    exact(d, a, "a", [p3, pa, prompts[3]])
    expect(d.metric("kvprefix_router_batches_total", engine="a", status="restarted") == 1,
           "restart seen")
    a.access(prompt(41000, 1))
    a.access(prompt(42000, 1))
    exact(d, a, "a", [p3, prompt(42000, 1)])

    # Step 4b: restart whose batch 0 is lost: batch 1 looks like a duplicate but is newer.
    a.stop()
    a.start()
    a.wait_subscribed()
    a.cmd("drop-next")
    p4, p5 = prompt(50000, 2), prompt(51000, 2)
    a.access(p4)
    a.access(p5)
    exact(d, a, "a", [p3, p4, p5, prompt(42000, 1)])
    expect(d.metric("kvprefix_router_batches_total", engine="a", status="restarted") == 2,
           "second restart seen through replay")

    # Step 5: B's replay endpoint has no listener: a gap, the replay times out, B is stale;
    # its publisher's restart makes it fresh.
    b.cmd("drop-next")
    b.access(prompt(60000, 2))
    b.access(prompt(61000, 2))
    wait_for(lambda: d.metric("kvprefix_router_stale_workers") == 1, "B stale")
    expect(d.blocks(pb)["pod-b"] == (0, "stale"), "B's rows are stale")
    expect(d.metric("kvprefix_router_replays_total", engine="pod-b", result="failed") == 1,
           "B's replay failed")
    b.cmd("restart")
    q3 = prompt(62000, 2)
    b.access(q3)
    wait_for(lambda: d.blocks(q3).get("pod-b") == (2, "scored"), "B fresh after its restart")
    expect(d.metric("kvprefix_router_stale_workers") == 0, "no stale worker")
    exact(d, b, "pod-b", [q3, pb])


def check_metrics(d):
    m = d.metrics()
    for name in ["kvprefix_router_events_total", "kvprefix_router_index_blocks",
                 "kvprefix_router_index_bytes", "kvprefix_router_bytes_per_holder",
                 "kvprefix_router_lookups_total", "kvprefix_router_hit_blocks_total",
                 "kvprefix_router_workers", "kvprefix_router_worker_blocks"]:
        expect(name in m, f"/metrics has no {name}")
    n_scores = d.n_scores
    expect(d.metric("kvprefix_router_lookups_total") == n_scores,
           f"lookups {d.metric('kvprefix_router_lookups_total')} != {n_scores}")
    expect(d.metric("kvprefix_router_events_total", type="stored") > 0, "stored events")
    expect(d.metric("kvprefix_router_events_total", type="removed") > 0, "removed events")
    expect(d.metric("kvprefix_router_workers") == 3, "3 workers (a, pod-b, junk)")
    expect(d.metric("kvprefix_router_index_bytes") > 0, "index bytes")
    expect(d.metric("kvprefix_router_hit_blocks_total") > 0, "hit blocks")


def check_cli_errors(kvprefix, tmp):
    """Bad input: usage errors exit 2, a bad config file or a port in use exit 1."""
    def run(args):
        p = subprocess.run([kvprefix, "router"] + args, capture_output=True, text=True,
                           timeout=DEADLINE)
        return p.returncode, p.stderr
    ep = f"ipc://{tmp}/none.pub"
    for args, code, msg in [
            ([], 2, "no engine"),
            (["--engine", "a"], 2, "is not ID=ENDPOINT"),
            (["--engine", "a=tcp://h:1,dp=0"], 2, "dp: '0'"),
            (["--engine", f"a={ep},replay"], 2, "'replay' is not key=value"),
            (["--engine", f"a={ep}", "--engine", f"a={ep}x"], 2, "given twice"),
            (["--engine", f"a={ep}", "--port", "70000"], 2, "--port"),
            (["--engine", f"a={ep}", "--hash", "keyed"], 2, "--hash-key"),
            (["--engine", f"a={ep}", "extra"], 2, "unexpected argument")]:
        rc, err = run(args)
        expect(rc == code and msg in err, f"{args}: exit {rc}, {err!r}")
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"engines": [\n  {"id": "a",}\n]}')
    rc, err = run(["--config", bad])
    expect(rc == 1 and f"{bad}:2:" in err, f"config syntax: exit {rc}, {err!r}")
    with open(bad, "w") as f:
        json.dump({"engines": [{"id": "a", "endpoint": ep, "dp": "2"}]}, f)
    rc, err = run(["--config", bad])
    expect(rc == 1 and "engines[0]" in err, f"config value: exit {rc}, {err!r}")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc, err = run(["--engine", f"a={ep}", "--port", str(s.getsockname()[1])])
        expect(rc == 1 and "cannot listen" in err, f"port in use: exit {rc}, {err!r}")


def main():
    kvprefix, fake = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="routerd-") as tmp:
        a = Engine(fake, tmp, "a", "kv@pod-a@m")
        b = Engine(fake, tmp, "b", "kv@pod-b@m")
        ctx = zmq.Context()
        junk = ctx.socket(zmq.XPUB)
        junk.setsockopt(zmq.LINGER, 0)
        junk_ep, junk_topic = f"ipc://{tmp}/junk.pub", "kv@junk@m"
        junk.bind(junk_ep)
        d = None
        try:
            check_cli_errors(kvprefix, tmp)
            a.start()
            b.start()
            cfg = os.path.join(tmp, "router.json")
            with open(cfg, "w") as f:
                json.dump({"engines": [{"id": "*", "endpoint": b.pub, "topic": "kv@pod-b@",
                                        "replay": f"ipc://{tmp}/nobody.replay"},
                                       {"id": "junk", "endpoint": junk_ep}]}, f)
            d = Daemon(kvprefix, ["--engine", f"a={a.pub},replay={a.replay},topic=kv@pod-a@",
                                  "--config", cfg, "--hash", PROFILE, "--block-size", "16",
                                  "--replay-timeout", "8000", "--max-body", "1MiB"],
                       os.path.join(tmp, "daemon.log"))
            a.wait_subscribed()
            b.wait_subscribed()
            expect(junk.poll(int(DEADLINE * 1000)) and junk.recv()[0] == 1, "junk subscribed")
            scenario(d, a, b, junk, junk_topic)
            check_http_errors(d)
            check_metrics(d)
            d.proc.send_signal(signal.SIGTERM)
            expect(d.proc.wait(timeout=DEADLINE) == 0, f"daemon exit {d.proc.returncode}")
            if os.environ.get("ROUTERD_TEST_VERBOSE"):
                d.log.flush()
                with open(os.path.join(tmp, "daemon.log")) as f:
                    sys.stderr.write("daemon log:\n" + f.read())
        except Fail:
            if d:
                d.log.flush()
                with open(os.path.join(tmp, "daemon.log")) as f:
                    sys.stderr.write("daemon log:\n" + f.read())
            raise
        finally:
            for e in (a, b):
                e.stop()
            if d and d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
            if d:
                d.log.close()
            junk.close()
            ctx.term()
        for p in (a.proc, b.proc, d.proc):
            expect(p.poll() is not None, "a process is still running")
    print("test_routerd: ok")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"test_routerd: FAIL: {e}")
        sys.exit(1)
