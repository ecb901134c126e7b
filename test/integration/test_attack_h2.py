"""Hardening: HTTP/2 clients that misbehave: a big-window reader of a 64 MiB response (it used to
stall), zero-window readers holding pod connections, many slow uploads against the body budget.
Each runs with a well-behaved client measured alongside (attack.Watch) and the router's RSS
sampled."""
import json
import select
import socket
import time

import pytest

from attack import Watch, clients_served, describe, router_env, sanitized
from attack_h2 import (FLOODS, H2Streams, big_window_read, bulk_sha, h2_connect, h2_flood,
                       raw_frame, raw_h2_open, raw_h2_outcome, raw_headers,
                       post_headers, slow_uploads)
from conftest import PCROUTER, RawConn, completion, get_metrics, make_config, metric, wait_for

MiB = 1 << 20
# RSS beyond the accounted buffers: allocator slack, evbuffer chains, nghttp2 state. Under
# AddressSanitizer every figure grows by its shadow memory and redzones.
ASAN = sanitized(PCROUTER)
# Under ThreadSanitizer the memory bounds are not checked (shadow memory is most of the RSS);
# the release and ASan builds check them.
TSAN = sanitized(PCROUTER, "tsan")
RSS_FACTOR = 2.0 if ASAN else 1.0
RSS_OVERHEAD_MB = 64 if ASAN else 32


def test_big_window_reader_gets_every_byte(cluster):
    """A client whose windows hold the whole 64 MiB response never has to send a frame: the
    router must keep writing on its own (it used to stop after 4-7 MiB until the client sent
    something)."""
    c = cluster(1)
    total = 64 * MiB
    with Watch(c.router, proto="h2c", rate=10) as w:
        res = big_window_read(c.router.port, total, timeout=60)
    assert res["status"] == "200" and res["ended"], (res, describe(w.figures))
    assert res["bytes"] == total and res["sha256"] == bulk_sha(total), res
    assert res["sent_during"] == 0, "the client sent %d bytes mid-response" % res["sent_during"]
    assert w.figures["client"]["failed"] == 0, describe(w.figures)


def test_slow_uploads_stay_within_budget_and_complete(stub_factory, router_factory):
    """32 streams x 2 MiB on one connection against an 8 MiB body budget: the router's RSS stays
    within the budget, the one body allowed past it, the windows of the connection's streams
    (64 KiB each), the copies of the body on its way to the pod, and a fixed overhead; and every
    upload still completes. They used to deadlock: partial bodies filled the budget, none could finish, the
    shut connection window kept even the exempt stream from sending, and all got 408."""
    stub = stub_factory("pod-a")
    budget, streams, size = 8 * MiB, 32, 2 * MiB
    r = router_factory(make_config([stub], limits={"max_buffered_body_bytes": budget,
                                                   "max_body_bytes": 64 * MiB},
                                   timeouts={"client_idle_ms": 60000},
                                   # The Python pod parsing large bodies on a busy machine
                                   # answers its health checks late: not what is tested.
                                   health={"timeout_ms": 5000, "fall": 10}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    with Watch(r, proto="h1", rate=10) as w:
        hs, sent = slow_uploads(r.port, streams, size, rate=64 * MiB, duration=60)
        try:
            snap = hs.wait(lambda sn: all(v["ended"] or v["reset"] is not None for v in sn.values()),
                           40, "every upload answered")
        finally:
            hs.close()
    figs = w.figures
    got = sorted(v["status"] or "reset" for v in snap.values())
    assert got == ["200"] * streams, (got, describe(figs))
    done = [e for e in stub.stats()["log"] if e["path"] == "/v1/completions" and e["body_bytes"] == size]
    assert len(done) == streams, "the pod got %d whole uploads" % len(done)
    # What the router may hold: the budget, the stream windows, and the copies of a body being
    # sent to the pod (parsed prompt, upstream request, socket output: 4 bodies in all, one of
    # them the body past the budget).
    granted_mb = (budget + streams * 64 * 1024 + 4 * size) / MiB
    limit = figs["rss_first_mb"] + RSS_FACTOR * granted_mb + RSS_OVERHEAD_MB
    assert TSAN or figs["rss_peak_mb"] <= limit, (
        "RSS peak %.0f MiB > %.0f MiB first + %.1f x (%d MiB budget + %d x 64 KiB windows + "
        "4 x %d MiB body) + %d MiB overhead"
        % (figs["rss_peak_mb"], figs["rss_first_mb"], RSS_FACTOR, budget // MiB, streams,
           size // MiB, RSS_OVERHEAD_MB))
    assert figs["client"]["failed"] == 0 and figs["client"]["served"] > 0, describe(figs)
    assert metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") == 0


def test_stalled_uploads_do_not_starve_small_requests(stub_factory, router_factory):
    """Uploads that fill the body budget and then stop sending hold it until client_idle_ms;
    meanwhile small requests on other connections are served: a connection's first 64 KiB of
    body need no budget (budget.h). HTTP/1.1 requests whose body came in a read of its own used
    to wait for the stalled uploads' 408."""
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], limits={"max_buffered_body_bytes": 8 * MiB,
                                                   "max_body_bytes": 64 * MiB},
                                   timeouts={"client_idle_ms": 30000}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    hs, sent = slow_uploads(r.port, 32, 4 * MiB, rate=256 * MiB, duration=15, stop_after=24 * MiB)
    try:
        wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") >= 8 * MiB,
                 15, what="the budget filled by partial uploads")
        body = json.dumps(completion("small one")).encode()
        for i in range(3):
            conn = RawConn(r.port, timeout=5)
            try:
                conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body))
                time.sleep(0.05)  # pacing: the body comes in a read of its own
                conn.send(body)
                assert conn.read_response()[0] == 200
            finally:
                conn.close()
        figs = clients_served(r, rate=10)
    finally:
        hs.close()
    for f in figs:
        assert f["client"]["failed"] == 0, describe(f)
    # The uploads themselves were not refused: those whose whole body got budget were answered,
    # the others are still waiting, not lost.
    assert all(v["status"] in (None, "200") for v in hs.snapshot().values())


