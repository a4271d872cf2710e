#!/usr/bin/python3
"""check_layers.py ROOT - the components' include rules (docs/design.md, docs/cli.md), executed.

Every `#include "..."` of every C file and header under ROOT/src and ROOT/include is resolved
the way the compiler resolves a quoted include: first against the including file's own folder
(so "../tok/bpe.h" is followed, not trusted), then against the include path its component is
allowed. The include fails, with FILE:LINE, when

  (a) it reaches a header of a component or layer the including folder may not reach: one
      above it, one beside it, or a repository header that is not on its path at all; or
  (b) it closes a cycle among the files' includes (the cycle is printed).

The rules, most specific first (a folder matching no rule is itself an error, so a new folder
needs a rule before it gets code):

  include/                    include/
  src/*.c, src/*.h (library)  src/, include/
  src/events/                 src/events/, include/  (not the library's internals: the
                              events library is a client of kvprefix.h like any other)
  src/cli/common/             common/, kvprefix.h
  src/cli/tok/                tok/, common/, kvprefix.h
  src/cli/input/              input/, tok/, common/, kvprefix.h
  src/cli/capacity/           capacity/, common/, kvprefix.h
  src/cli/cmd/X/              cmd/X/, the four layers, kvprefix.h; never another command
                              (cmd/fleet/ also kvprefix_events.h: --index drives kvp_router)
  src/cli/main.c              all of src/cli/, src/routerd/ (routerd.h: `kvprefix router`),
                              kvprefix.h, kvprefix_events.h
  src/routerd/                routerd/, src/cli/common/, src/cli/tok/, src/cli/input/,
                              kvprefix.h, kvprefix_events.h (tok/ and input/ for prompts
                              as text: one tokenizer and one template renderer for replay,
                              fleet and the router, so the daemon's ids are replay's; never
                              capacity/ or a command)

"kvprefix.h" alone means the tool reaches include/ for the library's public header only:
libkvprefix-events' header is for the components that link that library.

A header that meson generates (`output: 'NAME'` in the folder's meson.build, or NAME.in beside
it) counts as a file of that folder. A name found nowhere under src/ or include/ is an
external library's header (uthash.h, ...) and is not checked.

Exit status: 0 when every include keeps the rules, 1 with one line per violation, 2 on usage.
Standard library only, so that it runs wherever the tests run.
"""

import os
import re
import sys

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"')
OUTPUT_RE = re.compile(r"output\s*:\s*'([^']+)'")

LAYERS = ['src/cli/common', 'src/cli/tok', 'src/cli/input', 'src/cli/capacity']
LIB_HEADER = ['include/kvprefix.h', 'include/kvprefix']  # kvprefix/version.h with it
EVENTS_HEADER = ['include/kvprefix_events.h']


def rule_for(rel, commands):
    """The rule of the file at rel (a path relative to ROOT, '/'-separated): (name, search
    path, reachable). The search path is the folders the compiler searches after the file's
    own; reachable lists folders (a folder reaches everything below it) and single files the
    file may include. commands lists the folders src/cli/cmd/*. Returns None when no rule
    covers the file's folder."""
    folder = os.path.dirname(rel)
    parts = rel.split('/')
    if parts[0] == 'include':
        return ('include', ['include'], ['include'])
    if parts[0] != 'src':
        return None
    if folder == 'src':
        return ('library', ['src', 'include'], ['<src-top>', 'include'])
    if folder.startswith('src/events'):
        return ('events', ['src/events', 'include'], ['src/events', 'include'])
    if folder.startswith('src/routerd'):
        return ('routerd', ['src/routerd', 'src/cli/input', 'src/cli/tok', 'src/cli/common',
                            'include'],
                ['src/routerd', 'src/cli/common', 'src/cli/tok', 'src/cli/input'] + LIB_HEADER +
                EVENTS_HEADER)
    if rel == 'src/cli/main.c':
        return ('main.c', LAYERS + commands + ['src/routerd', 'include'],
                ['src/cli', 'src/routerd'] + LIB_HEADER + EVENTS_HEADER)
    if folder == 'src/cli/common':
        return ('cli common', ['src/cli/common', 'include'], ['src/cli/common'] + LIB_HEADER)
    if folder == 'src/cli/tok':
        return ('cli tok', ['src/cli/tok', 'src/cli/common', 'include'],
                ['src/cli/tok', 'src/cli/common'] + LIB_HEADER)
    if folder == 'src/cli/input':
        return ('cli input', ['src/cli/input', 'src/cli/tok', 'src/cli/common', 'include'],
                ['src/cli/input', 'src/cli/tok', 'src/cli/common'] + LIB_HEADER)
    if folder == 'src/cli/capacity':
        return ('cli capacity', ['src/cli/capacity', 'src/cli/common', 'include'],
                ['src/cli/capacity', 'src/cli/common'] + LIB_HEADER)
    if len(parts) == 5 and parts[:3] == ['src', 'cli', 'cmd']:
        cmd = '/'.join(parts[:4])
        extra = EVENTS_HEADER if parts[3] == 'fleet' else []
        return ('command ' + parts[3], [cmd] + LAYERS + ['include'],
                [cmd] + LAYERS + LIB_HEADER + extra)
    return None


