"""Bad input and failures: every error status with an OpenAI-style body, retries on a
second backend, and malformed input that neither crashes nor hangs pcrouter."""
import json
import time

import pytest

from conftest import (H2Client, RawConn, assert_error, completion, curl, free_port,
                      get_metrics, http_request, make_config, metric, wait_for)


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_400_not_json(cluster, proto):
    c = cluster(2)
    r = curl(c.url("/v1/completions", proto), '{"model": "m", "prompt": "unterminated', proto=proto)
    assert_error(r, 400, "invalid_json", "invalid_request_error")
    assert r.header("content-type", "").startswith("application/json"), r.headers
    assert sum(st["requests"].get("/v1/completions", 0) for st in c.stats().values()) == 0


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "m", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "m", "prompt": "a chat request needs messages"}),
])
def test_400_missing_prompt(cluster, path, body):
    c = cluster(1)
    r = curl(c.url(path), body)
    assert_error(r, 400, "missing_prompt", "invalid_request_error")


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_404_unknown_path(cluster, proto):
    c = cluster(1)
    assert_error(curl(c.url("/nope", proto), proto=proto), 404, "not_found")
    assert_error(curl(c.url("/v2/completions", proto), completion("x"), proto=proto), 404, "not_found")


def test_405_wrong_method(cluster):
    c = cluster(1)
    r = curl(c.url("/v1/completions"))
    assert_error(r, 405, "method_not_allowed")
    assert "POST" in r.header("allow", ""), r.headers
    r2 = curl(c.url("/v1/chat/completions"), method="DELETE")
    assert_error(r2, 405, "method_not_allowed")
    assert "POST" in r2.header("allow", ""), r2.headers


LIMITS = {"max_body_bytes": 65536, "max_header_bytes": 8192}


def test_413_body_too_large_content_length(cluster):
    c = cluster(1, limits=LIMITS)
    body = json.dumps(completion("x" * 200000))
    r = curl(c.url("/v1/completions"), body)
    assert_error(r, 413, "body_too_large")
    assert c.stubs[0].stats()["requests"].get("/v1/completions", 0) == 0
    # Just under the limit still passes.
    ok = curl(c.url("/v1/completions"), json.dumps(completion("y" * 60000)))
    assert ok.status == 200, ok


def test_413_body_too_large_chunked(cluster):
    c = cluster(1, limits=LIMITS)
    body = json.dumps(completion("x" * 200000))
    r = curl(c.url("/v1/completions"), body, headers=["Transfer-Encoding: chunked"])
    assert_error(r, 413, "body_too_large")
    assert c.stubs[0].stats()["requests"].get("/v1/completions", 0) == 0


def test_413_body_too_large_h2(cluster):
    c = cluster(1, limits=LIMITS)
    r = curl(c.url("/v1/completions", "h2c"), json.dumps(completion("x" * 200000)), proto="h2c")
    assert_error(r, 413, "body_too_large")


def test_431_headers_too_large(cluster):
    c = cluster(1, limits=LIMITS)
    r = curl(c.url("/v1/completions"), completion("x"), headers=["X-Big: " + "a" * 20000])
    assert_error(r, 431, "headers_too_large")
    # Many headers adding up over the limit, on a raw connection.
    conn = RawConn(c.router.port)
    conn.send(http_request("GET", "/health", headers=["X-H%d: %s" % (i, "b" * 200) for i in range(60)]))
    status, hdrs, body = conn.read_response()
    conn.close()
    assert status == 431, (status, body)
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert curl(c.url("/health")).status == 200


def test_502_both_backends_close(cluster):
    c = cluster(2, upstream={"retries": 1})
    r = curl(c.url("/v1/completions"), completion("doomed", mode="close"))
    assert_error(r, 502, "bad_gateway", "upstream_error")
    # It tried both before giving up.
    for s in c.stubs:
        assert s.stats()["requests"].get("/v1/completions", 0) >= 1, s.name
    assert curl(c.url("/v1/completions"), completion("fine")).status == 200


