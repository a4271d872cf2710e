#!/usr/bin/python3
"""kv_events_peer.py - an independent decoder for kvprefix's KV-event publisher.

Starts tests/events/kv_events_pub.c (a kvp_cache with a vLLM hash profile and a kvp_publisher),
subscribes to it with pyzmq as llm-d does (topic prefix "kv@"), decodes every message with
python3-msgpack and checks each field against what vLLM would publish for the same tokens:
block hashes recomputed here from vLLM's definition (CBOR with cbor2, SHA-256 with hashlib or
XXH3-128 with python3-xxhash; nothing from kvprefix), parents, token_ids, block_size, lora_id,
medium, lora_name, data_parallel_rank, the topic, sequence numbers 0..n-1 and the encoding
(array or map events, array or map batch, no extra fields). Then it asks the replay socket
(a DEALER, as vLLM's protocol wants) for every batch and for a suffix, checks the answers are
the live payloads byte for byte followed by the end marker (a prefix lost to ZeroMQ's slow
joiner is taken from replay, never more), and that a malformed request is ignored without
harming the publisher.

    kv_events_peer.py PUB_BINARY --form array|map|batchmap --profile PROFILE --transport ipc|tcp

tcp uses data-parallel rank 1 and checks the port offset vLLM applies. Exits 0 on success,
1 on a failed check, 77 (skipped) when pyzmq, msgpack, cbor2 or xxhash are missing
(scripts/deps.sh installs them).
"""
import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time

try:
    import cbor2
    import msgpack
    import xxhash
    import zmq
    from zmq.utils.monitor import recv_monitor_message
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"kv_events_peer: SKIPPED: {e} (install python3-zmq python3-msgpack "
          "python3-cbor2 python3-xxhash)")
    sys.exit(77)

TOPIC = "kv@pod-a@Qwen/Qwen3-8B"
BLOCK = 16
SEED = "vllm-none-hash"
END_SEQ = b"\xff" * 8
# Golden event integers (docs/test-vectors.md, "vLLM profiles") that this file's own hash
# function must reproduce before it is trusted to check the publisher.
GOLDEN_B0 = {"vllm-sha256-cbor": 2233398808101521225, "vllm-xxhash-cbor": 11534027033812148684}


