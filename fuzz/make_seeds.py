#!/usr/bin/env python3
"""make_seeds.py - write the seed inputs of the fuzz corpora (fuzz/corpus/<target>/seed-*).

The binary harnesses (isolation, ops, collision) decode one byte per decision (see each
fuzz_<target>.c), so their seeds are deterministic pseudo-random byte strings whose first
two bytes sweep the cache shapes that the harness reads first: a shape byte (verify mode,
pool mode, forced collisions...) and the block-size byte of fz_block_size (1, 2, 3, 4, 16,
16, 1021, 1500 by its value mod 8); the 64-bit seed follows, from the random body, then the
hash-profile byte of fz_keys_decode (mod 8: xxh3, keyed, siphash, vllm-sha256-cbor,
vllm-xxhash-cbor, xxh3, keyed, siphash), which the seeds sweep too, so every profile meets
every block size; the profile's key or vLLM seed string comes from the random body. The
replay_input seeds are small request logs, one per line format and error case. The
noninterference seeds (seed-salts-*) are programs in which the attacker spreads its calls
over many namespaces (a salt, adapter and model per call) and the victim over a few: the
quota-scope attack of docs/security.md section 5; its older seed-00..23 are kept as they are.
Minimized inputs found by campaigns (libFuzzer -merge=1) are added next to the seeds under
other names; this script only rewrites seed-* files. Run from anywhere:
    python3 fuzz/make_seeds.py
"""
import gzip
import json
import os
import random

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def binary_seeds(target, n, length, seed, shape):
    """n seeds: seed i has shape byte shape(i, rng), block-size byte i % 8, eight seed bytes
    and profile byte (i + i // 8) % 8."""
    rng = random.Random(seed)
    for i in range(n):
        head = bytes([shape(i, rng), i % 8])
        seed_bytes = bytes(rng.randrange(256) for _ in range(8))
        profile = bytes([(i + i // 8) % 8])
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(length // 2, length)))
        write(target, "%02d" % i, head + seed_bytes + profile + body)


def isolation_shape(i, rng):
    """fuzz_isolation: every block size in each of six modes (i // 8): large pool without and
    with verify, small pool without and with verify, forced collisions in a large and in a
    small pool. Bit 0 verify, bit 1 small pool, bits 2-3 zero forces collisions; the high
    nibble is part of the small pool's size."""
    mode = (i // 8) % 6
    collide = mode >= 4
    small = mode in (2, 3, 5)
    verify = mode in (1, 3)
    return (rng.randrange(16) << 4) | (0 if collide else 4) | (2 if small else 0) | verify


def replay_seeds():
    lines = {
        "tokens": b'{"tokens": [1, 2, 3, 4, 5], "output_tokens": [6, 7], "model": "m"}\n',
        "tokens_ns": b'{"tokens": [1], "model": "m", "adapter": null, "tenant": "t\\u0000x",'
                     b' "cache_salt": "", "timestamp": 1.5}\n',
        "mooncake": b'{"timestamp": 27482, "input_length": 6955, "output_length": 52,'
                    b' "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}\n',
        "mooncake_small": b'{"input_length": 3, "output_length": 1, "hash_ids": [0]}\n'
                          b'{"input_length": 1025, "output_length": 0, "hash_ids": [1, 2, 3]}\n',
        "openai_chat": b'{"model": "llama", "messages": [{"role": "system", "content": "be brief"},'
                       b' {"role": "user", "content": "hello there"}], "max_tokens": 8}\n',
        "openai_completion": b'{"model": "llama", "prompt": "once upon a time", "tenant": "t"}\n',
        "openai_parts": b'{"messages": [{"role": "user", "content": [{"type": "text",'
                        b' "text": "a b c"}]}], "user": "u1"}\n',
        "openai_batch": b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",'
                        b' "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},'
                        b' "tenant": "t", "timestamp": 3}\n',
        "openai_tools": b'{"messages": [{"role": "assistant", "content": null, "tool_calls":'
                        b' [{"id": "c1", "type": "function", "function": {"name": "f",'
                        b' "arguments": "{}"}}]}, {"role": "tool", "content": "0.1"}],'
                        b' "tools": [{"type": "function", "function": {"name": "f"}}],'
                        b' "max_completion_tokens": 5, "cache_salt": "s"}\n',
        "openai_token_prompt": b'{"prompt": [1, 2, 3], "max_tokens": 2}\n{"prompt": [[4, 5]]}\n'
                               b'{"prompt": ["a", "b"]}\n{"prompt": ""}\n',
        "errors": b'{"tokens": []}\n{"tokens": [1], "hash_ids": [2]}\n{}\n[1, 2]\n'
                  b'{"tokens": [-1]}\n{"tokens": [4294967296]}\n{"input_length": 0,'
                  b' "output_length": 0, "hash_ids": []}\n{"tokens": [1], "model": 5}\n'
                  b'{"tokens": [1], "timestamp": -1}\nnot json\n{"tokens": [1, 2]\n',
        "blank_crlf": b'\n   \n{"tokens": [9, 9]}\r\n\t\r\n{"tokens": [8]}',
        "dup_key": b'{"tokens": [1], "tokens": [2]}\n',
        "nul": b'{"tokens": [1]}\x00\n{"tokens": [2]}\n',
        "long_line": b'{"tokens": [' + b", ".join(b"%d" % i for i in range(3000)) + b"]}\n",
        "mixed": b'{"tokens": [1, 2]}\n{"input_length": 512, "output_length": 3,'
                 b' "hash_ids": [7]}\n{"prompt": "x y", "model": "m"}\n',
    }
    for name, data in lines.items():
        write("replay_input", name, data)
    write("replay_input", "gzip", gzip.compress(lines["mixed"], mtime=0))
    write("replay_input", "gzip_truncated", gzip.compress(lines["tokens"], mtime=0)[:-6])
    # zstd frame of the "tokens" line, stored raw (no compression needed for a valid frame):
    # magic, frame header (single segment, 1-byte content size), one raw last block.
    payload = lines["tokens"]
    frame = (b"\x28\xb5\x2f\xfd" + bytes([0x20, len(payload)]) +
             (((len(payload) << 3) | 1).to_bytes(3, "little")) + payload)
    write("replay_input", "zstd", frame)
    write("replay_input", "zstd_truncated", frame[:-10])


def kv_decode_seeds():
    """vLLM KV-event payloads (fuzz_kv_decode): the two documented examples (map and array
    events), every event type and optional field, both batch forms, signed and bin hashes,
    unknown fields, and a few malformed ones. Needs python3-msgpack (/usr/bin/python3)."""
    try:
        import msgpack
    except ImportError:
        print("make_seeds.py: kv_decode seeds skipped: python3-msgpack is missing")
        return
    pk = msgpack.packb
    ts = 1789095808.8378847
    h = 0xdab89baa7b5857c0
    stored_map = {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": None,
                  "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
                  "lora_name": None, "extra_keys": [None], "group_idx": 0,
                  "kv_cache_spec_kind": "full_attention"}
    stored_arr = ["BlockStored", [h], None, [1, 2, 3, 4], 4, None, "GPU", None]
    write("kv_decode", "example_map", pk([ts, [stored_map], 0]))
    write("kv_decode", "example_array", pk([ts, [stored_arr], 0]))
    chain = ["BlockStored", [1, 2**64 - 1, 2**63], 7, list(range(48)), 16, 3, "CPU", "my-lora",
             [None, ["my-lora", 5], [["mm", 0]]], 2, "sliding_window", 4096, "future"]
    removed = ["BlockRemoved", [1, 2], "CPU", 1]
    cleared = ["AllBlocksCleared"]
    write("kv_decode", "all_array", pk([ts, [chain, removed, cleared], None]))
    write("kv_decode", "all_map_batch", pk({"ts": ts, "events": [
        {"type": "BlockRemoved", "block_hashes": [5], "medium": None, "group_idx": 3},
        {"type": "AllBlocksCleared", "locality": "node-1"}], "data_parallel_rank": 2,
        "extra": [1, 2]}))
    write("kv_decode", "signed_bin", pk([1, [["BlockStored", [-2, bytes(range(32)), b"\x01"],
                                              bytes(16), [], 16]], 0], use_bin_type=True))
    write("kv_decode", "empty_events", pk([0.0, [], None]))
    write("kv_decode", "bad_tag", pk([ts, [["BlockMoved", [1]]], 0]))
    write("kv_decode", "bad_claim", bytes.fromhex("93cb41daa8dbe0359fe7ddffffffff"))
    write("kv_decode", "truncated", pk([ts, [stored_map], 0])[:-7])


def routerd_seeds():
    """fuzz_routerd_http: requests as the harness reads them (method, path, type, length and
    argument bytes, a 2-byte body length, the body, 2 bytes per chunk size); several per
    input. fuzz_routerd_events: pseudo-random programs (every byte string is one) whose op
    bytes sweep the three endpoints."""
    def req(method, path, ctype, lk, args, body, chunk=700):
        out = bytes([method, path, ctype, lk, len(args)])
        for key, value in args:
            out += bytes([key, 1, len(value)]) + value
        out += len(body).to_bytes(2, "big") + body
        out += (chunk - 1).to_bytes(2, "big") * (len(body) // chunk + 1)
        return out
    toks = list(range(1, 65))
    js = json.dumps({"tokens": toks, "model": None}).encode()
    binary = b"".join(t.to_bytes(4, "little") for t in toks)
    write("routerd_http", "json", req(1, 0, 1, 1, [], js))
    write("routerd_http", "json_tight", req(1, 0, 1, 0, [], js.replace(b" ", b""), 5))
    write("routerd_http", "binary", req(1, 0, 2, 1, [(0, b"")], binary, 6))
    write("routerd_http", "strings", req(1, 0, 1, 1, [], json.dumps(
        {"tokens": [5, 6], "model": "m\u00e9", "lora": "\ud83d\ude00", "salt": "s\"t",
         "tenant": "x"}).encode().replace(b"\\\\", b"\\")))
    write("routerd_http", "unknown", req(1, 0, 1, 1, [], b'{"tokens": [1], "colour": "red"}'))
    write("routerd_http", "workers_loads", req(1, 0, 1, 1, [], json.dumps(
        {"tokens": toks, "workers": ["w0", "w\"1/0"], "loads": {"w0": 3, "w\"1": 0.5e1}}).encode()))
    write("routerd_http", "load_then_score", req(1, 4, 1, 1, [], json.dumps(
        {"engine": "w0", "running": 7, "waiting": 1}).encode()) + req(1, 0, 1, 1, [], js))
    write("routerd_http", "get_then_score", req(0, 1, 0, 0, [], b"") + req(0, 2, 0, 0, [], b"") +
          req(1, 0, 1, 1, [], js) + req(1, 0, 1, 3, [], js))
    rng = random.Random(22)
    for i in range(8):
        body = bytearray(rng.randrange(256) for _ in range(900))
        for k in range(0, 900, 30):
            body[k] = (i % 3) | 4  # an op byte: endpoint i % 3, three frames
        write("routerd_events", "%02d" % i, bytes(body))


def noninterference_seeds():
    """fuzz_noninterference: 16 programs over every block size (byte 0 mod 5) and key width
    (byte 1 mod 13, 12 meaning full keys without verification), each call a step byte, a
    salt byte, an adapter/model byte and a prompt; the attacker's salts are drawn from all
    255, the victim's from four."""
    rng = random.Random(7)
    for i in range(16):
        head = bytes([i % 5, (i * 5) % 13, rng.randrange(8)])
        head += bytes(rng.randrange(256) for _ in range(8))
        body = bytearray()
        for _ in range(rng.randrange(40, 90)):
            victim = rng.random() < 0.35
            b = rng.randrange(256) & ~0x80 | (0x80 if rng.random() < 0.2 else 0)
            b = b | 1 if victim else b & ~1
            salt = rng.randrange(4) if victim else rng.randrange(256)
            body += bytes([b, salt, rng.randrange(16)])
            if not victim and b & 0x80:
                continue  # copies the victim's last prompt when there is one
            n = rng.randrange(256)
            body.append(n)
            body += bytes(rng.randrange(3) for _ in range(1 + n % (9 * [1, 2, 3, 4, 16][i % 5] - 1)))
        write("noninterference", "salts-%02d" % i, head + bytes(body))


def main():
    binary_seeds("isolation", 48, 240, 1, isolation_shape)
    binary_seeds("ops", 32, 400, 2, lambda i, rng: rng.randrange(256))
    binary_seeds("collision", 24, 300, 3, lambda i, rng: rng.randrange(256))
    binary_seeds("tiers", 24, 400, 4, lambda i, rng: rng.randrange(256))
    replay_seeds()
    kv_decode_seeds()
    noninterference_seeds()
    routerd_seeds()


if __name__ == "__main__":
    main()
