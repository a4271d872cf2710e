#!/usr/bin/python3
"""test_routerd_text.py - `kvprefix router --tokenizer` end to end: prompts as text.

A small hand-made tokenizer (a tiktoken rank file written here: the 256 bytes, one merge
"ll", and a sidecar naming <|im_start|> and <|im_end|> as special tokens), whose ids the
test also computes on its own (bytes, "ll" merged left to right, the specials), and two fake
engines (tests/routerd/fake_engine.c) that publish blocks of the exact tokenization of a
chat body. Then:

  1. the ids: the test's own computation equals `kvprefix tokenize` (replay's path) for the
     chat body, and for the llama3 template where the daemon is told to use it;
  2. /score with "messages" and with "prompt" (the rendered chat text) gives the same answer
     as /score with those "tokens", byte for byte (rows, blocks, prompt_tokens), also with
     "workers" and "loads" in text mode and with the text member first or last; a body
     large enough to arrive in several chunks counts the tokens `kvprefix tokenize` counts;
     --template MODEL=llama3 gives that model replay's llama3 ids; 48 text requests of two
     models at once on --http-threads 4 each get the answer they get alone;
  3. errors, each a 400 with its message: a model without a tokenizer, no model and no
     default, the renderer's messages (a message without a role, content of the wrong type, no messages), unknown
     members (before and after the text member), tokens with a prompt, invalid JSON, a
     member given twice, a prompt of token ids, a text body above 4 MiB;
  4. /metrics counts text requests (scored, refused) and the tokens made;
  5. start-up errors: a missing tokenizer file (exit 1, FILE: message), a stand-in
     tokenizer, an unknown template, a template without a tokenizer (exit 2); a path with
     "=" in it is taken whole.

    test_routerd_text.py KVPREFIX_BINARY FAKE_ENGINE_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) without pyzmq or prometheus_client.
"""
import base64
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_routerd as base  # noqa: E402  (exits 77 without its modules)
from test_routerd import DEADLINE, Daemon, Fail, expect  # noqa: E402

SPECIALS = {"<|im_start|>": 256, "<|im_end|>": 257}
LL = 258  # the one merge: "ll"


def write_tokenizer(tmp):
    """A cl100k-kind rank file: bytes 0..255, "ll" 258; specials 256, 257 in the sidecar."""
    path = os.path.join(tmp, "tiny.tiktoken")
    with open(path, "w") as f:
        for b in range(256):
            f.write(f"{base64.b64encode(bytes([b])).decode()} {b}\n")
        f.write(f"{base64.b64encode(b'll').decode()} {LL}\n")
    with open(path + ".json", "w") as f:
        json.dump({"kind": "cl100k", "special_tokens": SPECIALS}, f)
    return path


def own_ids(text):
    """The tokenizer's ids for text, computed here: specials, else bytes with "ll" merged
    leftmost first (two l's in a row are always in one pre-tokenizer piece)."""
    out, i, data = [], 0, text
    while i < len(data):
        sp = next((s for s in SPECIALS if data.startswith(s, i)), None)
        if sp:
            out.append(SPECIALS[sp])
            i += len(sp)
            continue
        j = i
        while j < len(data) and not any(data.startswith(s, j) for s in SPECIALS):
            j += 1
        raw, k = data[i:j].encode(), 0
        while k < len(raw):
            if raw[k:k + 2] == b"ll":
                out.append(LL)
                k += 2
            else:
                out.append(raw[k])
                k += 1
        i = j
    return out


def chatml(messages):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def tokenize(kvprefix, tok, body, tmp, template=None):
    """`kvprefix tokenize --json` of body (replay's path): its ids."""
    path = os.path.join(tmp, "body.json")
    with open(path, "w") as f:
        json.dump(body, f)
    args = [kvprefix, "tokenize", "--tokenizer", tok, "--json", path]
    if template:
        args += ["--template", template]
    r = subprocess.run(args, capture_output=True, text=True, timeout=DEADLINE)
    expect(r.returncode == 0, f"kvprefix tokenize: {r.returncode} {r.stderr}")
    return json.loads(r.stdout)["ids"]


def post(d, body):
    status, out = d.request("POST", "/score", json.dumps(body).encode())
    return status, json.loads(out)


