"""kvprefix.encode_batch / decode_batch / Publisher: libkvprefix-events' vLLM KV-event codec
and ZeroMQ publisher from Python, checked against msgpack and pyzmq as a router would read
them (the frames vLLM's own subscribers expect)."""

import time

import pytest

import kvprefix

pytestmark = pytest.mark.skipif(not hasattr(kvprefix, "Publisher"),
                                reason="built without libkvprefix-events")
msgpack = pytest.importorskip("msgpack")
zmq = pytest.importorskip("zmq")


def test_encode_is_vllm_array_form():
    events = [("BlockStored", [1, 2], None, list(range(32)), 16),
              ("BlockRemoved", [5], "GPU"), ("AllBlocksCleared",)]
    raw = msgpack.unpackb(kvprefix.encode_batch(events, ts=1.5, dp_rank=0))
    assert raw[0] == 1.5 and raw[2] == 0
    assert raw[1][0][:5] == ["BlockStored", [1, 2], None, list(range(32)), 16]
    assert raw[1][1] == ["BlockRemoved", [5], "GPU"]
    assert raw[1][2] == ["AllBlocksCleared"]


def test_round_trip_both_forms():
    events = [("BlockStored", [2**63, 2**64 - 1], 7, list(range(8)), 4, 3, "CPU", "lora-a"),
              ("BlockRemoved", [9, 10], None), ("AllBlocksCleared",)]
    for form in ("array", "map"):
        for batch_map in (False, True):
            p = kvprefix.encode_batch(events, ts=2.0, dp_rank=3, form=form, batch_map=batch_map)
            assert kvprefix.decode_batch(p) == (2.0, events, 3)
    ts, _, rank = kvprefix.decode_batch(kvprefix.encode_batch([]))
    assert abs(ts - time.time()) < 60 and rank is None
    # A negative hash is its two's complement, as vLLM's decoders take it.
    assert kvprefix.decode_batch(kvprefix.encode_batch(
        [("BlockRemoved", [-1])]))[1] == [("BlockRemoved", [2**64 - 1], None)]


@pytest.mark.parametrize("bad", [
    [("BlockStored", [1], None, [1, 2], 0)],          # block size 0
    [("BlockStored", [1], None, [-1], 1)],             # a token id below 0
    [("BlockStored", [1], None, [2**32], 1)],          # a token id above 2**32-1
    [("BlockStored", [2**64], None, [1], 1)],          # a hash above 2**64-1
    [("Evicted", [1])],                                 # an unknown type
    [["BlockRemoved", [1]]],                            # a list, not a tuple
    [("BlockRemoved", [1], 5)],                         # medium not a str
])
def test_encode_refuses(bad):
    with pytest.raises((TypeError, ValueError)):
        kvprefix.encode_batch(bad)


def test_decode_refuses():
    for junk in (b"", b"\x90\x90", b"\xc1", msgpack.packb([1.0, [["Nope"]], None])):
        with pytest.raises(ValueError):
            kvprefix.decode_batch(junk)
    with pytest.raises(ValueError):
        kvprefix.encode_batch([], form="xml")


def test_publisher_frames_and_replay():
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    dealer = ctx.socket(zmq.DEALER)
    with kvprefix.Publisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                            topic="kv@pod@m") as pub:
        pub_ep, replay_ep = pub.endpoint(0), pub.endpoint(1)
        assert pub_ep.startswith("tcp://127.0.0.1:") and replay_ep != pub_ep
        sub.connect(pub_ep)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        # ZeroMQ's subscriber joins late: publish probe batches until one arrives.
        deadline = time.monotonic() + 30
        while not sub.poll(50):
            assert time.monotonic() < deadline, "the SUB socket never received"
            pub.removed([12345])
            pub.flush()
        while sub.poll(200):
            sub.recv_multipart()
        n0 = pub.stats()["next_seq"]
        tokens = list(range(100, 132))
        pub.stored([11, 12], tokens)
        pub.stored([13], list(range(16)), parent=12)  # continues the chain: one event
        pub.stored([21], list(range(16)), parent=99)  # another chain
        pub.flush()
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv@pod@m" and int.from_bytes(seq, "big") == n0
        _, events, rank = kvprefix.decode_batch(payload)
        assert rank == 0
        assert events[0][:5] == ("BlockStored", [11, 12, 13], None,
                                 tokens + list(range(16)), 16)
        assert events[1][:5] == ("BlockStored", [21], 99, list(range(16)), 16)
        assert len(events) == 2
        assert pub.stats()["batches"] == n0 + 1
        # The replay socket re-sends it, then the end marker.
        dealer.connect(replay_ep)
        dealer.send_multipart([b"", n0.to_bytes(8, "big")])
        assert dealer.poll(30000)
        _, rseq, rpayload = dealer.recv_multipart()
        assert int.from_bytes(rseq, "big") == n0 and rpayload == payload
        _, end, empty = dealer.recv_multipart()
        assert end == b"\xff" * 8 and empty == b""
        with pytest.raises(ValueError):
            pub.stored([1, 2], [1, 2, 3])  # 3 tokens for 2 blocks
    with pytest.raises(ValueError):
        pub.flush()  # closed
    sub.close(0)
    dealer.close(0)
    ctx.term()


def test_publisher_refuses_a_bad_endpoint():
    with pytest.raises((ValueError, OSError)):
        kvprefix.Publisher("nonsense")
