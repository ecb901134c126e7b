"""Hardening: clients that hold what they should not: slowloris connections, request bodies that
stop arriving, readers that stop reading, more connections than pcrouter has descriptors for;
and SIGHUP, which used to kill the process. A well-behaved client is measured alongside
(attack.Watch): it must be served throughout, or, for EMFILE, as soon as the descriptors are
back."""
import json
import re
import resource
import signal
import socket

import pytest

from attack import Watch, describe, router_env, sanitized
from attack_conn import HeldConns, Slowloris
from attack_h2 import H2Streams, h2_connect, post_headers
from conftest import (PCROUTER, CurlStream, RawConn, completion, curl, get_metrics, http_request,
                      make_config, metric, split_head, sse_events, wait_for)


def test_slowloris(cluster):
    """600 connections each sending a byte of a request head every 250 ms, against
    max_client_connections 300: the oldest waiting ones are evicted as new ones come, the rest
    get 408 once timeouts.request_header_ms (1 s) has passed, and a well-behaved client (a fresh
    connection per request) is served throughout. Before, every byte restarted the idle timer:
    such connections stayed open for good and, at the limit, locked everyone else out."""
    n, limit = 600, 300
    c = cluster(1, limits={"max_client_connections": limit},
                timeouts={"request_header_ms": 1000}, log={"access_log": False})
    with Watch(c.router, proto="h1", rate=10) as w:
        sl = Slowloris(c.router.port, n, 0.25, reconnect=False).start()
        try:
            wait_for(lambda: sl.stats()["open_now"] == 0, 20, 0.1,
                     "every slowloris connection answered or closed")
        finally:
            st = sl.stop()
        served = w.client.count()
        wait_for(lambda: w.client.count() >= served + 5, 10, what="5 more well-behaved requests")
    assert st["opened"] == n and st["answered_other"] == 0, st
    assert st["answered_408"] >= 1 and st["closed_silently"] >= 1, st
    assert st["answered_408"] + st["closed_silently"] == n, st
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_client_connections_evicted_total") >= st["closed_silently"], text
    assert metric(text, "pcrouter_request_timeouts_total") == st["answered_408"], text
    assert w.figures["client"]["failed"] == 0, describe(w.figures)


def test_h1_body_stall_gets_408(cluster):
    c = cluster(1, timeouts={"client_idle_ms": 500})
    conn = RawConn(c.router.port, timeout=10)
    try:
        conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"prompt\": \"the rest never comes")
        status, hdrs, body = conn.read_response()
        assert status == 408, (status, body)
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert hdrs.get("connection") == "close"
        rest, closed = conn.read_until_close_or_data(10)
        assert closed and rest == b""
    finally:
        conn.close()
    assert metric(get_metrics(c.router), "pcrouter_request_timeouts_total") == 1
    assert c.stubs[0].stats()["requests"].get("/v1/completions", 0) == 0


def test_h2_body_stall_gets_408(cluster):
    c = cluster(1, timeouts={"client_idle_ms": 500})
    hs = H2Streams(c.router.port)
    try:
        key = hs.open("/v1/completions", b'{"prompt": "the rest never', end_stream=False, length=1000)
        other = hs.open("/v1/completions", json.dumps(completion("complete one")).encode())
        snap = hs.wait(lambda sn: sn[key]["ended"] and sn[other]["ended"], 15, "both answered")
    finally:
        hs.close()
    assert snap[key]["status"] == "408" and snap[other]["status"] == "200", snap
    assert metric(get_metrics(c.router), "pcrouter_request_timeouts_total") == 1
    assert c.stubs[0].stats()["requests"].get("/v1/completions", 0) == 1


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_reader_that_stops_reading_is_cut(cluster, proto):
    """A client that accepts no response bytes at all for timeouts.client_write_ms loses its
    connection, and its pod request is cancelled (the pod sees the close)."""
    c = cluster(1, timeouts={"client_write_ms": 500})
    big = completion("never read", bytes=256 << 20)
    if proto == "h1":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        s.settimeout(10)
        s.connect(("127.0.0.1", c.router.port))
        s.sendall(http_request("POST", "/v1/completions", big))
    else:
        s, conn = h2_connect(c.router.port, window=2 ** 31 - 1)
        body = json.dumps(big).encode()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, post_headers(c.router.port, "/v1/completions", len(body)))
        conn.send_data(sid, body, end_stream=True)
        s.sendall(conn.data_to_send())
    try:
        wait_for(lambda: c.stubs[0].stats()["aborted"] >= 1, 20, what="the pod request cancelled")
        wait_for(lambda: metric(get_metrics(c.router), "pcrouter_client_write_timeouts_total") == 1,
                 10, what="the write timeout counted")
    finally:
        s.close()
    assert curl(c.url("/v1/completions"), completion("next")).status == 200


