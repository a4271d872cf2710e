#!/usr/bin/python3
"""pyjson_repr_check.py - pyjson_repr_double against CPython's repr() of the same doubles.

    pyjson_repr_check.py PYJSON_REPR_DUMP [N]

Runs the dump program (tests/cli/pyjson_repr_dump.c), reads its "HEX<TAB>REPR" lines and checks
that each REPR is repr(float.fromhex(HEX)): the text Python's json.dumps, and so the chat
templates' tojson, writes for that real. Prints the first mismatches and exits 1 if any.
"""
import subprocess
import sys


def main():
    args = [sys.argv[1]] + sys.argv[2:3]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    n = bad = 0
    for line in out.splitlines():
        hx, ours = line.split("\t")
        want = repr(float.fromhex(hx))
        n += 1
        if ours != want:
            bad += 1
            if bad <= 10:
                print("%s: ours %s, Python %s" % (hx, ours, want))
    print("pyjson_repr_check: %d doubles, %d differ from Python's repr" % (n, bad))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
