"""examples/python/frontend.py: the toy scheduler over a small token log, and over the
example generator's log when scripts/test.sh points KVPREFIX_GEN_CHATLOG at it."""

import io
import json
import os
import random
import subprocess
import sys

import pytest

from conftest import REPO

FRONTEND = REPO / "examples" / "python" / "frontend.py"


def write_log(path, n_requests=40, seed=5):
    """A chat-like token log: 3 tenants with their own system prompts, multi-turn chats
    that extend the previous turn, and one request larger than any pool used here."""
    rng = random.Random(seed)
    system = {t: [rng.randrange(1000, 2000) for _ in range(rng.randrange(40, 120))]
              for t in ("acme", "initech", "globex")}
    chats = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_requests):
            tenant = rng.choice(sorted(system))
            if chats and rng.random() < 0.5:
                prev = rng.choice(chats)
                tokens = prev["tokens"] + prev["output_tokens"] + [3] + [
                    rng.randrange(1000, 2000) for _ in range(rng.randrange(5, 30))]
                tenant = prev["tenant"]
            else:
                tokens = [1, 2] + system[tenant] + [3] + [
                    rng.randrange(1000, 2000) for _ in range(rng.randrange(5, 60))]
            r = {"timestamp": i, "model": "m", "tenant": tenant, "tokens": tokens,
                 "output_tokens": [rng.randrange(1000, 2000) for _ in range(rng.randrange(4, 40))]}
            chats.append(r)
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"model": "m", "tokens": list(range(100000))}) + "\n")


def load_frontend():
    sys.path.insert(0, str(FRONTEND.parent))
    try:
        import frontend
    finally:
        sys.path.pop(0)
    return frontend


def test_frontend_runs(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log)
    fe = load_frontend()
    out = io.StringIO()
    res = fe.run(str(log), n_blocks=64, block_size=16, max_running=8, out=out)
    s = res["stats"]
    assert res["requests"] == 41 and res["rejected"] == 1
    assert 0 < res["prefill_skipped"] < res["prefill_tokens"]
    assert s.n_requests_active == 0 and s.n_requests >= 40  # re-admissions count too
    assert res["prefill_skipped"] == s.n_tokens_hit
    assert s.n_evictions > 0
    assert "skipped" in out.getvalue()


def test_frontend_preempts_under_pressure(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log)
    fe = load_frontend()
    res = fe.run(str(log), n_blocks=24, block_size=16, max_running=16, out=io.StringIO())
    assert res["preemptions"] > 0
    assert res["stats"].n_requests_active == 0


def test_frontend_cli(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log)
    p = subprocess.run([sys.executable, str(FRONTEND), str(log), "--blocks", "512", "--metrics"],
                       capture_output=True, text=True, timeout=120, check=True)
    assert p.stdout.startswith("frontend: 41 requests")
    assert 'kvprefix_requests_total{engine="frontend.py"}' in p.stdout


def test_frontend_on_gen_chatlog(tmp_path):
    gen = os.environ.get("KVPREFIX_GEN_CHATLOG")
    if not gen or not os.path.exists(gen):
        pytest.skip("KVPREFIX_GEN_CHATLOG not set (scripts/test.sh sets it)")
    log = tmp_path / "chat.jsonl"
    subprocess.run([gen, "--requests", "300", "-o", str(log)], check=True, timeout=60)
    fe = load_frontend()
    res = fe.run(str(log), n_blocks=2048, block_size=16, max_running=32, out=io.StringIO())
    assert res["requests"] == 300
    assert res["prefill_skipped"] > 0.3 * res["prefill_tokens"]