@pytest.mark.parametrize("what", ["tls_silent", "tls_partial_hello", "h2c_partial_preface", "silent"])
def test_handshake_that_never_ends_is_closed(cluster, tls_cert, what):
    """A connection that never finishes its TLS handshake, or its h2c preface, or sends nothing,
    is closed after timeouts.request_header_ms."""
    c = cluster(1, tls=tls_cert, timeouts={"request_header_ms": 500})
    port = c.router.tls_port if what.startswith("tls") else c.router.port
    data = {"tls_silent": b"", "tls_partial_hello": b"\x16\x03\x01\x02\x00\x01",
            "h2c_partial_preface": b"PRI * HTTP/2.0\r\n", "silent": b""}[what]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(data)
        assert s.recv(100) == b""
    finally:
        s.close()
    assert curl(c.url("/health")).status == 200


def limit_fds(n):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


ACCEPT_LOG = re.compile(r"accept|listen .*accepting again", re.I)


def test_emfile_backs_off_and_recovers(stub_factory, router_factory):
    """pcrouter under a limit of 64 descriptors, 150 connections held open: accept fails with
    EMFILE. It must neither spin (the old accept loop took a whole core) nor log each failure
    (millions of lines), and it serves again once the connections close."""
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], log={"access_log": False}), preexec_fn=limit_fds(64),
                       env=router_env())
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, 0.05, "/health 200")
    start = len(r.err.lines)
    with Watch(r, client=False) as w:
        held = HeldConns(r.port, 150)
        try:
            assert r.err.wait_line(r"Too many open files", 15, start), r.err.tail()
            # Let the back-off run a while (50 + 100 + ... + 800 ms): CPU is measured over it.
            assert r.err.wait_line(r"accepting again after 800 ms", 15, start), r.err.tail()
        finally:
            lines = [l for l in r.err.lines[start:] if ACCEPT_LOG.search(l)]
            held.close()
    figs = w.figures
    assert sanitized(PCROUTER, "tsan") or figs["cpu_pct"] < 30, "CPU %.0f%% of a core while out of descriptors" % figs["cpu_pct"]
    assert 1 <= len(lines) <= 40, "%d accept log lines:\n%s" % (len(lines), "\n".join(lines[:50]))
    wait_for(lambda: curl(r.url("/v1/completions"), completion("back"), timeout=5).status == 200,
             20, 0.2, "service back once the connections closed")
    # Read like the completion above: a connection may still meet the last of the back-off.
    def exhausted():
        resp = curl(r.url("/metrics"), timeout=5)
        return resp.status == 200 and metric(resp.body.decode(), "pcrouter_accept_fd_exhausted_total") >= 1
    wait_for(exhausted, 20, 0.2, "pcrouter_accept_fd_exhausted_total counted")


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_sighup_is_logged_and_streams_survive(cluster, proto):
    c = cluster(1)
    streams = [CurlStream(c.url("/v1/completions"), completion("hup %d" % i, stream=True, gate="hup", events=3),
                          proto=proto) for i in range(5)]
    try:
        for cs in streams:
            cs.wait_output(b"data: {", 15)
        start = len(c.router.err.lines)
        c.router.send_signal(signal.SIGHUP)
        assert c.router.err.wait_line(r"config reloaded from", 10, start), c.router.err.tail()
        assert c.router.alive()
        assert curl(c.url("/v1/completions"), completion("after hup")).status == 200
        c.stubs[0].release("hup")
        for cs in streams:
            rc, out = cs.finish(20)
            assert rc == 0, out[-300:]
            assert sse_events(split_head(out)[2])[-1] == "[DONE]"
    finally:
        for cs in streams:
            cs.kill()
