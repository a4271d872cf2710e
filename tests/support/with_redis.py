#!/usr/bin/python3
"""with_redis.py - run a command with a private redis-server.

  with_redis.py COMMAND [ARG...]

Starts `redis-server` on a free TCP port (127.0.0.1) and a unix socket in a temporary
directory, with no persistence (--save '' --appendonly no), waits until it answers PING,
runs COMMAND with these in its environment:

  KVP_TEST_REDIS_URL   redis://127.0.0.1:PORT
  KVP_TEST_REDIS_PORT  PORT
  KVP_TEST_REDIS_SOCK  the unix socket's path
  KVP_TEST_REDIS_PID   the server's pid (tests stop, continue, kill and restart it)
  KVP_TEST_REDIS_SERVER the redis-server program (to start another one)

then stops the server and exits with COMMAND's status. When redis-server is missing it
exits 77 (meson's "skipped"), unless KVPREFIX_REDIS_REQUIRED is set (CI): then 1.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    """A TCP port nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port, timeout_s):
    """True once the server at port answers PING within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def start(server, tmp, tries=5):
    """(process, port) of a started server; retries when the port was taken meanwhile."""
    for _ in range(tries):
        port = free_port()
        args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--unixsocket", os.path.join(tmp, "redis.sock"),
                "--unixsocketperm", "700", "--dir", tmp, "--logfile",
                os.path.join(tmp, "redis.log")]
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        if ping(port, 10):
            return proc, port
        proc.kill()
        proc.wait()
    raise RuntimeError("redis-server did not start (see its log in %s)" % tmp)


def stop(proc):
    """Stop the server, even a stopped (SIGSTOP) one."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: with_redis.py COMMAND [ARG...]\n")
        return 2
    server = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)
    if not server:
        if os.environ.get("KVPREFIX_REDIS_REQUIRED"):
            sys.stderr.write("with_redis.py: redis-server not found (KVPREFIX_REDIS_REQUIRED)\n")
            return 1
        sys.stderr.write("with_redis.py: redis-server not found: skipped\n")
        return 77
    with tempfile.TemporaryDirectory(prefix="kvp-redis-") as tmp:
        proc, port = start(server, tmp)
        env = dict(os.environ)
        env["KVP_TEST_REDIS_URL"] = "redis://127.0.0.1:%d" % port
        env["KVP_TEST_REDIS_PORT"] = str(port)
        env["KVP_TEST_REDIS_SOCK"] = os.path.join(tmp, "redis.sock")
        env["KVP_TEST_REDIS_PID"] = str(proc.pid)
        env["KVP_TEST_REDIS_SERVER"] = server
        try:
            return subprocess.call(sys.argv[1:], env=env)
        finally:
            stop(proc)


if __name__ == "__main__":
    sys.exit(main())