def test_zero_window_readers_are_reset_and_free_the_pod(stub_factory, router_factory):
    """12 streams whose window stays 0 take all 4 connections the pod allows. With a small
    timeouts.client_write_ms each is reset (RST_STREAM CANCEL) and its pod request cancelled, so
    well-behaved requests queued behind them are served. Without it they held the pod's
    connections for client_idle_ms and the others got 503 after response_ms."""
    stub = stub_factory("pod-a")
    n = 12
    r = router_factory(make_config([{"name": "pod-a", "url": stub.url, "max_connections": 4}],
                                   timeouts={"client_write_ms": 500, "response_ms": 8000}))
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    body = json.dumps(completion("zero window", stream=True, gate="never", events=4)).encode()
    with Watch(r, proto="h1", rate=10) as w:
        hs = H2Streams(r.port, window=0, ack=False)
        try:
            for _ in range(n):
                hs.open("/v1/completions", body)
            snap = hs.wait(lambda sn: all(v["reset"] is not None for v in sn.values()), 30,
                           "every zero-window stream reset")
            wait_for(lambda: stub.stats()["aborted"] >= n, 10, what="the pod requests cancelled")
            served = w.client.count()
            wait_for(lambda: w.client.count() >= served + 5, 10, what="5 more well-behaved requests")
        finally:
            hs.close()
    assert all(v["status"] == "200" and v["bytes"] == 0 and v["reset"] == 8 for v in snap.values()), snap
    assert metric(get_metrics(r), "pcrouter_client_write_timeouts_total") >= n
    assert w.figures["client"]["failed"] == 0, describe(w.figures)


FLOOD_RSS_MB = 48 if ASAN else 16


