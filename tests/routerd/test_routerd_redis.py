#!/usr/bin/python3
"""test_routerd_redis.py - several `kvprefix router --redis` daemons on one Redis.

Starts its own redis-server on a free port (no persistence, its own temporary directory),
two fake engines (tests/routerd/fake_engine.c: a kvp_cache with a kvp_publisher, commands on stdin)
on ipc:// endpoints, and two routers sharing the Redis database under one key prefix, then
checks (docs/routing.md, "Several routers on one Redis"):

  a. both routers return the same rows (same ranking, same blocks) for several prompts,
     equal to each engine's own kvp_lookup, from the shared view ("view": "redis");
  b. router 1 killed (SIGKILL): the engines store more blocks, router 2 scores them; router
     1 started again answers its first scores with the same rows, blocks stored while it
     was down included, before it has applied a single event itself (they come from Redis);
  c. Redis killed and started again empty on the same port: both routers survive, count and
     log the loss, and put the lost workers back from a local view (blocks both routers'
     local views hold come back); blocks stored after the restart are scored; no score ever
     exceeds what the engine holds; what was lost (blocks only router 2's local view held,
     when router 1 found the loss) is measured and printed;
  d. Redis stopped (SIGKILL, then separately SIGSTOP: a hang): /score still answers within
     2 s with "view": "local" and the blocks stored during the outage (the local view), the
     metrics show the fallback, the log says so; once Redis is back the routers return to
     the shared view after --redis-retry, and the outage's batches reach Redis (re-seeded
     after the kill; a GAP at the next batch, replayed from the engine, after the hang).

Also: bad --redis flags exit 2; a Redis absent at start leaves the daemon on its local view;
no router takes the other's duplicates for a publisher restart or marks a worker stale.

    test_routerd_redis.py KVPREFIX_BINARY FAKE_ENGINE_BINARY

Exits 0 on success, 1 on a failed check, 77 (skipped) when redis-server is missing or this
build has no Redis support, unless KVPREFIX_REDIS_REQUIRED is set (then those fail).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree for the import below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_routerd import BLOCK, Daemon, Engine, Fail, expect, prompt  # noqa: E402

REQUIRED = bool(os.environ.get("KVPREFIX_REDIS_REQUIRED"))
TIMEOUT_MS, RETRY_MS = 200, 500
BOUND_S = 2.0  # longest a /score may take while Redis is down or hung
WAIT_S = 20.0  # longest any condition may take to hold on a loaded machine


def skip(why):
    if REQUIRED:
        print(f"test_routerd_redis: FAIL: {why} (KVPREFIX_REDIS_REQUIRED is set)")
        sys.exit(1)
    print(f"test_routerd_redis: SKIPPED: {why}")
    sys.exit(77)


def wait(pred, what, limit=WAIT_S):
    end = time.monotonic() + limit
    last = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(0.02)
    raise Fail(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server of our own: no persistence, its own directory, one fixed port."""

    def __init__(self, exe, tmp, port):
        self.exe, self.dir, self.port, self.proc = exe, os.path.join(tmp, "redis"), port, None
        os.makedirs(self.dir, exist_ok=True)
        self.n_starts = 0

    def start(self):
        self.n_starts += 1
        log = os.path.join(self.dir, f"redis-{self.n_starts}.log")
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", log, "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: self.proc.poll() is not None or self.call("PING") == b"+PONG",
             "redis-server to answer PING", 10)
        expect(self.proc.poll() is None, f"redis-server exited {self.proc.returncode}")

    def call(self, *args):
        """One command over RESP; the first reply line, or None when it does not answer."""
        msg = f"*{len(args)}\r\n".encode()
        for a in args:
            a = str(a).encode()
            msg += b"$%d\r\n%s\r\n" % (len(a), a)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(msg)
                return s.makefile("rb").readline().rstrip(b"\r\n")
        except OSError:
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


