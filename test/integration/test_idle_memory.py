"""Memory of idle keep-alive connections: N connections each make one request, then wait; the
router's RSS may grow by at most a bound per connection. The bounds are generous (the figures
against HAProxy are bench/proxies.py --idle's, docs/BENCHMARKS.md); what they catch is an idle
h2 session that keeps nghttp2's 16 KiB frame buffer resident, which it did before its pages
were given back after IDLE_TRIM_MS (h2_server.c), and an idle HTTP/1.1 connection that keeps
its socket's buffers and its reading state (sock_plain.c, h1_server.c); and that such
connections still serve: each makes one more request once they have been idle.

Under AddressSanitizer or ThreadSanitizer RSS says nothing about the router's own memory
(shadow memory, redzones, quarantine): the connections are still made and served, the bound
is not checked. Polling with a deadline, no sleep.
"""
import os
import re
import subprocess

from attack import proc_rss_kb, router_env, sanitized, small_completion
from conftest import PCROUTER, PY, ROOT, wait_for

IDLE_CONNS = os.path.join(ROOT, "bench", "proxies", "idle_conns.py")
CONNS = 300
# Bytes of RSS per idle h2-over-TLS connection: about 29 KB with the frame buffer's pages
# given back, 45 KB before.
H2_TLS_BOUND = 37000
# Bytes of RSS per idle plain HTTP/1.1 connection: about 1.1 KB with the buffers and the
# reading state freed while idle, 2.0 KB before.
H1_CONNS = 1000
H1_BOUND = 1500


def open_idle(port, count, body, tls=False, h2=False):
    """Starts idle_conns.py; returns the process once its connections are open and served."""
    argv = [PY, IDLE_CONNS, "--port", str(port), "--count", str(count), "--deadline", "60",
            "--hold", "120", "--body", body]
    argv += ["--tls"] if tls else []
    argv += ["--h2"] if h2 else []
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    m = re.search(r"OPEN (\d+) FAILED (\d+)", line)
    assert m, "idle_conns.py: %r" % line
    assert int(m.group(1)) == count and int(m.group(2)) == 0, line
    return p


def close_idle(p):
    try:
        p.stdin.write("\n")
        p.stdin.close()
    except OSError:
        pass
    p.wait(60)


def test_idle_h2_connections_hold_no_frame_buffer(cluster, tls_cert, tmp_path):
    c = cluster(n=1, tls=tls_cert, log={"access_log": False},
                limits={"max_client_connections": 4 * CONNS}, popen={"env": router_env()})
    r = c.router
    pid = r.proc.pid
    body = str(tmp_path / "body.json")
    with open(body, "wb") as f:
        f.write(small_completion("idle"))
    warm = open_idle(r.tls_port, 5, body, tls=True, h2=True)
    close_idle(warm)
    before = proc_rss_kb(pid)
    p = open_idle(r.tls_port, CONNS, body, tls=True, h2=True)
    try:
        if not (sanitized(PCROUTER, "asan") or sanitized(PCROUTER, "tsan")):
            per_conn = []

            def small_enough():
                per_conn.append((proc_rss_kb(pid) - before) * 1024.0 / CONNS)
                return per_conn[-1] <= H2_TLS_BOUND

            try:
                wait_for(small_enough, 15, 0.2,
                         "RSS per idle h2 connection <= %d bytes" % H2_TLS_BOUND)
            except AssertionError as e:
                raise AssertionError("%s: %.0f bytes a connection" % (e, per_conn[-1])) from None
        # The sessions whose pages went back serve again: one more request on each, on the
        # same h2 session (its next stream).
        p.stdin.write("again\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert line.startswith("AGAIN %d FAILED 0" % CONNS), line
    finally:
        close_idle(p)


def test_idle_h1_connections_hold_no_buffers(cluster, tmp_path):
    c = cluster(n=1, log={"access_log": False},
                limits={"max_client_connections": 4 * H1_CONNS}, popen={"env": router_env()})
    r = c.router
    pid = r.proc.pid
    body = str(tmp_path / "body.json")
    with open(body, "wb") as f:
        f.write(small_completion("idle"))
    warm = open_idle(r.port, 5, body)
    close_idle(warm)
    before = proc_rss_kb(pid)
    p = open_idle(r.port, H1_CONNS, body)
    try:
        if not (sanitized(PCROUTER, "asan") or sanitized(PCROUTER, "tsan")):
            per_conn = []

            def small_enough():
                per_conn.append((proc_rss_kb(pid) - before) * 1024.0 / H1_CONNS)
                return per_conn[-1] <= H1_BOUND

            try:
                wait_for(small_enough, 15, 0.2,
                         "RSS per idle HTTP/1.1 connection <= %d bytes" % H1_BOUND)
            except AssertionError as e:
                raise AssertionError("%s: %.0f bytes a connection" % (e, per_conn[-1])) from None
        # Connections whose buffers went make them again: one more request on each.
        p.stdin.write("again\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert line.startswith("AGAIN %d FAILED 0" % H1_CONNS), line
    finally:
        close_idle(p)
