#!/usr/bin/python3
"""test_routerd_score.py - the /score fast path of `kvprefix router` (issue 22 item 2): the
push scanner, the binary body, keep-alive, and the two histograms.

One daemon, one raw PUB engine ("e", rank 0) that stores one 8-block prompt. Checks:
  1. the same request as compact JSON, as JSON with whitespace and escapes (Python's
     json.dumps, "\\u00e9" in a string) and as a binary body (little-endian uint32, the
     namespace in the query string) answers the same rows: 8 blocks on "e";
  1b. "workers" and "loads" read by the scanner (merge of router-ops into router-fast):
     compact, spaced with escapes and before "tokens" give the same rows with the request's
     load; a candidate list without "e" or an empty one keeps no row, null ones keep it;
     a load pushed to POST /load shows in "load" when the request gives none;
  2. refusals, each a 400 naming the byte: a repeated member, an unknown member, a token
     above 2^32-1, a negative id, a real, a truncated body, a lone surrogate, a negative,
     infinite or leading-zero load, a load key given twice, workers not a list, a binary body
     whose length is not a multiple of 4, an unknown query argument, query arguments with a
     JSON body; a Content-Length above --max-body is a 413 decided before the body (which
     is then read into nothing, so that a client still sending sees the answer);
  3. keep-alive: GET /healthz, POST /score (JSON, then binary), GET /metrics on one
     connection, none answered with "Connection: close";
  4. kvprefix_router_score_seconds counts every 200 /score (and only those), its buckets
     are cumulative and end with +Inf = count; kvprefix_router_event_lag_seconds counts the
     engine's applied batch.

    test_routerd_score.py KVPREFIX_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) without pyzmq, msgpack or
prometheus_client.
"""
import http.client
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time

try:
    import msgpack
    import zmq
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"test_routerd_score: SKIPPED: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_routerd import BLOCK, DEADLINE, Fail, expect, wait_for  # noqa: E402,F401


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)

    def req(self, method, path, body=None, ctype="application/json"):
        headers = {"Content-Type": ctype} if body is not None else {}
        self.c.request(method, path, body=body, headers=headers)
        r = self.c.getresponse()
        data = r.read()
        return r.status, data, r.getheader("Connection")


def metrics(cl):
    status, out, conn = cl.req("GET", "/metrics")
    expect(status == 200, f"/metrics: {status}")
    expect(conn != "close", "GET /metrics closed a keep-alive connection")
    fams = {}
    for fam in text_string_to_metric_families(out.decode("utf-8")):
        for s in fam.samples:
            fams.setdefault(s.name, []).append((s.labels, s.value))
    return fams


def value(fams, name, **labels):
    return sum(v for lab, v in fams.get(name, [])
               if all(lab.get(k) == str(x) for k, x in labels.items()))


