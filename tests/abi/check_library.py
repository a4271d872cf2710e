#!/usr/bin/python3
"""check_library.py - checks of the built shared library against its public contract.

  check_library.py exports NM LIBRARY HEADER INCLUDE_DIR...
      The dynamic symbols LIBRARY defines (nm -D --defined-only) must be exactly the
      functions and objects declared with KVP_EXPORT in HEADER and in the kvprefix/*.h
      headers it includes (found in the INCLUDE_DIRs). The list is parsed from the headers
      on every run, so a public function added there is expected in the library and a
      function exported by mistake (a missing static, a kvp__ internal) fails the test.

  check_library.py pkgconfig NM LIBRARY PC_FILE [PKG_CONFIG [-lLIB...]]
      xxHash is compiled into the library (XXH_INLINE_ALL): the generated .pc file must
      not ask dependents for libxxhash (Requires, Requires.private, Libs, Libs.private) and
      the library must neither define nor import an XXH symbol.
      With PKG_CONFIG, the .pc file (in meson-private, found through PKG_CONFIG_PATH) and
      its build-tree variant (meson-uninstalled/NAME-uninstalled.pc, when meson wrote one)
      must hand a consumer nothing of the private dependencies: no Requires.private, and
      `pkg-config --cflags NAME` prints only -I flags naming the project's own include
      directories (the includedir of NAME and of the kvprefix .pc files it requires; for the
      build-tree variant, directories under its prefix or srcdir), no -D, no -isystem, no
      foreign path. `pkg-config --static --libs NAME` must list every -lLIB given, and
      `pkg-config --libs NAME` none of them (a dynamic link needs only the library).

Exits 0 when the check holds, 1 with a list of differences otherwise, 77 (skipped) when
nm cannot be run.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

# Symbols a sanitizer runtime or the toolchain may add to any shared object; they are not
# part of the API and are ignored (none appears in an ordinary build).
TOOLCHAIN_PREFIXES = ("__asan", "__ubsan", "__sanitizer", "__odr_asan", "__sancov", "__llvm",
                      "__tsan", "__msan", "__lsan",
                      # the linker's bounds of the coverage sections (-fsanitize=fuzzer-no-link)
                      "__start___sancov", "__stop___sancov")
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


def check_pkgconfig(nm_prog, library, pc_file, pkg_config=None, private_libs=()):
    bad = []
    for line in Path(pc_file).read_text().splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("Requires", "Requires.private", "Libs", "Libs.private") and \
                "xxhash" in line.lower():
            bad.append(f"{pc_file}: {line}")
    for kind, name in nm(nm_prog, library):
        if name.startswith("XXH"):
            bad.append(f"{library}: dynamic symbol {name} ({kind}): xxHash is not compiled in")
    if pkg_config:
        bad += check_pc_flags(pkg_config, Path(pc_file), private_libs)
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"{pc_file} asks nothing of xxHash; {library} has no XXH symbol")
    if pkg_config:
        print(f"{pc_file}: --cflags names only the project's include directories; "
              f"--static --libs lists {' '.join(private_libs) or 'no private library'}")
    return 0


def pkg_config_run(pkg_config, pc_dir, uninstalled, *args):
    """The flags pkg-config prints for args with pc_dir first on its search path (the
    NAME-uninstalled.pc variants allowed or not), or exits 77 if it cannot run."""
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc_dir))
    env.pop("PKG_CONFIG_DISABLE_UNINSTALLED", None)
    if not uninstalled:
        env["PKG_CONFIG_DISABLE_UNINSTALLED"] = "1"
    try:
        r = subprocess.run([pkg_config, *args], capture_output=True, text=True, env=env)
    except OSError as e:
        print(f"check_library: cannot run pkg-config: {e}")
        sys.exit(77)
    if r.returncode != 0:
        return None, f"pkg-config {' '.join(args)} (PKG_CONFIG_PATH={pc_dir}): " \
            f"{r.stderr.strip() or 'exit ' + str(r.returncode)}"
    return r.stdout.split(), None


def check_cflags(pkg_config, pc_dir, name, uninstalled, allowed_roots):
    """Problems with `pkg-config --cflags name`: any flag but -I, or an -I outside
    allowed_roots (exact include directories, or trees for the build-tree variant)."""
    flags, err = pkg_config_run(pkg_config, pc_dir, uninstalled, "--cflags", name)
    if err:
        return [err]
    foreign = []
    for f in flags:
        path = f[2:] if f.startswith("-I") else None
        ok = path is not None and any(
            path == root or (uninstalled and path.startswith(root.rstrip("/") + "/"))
            for root in allowed_roots)
        if not ok:
            foreign.append(f)
    if not foreign:
        return []
    return [f"{pc_dir}/{name}: pkg-config --cflags hands consumers {' '.join(foreign)} "
            f"(all: {' '.join(flags)}); only the project's include directories may appear"]


def check_pc_flags(pkg_config, pc_file, private_libs):
    bad = []
    name = pc_file.name[:-len(".pc")]
    pc_dir = pc_file.parent
    for line in pc_file.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Requires.private" and value.strip():
            bad.append(f"{pc_file}: {line}: a private requirement's Cflags reach every "
                       f"consumer; list its library in Libs.private")

    # The installed form (meson-private/NAME.pc): exactly the includedirs of NAME and of the
    # kvprefix .pc files beside it.
    roots = []
    for pc in sorted(pc_dir.glob("kvprefix*.pc")):
        out, err = pkg_config_run(pkg_config, pc_dir, False, "--variable=includedir",
                                  pc.name[:-3])
        if err:
            bad.append(err)
        elif out:
            roots.append(out[0])
    bad += check_cflags(pkg_config, pc_dir, name, False, roots)

    static, err = pkg_config_run(pkg_config, pc_dir, False, "--static", "--libs", name)
    shared, err2 = pkg_config_run(pkg_config, pc_dir, False, "--libs", name)
    for e in (err, err2):
        if e:
            bad.append(e)
    for lib in private_libs:
        if static is not None and lib not in static:
            bad.append(f"{pc_file}: pkg-config --static --libs lacks {lib} "
                       f"(got: {' '.join(static)})")
        if shared is not None and lib in shared:
            bad.append(f"{pc_file}: pkg-config --libs lists the private {lib} "
                       f"(got: {' '.join(shared)})")

    # The build-tree form (meson-uninstalled/NAME-uninstalled.pc): -I under its prefix (the
    # build directory) or srcdir (the source tree) only.
    un_dir = pc_dir.parent / "meson-uninstalled"
    if (un_dir / f"{name}-uninstalled.pc").is_file():
        roots = []
        for var in ("prefix", "srcdir"):
            out, err = pkg_config_run(pkg_config, un_dir, True, f"--variable={var}", name)
            if err:
                bad.append(err)
            elif out:
                roots.append(out[0])
        bad += check_cflags(pkg_config, un_dir, name, True, roots)
    return bad


def main(argv):
    if len(argv) >= 5 and argv[1] == "exports":
        return check_exports(argv[2], argv[3], argv[4], argv[5:])
    if len(argv) >= 5 and argv[1] == "pkgconfig":
        return check_pkgconfig(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else None,
                               argv[6:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