def same(d, text_body, tokens, what, **extra):
    """/score of text_body equals /score of tokens with the same other members."""
    s1, a = post(d, text_body)
    expect(s1 == 200, f"{what}: {s1} {a}")
    s2, b = post(d, dict(tokens=tokens, **extra))
    expect(s2 == 200, f"{what} (tokens): {s2} {b}")
    expect(a == b, f"{what}: text {a} != tokens {b}")
    return a


def refused(d, raw, want, what):
    status, out = d.request("POST", "/score", raw if isinstance(raw, bytes)
                            else json.dumps(raw).encode())
    err = json.loads(out).get("error", "")
    expect(status == 400 and want in err, f"{what}: {status} {err!r} (want {want!r})")


def check_startup(kvprefix, tok, tmp):
    def run(args):
        return subprocess.run([kvprefix, "router", "--port", "0", "--engine",
                               f"e=ipc://{tmp}/none.pub"] + args, capture_output=True,
                              text=True, timeout=DEADLINE)
    missing = os.path.join(tmp, "missing.tiktoken")
    r = run(["--tokenizer", f"m={missing}"])
    expect(r.returncode == 1 and missing in r.stderr, f"missing tokenizer: {r.returncode} "
           f"{r.stderr}")
    r = run(["--tokenizer", "words"])
    expect(r.returncode == 2 and "stand-in" in r.stderr, f"words: {r.returncode} {r.stderr}")
    r = run(["--tokenizer", tok, "--template", "bogus"])
    expect(r.returncode == 2 and "bogus" in r.stderr, f"template: {r.returncode} {r.stderr}")
    r = run(["--tokenizer", f"m={tok}", "--template", "x=chatml"])
    expect(r.returncode == 2 and "no --tokenizer" in r.stderr,
           f"template alone: {r.returncode} {r.stderr}")
    r = run(["--tokenizer", f"m={tok}", "--tokenizer", f"m={tok}"])
    expect(r.returncode == 2 and "twice" in r.stderr, f"twice: {r.returncode} {r.stderr}")
    # A path with '=' in it is taken whole when it exists: it loads (its log line), then the
    # missing file given after it stops the daemon.
    eq = os.path.join(tmp, "a=b.tiktoken")
    for suffix in ("", ".json"):
        with open(tok + suffix, "rb") as src, open(eq + suffix, "wb") as dst:
            dst.write(src.read())
    r = run(["--tokenizer", eq, "--tokenizer", f"m={missing}"])
    expect(r.returncode == 1 and f"every other model: {eq}" in r.stderr and missing in r.stderr,
           f"a path with '=': {r.returncode} {r.stderr}")