def reachable(rule, target):
    """Whether target (relative to ROOT) is within what rule may include."""
    for r in rule[2]:
        if r == '<src-top>':
            if os.path.dirname(target) == 'src':
                return True
        elif target == r or target.startswith(r + '/'):
            return True
    return False


def strip_comments(text):
    """text with every /* */ and // comment blanked, line breaks kept (so line numbers stay
    and an include inside a comment is not one). String and character literals are skipped
    whole, so a "/*" inside one opens no comment."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(text[i:j])
        else:
            j = i + 1
            while j < n and text[j] not in '/"\'':
                j += 1
            out.append(text[i:j])
        i = j
    return ''.join(out)


class Tree:
    """The files under ROOT/src and ROOT/include, and the headers meson generates there."""

    def __init__(self, root):
        self.root = root
        self.files = []           # C sources and headers to check, relative to root
        self.known = set()        # every file an include may name (with generated ones)
        self.by_name = {}         # basename -> [relative paths], for "not on its path"
        cmd = os.path.join(root, 'src', 'cli', 'cmd')
        self.commands = ['src/cli/cmd/' + d for d in sorted(os.listdir(cmd))
                         if os.path.isdir(os.path.join(cmd, d))] if os.path.isdir(cmd) else []
        for top in ('src', 'include'):
            for d, dirs, names in os.walk(os.path.join(root, top)):
                dirs.sort()
                rd = os.path.relpath(d, root).replace(os.sep, '/')
                for name in sorted(names):
                    rel = rd + '/' + name
                    if name.endswith(('.c', '.h')):
                        self.files.append(rel)
                        self.add(rel)
                    elif name.endswith('.h.in'):
                        self.add(rel[:-3])
                    elif name == 'meson.build':
                        with open(os.path.join(d, name), encoding='utf-8') as f:
                            for out in OUTPUT_RE.findall(f.read()):
                                if out.endswith('.h'):
                                    self.add(rd + '/' + out)

    def add(self, rel):
        self.known.add(rel)
        self.by_name.setdefault(os.path.basename(rel), []).append(rel)

    def resolve(self, folder, name):
        """The known file that `#include "name"` names from folder, or None."""
        rel = os.path.normpath(folder + '/' + name).replace(os.sep, '/')
        return rel if rel in self.known else None


def check(root):
    """Check the tree at root; returns (violations, n_files, n_includes)."""
    tree = Tree(root)
    errors = []
    graph = {}  # file -> [(included file, line number)]
    n_includes = 0
    for rel in tree.files:
        rule = rule_for(rel, tree.commands)
        with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
            text = strip_comments(f.read())
        edges = graph.setdefault(rel, [])
        for no, line in enumerate(text.split('\n'), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            n_includes += 1
            name = m.group(1)
            if rule is None:
                errors.append('%s:%d: "%s": no layer rule covers %s/ (add one to '
                              'tests/abi/check_layers.py and docs/design.md)'
                              % (rel, no, name, os.path.dirname(rel)))
                continue
            # Step 1: the including file's folder, as the compiler searches it first.
            target = tree.resolve(os.path.dirname(rel), name)
            # Step 2: the component's include path.
            if target is None:
                for d in rule[1]:
                    target = tree.resolve(d, name)
                    if target:
                        break
            if target is None:
                owners = tree.by_name.get(os.path.basename(name), [])
                owners = [o for o in owners if o.endswith('/' + name) or o == name]
                if owners:
                    errors.append('%s:%d: "%s" is %s, which is not on the include path of '
                                  '%s (%s)' % (rel, no, name, ' or '.join(owners), rule[0],
                                               ', '.join(d + '/' for d in rule[1])))
                continue  # an external library's header
            if not reachable(rule, target):
                errors.append('%s:%d: "%s" resolves to %s: %s may not reach it (it reaches '
                              '%s)' % (rel, no, name, target, rule[0],
                                       ', '.join(r for r in rule[2] if r != '<src-top>')
                                       or 'src/*.h'))
            edges.append((target, no))
    errors += cycles(graph)
    return errors, len(tree.files), n_includes


def cycles(graph):
    """One error per include that closes a cycle (depth-first, files in sorted order)."""
    errors = []
    state = {}  # file -> 1 on the stack, 2 done
    stack = []

    def visit(f):
        state[f] = 1
        stack.append(f)
        for t, no in graph.get(f, []):
            if state.get(t) == 1:
                loop = stack[stack.index(t):] + [t]
                errors.append('%s:%d: include cycle: %s' % (f, no, ' -> '.join(loop)))
            elif t not in state:
                visit(t)
        stack.pop()
        state[f] = 2

    sys.setrecursionlimit(max(1000, 4 * len(graph) + 100))
    for f in sorted(graph):
        if f not in state:
            visit(f)
    return errors


def main(argv):
    if len(argv) != 2 or not os.path.isdir(os.path.join(argv[1], 'src')):
        sys.stderr.write('usage: check_layers.py ROOT (the folder holding src/ and include/)\n')
        return 2
    errors, n_files, n_includes = check(argv[1])
    for e in errors:
        print(e)
    if errors:
        print('check_layers: %d violation%s in %d files' %
              (len(errors), '' if len(errors) == 1 else 's', n_files))
        return 1
    print('check_layers: %d files, %d includes: every include within its layer, no cycle' %
          (n_files, n_includes))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