@pytest.mark.parametrize("kind", FLOODS)
def test_frame_flood(stub_factory, router_factory, kind):
    """PING and SETTINGS floods whose replies are never read, endless empty DATA or
    CONTINUATION frames, rapid reset (a request to the pod, reset at once): for 3 s, while a
    well-behaved h2c client is measured. The router lives, its RSS stays flat, the client is
    served. (nghttp2 itself ends the PING, SETTINGS, CONTINUATION and reset floods with a
    GOAWAY after a burst; the flood then opens a new connection.)"""
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], timeouts={"request_header_ms": 1000, "client_idle_ms": 1000},
                                   log={"access_log": False}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    conns0 = stub.stats()["connections"]
    with Watch(r, proto="h2c", rate=10) as w:
        res = h2_flood(r.port, kind, 3.0)
    figs = w.figures
    assert r.alive(), r.err.tail()
    assert res["frames"] > 1000, res
    assert TSAN or figs["rss_peak_mb"] - figs["rss_first_mb"] <= FLOOD_RSS_MB, (res, describe(figs))
    assert figs["client"]["failed"] == 0 and figs["client"]["served"] >= 5, (res, describe(figs))
    text = get_metrics(r)
    assert metric(text, "pcrouter_requests_in_flight") == 0, text
    if kind == "rapid_reset":
        # A request reset in the read that completed it never reaches the pod: it used to be
        # sent (a connection and a request each), and the pod, swamped, failed other clients.
        pod_conns = stub.stats()["connections"] - conns0
        assert pod_conns <= 20, "%d connections to the pod during rapid reset" % pod_conns


def test_empty_data_frames_are_no_progress(cluster):
    """A request body made of empty DATA frames stops arriving as surely as one that stops:
    408 after client_idle_ms. Each empty frame used to restart the request's idle time."""
    c = cluster(1, timeouts={"client_idle_ms": 600})
    sock, conn = h2_connect(c.router.port)
    try:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, post_headers(c.router.port, "/v1/completions", 1000))
        sock.sendall(conn.data_to_send())
        status = None
        deadline = time.monotonic() + 10
        while status is None and time.monotonic() < deadline:
            conn.send_data(sid, b"")
            sock.sendall(conn.data_to_send())
            if select.select([sock], [], [], 0.05)[0]:
                data = sock.recv(65536)
                assert data, "the router closed the connection"
                for e in conn.receive_data(data):
                    if getattr(e, "stream_id", None) == sid and hasattr(e, "headers"):
                        status = dict(e.headers).get(b":status")
                sock.sendall(conn.data_to_send())
        assert status == b"408", status
    finally:
        sock.close()
    assert metric(get_metrics(c.router), "pcrouter_request_timeouts_total") == 1
    assert c.stubs[0].stats()["requests"].get("/v1/completions", 0) == 0


def test_memory_of_finished_uploads_goes_back_to_the_system(stub_factory, router_factory):
    """After an upload flood the bodies are freed, and the router's RSS must come down with
    them: the allocator's free pages are given back (it used to stay near twice the budget per
    worker, as if the flood were still there)."""
    from attack import proc_rss_kb as rss_kib
    stub = stub_factory("pod-a")
    budget, streams, size = 256 * MiB, 96, 1 * MiB
    r = router_factory(make_config([stub], workers=2,
                                   limits={"max_buffered_body_bytes": budget, "max_body_bytes": 64 * MiB},
                                   timeouts={"client_idle_ms": 20000}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    before = rss_kib(r.proc.pid) / 1024
    for _ in range(2):
        hs, sent = slow_uploads(r.port, streams, size, rate=1024 * MiB, duration=60)
        try:
            snap = hs.wait(lambda sn: all(v["ended"] or v["reset"] is not None for v in sn.values()),
                           40, "every upload answered")
        finally:
            hs.close()
        assert sorted(v["status"] for v in snap.values()) == ["200"] * streams
    wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") == 0, 10,
             what="every body freed")
    # The flood held up to streams x size of bodies (96 MiB), several copies of each on the way.
    limit = before + RSS_FACTOR * 48 + RSS_OVERHEAD_MB
    if TSAN:
        return
    wait_for(lambda: rss_kib(r.proc.pid) / 1024 <= limit, 10, interval=0.2,
             what="RSS back within %.0f MiB (it started at %.0f MiB)" % (limit, before))


PROTOCOL_ERROR, FRAME_SIZE_ERROR = 0x1, 0x6


def conformance_port(c, listener, tls_cert):
    return (c.router.tls_port, tls_cert[0]) if listener == "tls" else (c.router.port, None)


@pytest.mark.parametrize("listener", ["h2c", "tls"])
@pytest.mark.parametrize("ping", ["stream_id", "length"])
def test_invalid_ping_goaway_then_close(cluster, tls_cert, listener, ping):
    """A PING on a stream, or one whose payload is not 8 bytes, is a connection error (RFC 9113,
    6.7): a GOAWAY, and then the TCP connection closed (5.4.1). The GOAWAY used to be sent and
    the connection left open until client_idle_ms (h2spec 5.4.1/1)."""
    c = cluster(1, tls=tls_cert, timeouts={"client_idle_ms": 60000})
    port, ca = conformance_port(c, listener, tls_cert)
    sock = raw_h2_open(port, ca)
    frame = raw_frame(0x6, 0, 3, b"\0" * 8) if ping == "stream_id" else raw_frame(0x6, 0, 0, b"\0" * 6)
    sock.sendall(frame)
    res = raw_h2_outcome(sock, timeout=5)
    expect = PROTOCOL_ERROR if ping == "stream_id" else FRAME_SIZE_ERROR
    assert res["goaway"] == expect and res["closed"], res
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_client_connections") <= 1, 10,
             what="the connection gone from pcrouter_client_connections (the scrape is one)")


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_smaller_stream_id_is_connection_error(cluster, tls_cert, listener):
    """HEADERS on stream 5 and then on stream 3: a new stream's id must be greater than every
    earlier one (RFC 9113, 5.1.1), so stream 3 is a connection error PROTOCOL_ERROR, not a
    request to answer (h2spec 5.1.1/2)."""
    c = cluster(1, tls=tls_cert, timeouts={"client_idle_ms": 60000})
    port, ca = conformance_port(c, listener, tls_cert)
    sock = raw_h2_open(port, ca)
    sock.sendall(raw_headers(5, port) + raw_headers(3, port))
    res = raw_h2_outcome(sock, timeout=5)
    assert res["goaway"] == PROTOCOL_ERROR and res["closed"], res
    assert 3 not in res["headers"], res


