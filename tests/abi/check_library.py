#!/usr/bin/python3
"""check_library.py - checks of the built shared library against its public contract.

  check_library.py exports NM LIBRARY HEADER INCLUDE_DIR...
      The dynamic symbols LIBRARY defines (nm -D --defined-only) must be exactly the
      functions and objects declared with KVP_EXPORT in HEADER and in the kvprefix/*.h
      headers it includes (found in the INCLUDE_DIRs). The list is parsed from the headers
      on every run, so a public function added there is expected in the library and a
      function exported by mistake (a missing static, a kvp__ internal) fails the test.

  check_library.py pkgconfig NM LIBRARY PC_FILE
      xxHash is compiled into the library (XXH_INLINE_ALL): the generated kvprefix.pc must
      not ask dependents for libxxhash (Requires, Requires.private, Libs, Libs.private) and
      the library must neither define nor import an XXH symbol.

Exits 0 when the check holds, 1 with a list of differences otherwise, 77 (skipped) when
nm cannot be run.
"""
import re
import subprocess
import sys
from pathlib import Path

# Symbols a sanitizer runtime or the toolchain may add to any shared object; they are not
# part of the API and are ignored (none appears in an ordinary build).
TOOLCHAIN_PREFIXES = ("__asan", "__ubsan", "__sanitizer", "__odr_asan", "__sancov", "__llvm",
                      "__tsan", "__msan", "__lsan")
TOOLCHAIN_NAMES = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def strip_comments(text):
    """The header text without /* */ and // comments (string literals hold none here)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def logical_lines(text):
    """Lines with backslash continuations joined."""
    return text.replace("\\\n", " ").split("\n")


def declared_names(header, include_dirs, seen):
    """KVP_EXPORT names declared in header and in the kvprefix/ headers it includes."""
    header = Path(header).resolve()
    if header in seen:
        return set()
    seen.add(header)
    names = set()
    code = []
    for line in logical_lines(strip_comments(header.read_text())):
        stripped = line.strip()
        if stripped.startswith("#"):
            m = re.match(r'#\s*include\s*"(kvprefix/[^"]+)"', stripped)
            if m:
                for d in include_dirs:
                    candidate = Path(d) / m.group(1)
                    if candidate.is_file():
                        names |= declared_names(candidate, include_dirs, seen)
                        break
                else:
                    sys.exit(f"check_library: {header}: cannot find {m.group(1)} in "
                             f"{', '.join(include_dirs)}")
            continue
        code.append(line)
    text = " ".join(code)
    for m in re.finditer(r"\bKVP_EXPORT\b([^;{]*)", text):
        decl = m.group(1)
        if "(" in decl:
            before = decl.split("(", 1)[0]
        else:
            before = re.sub(r"\[[^\]]*\]", " ", decl)  # an exported array object
        ids = re.findall(r"[A-Za-z_]\w*", before)
        if not ids:
            sys.exit(f"check_library: {header}: cannot read the name in 'KVP_EXPORT{decl}'")
        names.add(ids[-1])
    return names


def nm(nm_prog, library, *flags):
    """(type, name) of the dynamic symbols nm lists with flags; exits 77 if nm fails."""
    try:
        out = subprocess.run([nm_prog, "-D", *flags, library], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"check_library: cannot run nm: {e}")
        sys.exit(77)
    symbols = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            symbols.append((fields[-2], fields[-1].split("@")[0]))
    return symbols


def is_toolchain(name):
    return name in TOOLCHAIN_NAMES or name.startswith(TOOLCHAIN_PREFIXES)


def check_exports(nm_prog, library, header, include_dirs):
    declared = declared_names(header, include_dirs, set())
    if not declared:
        sys.exit(f"check_library: no KVP_EXPORT declaration found in {header}")
    exported = {name for _, name in nm(nm_prog, library, "--defined-only")
                if not is_toolchain(name)}
    missing = sorted(declared - exported)
    extra = sorted(exported - declared)
    for name in missing:
        print(f"declared KVP_EXPORT in the header but not exported by the library: {name}")
    for name in extra:
        print(f"exported by the library but not declared KVP_EXPORT in the header: {name}")
    if missing or extra:
        return 1
    print(f"{len(declared)} public symbols, exported exactly: {', '.join(sorted(declared))}")
    return 0


def check_pkgconfig(nm_prog, library, pc_file):
    bad = []
    for line in Path(pc_file).read_text().splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("Requires", "Requires.private", "Libs", "Libs.private") and \
                "xxhash" in line.lower():
            bad.append(f"{pc_file}: {line}")
    for kind, name in nm(nm_prog, library):
        if name.startswith("XXH"):
            bad.append(f"{library}: dynamic symbol {name} ({kind}): xxHash is not compiled in")
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"{pc_file} asks nothing of xxHash; {library} has no XXH symbol")
    return 0


def main(argv):
    if len(argv) >= 5 and argv[1] == "exports":
        return check_exports(argv[2], argv[3], argv[4], argv[5:])
    if len(argv) == 5 and argv[1] == "pkgconfig":
        return check_pkgconfig(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