class Router(Daemon):
    """A `kvprefix router --redis` whose log is kept in a file of its own per start."""

    def __init__(self, exe, args, log_path):
        self.log_path = log_path
        super().__init__(exe, args, log_path)

    def logtext(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def rows(self, tokens):
        """(view, [(engine, blocks, state), ...] best first) for a prompt."""
        r = self.score(tokens)
        return r["view"], [(w["engine"], w["blocks"], w["state"]) for w in r["workers"]]

    def timed_score(self, tokens):
        t0 = time.monotonic()
        r = self.score(tokens)
        return r, time.monotonic() - t0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def truth(engines, p):
    """What each engine holds of prompt p, ranked as the router ranks (blocks, then id)."""
    held = [(name, e.lookup(p)) for name, e in engines.items()]
    held.sort(key=lambda x: (-x[1], x[0]))
    return [(name, n, "scored") for name, n in held]


def check_same(routers, engines, prompts, what):
    """Every router returns the engines' own rows from the shared view, for every prompt."""
    def ok():
        for p in prompts:
            want = truth(engines, p)
            for r in routers:
                out = r.score(p)  # "fallback" false: the call itself says Redis answered
                view, fallback = out["view"], out.get("fallback")
                rows = [(w["engine"], w["blocks"], w["state"]) for w in out["workers"]]
                if view != "redis" or fallback is not False or rows != want:
                    check_same.last = (f"prompt at {p[0]}: {view} (fallback {fallback}) {rows}, "
                                       f"engines {want}")
                    return False
        return True
    check_same.last = ""
    try:
        wait(ok, what)
    except Fail as e:
        raise Fail(f"{e}: {check_same.last}")


def never_over(routers, engines, prompts):
    """No router reports more blocks for a worker than its engine holds."""
    for p in prompts:
        have = {name: e.lookup(p) for name, e in engines.items()}
        for r in routers:
            view, rows = r.rows(p)
            for name, n, state in rows:
                expect(n <= have[name], f"over-reported: prompt at {p[0]}, {name} {n} > "
                       f"{have[name]} ({view})")


def subscribed(routers, engines):
    """Wait until every router receives every engine's messages (a probe batch each round:
    ZeroMQ's subscriber joins late). Returns the probe prompts stored."""
    probes = []
    for e in engines.values():
        e.wait_subscribed()

    def ok():
        for name, e in engines.items():
            p = prompt(900000 + 1000 * len(probes), 1)
            probes.append(p)
            e.access(p)
        time.sleep(0.1)
        return all(r.metric("kvprefix_router_messages_total", endpoint=e.pub) > 0
                   for r in routers for e in engines.values())
    wait(ok, "both routers subscribed to both engines")
    return probes


def phase_a(r1, r2, engines):
    a, b = engines["a"], engines["b"]
    pa, pb, shared = prompt(0, 4), prompt(1000, 3), prompt(5000, 4)
    a.access(pa)
    b.access(pb)
    a.access(shared[:2 * BLOCK])
    b.access(shared)
    check_same([r1, r2], engines, [pa, pb, shared, prompt(77000, 2)], "(a) the same rows")
    _, rows = r1.rows(shared)
    expect(rows == [("b", 4, "scored"), ("a", 2, "scored")], f"(a) ranking: {rows}")
    for r in (r1, r2):
        expect(r.metric("kvprefix_router_redis_up") == 1, "(a) redis_up")
        expect(r.metric("kvprefix_router_redis_calls_total") > 0, "(a) redis calls")
        expect("redis: connected to" in r.logtext(), "(a) no 'connected' line")
    # Both routers applied every batch; at most one of them to Redis each time.
    dups = r1.metric("kvprefix_router_redis_duplicates_total") + \
        r2.metric("kvprefix_router_redis_duplicates_total")
    expect(dups > 0, "(a) no batch seen as applied by the other router")
    expect("restarted and its first batches were lost" not in r1.logtext() + r2.logtext(),
           "(a) a shared DUPLICATE was taken for a lost restart")
    return [pa, pb, shared]


def phase_b(kvprefix, args, tmp, routers, engines, prompts):
    r1, r2 = routers
    a, b = engines["a"], engines["b"]
    r1.kill()
    pc, pd = prompt(10000, 3), prompt(11000, 2)
    a.access(pc)
    b.access(pd)
    check_same([r2], engines, prompts + [pc, pd], "(b) router 2 alone")
    r1 = Router(kvprefix, args, os.path.join(tmp, "router1-b.log"))
    routers[0] = r1
    # At once: the first score of each prompt, nothing applied by router 1 yet.
    for p in prompts + [pc, pd]:
        view, rows = r1.rows(p)
        expect(view == "redis" and rows == truth(engines, p),
               f"(b) restarted router 1, prompt at {p[0]}: {view} {rows}")
    expect(r1.metric("kvprefix_router_events_total", type="stored") == 0,
           "(b) router 1 re-learned blocks from the engines")
    # Its next batches: a gap in its local view that the fleet does not have, so the library
    # follows it (no replay: the local view restarts there, partial) and Redis has them.
    # Router 1 is paused (SIGSTOP) while they are published, so that router 2 applies them
    # to Redis first: router 1, resumed, finds them DUPLICATE in the store while its own
    # local view has a gap there, and must count them as duplicates all the same.
    dups0 = r1.metric("kvprefix_router_redis_duplicates_total")
    pq, pr = prompt(12000, 1), prompt(13000, 1)
    r1.proc.send_signal(signal.SIGSTOP)
    try:
        a.access(pq)
        b.access(pr)
        check_same([r2], engines, [pq, pr], "(b) router 2 first")
    finally:
        r1.proc.send_signal(signal.SIGCONT)
    check_same([r1, r2], engines, prompts + [pc, pd, pq, pr], "(b) the next batches")
    expect(r1.metric("kvprefix_router_replays_total") == 0, "(b) router 1 replayed")
    dups = r1.metric("kvprefix_router_redis_duplicates_total") - dups0
    expect(dups == 2, f"(b) router 1, started late, counted {dups:g} of the 2 batches router "
           "2 had applied as duplicates")
    return r1, prompts + [pc, pd, pq, pr], [pq, pr]


def back_to_redis(routers, p, what):
    """Score p on every router until the shared view answers (the routers try Redis again
    --redis-retry after a failure). Returns the seconds it took."""
    t0 = time.monotonic()
    for i, r in enumerate(routers):
        wait(lambda: r.rows(p)[0] == "redis", f"{what}: router {i + 1} back on Redis")
    return time.monotonic() - t0


def logged_losses(r):
    """Losses the router's log lines report, summed."""
    return sum(int(n) for n in re.findall(r"(\d+) worker\(s\) found missing", r.logtext()))


def logged_reseeds(r):
    """Re-seeds the router's log lines report, summed."""
    return sum(int(n) for n in re.findall(r"re-seeded (\d+) worker view\(s\)", r.logtext()))


def phase_c(redis, r1, r2, engines, prompts, recent):
    """recent: prompts stored since router 1's restart (both routers' local views hold
    them; the older ones only router 2's: router 1's local view follows from its restart)."""
    a, b = engines["a"], engines["b"]
    lost0 = [r.metric("kvprefix_router_redis_lost_total") for r in (r1, r2)]
    reseeds0 = sum(r.metric("kvprefix_router_redis_reseeds_total") for r in (r1, r2))
    redis.kill()
    redis.start()
    dt = back_to_redis([r1, r2], prompts[0], "(c)")
    print(f"test_routerd_redis: (c) both routers on the restarted Redis after {dt:.2f} s")
    pe, pf = prompt(20000, 2), prompt(21000, 3)
    a.access(pe)
    b.access(pf)
    check_same([r1, r2], engines, [pe, pf], "(c) blocks stored after the Redis restart")
    # The router whose batch reaches the empty store first finds the worker's state missing,
    # counts it and puts the worker's blocks back from its local view (the other one then
    # sees a duplicate): both workers, across the routers.
    lost = lambda: [r.metric("kvprefix_router_redis_lost_total") for r in (r1, r2)]
    wait(lambda: sum(lost()) >= sum(lost0) + 2, "(c) both workers counted as lost")
    expect(sum(r.metric("kvprefix_router_redis_reseeds_total") for r in (r1, r2)) >=
           reseeds0 + 2, "(c) the lost workers were not re-seeded")
    check_same([r1, r2], engines, recent, "(c) blocks both local views hold, re-seeded")
    for i, r in enumerate((r1, r2)):
        if lost()[i] > lost0[i]:
            wait(lambda: "redis: worker state lost" in r.logtext(),
                 f"(c) router {i + 1}: no loss line")
        expect(r.proc.poll() is None, f"(c) router {i + 1} died")
    never_over([r1, r2], engines, prompts + [pe, pf])
    # Every loss and every re-seed is in the log, as separate figures (a re-seed also
    # repairs a view another router put back in part, so re-seeds may outnumber losses).
    for i, r in enumerate((r1, r2)):
        wait(lambda: logged_reseeds(r) == r.metric("kvprefix_router_redis_reseeds_total") and
             logged_losses(r) == r.metric("kvprefix_router_redis_lost_total"),
             f"(c) router {i + 1}: its log lines to add up to its loss and re-seed counters "
             f"(logged {logged_losses(r)} losses, {logged_reseeds(r)} re-seeds; counters "
             f"{r.metric('kvprefix_router_redis_lost_total'):g}, "
             f"{r.metric('kvprefix_router_redis_reseeds_total'):g})")
    lost_now = lost()
    # What the restart lost: blocks the engines hold but the shared view no longer shows.
    lost = held = 0
    for p in prompts:
        want = truth(engines, p)
        _, rows = r2.rows(p)
        got = {name: n for name, n, _ in rows}
        for name, n, _ in want:
            held += n
            lost += n - got[name]
    finders = [int(n - n0) for n, n0 in zip(lost_now, lost0)]
    print(f"test_routerd_redis: (c) after the Redis restart the shared view shows "
          f"{held - lost} of the {held} blocks stored before it ({lost} lost until their "
          f"engines store them again; losses found by router 1: {finders[0]}, router 2: "
          f"{finders[1]})")
    return [pe, pf]


SLOWEST = {}  # the slowest /score while Redis was unavailable, per outage kind


def bounded_local(r, p, engines, what):
    """A score while Redis is unavailable: answered within BOUND_S from the local view."""
    r_, dt = r.timed_score(p)
    expect(dt < BOUND_S, f"{what}: /score took {dt:.2f} s")
    SLOWEST[what] = max(SLOWEST.get(what, 0.0), dt)
    return r_


def outage(redis, r1, r2, engines, how):
    """Redis killed or stopped: the fallback; then back to the shared view."""
    a, b = engines["a"], engines["b"]
    fb0 = [r.metric("kvprefix_router_fallback_scores_total") for r in (r1, r2)]
    lines0 = [(r.logtext().count("redis: unreachable"), r.logtext().count("redis: reachable again"))
              for r in (r1, r2)]
    if how == "kill":
        redis.kill()
    else:
        redis.proc.send_signal(signal.SIGSTOP)
    # Two batches back to back: the first one's call fails (refused, or times out on the hung
    # server, which may still run it when it resumes), the second comes within the retry
    # pause and is never sent: Redis misses it for sure.
    pg = prompt(30000 + (0 if how == "kill" else 1000), 2)
    pg2 = prompt(36000 + (0 if how == "kill" else 1000), 1)
    b.access(pg)
    b.access(pg2)
    for i, r in enumerate((r1, r2)):
        wait(lambda: (bounded_local(r, pg, engines, f"(d) {how}")["view"] == "local" and
                      r.blocks(pg).get("b") == (2, "scored")),
             f"(d) {how}: router {i + 1} scores from its local view")
        for _ in range(3):
            out = bounded_local(r, pg, engines, f"(d) {how}")
            expect(out["view"] == "local" and out.get("fallback") is True,
                   f"(d) {how}: view {out['view']}, fallback {out.get('fallback')}")
        status, body = r.request("GET", "/healthz")
        expect(status == 200 and b'"view":"local"' in body, f"(d) {how}: healthz {body}")
        expect(r.metric("kvprefix_router_redis_up") == 0, f"(d) {how}: redis_up")
        expect(r.metric("kvprefix_router_fallback_scores_total") > fb0[i],
               f"(d) {how}: fallback scores")
        expect(r.metric("kvprefix_router_fallback_applies_total") > 0,
               f"(d) {how}: fallback applies")
        expect(r.metric("kvprefix_router_redis_errors_total") > 0, f"(d) {how}: errors")
        wait(lambda: r.logtext().count("redis: unreachable") > lines0[i][0],
             f"(d) {how}: no 'unreachable' line")
    if how == "kill":
        redis.start()
    else:
        redis.proc.send_signal(signal.SIGCONT)
    print(f"test_routerd_redis: (d) {how}: slowest /score during the outage "
          f"{SLOWEST[f'(d) {how}'] * 1000:.0f} ms (--redis-timeout {TIMEOUT_MS} ms)")
    dt = back_to_redis([r1, r2], pg, f"(d) {how}")
    print(f"test_routerd_redis: (d) {how}: shared view again {dt:.2f} s after Redis returned "
          f"(--redis-retry {RETRY_MS} ms)")
    off = 0 if how == "kill" else 1000
    ph, pi = prompt(32000 + off, 2), prompt(34000 + off, 1)
    a.access(ph)
    check_same([r1, r2], engines, [ph], f"(d) {how}: blocks stored once Redis is back")
    # B's next batch: a Redis that kept its state (stopped) missed pg's batch: a GAP, which
    # the routers fill from B's replay socket; a restarted one lost B: only the new batch.
    gaps0 = sum(r.metric("kvprefix_router_batches_total", engine="b", status="gap")
                for r in (r1, r2))
    b.access(pi)
    if how == "stop":
        check_same([r1, r2], engines, [pg, pg2, pi], f"(d) {how}: the outage's batches replayed")
        expect(sum(r.metric("kvprefix_router_batches_total", engine="b", status="gap")
                   for r in (r1, r2)) > gaps0, f"(d) {how}: no gap seen")
    else:
        # B's state is lost again; its finder puts back its local view, which holds the
        # outage's batches (applied locally only).
        check_same([r1, r2], engines, [pg, pg2, pi], f"(d) {how}: the outage's batches re-seeded")
    for i, r in enumerate((r1, r2)):
        wait(lambda: r.logtext().count("redis: reachable again") > lines0[i][1],
             f"(d) {how}: no 'reachable again' line")
        expect(r.metric("kvprefix_router_redis_up") == 1, f"(d) {how}: redis_up again")
    return [pg, pg2, ph, pi]


def supported(kvprefix, tmp):
    """Skip unless this build has Redis support: a daemon that gets as far as its HTTP
    server (an address that cannot be listened on) has created its Redis router."""
    p = subprocess.run([kvprefix, "router", "--engine", f"a=ipc://{tmp}/none.pub", "--redis",
                        f"127.0.0.1:{free_port()}", "--listen", "999.0.0.1"],
                       capture_output=True, text=True, timeout=WAIT_S)
    if p.returncode == 2 and "no Redis support" in p.stderr:
        skip("this build has no Redis support (meson option redis)")
    expect(p.returncode == 1 and "--listen" in p.stderr, f"probe: exit {p.returncode}, "
           f"{p.stderr!r}")


def check_cli(kvprefix, tmp):
    """Bad --redis flags exit 2 with the flag's message."""
    ep = f"ipc://{tmp}/none.pub"
    for args, msg in [
            (["--redis", "localhost"], "--redis: 'localhost' is not redis://"),
            (["--redis", "redis://h:6379/x"], "is not redis://HOST[:PORT]"),
            (["--redis", "redis://h:0"], "is not redis://HOST[:PORT]"),
            (["--redis", "h:1/2"], "is not redis://HOST[:PORT]"),
            (["--redis", "unix:"], "is not redis://HOST[:PORT]"),
            (["--redis", "h:1", "--redis-prefix", "a b"], "--redis-prefix: 'a b'"),
            (["--redis", "h:1", "--redis-prefix", "x" * 65], "--redis-prefix"),
            (["--redis", "h:1", "--redis-timeout", "0"], "--redis-timeout"),
            (["--redis", "h:1", "--redis-retry", "600001"], "--redis-retry"),
            (["--redis", "h:1", "--worker-ttl", "-1"], "--worker-ttl"),
            (["--redis-retry", "5"], "need --redis URL")]:
        p = subprocess.run([kvprefix, "router", "--engine", f"a={ep}"] + args,
                           capture_output=True, text=True, timeout=WAIT_S)
        expect(p.returncode == 2 and msg in p.stderr, f"{args}: exit {p.returncode}, "
               f"{p.stderr!r}")


def unreachable_at_start(kvprefix, tmp, engine):
    """A Redis that is not there at start: the daemon runs on its local view."""
    port = free_port()
    r = Router(kvprefix, ["--redis", f"redis://127.0.0.1:{port}/0", "--redis-timeout", "100",
                          "--engine", f"a={engine.pub},replay={engine.replay}"],
               os.path.join(tmp, "router0.log"))
    try:
        out, dt = r.timed_score(prompt(0, 2))
        expect(out["view"] == "local" and dt < BOUND_S, f"no Redis at start: {out} {dt:.2f} s")
        status, body = r.request("GET", "/healthz")
        expect(status == 200 and b'"redis":"down"' in body, f"healthz {body}")
        wait(lambda: "redis: unreachable" in r.logtext(), "no Redis at start: the log line")
        r.proc.send_signal(signal.SIGTERM)
        expect(r.proc.wait(timeout=WAIT_S) == 0, f"router exit {r.proc.returncode}")
    finally:
        r.kill()


def run(kvprefix, fake, redis_exe, tmp):
    redis = Redis(redis_exe, tmp, free_port())
    engines = {"a": Engine(fake, tmp, "a", "kv@pod-a@m"),
               "b": Engine(fake, tmp, "b", "kv@pod-b@m")}
    routers = []
    try:
        supported(kvprefix, tmp)
        check_cli(kvprefix, tmp)
        redis.start()
        for e in engines.values():
            e.start()
        args = ["--hash", "vllm-sha256-cbor", "--block-size", str(BLOCK),
                "--redis", f"127.0.0.1:{redis.port}", "--redis-prefix", "t15",
                "--redis-timeout", str(TIMEOUT_MS), "--redis-retry", str(RETRY_MS)]
        for name, e in engines.items():
            args += ["--engine", f"{name}={e.pub},replay={e.replay},topic={e.topic[:-1]}"]
        unreachable_at_start(kvprefix, tmp, engines["a"])
        routers.append(Router(kvprefix, args, os.path.join(tmp, "router1.log")))
        routers.append(Router(kvprefix, args, os.path.join(tmp, "router2.log")))
        r1, r2 = routers
        probes = subscribed(routers, engines)
        prompts = phase_a(r1, r2, engines) + probes[:2]
        r1, prompts, recent = phase_b(kvprefix, args, tmp, routers, engines, prompts)
        prompts += phase_c(redis, r1, r2, engines, prompts, recent)
        prompts += outage(redis, r1, r2, engines, "kill")
        prompts += outage(redis, r1, r2, engines, "stop")
        never_over([r1, r2], engines, prompts)
        for r in (r1, r2):
            expect(r.proc.poll() is None, "a router died")
            # No engine restarted: a line saying so would be a duplicate from the other
            # router, or a replayed batch, taken for a restart.
            expect("the publisher restarted" not in r.logtext(), "a restart was imagined")
            expect("marked stale" not in r.logtext(), "a worker was marked stale")
            r.proc.send_signal(signal.SIGTERM)
            expect(r.proc.wait(timeout=WAIT_S) == 0, f"router exit {r.proc.returncode}")
        if os.environ.get("ROUTERD_TEST_VERBOSE"):
            for i, r in enumerate(routers):
                sys.stderr.write(f"router {i + 1} log:\n{r.logtext()}")
    except Fail:
        for i, r in enumerate(routers):
            sys.stderr.write(f"router {i + 1} log:\n{r.logtext()}")
        raise
    finally:
        for e in engines.values():
            e.stop()
        for r in routers:
            r.kill()
        redis.kill()


def main():
    kvprefix, fake = sys.argv[1], sys.argv[2]
    redis_exe = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)
    if redis_exe is None:
        skip("redis-server is not installed (scripts/deps.sh installs it)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="routerd-redis-") as tmp:
        run(kvprefix, fake, redis_exe, tmp)
    print(f"test_routerd_redis: ok ({time.monotonic() - t0:.1f} s)")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"test_routerd_redis: FAIL: {e}")
        sys.exit(1)
