"""Memory of idle keep-alive connections: N connections each make one request, then wait; the
router's RSS may grow by at most a bound per connection. The bounds are generous (the figures
against HAProxy are bench/proxies.py --idle's, docs/BENCHMARKS.md); what they catch is an idle
h2 session that keeps nghttp2's 16 KiB frame buffer resident, which it did before its pages
were given back after IDLE_TRIM_MS (h2_server.c), or its whole nghttp2 session, which it did
before idle sessions hibernated, and an idle HTTP/1.1 connection that keeps
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
# Bytes of RSS per idle h2-over-TLS connection: about 21 KB here with the session hibernated
# (nghttp2's freed), 29 KB with only the frame buffer's pages given back, 45 KB before that.
# Checked over 600 connections (release builds): what the allocator keeps after the burst of
# handshakes and answers, a few MiB whatever the count, came to 33 to 39 KB a connection over
# 300 once the stub pod answered without Nagle's delay (23 to 24 KB over 600).
H2_TLS_BOUND = 26000
H2_TLS_CONNS = 600
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


def check_idle(c, tmp_path, port, count, bound, what, **proto):
    """Opens `count` idle connections (one request each) to `port`; RSS per connection must
    fall to `bound` bytes (release builds); then each serves one more request."""
    pid = c.router.proc.pid
    body = str(tmp_path / "body.json")
    with open(body, "wb") as f:
        f.write(small_completion("idle"))
    warm = open_idle(port, 5, body, **proto)
    close_idle(warm)
    before = proc_rss_kb(pid)
    p = open_idle(port, count, body, **proto)
    try:
        if not (sanitized(PCROUTER, "asan") or sanitized(PCROUTER, "tsan")):
            per_conn = []

            def small_enough():
                per_conn.append((proc_rss_kb(pid) - before) * 1024.0 / count)
                return per_conn[-1] <= bound

            try:
                wait_for(small_enough, 15, 0.2, "RSS per idle %s connection <= %d bytes" % (what, bound))
            except AssertionError as e:
                raise AssertionError("%s: %.0f bytes a connection" % (e, per_conn[-1])) from None
        # What went from the idle connections comes back: one more request on each (over h2,
        # on the same session: its next stream).
        p.stdin.write("again\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert line.startswith("AGAIN %d FAILED 0" % count), line
    finally:
        close_idle(p)


def test_idle_h2_connections_hold_no_frame_buffer(cluster, tls_cert, tmp_path):
    c = cluster(n=1, tls=tls_cert, log={"access_log": False},
                limits={"max_client_connections": 4 * H2_TLS_CONNS}, popen={"env": router_env()})
    n = CONNS if sanitized(PCROUTER, "asan") or sanitized(PCROUTER, "tsan") else H2_TLS_CONNS
    check_idle(c, tmp_path, c.router.tls_port, n, H2_TLS_BOUND, "h2", tls=True, h2=True)


def test_idle_h1_connections_hold_no_buffers(cluster, tmp_path):
    c = cluster(n=1, log={"access_log": False},
                limits={"max_client_connections": 4 * H1_CONNS}, popen={"env": router_env()})
    check_idle(c, tmp_path, c.router.port, H1_CONNS, H1_BOUND, "HTTP/1.1")