def main():
    if len(sys.argv) != 2:
        print("usage: test_routerd_score.py KVPREFIX_BINARY", file=sys.stderr)
        return 2
    exe = sys.argv[1]
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        ep = f"ipc://{tmp}/e"
        pub = ctx.socket(zmq.PUB)
        pub.bind(ep)
        log = open(f"{tmp}/d.log", "w")
        proc = subprocess.Popen([exe, "router", "--port", "0", "--engine", f"e={ep}",
                                 "--max-body", "1MiB"],
                                stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            r, _, _ = select.select([proc.stdout], [], [], DEADLINE)
            line = proc.stdout.readline() if r else ""
            expect("listening on http://" in line, f"daemon did not start: {line!r}")
            port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
            check(port, pub)
        except Fail as e:
            print(f"test_routerd_score: FAIL: {e}", file=sys.stderr)
            log.flush()
            with open(f"{tmp}/d.log") as f:
                print(f.read()[-3000:], file=sys.stderr)
            return 1
        finally:
            proc.terminate()
            proc.wait(timeout=DEADLINE)
            log.close()
            pub.close(linger=0)
    ctx.term()
    print("test_routerd_score: ok")
    return 0


def check(port, pub):
    cl = Client(port)
    toks = [(i * 7919 + 13) % 50000 for i in range(8 * BLOCK)]
    ev = ["BlockStored", [k + 1 for k in range(8)], None, toks, BLOCK, None, "GPU", None]
    payload = msgpack.packb([time.time(), [ev], None])

    def stored():
        pub.send_multipart([b"", (0).to_bytes(8, "big"), payload])
        fams = metrics(cl)
        return value(fams, "kvprefix_router_worker_blocks", engine="e") == 8

    wait_for(stored, "the engine's 8 blocks")
    fams0 = metrics(cl)

    # Step 1: three encodings, one answer.
    compact = json.dumps({"tokens": toks, "model": None}, separators=(",", ":")).encode()
    spaced = json.dumps({"lora": None, "tokens": toks, "tenant": None}).encode()
    binary = struct.pack(f"<{len(toks)}I", *toks)
    answers = []
    for path, body, ctype in (("/score", compact, "application/json"),
                              ("/score", b" \n" + spaced + b" \r\n", "application/json"),
                              ("/score", binary, "application/octet-stream")):
        status, out, conn = cl.req("POST", path, body, ctype)
        expect(status == 200, f"{ctype}: {status} {out[:200]}")
        expect(conn != "close", f"{ctype}: the daemon closed a keep-alive connection")
        a = json.loads(out)
        expect(a["workers"][0]["engine"] == "e" and a["workers"][0]["blocks"] == 8 and
               a["prompt_tokens"] == len(toks), f"{ctype}: {a}")
        answers.append(a)
    expect(answers[0] == answers[1] == answers[2], f"encodings disagree: {answers}")
    status, out, _ = cl.req("POST", "/score?model=x%C3%A9", binary, "application/octet-stream")
    expect(status == 200, f"binary with a model: {status} {out[:200]}")
    status, out2, _ = cl.req("POST", "/score", json.dumps(
        {"tokens": toks, "model": "x\u00e9"}).encode())
    expect(status == 200 and json.loads(out) == json.loads(out2),
           "a model given as a query argument and as an escaped JSON string")
    n_ok = 5

    # Step 1b: workers and loads through the scanner.
    ranked = []
    for body in (json.dumps({"tokens": toks, "workers": ["e"], "loads": {"e": 2.5}},
                            separators=(",", ":")).encode(),
                 b'{ "loads" : { "\u0065" : 25e-1 } , "workers" : [ "e" , "x/3" ] , '
                 b'"tokens" : ' + json.dumps(toks).encode() + b" }",
                 json.dumps({"tokens": toks, "loads": {"e/0": 2.5, "e": 9}}).encode()):
        status, out, _ = cl.req("POST", "/score", body)
        expect(status == 200, f"{body[:80]!r}: {status} {out[:200]}")
        a = json.loads(out)
        expect(len(a["workers"]) == 1 and a["workers"][0]["load"] == 2.5 and
               a["workers"][0]["over_cap"] is False and a["workers"][0]["blocks"] == 8,
               f"{body[:80]!r}: {a}")
        ranked.append(a)
    expect(ranked[0] == ranked[1] == ranked[2], f"workers/loads encodings disagree: {ranked}")
    for members, rows in (({"workers": ["x"]}, 0), ({"workers": []}, 0),
                          ({"workers": None, "loads": None}, 1), ({"loads": {}}, 1)):
        status, out, _ = cl.req("POST", "/score", json.dumps({"tokens": toks, **members}).encode())
        a = json.loads(out)
        expect(status == 200 and len(a["workers"]) == rows, f"{members}: {status} {a}")
        expect(rows == 0 or a["workers"][0]["load"] is None, f"{members}: a load from nowhere")
    status, out, conn = cl.req("POST", "/load", b'{"engine": "e", "running": 3, "waiting": 1}')
    expect(status == 200 and json.loads(out) == {"status": "ok"} and conn != "close",
           f"POST /load: {status} {out[:200]}")
    status, out, _ = cl.req("POST", "/score", compact)
    expect(status == 200 and json.loads(out)["workers"][0]["load"] == 4.0,
           f"the pushed load: {status} {out[:300]}")
    status, out, _ = cl.req("POST", "/load", b'{"engine": "e", "running": -1}')
    expect(status == 400, f"POST /load with a negative figure: {status}")
    n_ok += 3 + 4 + 1

    # Step 2: refusals.
    bad = [
        (b'{"tokens": [1], "tokens": [2]}', "given twice"),
        (b'{"tokens": [1], "colour": 1}', "unknown member"),
        (b'{"tokens": [4294967296]}', "0..4294967295"),
        (b'{"tokens": [-1]}', "0..4294967295"),
        (b'{"tokens": [1.5]}', "0..4294967295"),
        (b'{"tokens": [1, 2', "ends inside"),
        (b'{"tokens": [1], "model": "\\ud800"}', "surrogate"),
        (b'{"model": "m"}', "tokens must be"),
        (b'{"tokens": [1], "loads": {"e": -1}}', "loads must be"),
        (b'{"tokens": [1], "loads": {"e": 1e999}}', "loads must be"),
        (b'{"tokens": [1], "loads": {"e": 01}}', "loads must be"),
        (b'{"tokens": [1], "loads": {"e": 1, "e": 2}}', "given twice"),
        (b'{"tokens": [1], "loads": ["e"]}', "loads must be"),
        (b'{"tokens": [1], "workers": "e"}', "workers must be"),
        (b'{"tokens": [1], "workers": ["e", 1]}', "workers must be"),
    ]
    for body, why in bad:
        status, out, _ = cl.req("POST", "/score", body)
        err = json.loads(out).get("error", "")
        expect(status == 400 and why in err and "at byte" in err, f"{body!r}: {status} {err}")
    for path, body, ctype, why in (
            ("/score", b"\x01\x00\x00", "application/octet-stream", "multiple of 4"),
            ("/score?colour=red", binary, "application/octet-stream", "unknown query"),
            ("/score?model=m", compact, "application/json", "query arguments")):
        status, out, _ = cl.req("POST", path, body, ctype)
        err = json.loads(out).get("error", "")
        expect(status == 400 and why in err, f"{path} {ctype}: {status} {err}")
    raw = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    raw.putrequest("POST", "/score")
    raw.putheader("Content-Length", str(2 << 20))
    raw.endheaders()
    raw.send(b"x" * (2 << 20))  # read into nothing: not even scanned
    r = raw.getresponse()
    expect(r.status == 413, f"Content-Length above --max-body: {r.status}")
    raw.close()

    # Step 3 was every request above on one connection; step 4: the histograms.
    fams = metrics(cl)
    count = value(fams, "kvprefix_router_score_seconds_count")
    expect(count - value(fams0, "kvprefix_router_score_seconds_count") == n_ok,
           f"score histogram counted {count} (200s: {n_ok})")
    buckets = sorted(((float(lab["le"]), v) for lab, v in
                      fams["kvprefix_router_score_seconds_bucket"]), key=lambda x: x[0])
    expect(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])) and
           buckets[-1][0] == float("inf") and buckets[-1][1] == count,
           f"score buckets: {buckets}")
    expect(value(fams, "kvprefix_router_score_seconds_sum") > 0, "score sum")
    expect(value(fams, "kvprefix_router_event_lag_seconds_count") >= 1, "lag histogram")
    expect(value(fams, "kvprefix_router_event_lag_seconds_sum") < 60, "lag of a fresh batch")


if __name__ == "__main__":
    sys.exit(main())