@pytest.mark.parametrize("preface", [b"INVALID CONNECTION PREFACE\r\n\r\n",
                                     b"PRI * HTTP/2.0\r\n\r\nSM\r\nXX\r\n\r\n"])
def test_invalid_preface_on_h2c_port_is_http1_400(cluster, preface):
    """The plain port speaks HTTP/1.1 and h2c: what is not the exact preface is HTTP/1.1, so an
    invalid preface gets a 400 and a closed connection (README: Clients), not a GOAWAY."""
    c = cluster(1)
    s = socket.create_connection(("127.0.0.1", c.router.port), timeout=10)
    try:
        s.sendall(preface)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    finally:
        s.close()
    assert out.startswith(b"HTTP/1.1 400 ") and b"connection: close" in out.lower(), out


def test_invalid_preface_over_tls_is_goaway(cluster, tls_cert):
    """Over TLS, ALPN chose HTTP/2: an invalid preface gets GOAWAY PROTOCOL_ERROR and the
    connection closed (h2spec 3.5/2)."""
    import ssl
    c = cluster(1, tls=tls_cert)
    ctx = ssl.create_default_context(cafile=tls_cert[0])
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", c.router.tls_port), timeout=10),
                           server_hostname="localhost")
    sock.sendall(b"INVALID CONNECTION PREFACE\r\n\r\n")
    res = raw_h2_outcome(sock, timeout=5)
    assert res["goaway"] == PROTOCOL_ERROR and res["closed"], res


def test_tls_protocol_error_with_unread_input_closes(cluster, tls_cert):
    """Over TLS, a connection error with more input behind it (an invalid preface, then 256 KiB
    nghttp2 never reads) and a client that keeps its socket open: pcrouter closes
    within its linger, and pcrouter_client_connections drops. The socket used to stay in
    CLOSE-WAIT, counted, until client_idle_ms."""
    import ssl
    c = cluster(1, tls=tls_cert, timeouts={"client_idle_ms": 60000})
    ctx = ssl.create_default_context(cafile=tls_cert[0])
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", c.router.tls_port), timeout=10),
                           server_hostname="localhost")
    try:
        sock.sendall(b"INVALID CONNECTION PREFACE\r\n\r\n" + b"x" * (256 << 10))
        wait_for(lambda: metric(get_metrics(c.router), "pcrouter_client_connections") <= 1, 10,
                 what="the connection gone from pcrouter_client_connections (the scrape is one)")
    finally:
        sock.close()