class Fail(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Fail(what)


def hash_fn(profile):
    if profile == "vllm-sha256-cbor":
        return lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    return lambda obj: xxhash.xxh3_128(cbor2.dumps(obj, canonical=True)).digest()


def event_int(digest):
    return int.from_bytes(digest, "big") & (2**64 - 1)


def chain(profile, tokens, extra_first=None):
    """vLLM's block hashes (digests) of the full blocks of tokens from the root."""
    h = hash_fn(profile)
    parent = h(SEED)
    out = []
    for i in range(len(tokens) // BLOCK):
        extra = extra_first if i == 0 else None
        parent = h((parent, tuple(tokens[i * BLOCK:(i + 1) * BLOCK]), extra))
        out.append(parent)
    return out


STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
               "lora_id", "medium", "lora_name"]
REMOVED_KEYS = ["type", "block_hashes", "medium"]


def as_dict(ev, form):
    """An event as a dict, checking its encoding has exactly vLLM's fields."""
    if form == "array":
        expect(isinstance(ev, list) and ev, f"array-form event expected: {ev!r}")
        names = {"BlockStored": STORED_KEYS, "BlockRemoved": REMOVED_KEYS,
                 "AllBlocksCleared": ["type"]}.get(ev[0])
        expect(names is not None, f"unknown tag {ev[0]!r}")
        expect(len(ev) == len(names), f"{ev[0]} has {len(ev)} elements, expected "
               f"{len(names)} (optional trailing fields must be omitted)")
        return dict(zip(names, ev))
    expect(isinstance(ev, dict), f"map-form event expected: {ev!r}")
    names = {"BlockStored": STORED_KEYS, "BlockRemoved": REMOVED_KEYS,
             "AllBlocksCleared": ["type"]}.get(ev.get("type"))
    expect(names is not None, f"unknown type {ev.get('type')!r}")
    expect(sorted(ev) == sorted(names), f"{ev['type']} keys {sorted(ev)}")
    return ev


def decode_batch(payload, form, dp_rank):
    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if form == "batchmap":
        expect(isinstance(obj, dict) and sorted(obj) == ["data_parallel_rank", "events", "ts"],
               f"map batch expected: {obj!r}")
        ts, events, rank = obj["ts"], obj["events"], obj["data_parallel_rank"]
    else:
        expect(isinstance(obj, list) and len(obj) == 3, f"[ts, events, rank] expected: {obj!r}")
        ts, events, rank = obj
    expect(isinstance(ts, float) and abs(ts - time.time()) < 300, f"ts {ts!r} is not now")
    expect(payload[1] == 0xcb if form != "batchmap" else True, "ts is a float64")
    expect(rank == dp_rank, f"data_parallel_rank {rank!r}, expected {dp_rank}")
    ev_form = "array" if form == "array" else "map"
    return [as_dict(e, ev_form) for e in events]


def check_stored(ev, hashes, parent, tokens):
    expect(ev["type"] == "BlockStored", f"BlockStored expected, got {ev['type']}")
    expect(ev["block_hashes"] == hashes, f"block_hashes {ev['block_hashes']} != {hashes}")
    expect(ev["parent_block_hash"] == parent, f"parent {ev['parent_block_hash']} != {parent}")
    expect(ev["token_ids"] == list(tokens), "token_ids differ")
    expect(ev["block_size"] == BLOCK, f"block_size {ev['block_size']}")
    expect(ev["lora_id"] is None and ev["lora_name"] is None, "lora fields are nil")
    expect(ev["medium"] == "GPU", f"medium {ev['medium']!r}")


def check_batches(batches, profile):
    """The scenario of kv_events_pub.c, recomputed here."""
    plain = [event_int(d) for d in chain(profile, list(range(48)))]
    expect(plain[0] == GOLDEN_B0[profile], "this file's vLLM hash disagrees with the golden "
           "vectors: fix the checker first")
    lora = [event_int(d) for d in chain(profile, list(range(16)), ("my-lora", "tenant-a"))]
    long = [event_int(d) for d in chain(profile, list(range(1000, 1096)))]
    expect(len(batches) == 5, f"{len(batches)} batches, expected 5")
    b0, b1, b2, b3, b4 = batches
    expect(len(b0) == 1 and len(b1) == 1 and len(b2) == 1, "one event in batches 0-2")
    check_stored(b0[0], plain[:2], None, range(32))
    check_stored(b1[0], plain[2:3], plain[1], range(32, 48))
    check_stored(b2[0], lora, None, range(16))
    # Batch 3: the 6-block chain, its stores interleaved with two evictions.
    cached = set(plain) | set(lora)
    stored, removed = [], []
    for ev in b3:
        if ev["type"] == "BlockStored":
            n = len(ev["block_hashes"])
            first = len(stored)
            check_stored(ev, long[first:first + n], long[first - 1] if first else None,
                         range(1000 + first * BLOCK, 1000 + (first + n) * BLOCK))
            stored += ev["block_hashes"]
        else:
            expect(ev["type"] == "BlockRemoved" and ev["medium"] == "GPU", f"event {ev!r}")
            removed += ev["block_hashes"]
    expect(stored == long, "batch 3 stores the 6-block chain")
    expect(len(removed) == 2 and len(set(removed)) == 2 and set(removed) <= cached,
           f"batch 3 evicts two cached blocks: {removed}")
    cached = (cached - set(removed)) | set(long)
    # Batch 4: the reset removes every cached block, then clears.
    expect(b4[-1]["type"] == "AllBlocksCleared", "the reset ends with AllBlocksCleared")
    gone = [h for ev in b4[:-1] for h in ev["block_hashes"]]
    expect(all(ev["type"] == "BlockRemoved" for ev in b4[:-1]), "the reset removes")
    expect(sorted(gone) == sorted(cached), "the reset removes exactly the cached blocks")


def recv_multipart(sock, timeout_ms=5000):
    expect(sock.poll(timeout_ms) != 0, "no message within the timeout")
    return sock.recv_multipart()


def replay(ctx, endpoint, start):
    """[(seq, payload)] answered to [empty, start] until the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        frames = recv_multipart(dealer)
        expect(len(frames) == 3 and frames[0] == b"" and len(frames[1]) == 8,
               f"replay answer {frames!r}")
        if frames[1] == END_SEQ:
            expect(frames[2] == b"", "the end marker's payload is empty")
            break
        out.append((int.from_bytes(frames[1], "big"), frames[2]))
    dealer.close()
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, tmp):
    dp_rank = 1 if args.transport == "tcp" else 0
    if args.transport == "tcp":
        port, rport = free_port(), free_port()
        ep, rep = f"tcp://*:{port - 1}", f"tcp://*:{rport - 1}"
    else:
        ep, rep = f"ipc://{tmp}/pub", f"ipc://{tmp}/replay"
    proc = subprocess.Popen([args.binary, ep, rep, TOPIC, args.form, args.profile,
                             str(dp_rank)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        ready = proc.stdout.readline().split()
        expect(ready and ready[0] == "READY", f"publisher did not start: {ready}")
        pub_ep, replay_ep = (e.replace("0.0.0.0", "127.0.0.1") for e in ready[1:3])
        if args.transport == "tcp":
            expect(pub_ep.endswith(f":{port}") and replay_ep.endswith(f":{rport}"),
                   f"dp rank 1 adds 1 to the ports: {ready}")
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sub.connect(pub_ep)
        # The subscription must reach the publisher before its first batch (ZeroMQ's slow
        # joiner): wait for the handshake, after which it is sent, and a little more.
        expect(monitor.poll(10000), "no ZeroMQ handshake with the publisher")
        recv_monitor_message(monitor)
        sub.disable_monitor()
        monitor.close()
        time.sleep(0.5)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        done = proc.stdout.readline().split()
        expect(done and done[0] == "DONE", f"scenario failed: {done}")
        n = int(done[1])
        live = {}
        while len(live) < n and sub.poll(3000):
            frames = sub.recv_multipart()
            expect(len(frames) == 3, f"a message has {len(frames)} frames")
            topic, seq, payload = frames
            expect(topic == TOPIC.encode(), f"topic {topic!r}")
            expect(len(seq) == 8, f"seq frame {seq.hex()}")
            s = int.from_bytes(seq, "big")
            expect(not live or s == max(live) + 1, f"seq {s} after {sorted(live)}")
            live[s] = payload
        # A subscription can reach the publisher after its first batch (ZeroMQ's slow
        # joiner): then only a prefix is missing, and replay must supply it.
        expect(live and max(live) == n - 1, f"the last batch did not arrive live: {sorted(live)}")
        replayed = replay(ctx, replay_ep, 0)
        expect([s for s, _ in replayed] == list(range(n)), "replay from 0 gives seqs 0..n-1")
        for s, p in replayed:
            expect(s not in live or p == live[s], f"replayed batch {s} differs from the live one")
        if min(live) > 0:
            print(f"kv_events_peer: note: batches 0..{min(live) - 1} came from replay only")
        live = [p for _, p in replayed]
        check_batches([decode_batch(p, args.form, dp_rank) for p in live], args.profile)

        expect(replay(ctx, replay_ep, 3) == [(3, live[3]), (4, live[4])], "replay from 3")
        bad = ctx.socket(zmq.DEALER)
        bad.linger = 0
        bad.connect(replay_ep)
        bad.send_multipart([b"", b"xyz"])
        expect(bad.poll(300) == 0, "a malformed replay request is not answered")
        bad.close()
        expect(replay(ctx, replay_ep, 4) == [(4, live[4])], "replay after a bad request")
        sub.close()
        ctx.term()
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        expect(proc.wait(timeout=10) == 0, f"publisher exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--form", choices=["array", "map", "batchmap"], default="array")
    ap.add_argument("--profile", choices=sorted(GOLDEN_B0), default="vllm-sha256-cbor")
    ap.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvp-peer-") as tmp:
        try:
            run(args, tmp)
        except Fail as e:
            print(f"kv_events_peer: FAILED: {e}")
            return 1
    print(f"kv_events_peer: ok ({args.form}, {args.profile}, {args.transport})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