def scenario(d, kvprefix, tok, tmp, a, b):
    messages = [{"role": "system", "content": "You are a helpful, well-spoken assistant. " * 3},
                {"role": "user", "content": "Hello! Tell me all about llamas and their wool, "
                 "and spell 'llll' as well."}]
    chat = {"model": "m", "messages": messages}
    ids = tokenize(kvprefix, tok, chat, tmp)
    expect(ids == own_ids(chatml(messages)), f"tokenize vs the test's own ids: {ids}")
    expect(LL in ids and 256 in ids and len(ids) >= 8 * base.BLOCK, "a long, merged prompt")
    n_text, n_tokens, n_refused = 0, 0, 0

    # Engine a holds the whole chat prompt, b its first two blocks.
    a.access(ids)
    b.access(ids[:2 * base.BLOCK])
    ans = {}

    def indexed():
        st, out = post(d, {"tokens": ids, "model": "m"})
        ans["last"] = out
        rows = {w["engine"]: w["blocks"] for w in out.get("workers", [])}
        return st == 200 and rows == {"a": len(ids) // base.BLOCK, "b": 2}
    try:
        base.wait_for(indexed, "the engines' blocks in the daemon")
    except Fail as e:
        raise Fail(f"{e}: {ans.get('last')}")

    # 2. Text scores as its tokens.
    r = alone = same(d, chat, ids, "messages", model="m")
    expect(r["workers"][0]["engine"] == "a" and r["prompt_tokens"] == len(ids), f"rows: {r}")
    n_text, n_tokens = n_text + 1, n_tokens + len(ids)
    same(d, {"prompt": chatml(messages), "model": "m"}, ids, "prompt", model="m")
    n_text, n_tokens = n_text + 1, n_tokens + len(ids)
    same(d, {"messages": messages, "workers": ["b"], "loads": {"a": 3}, "model": "m",
             "add_generation_prompt": True}, ids, "messages with workers and loads last",
         model="m", workers=["b"], loads={"a": 3})
    n_text, n_tokens = n_text + 1, n_tokens + len(ids)
    r = same(d, {"model": "m", "loads": {"b": 2.5}, "tenant": None, "messages": messages,
                 "tools": None}, ids, "messages after loads", model="m", loads={"b": 2.5})
    n_text, n_tokens = n_text + 1, n_tokens + len(ids)
    expect([w["engine"] for w in r["workers"]] == ["a", "b"], f"ranked rows: {r}")
    big = "Hello llamas, all of them. " * 6000  # ~160 KB: several upload chunks
    st, out = post(d, {"model": "m", "prompt": big})
    want = tokenize(kvprefix, tok, {"model": "m", "prompt": big}, tmp)
    expect(st == 200 and out["prompt_tokens"] == len(want) == len(own_ids(big)),
           f"big prompt: {st} {out.get('prompt_tokens')} vs {len(want)}")
    n_text, n_tokens = n_text + 1, n_tokens + len(want)
    ids3 = tokenize(kvprefix, tok, chat, tmp, template="llama3")
    expect(ids3 != ids, "llama3 and chatml differ")
    st, out = post(d, {"model": "m3", "messages": messages})
    expect(st == 200 and out["prompt_tokens"] == len(ids3) and
           all(w["state"] == "model" for w in out["workers"]),
           f"--template m3=llama3: {st} {out} vs {len(ids3)}")
    n_text, n_tokens = n_text + 1, n_tokens + len(ids3)

    # Several HTTP threads tokenizing at once (one tokenizer per model, two models): every
    # answer is the one given alone.
    jobs = [({"model": "m", "messages": messages}, alone),
            ({"model": "m3", "messages": messages}, out),
            ({"model": "m", "prompt": chatml(messages)}, alone)] * 16
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda j: post(d, j[0]), jobs))
    for (body, want_ans), (st, ans) in zip(jobs, got):
        expect(st == 200 and ans["prompt_tokens"] == want_ans["prompt_tokens"] and
               [w["blocks"] for w in ans["workers"]] == [w["blocks"] for w in want_ans["workers"]],
               f"concurrent {body['model']}: {st} {ans}")
    n_text += len(jobs)
    n_tokens += sum(a["prompt_tokens"] for _, a in got)

    # 3. Errors.
    for raw, want, what in [
            ({"model": "x", "prompt": "hi"}, "no tokenizer for model 'x'", "unknown model"),
            ({"prompt": "hi"}, "needs a tokenizer", "no model"),
            ({"model": "m", "messages": [{"content": "x"}]},
             "messages[0] must be an object with a string \"role\"", "renderer"),
            ({"model": "m", "messages": [{"role": "user", "content": 5}]},
             "messages[0].content must be a string", "renderer, content"),
            ({"model": "m", "messages": "x"}, "messages must be an array", "messages type"),
            ({"model": "m", "messages": []}, "messages is empty", "no messages"),
            ({"model": "m", "prompt": [1, 2, 3]}, "send them as \"tokens\"", "id prompt"),
            ({"model": "m", "prompt": ""}, "prompt is empty", "empty prompt")]:
        refused(d, raw, want, what)
        n_refused += 1
    for raw, want, what in [
            ({"model": "m", "prompt": "hi", "temperature": 0.5}, "unknown member 'temperature'",
             "unknown member after the text"),
            ({"model": "m", "prompt": "hi", "tokens": [1]}, "not both", "tokens after"),
            (b'{"model": "m", "prompt": "hi", }', "invalid JSON", "invalid JSON"),
            (b'{"model": "m", "prompt": "hi", "model": "m"}', "given twice", "twice"),
            ({"model": "m", "prompt": "hi", "workers": [7]}, "workers must be", "bad workers"),
            ({"model": "m", "prompt": "hi", "loads": {"a": -1}}, "loads must be", "bad loads")]:
        refused(d, raw, want, what)
        n_refused += 1
    refused(d, {"temperature": 0.5, "prompt": "hi"}, "unknown member", "unknown before")
    refused(d, {"tokens": [1], "prompt": "hi"}, "not both", "tokens before")
    n_refused += 1  # tokens before: the text member is met, then refused
    status, out = d.request("POST", "/score", b'{"model": "m", "prompt": "h')
    expect(status == 400, f"truncated text body: {status} {out}")
    n_refused += 1
    refused(d, {"model": "m", "prompt": "x" * (4 << 20)}, "above 4 MiB", "text above 4 MiB")
    n_refused += 1

    # 4. Metrics.
    expect(d.metric("kvprefix_router_text_requests_total", result="scored") == n_text,
           f"text scored: {n_text}")
    expect(d.metric("kvprefix_router_text_requests_total", result="refused") == n_refused,
           f"text refused: {n_refused}, got "
           f"{d.metric('kvprefix_router_text_requests_total', result='refused')}")
    expect(d.metric("kvprefix_router_text_tokens_total") == n_tokens, "text tokens")