def test_retry_on_second_backend_when_one_closes(cluster):
    """pod-a closes every completion without answering; pod-b answers: all requests succeed."""
    c = cluster(2, upstream={"retries": 1})
    c.by_name["pod-a"].configure(defaults={"mode": "close"})
    for i in range(4):
        r = curl(c.url("/v1/completions"), completion("r%d" % i))
        assert r.status == 200, r
        assert r.json()["stub"]["pod"] == "pod-b"
    assert c.by_name["pod-a"].stats()["requests"].get("/v1/completions", 0) >= 1


def test_unreachable_backend_retried_on_healthy_one(stub_factory, router_factory):
    s = stub_factory("pod-b")
    cfg = make_config([("pod-dead", "http://127.0.0.1:%d" % free_port()), s],
                      routing={"policy": "round_robin"}, upstream={"retries": 1},
                      health={"interval_ms": 60000, "fall": 100}, timeouts={"connect_ms": 1000})
    r = router_factory(cfg)
    for i in range(6):
        resp = curl(r.url("/v1/completions"), completion("u%d" % i))
        assert resp.status == 200, resp
        assert resp.json()["stub"]["pod"] == "pod-b"
        assert resp.header("x-pcrouter-backend") == "pod-b"
    text = get_metrics(r)
    assert metric(text, "pcrouter_upstream_connect_errors_total", backend="pod-dead") >= 1, text


def test_503_no_backend(router_factory):
    cfg = make_config([("pod-a", "http://127.0.0.1:%d" % free_port()),
                       ("pod-b", "http://127.0.0.1:%d" % free_port())],
                      health={"interval_ms": 100, "fall": 1, "rise": 1}, timeouts={"connect_ms": 500})
    r = router_factory(cfg)
    wait_for(lambda: curl(r.url("/health")).status == 503, 15, 0.05, "/health 503")
    resp = curl(r.url("/v1/completions"), completion("anyone?"))
    assert_error(resp, 503, "no_backend", "service_unavailable")
    text = get_metrics(r)
    assert metric(text, "pcrouter_backend_up", backend="pod-a") == 0, text


def test_health_follows_backend_health_checks(cluster):
    c = cluster(2, health={"interval_ms": 100, "fall": 1, "rise": 1})
    for s in c.stubs:
        s.configure(health_status=503)
    wait_for(lambda: curl(c.url("/health")).status == 503, 15, 0.05, "/health 503 once pods fail checks")
    assert_error(curl(c.url("/v1/completions"), completion("x")), 503, "no_backend", "service_unavailable")
    c.by_name["pod-b"].configure(health_status=200)
    wait_for(lambda: curl(c.url("/health")).status == 200, 15, 0.05, "/health 200 after pod-b recovers")
    r = curl(c.url("/v1/completions"), completion("x"))
    assert r.status == 200 and r.json()["stub"]["pod"] == "pod-b", r


def test_504_upstream_timeout(cluster):
    c = cluster(1, timeouts={"response_ms": 500})
    t0 = time.monotonic()
    r = curl(c.url("/v1/completions"), completion("stuck", mode="stall"))
    elapsed = time.monotonic() - t0
    assert_error(r, 504, "upstream_timeout", "timeout")
    assert 0.4 <= elapsed < 10, elapsed
    # pcrouter gave up on the upstream request: the pod sees its connection closed.
    wait_for(lambda: c.stubs[0].stats()["aborted"] >= 1, 10, what="the stalled upstream closed")


# --------------------------------------------------------------------------------------------
# malformed input: after each, the router still answers and its process is alive

def still_serving(c):
    assert c.router.alive(), c.router.err.tail()
    r = curl(c.url("/health"), timeout=10)
    assert r.status == 200, r
    r = curl(c.url("/v1/completions"), completion("still here"), timeout=10)
    assert r.status == 200, r


