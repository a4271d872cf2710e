#!/usr/bin/python3
"""check_paths.py - nothing in the repository points outside it.

  check_paths.py SOURCE_ROOT [GIT]

Every git-tracked text file under SOURCE_ROOT is searched for a reference to a sibling
folder of the checkout (a parent-directory path into "shared") or to a path of one machine
(a home folder or the work tree the project was developed in). What the code and tests rely
on is stated in docs/ instead (docs/kv-events.md, docs/test-vectors.md, the trace section
of docs/replay.md). Skipped: fuzz corpora (data, kept byte for byte) and binary files
(holding a NUL byte); the tokenizer corpus is checked (scripts/tokref.sh recomputes its
reference token ids whenever it changes).

The patterns below are spelt so that this file does not match itself. They are checked
against known good and bad lines on every run, so a pattern that stops matching fails here
rather than passing silently.

Exits 0 when no file matches, 1 listing each FILE:LINE: text otherwise, 77 (skipped) when
git cannot list the files (a tarball, no git).
"""
import re
import subprocess
import sys
from pathlib import Path

FORBIDDEN = [
    ("a path to a folder beside the repository", re.compile(r"\.\./shared\b")),
    ("a machine path", re.compile(r"(?<![\w.])/(?:wor[k]|hom[e]|User[s])/")),
]

# Fuzz inputs are data kept byte for byte (a mutation may spell anything); the tokenizer
# corpus is checked like prose (its reference ids are recomputed from it by scripts/tokref.sh).
SKIPPED_PREFIXES = ("fuzz/corpus/",)

SELF_TEST_BAD = [
    "see " + ".." + "/shared/kv-events.md",
    "python = '/" + "work/wt/x/venv/bin/python3'",
    "cd /" + "home/alice/kvprefix",
    "(/" + "Users/bob/src)",
]
SELF_TEST_GOOD = [
    "char path[] = \"/tmp/kvp_io_XXXXXX\";",
    "docs/kv-events.md (vLLM's wire format)",
    "src/cli/common/outfile.c",
    "src/homework/ and ./shared/ are fine",
]


def match(line):
    """The description of the first forbidden pattern in line, or None."""
    for what, pattern in FORBIDDEN:
        if pattern.search(line):
            return what
    return None


def self_test():
    bad = [s for s in SELF_TEST_BAD if match(s) is None]
    bad += [s for s in SELF_TEST_GOOD if match(s) is not None]
    for s in bad:
        print(f"check_paths: pattern self-test failed on {s!r}")
    return not bad


def tracked_files(root, git):
    try:
        out = subprocess.run([git, "-C", str(root), "ls-files", "-z"], check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"check_paths: cannot list the tracked files: {e}")
        sys.exit(77)
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1])
    git = argv[2] if len(argv) == 3 else "git"
    if not self_test():
        return 1
    hits = []
    n_files = 0
    for rel in tracked_files(root, git):
        if rel.startswith(SKIPPED_PREFIXES):
            continue
        path = root / rel
        if not path.is_file():  # deleted in the work tree, or a submodule
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        n_files += 1
        text = data.decode("utf-8", "replace")
        for no, line in enumerate(text.splitlines(), 1):
            what = match(line)
            if what:
                hits.append(f"{rel}:{no}: {what}: {line.strip()}")
    for h in hits:
        print(h)
    if hits:
        print(f"check_paths: {len(hits)} line(s) point outside the repository; state what "
              f"they rely on in docs/ and cite that instead")
        return 1
    print(f"check_paths: {n_files} tracked text files, none points outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
