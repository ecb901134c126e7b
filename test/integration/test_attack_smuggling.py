"""Hardening: request smuggling: framing that a proxy and a pod could read differently is refused
with 400 and the connection closes, and the pod receives nothing at all (a raw pod records every
byte it is sent; health checks are off so nothing else reaches it). An absolute-form target is
accepted as its path, and hop-by-hop fields never reach the pod."""
import json
import socket
import time

import pytest

from attack_pod import RawPod, ok_response
from conftest import QUIET_SCRAPE, RawConn, make_config

JSON = b'{"model":"m","prompt":"smuggled"}'
# What a pod that read the framing differently would take as a second request.
SMUGGLED = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(JSON), JSON))
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(JSON), JSON)


def req(*headers, body=CHUNKED):
    return (b"POST /v1/completions HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in headers) +
            b"Content-Type: application/json\r\n\r\n" + body + SMUGGLED)


VARIANTS = {
    "te_space_before_colon": req(b"Host: x", b"Transfer-Encoding : chunked", b"Content-Length: %d" % len(CHUNKED)),
    "te_tab_before_colon": req(b"Host: x", b"Transfer-Encoding\t: chunked"),
    "cl_duplicate_different": req(b"Host: x", b"Content-Length: %d" % len(CHUNKED), b"Content-Length: 5"),
    "cl_duplicate_same": req(b"Host: x", b"Content-Length: %d" % len(CHUNKED), b"Content-Length: %d" % len(CHUNKED)),
    "cl_list": req(b"Host: x", b"Content-Length: %d, %d" % (len(CHUNKED), len(CHUNKED))),
    "cl_and_te": req(b"Host: x", b"Content-Length: 5", b"Transfer-Encoding: chunked"),
    "te_chunked_identity": req(b"Host: x", b"Transfer-Encoding: chunked, identity"),
    "te_identity_chunked": req(b"Host: x", b"Transfer-Encoding: identity, chunked"),
    "te_twice": req(b"Host: x", b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"),
    "te_xchunked": req(b"Host: x", b"Transfer-Encoding: xchunked"),
    "te_obs_fold": req(b"Host: x", b"Transfer-Encoding: identity", b" chunked"),
    "te_obs_fold_empty": req(b"Host: x", b"Transfer-Encoding:", b" chunked"),
    "te_obs_fold_tab_empty": req(b"Host: x", b"Transfer-Encoding: \t", b"\tchunked"),
    "host_missing": req(b"Transfer-Encoding: chunked"),
    "host_twice": req(b"Host: x", b"Host: y", b"Transfer-Encoding: chunked"),
}


@pytest.fixture
def raw_pod_router(router_factory):
    pods = []

    def make():
        pod = RawPod(lambda r: ok_response())
        pods.append(pod)
        r = router_factory(make_config([("pod-raw", pod.url)], health={"interval_ms": 0}, scrape=QUIET_SCRAPE))
        return pod, r

    yield make
    for p in pods:
        p.close()


def status_of(port, *parts, pause=0.05):
    """Sends the parts of a request with a pause between them, so that the router reads them
    apart (loopback may still merge some: that only makes a test weaker, never flaky), and
    returns the response's status."""
    conn = RawConn(port, timeout=10)
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause)  # pacing, not synchronisation
            conn.send(part)
        return conn.read_response()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_smuggling_variant_is_refused(raw_pod_router, name):
    pod, r = raw_pod_router()
    conn = RawConn(r.port, timeout=10)
    try:
        conn.send(VARIANTS[name])
        status, hdrs, body = conn.read_response()
        assert status == 400, (status, body)
        err = json.loads(body)["error"]
        assert err["code"] == "bad_request", err
        assert hdrs.get("connection", "").lower() == "close", hdrs
        # Nothing after the 400: the smuggled request is never parsed.
        rest, closed = conn.read_until_close_or_data(10)
        assert closed and rest == b"", rest
    finally:
        conn.close()
    # The router is fine, and the pod never saw a byte (not even a connection).
    assert status_of(r.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") == 200
    snap = pod.snapshot()
    assert snap["connections"] == 0 and snap["bytes"] == b"", snap["bytes"][:500]


def test_absolute_form_target_accepted_and_hop_by_hop_dropped(raw_pod_router):
    pod, r = raw_pod_router()
    conn = RawConn(r.port, timeout=10)
    try:
        conn.send(b"POST http://evil.example:81/v1/completions HTTP/1.1\r\nHost: evil.example:81\r\n"
                  b"Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n"
                  b"TE: trailers\r\nX-Kept: yes\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED)
        status, hdrs, body = conn.read_response()
        assert status == 200, (status, body)
    finally:
        conn.close()
    reqs = pod.snapshot()["requests"]
    assert len(reqs) == 1, reqs
    head = reqs[0]["head"].decode("latin-1").split("\r\n")
    assert head[0] == "POST /v1/completions HTTP/1.1", head
    fields = [l.split(":", 1)[0].strip().lower() for l in head[1:]]
    values = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in head[1:]}
    assert fields.count("host") == 1 and values["host"] == "127.0.0.1:%d" % pod.port, head
    assert fields.count("content-length") == 1 and values["content-length"] == str(len(JSON)), head
    for hop in ("transfer-encoding", "connection", "keep-alive", "te", "x-hop"):
        assert hop not in fields, head
    assert values.get("x-kept") == "yes", head
    assert reqs[0]["body"] == JSON


def test_header_values_split_across_reads_are_not_folds(raw_pod_router):
    """A value cut by a read boundary is one value, whichever read the request began in. The
    fold check took a value split in a request's first read for an obs-fold: a legitimate client
    whose request head arrived in two segments got a 400."""
    pod, r = raw_pod_router()
    for split in (b"Host: 127.", b"X-Long: abc", b"X-Long:"):
        data = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: abcdefgh\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(JSON), JSON))
        cut = data.index(split) + len(split)
        assert status_of(r.port, data[:cut], data[cut:]) == 200, split
    dribbled = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: one two three\r\nX-B: four\r\n\r\n"
    assert status_of(r.port, *[dribbled[i:i + 3] for i in range(0, len(dribbled), 3)], pause=0.01) == 200
    # A fold across a read boundary is still a fold, after a value or before any.
    for first, second in ((b"X-A: one\r\n", b" two\r\n\r\n"), (b"X-A:\r\n", b" two\r\n\r\n"),
                          (b"X-A:\r\n ", b"two\r\n\r\n")):
        assert status_of(r.port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + first, second) == 400, first
    # An empty value is not a fold.
    assert status_of(r.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nX-B: b\r\n\r\n") == 200


def read_to_close(conn, timeout=10):
    """Every byte the router sends until it closes the connection."""
    conn.sock.settimeout(timeout)
    got = conn.buf
    while True:
        try:
            chunk = conn.sock.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def split_response(raw):
    """(status, headers lower->value, rest): one response head and what follows it."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
    return int(lines[0].split(" ")[1]), hdrs, rest


def test_refusal_after_a_head_request_has_its_body(raw_pod_router):
    """A response to HEAD has no body; the refusal of the bytes after it (which begin no request
    at all) has its body. The router kept the HEAD for that refusal: its 400 announced a body it
    never sent, and the client waited for it until the close. Found by the h1_request fuzz
    target."""
    pod, r = raw_pod_router()
    conn = RawConn(r.port, timeout=10)
    try:
        conn.send(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n\x01garbage\r\n\r\n")
        status, hdrs, rest = split_response(read_to_close(conn))
        assert status == 200 and int(hdrs["content-length"]) > 0, hdrs
        status, hdrs, body = split_response(rest)
        assert status == 400 and len(body) == int(hdrs["content-length"]), (hdrs, body)
        assert json.loads(body)["error"]["code"] == "bad_request", body
    finally:
        conn.close()
    assert pod.snapshot()["connections"] == 0


def test_chunked_trailers_never_become_headers(raw_pod_router):
    """Trailer fields after a chunked body (a second Authorization, an X-Foo) are dropped: they
    used to reach the pod as request headers (the parser reports trailers through the same
    callbacks as headers). Twenty of them, so that any one merged would show."""
    pod, r = raw_pod_router()
    trailers = b"Authorization: Bearer smuggled\r\nX-Foo: y\r\n" + \
        b"".join(b"X-Trailer-%d: t\r\n" % i for i in range(18))
    body = b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(JSON), JSON, trailers)
    conn = RawConn(r.port, timeout=10)
    try:
        conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer real\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        status, hdrs, rbody = conn.read_response()
        assert status == 200, (status, rbody)
        # The connection goes on: the next request is read after the trailers, not into them.
        conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.read_response()[0] == 200
    finally:
        conn.close()
    reqs = pod.snapshot()["requests"]
    assert len(reqs) == 1, reqs
    head = reqs[0]["head"].decode("latin-1").lower()
    assert head.count("authorization:") == 1 and "bearer real" in head, head
    assert "smuggled" not in head and "x-foo" not in head and "x-trailer" not in head, head
    assert reqs[0]["body"] == JSON


def test_pod_response_trailers_are_dropped(router_factory):
    """A pod's chunked response with 100 trailer fields: the client gets the whole body and no
    trailer as a header (the pod side used to collect trailers with the head's fields, past its
    64-field bound, and fail the response)."""
    trailers = b"".join(b"X-Pod-Trailer-%d: t\r\n" % i for i in range(100))
    payload = b'{"choices":[{"text":"ok"}]}'
    resp = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            b"Trailer: X-Pod-Trailer-0\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n" % (len(payload), payload, trailers))
    pod = RawPod(lambda req: resp)
    try:
        r = router_factory(make_config([("pod-raw", pod.url)], health={"interval_ms": 0}, scrape=QUIET_SCRAPE))
        conn = RawConn(r.port, timeout=10)
        try:
            conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(JSON), JSON))
            status, hdrs, body = conn.read_response()
        finally:
            conn.close()
        assert status == 200 and body == payload, (status, hdrs, body)
        assert not any(k.lower().startswith("x-pod-trailer") for k in hdrs), hdrs
    finally:
        pod.close()