def check_model_folders(kvprefix, ref, tmp):
    """With a Hugging Face model folder (scripts/tokref.sh writes them into build-tok/ref/hf),
    the daemon renders with the model's own chat template: the ids it scores are those of
    `kvprefix tokenize --tokenizer DIR`, tools included. Returns the folders checked."""
    n = 0
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi there, how are you?"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    for model in ("qwen2_5", "llama3_1", "gemma3", "deepseek_v3"):
        folder = os.path.join(ref, "hf", model)
        if not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
            continue
        d = Daemon(kvprefix, ["--engine", "e=tcp://127.0.0.1:1", "--tokenizer", folder],
                   os.path.join(tmp, model + ".log"))
        try:
            want = tokenize(kvprefix, folder, body, tmp)
            status, out = post(d, body)
            expect(status == 200 and out["prompt_tokens"] == len(want),
                   f"{model}: /score {status} {out}, tokenize gives {len(want)} ids")
        finally:
            d.proc.send_signal(signal.SIGTERM)
            d.proc.wait(timeout=DEADLINE)
            d.log.close()
        n += 1
    if n == 0 and os.environ.get("KVPREFIX_TOKREF_REQUIRED") == "1":
        raise Fail(f"no model folders under {ref}/hf (scripts/tokref.sh writes them)")
    return n


def main():
    kvprefix, fake = sys.argv[1], sys.argv[2]
    ref = sys.argv[3] if len(sys.argv) > 3 else ""
    with tempfile.TemporaryDirectory(prefix="routerd-text-") as tmp:
        tok = write_tokenizer(tmp)
        a = base.Engine(fake, tmp, "a", "kv@a@m")
        b = base.Engine(fake, tmp, "b", "kv@b@m")
        d = None
        try:
            check_startup(kvprefix, tok, tmp)
            n_folders = check_model_folders(kvprefix, ref, tmp) if ref else 0
            print(f"test_routerd_text: {n_folders} model folders with their own template")
            a.start()
            b.start()
            d = base.Daemon(kvprefix, [
                "--engine", f"*={a.pub},replay={a.replay}",
                "--engine", f"*={b.pub},replay={b.replay}",
                "--hash", base.PROFILE, "--block-size", str(base.BLOCK),
                "--tokenizer", f"m={tok}", "--tokenizer", f"m3={tok}",
                "--template", "m3=llama3", "--max-body", "8MiB", "--http-threads", "4"],
                os.path.join(tmp, "daemon.log"))
            a.wait_subscribed()
            b.wait_subscribed()
            scenario(d, kvprefix, tok, tmp, a, b)
            d.proc.send_signal(signal.SIGTERM)
            expect(d.proc.wait(timeout=DEADLINE) == 0, f"daemon exit {d.proc.returncode}")
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
        for p in (a.proc, b.proc, d.proc):
            expect(p.poll() is not None, "a process is still running")
    print("test_routerd_text: ok")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"test_routerd_text: FAIL: {e}")
        sys.exit(1)
