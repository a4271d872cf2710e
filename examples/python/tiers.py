#!/usr/bin/python3
"""An engine embedding a two-tier cache from Python: a small device pool ("GPU") and a host
memory tier ("CPU"), with the copies the cache orders done by the engine.

  acquire_tiers -> (Match, load orders): copy CPU block -> device block, confirm each, then
                   prefill the rest and commit the whole prompt as usual;
  commit        -> store orders (tier_orders): copy device block -> CPU block and confirm;
                   until then the CPU copy is not used by any lookup.

The KV of a block is simulated as one int computed from its prefix, so the program checks
that every loaded block holds what computing it would have produced. Copies complete one
engine step late, in reverse order (as DMA completions might), and one load in ten fails:
the engine then computes that block and every block after it. Prints one line per request and
the CPU tier's counters; exits 1 if a check fails.

    python3 examples/python/tiers.py [--gpu BLOCKS] [--cpu BLOCKS]
"""

import argparse
import sys
import zlib

import kvprefix

BS = 16


def compute_kv(tokens, block):
    """What computing block `block` of a prompt gives: a function of its whole prefix."""
    return zlib.crc32(repr(tokens[: (block + 1) * BS]).encode())


class Engine:
    def __init__(self, gpu_blocks, cpu_blocks):
        self.cache = kvprefix.Cache(gpu_blocks, BS)
        self.cpu_tier = self.cache.add_tier("CPU", cpu_blocks)
        self.gpu = [None] * gpu_blocks  # device memory: one simulated KV word per block
        self.cpu = [None] * cpu_blocks  # host memory
        self.in_flight = []  # copies issued, completed at the next step
        self.failures = 0
        self.n_loads_failed = 0

    def complete_copies(self, fail_some=False):
        """Finish every copy in flight, last issued first, and confirm each."""
        while self.in_flight:
            o = self.in_flight.pop()
            ok = not (fail_some and o.kind == kvprefix.ORDER_LOAD and o.id % 10 == 3)
            if ok and o.kind == kvprefix.ORDER_STORE:
                self.cpu[o.tier_block] = self.gpu[o.device_block]
            elif ok:
                self.gpu[o.device_block] = self.cpu[o.tier_block]
            else:
                self.n_loads_failed += 1
            self.cache.tier_confirm(o.id, ok)
            if not ok:
                self.gpu[o.device_block] = None  # nothing arrived

    def serve(self, req_id, ns, tokens, name):
        m, loads = self.cache.acquire_tiers(req_id, ns, tokens)
        blocks = self.cache.request_blocks(req_id)
        self.in_flight += loads
        self.complete_copies(fail_some=True)
        # Usable: the device hits, then the loaded blocks up to the first failed load.
        n_ready = m.n_blocks_hit
        for o in loads:
            if self.gpu[o.device_block] is None:
                break
            n_ready += 1
        for b in range(n_ready):
            if self.gpu[blocks[b]] != compute_kv(tokens, b):
                print(f"{name}: block {b} holds the wrong KV", file=sys.stderr)
                self.failures += 1
        for b in range(n_ready, len(tokens) // BS):  # prefill computes the rest
            self.gpu[blocks[b]] = compute_kv(tokens, b)
        self.cache.commit(req_id, tokens)
        self.in_flight += self.cache.tier_orders()  # write-through to host memory
        self.cache.release(req_id)
        print(f"{name:8} {len(tokens) // BS:3} blocks: {m.n_blocks_hit:2} from GPU, "
              f"{n_ready - m.n_blocks_hit:2} loaded from CPU ({len(loads)} ordered), "
              f"{len(tokens) // BS - n_ready:2} computed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=48, help="device pool blocks (default 48)")
    ap.add_argument("--cpu", type=int, default=256, help="host tier blocks (default 256)")
    args = ap.parse_args(argv)
    eng = Engine(args.gpu, args.cpu)
    ns = kvprefix.Namespace(model="llama-3.1-8b")
    chat = [1000 + i for i in range(24 * BS)]
    eng.serve(1, ns, chat[: 12 * BS + 5], "turn 1")
    for r in range(6):  # other traffic evicts the conversation from the device pool
        eng.serve(100 + r, ns, [50000 + r * 1000 + i for i in range(20 * BS)], "other")
    eng.complete_copies()
    eng.serve(2, ns, chat[: 18 * BS + 3], "turn 2")
    eng.complete_copies()
    st = eng.cache.tier_stats(eng.cpu_tier)
    print(f"{st.medium} tier: {st.n_blocks_ready} blocks ready, {st.n_loads} loads "
          f"({st.n_loads_failed} failed), {st.n_stores} stores")
    eng.cache.check()
    if st.n_loads + st.n_loads_failed == 0:
        print("the second turn loaded nothing from the CPU tier", file=sys.stderr)
        eng.failures += 1
    return 1 if eng.failures else 0


if __name__ == "__main__":
    sys.exit(main())