MALFORMED = {
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 4,
    "binary_noise": bytes((i * 37 + 11) % 256 for i in range(3000)),
    "bad_request_line": b"GET\x00/ HTTP/9.9\r\n\r\n",
    "bad_h2_preface": b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\x00" * 64,
    "h2_garbage_frames": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 200,
    "bad_chunked": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{\"prompt\":1}\r\n0\r\n\r\n"),
    "bad_content_length": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
    "header_without_colon": b"GET /health HTTP/1.1\r\nHost x\r\nNoColonHere\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_input(cluster, name):
    c = cluster(1)
    conn = RawConn(c.router.port)
    try:
        conn.send(MALFORMED[name])
    except (BrokenPipeError, ConnectionResetError):
        pass
    got, closed = conn.read_until_close_or_data(10)
    conn.close()
    if got.startswith(b"HTTP/1."):
        status = int(got.split(b" ", 2)[1])
        assert 400 <= status < 500, got[:300]
    still_serving(c)


def test_truncated_requests(cluster):
    c = cluster(1)
    partials = [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"abc",
        b"GET /health HTTP/1.1\r\nHo",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00",
    ]
    conns = []
    for p in partials:
        conn = RawConn(c.router.port)
        conn.send(p)
        conns.append(conn)
    # Half-sent requests must not block anybody else.
    still_serving(c)
    for conn in conns:
        conn.close()
    still_serving(c)


def test_h2_bad_frames_get_goaway_not_crash(cluster):
    c = cluster(1)
    h = H2Client(c.router.port)
    # A HEADERS frame on stream 2 (even ids are the server's) with a bogus header block.
    h.sock.sendall(b"\x00\x00\x04\x01\x05\x00\x00\x00\x02" + b"\xff\xff\xff\xff")
    h.sock.settimeout(10)
    data = b""
    try:
        while True:
            chunk = h.sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\x07\x00\x00\x00\x00\x00" in data:  # a GOAWAY frame header (type 7, stream 0)
                break
    except (ConnectionResetError, TimeoutError, OSError):
        pass
    h.sock.close()
    assert b"\x07\x00\x00\x00\x00\x00" in data, "expected GOAWAY, got %r" % data[-200:]
    still_serving(c)


def test_many_malformed_connections_in_a_row(cluster):
    c = cluster(1)
    for i in range(50):
        conn = RawConn(c.router.port)
        try:
            conn.send(bytes(((i * 131 + j * 7) % 256 for j in range(500))) + b"\r\n\r\n")
        except OSError:
            pass
        conn.close()
    still_serving(c)


@pytest.mark.parametrize("status,head", [
    (413, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Content-Length: 10000000\r\n\r\n"),
    (400, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 10000000\r\n\r\n"),
])
def test_rejected_upload_gets_its_answer(cluster, status, head):
    """A request refused before its body was read leaves unread bytes behind. Closing the
    socket on them makes the kernel send a reset, which can destroy the error response before
    the client reads it; the router half-closes and discards what still arrives instead. The
    client here keeps uploading after the answer was sent and must still read it whole, then a
    clean end of stream."""
    import select
    import socket
    c = cluster(1, limits=LIMITS)
    s = socket.create_connection(("127.0.0.1", c.router.port), timeout=15)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer waits in our buffer
    s.sendall(head.encode() + b"x" * 65536)
    r, _, _ = select.select([s], [], [], 15)
    assert r, "no answer within 15 s"
    # The answer is here, unread; the router already closed its side. More body bytes now
    # arrive at a socket that must still be open for reading.
    s.sendall(b"y" * 262144)
    data = b""
    while True:
        chunk = s.recv(65536)  # ConnectionResetError when the router reset the connection
        if not chunk:
            break
        data += chunk
    s.close()
    head_part, _, body = data.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 %d " % status), data[:300]
    assert b"connection: close" in head_part.lower(), head_part
    assert json.loads(body)["error"]["code"] in ("body_too_large", "bad_request"), body
    # A client that neither reads nor closes: the lingering ends on its own (2 s), the
    # connection is gone from the router while the client still holds its socket.
    s2 = socket.create_connection(("127.0.0.1", c.router.port), timeout=15)
    s2.sendall(head.encode() + b"x" * 65536)
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_client_connections") <= 1,
             what="the lingering connection to close")
    assert s2.recv(65536).startswith(b"HTTP/1.1 %d " % status)
    s2.close()
