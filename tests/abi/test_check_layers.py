#!/usr/bin/python3
"""test_check_layers.py ROOT - check_layers.py shown catching each kind of violation.

A checker is only trusted once it has been seen failing. Each case copies ROOT's src/ and
include/ into a temporary folder, plants one include (or one file) and runs check_layers.py
on the copy: the clean copy must pass, and each planted violation must fail with exit 1 and
name the planted FILE:LINE. One case plants an include inside a comment, which must pass.

Exit status 0 when every case behaves, 1 otherwise (each failing case is printed).
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, 'check_layers.py')

# (what it shows, file to append to or create, lines to write, expected status, text the
# report must hold). {line} is the number of the first planted line.
CASES = [
    ('the tree as it is', None, [], 0, 'no cycle'),
    ('a layer beside: capacity/ includes input/\'s header',
     'src/cli/capacity/kvplan.c', ['#include "logread.h"'], 1,
     'src/cli/capacity/kvplan.c:{line}: "logread.h" is src/cli/input/logread.h, which is '
     'not on the include path'),
    ('a layer above, through a relative path: tok/ includes ../input/logread.h',
     'src/cli/tok/bpe.c', ['#include "../input/logread.h"'], 1,
     'src/cli/tok/bpe.c:{line}: "../input/logread.h" resolves to src/cli/input/logread.h'),
    ('a command beside: cmd/replay/ includes cmd/fleet/\'s header',
     'src/cli/cmd/replay/replay.c', ['#include "../fleet/fleet.h"'], 1,
     'src/cli/cmd/replay/replay.c:{line}: "../fleet/fleet.h" resolves to '
     'src/cli/cmd/fleet/fleet.h: command replay may not reach it'),
    ('the tool\'s base layer above its commands: common/ includes replay.h',
     'src/cli/common/flags.c', ['#include "../cmd/replay/replay.h"'], 1,
     'src/cli/common/flags.c:{line}:'),
    ('libkvprefix-events reaching the library\'s internals',
     'src/events/router.c', ['#include "../internal.h"'], 1,
     'src/events/router.c:{line}: "../internal.h" resolves to src/internal.h: events may '
     'not reach it'),
    ('a tool layer including libkvprefix-events\' header',
     'src/cli/input/logread.c', ['#include "kvprefix_events.h"'], 1,
     'src/cli/input/logread.c:{line}: "kvprefix_events.h" resolves to '
     'include/kvprefix_events.h: cli input may not reach it'),
    ('the library including an events header',
     'src/cache.c', ['#include "router.h"'], 1,
     'src/cache.c:{line}: "router.h" is src/events/router.h, which is not on the include '
     'path of library'),
    ('the daemon including a command\'s header',
     'src/routerd/rd_http.c', ['#include "../cli/cmd/plan/plan.h"'], 1,
     'src/routerd/rd_http.c:{line}: "../cli/cmd/plan/plan.h" resolves to '
     'src/cli/cmd/plan/plan.h: routerd may not reach it'),
    ('the daemon including the tool\'s capacity layer (it may reach tok/ and input/ only)',
     'src/routerd/rd_text.c', ['#include "../cli/capacity/kvplan.h"'], 1,
     'src/routerd/rd_text.c:{line}: "../cli/capacity/kvplan.h" resolves to '
     'src/cli/capacity/kvplan.h: routerd may not reach it'),
    ('the daemon including input/\'s header (allowed: prompts as text)',
     'src/routerd/rd_http.c', ['#include "logread.h"'], 0, 'no cycle'),
    ('a cycle: the two public headers including each other',
     'include/kvprefix.h', ['#include "kvprefix_events.h"'], 1,
     'include cycle: include/kvprefix.h -> include/kvprefix_events.h -> include/kvprefix.h'),
    ('a folder no rule covers',
     'src/extra/extra.c', ['#include "kvprefix.h"'], 1,
     'src/extra/extra.c:{line}: "kvprefix.h": no layer rule covers src/extra/'),
    ('an include inside a comment is not one',
     'src/cli/capacity/kvplan.c', ['/* #include "logread.h"', '#include "bpe.h" */'], 0,
     'no cycle'),
]


def run_case(root, case):
    """Run one case on a fresh copy of root; returns an error text or None."""
    what, path, lines, want_rc, want_text = case
    with tempfile.TemporaryDirectory(prefix='check_layers.') as tmp:
        for top in ('src', 'include'):
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
        line = 1
        if path:
            full = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            old = ''
            if os.path.exists(full):
                with open(full, encoding='utf-8') as f:
                    old = f.read()
            if old and not old.endswith('\n'):
                old += '\n'
            line = old.count('\n') + 1
            with open(full, 'w', encoding='utf-8') as f:
                f.write(old + '\n'.join(lines) + '\n')
        p = subprocess.run([sys.executable, CHECKER, tmp], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        want = want_text.format(line=line)
        if p.returncode != want_rc or want not in p.stdout:
            return ('%s: exit %d (want %d), report:\n%s\n(want it to hold: %s)'
                    % (what, p.returncode, want_rc, p.stdout, want))
    return None


def main(argv):
    if len(argv) != 2:
        sys.stderr.write('usage: test_check_layers.py ROOT\n')
        return 2
    failed = 0
    for i, case in enumerate(CASES, 1):
        err = run_case(argv[1], case)
        if err:
            failed += 1
            print('not ok %d - %s' % (i, err))
        else:
            print('ok %d - %s' % (i, case[0]))
    print('1..%d' % len(CASES))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
