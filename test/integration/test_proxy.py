"""The proxy core: requests over HTTP/1.1, h2c and h2 over TLS reach a backend and come
back intact; keep-alive and pipelining; /v1/models, /health, /metrics, other /v1 endpoints."""
import hashlib
import json
import random
import string

import pytest

from conftest import (H2Client, RawConn, completion, chat, curl, get_metrics, http_request, metric,
                      sha256)

PROTOS = ["h1", "h2c", "h2"]
VERSION = {"h1": "1.1", "h2c": "2", "h2": "2"}


def check_routed(resp, c, path):
    assert resp.status == 200, resp
    obj = resp.json()
    pod = obj["stub"]["pod"]
    assert obj["system_fingerprint"] == pod
    assert obj["stub"]["path"] == path
    assert resp.header("x-pcrouter-backend") == pod, resp.headers
    assert resp.header("x-pcrouter-route"), resp.headers
    assert resp.header("x-stub-pod") == pod, "upstream response headers must pass through"
    assert pod in c.by_name
    return obj


@pytest.mark.parametrize("proto", PROTOS)
def test_completion(cluster, tls_cert, proto):
    c = cluster(2, tls=tls_cert)
    r = curl(c.url("/v1/completions", proto), completion("Say hello", tag="one"), proto=proto,
             cacert=tls_cert[0])
    assert r.version == VERSION[proto], r
    obj = check_routed(r, c, "/v1/completions")
    assert obj["object"] == "text_completion"
    assert obj["choices"][0]["text"].startswith("hello from ")
    assert obj["stub"]["tag"] == "one"


@pytest.mark.parametrize("proto", PROTOS)
def test_chat_completion(cluster, tls_cert, proto):
    c = cluster(2, tls=tls_cert)
    body = chat([{"role": "system", "content": "You are terse."},
                 {"role": "user", "content": "Hello?"}])
    r = curl(c.url("/v1/chat/completions", proto), body, proto=proto, cacert=tls_cert[0])
    assert r.version == VERSION[proto], r
    obj = check_routed(r, c, "/v1/chat/completions")
    assert obj["object"] == "chat.completion"
    assert obj["choices"][0]["message"]["role"] == "assistant"
    # The body reached the pod byte for byte.
    assert obj["stub"]["body_sha256"] == sha256(json.dumps(body).encode())


def test_tls_alpn_offers_http11(cluster, tls_cert):
    c = cluster(1, tls=tls_cert)
    r = curl(c.url("/v1/completions", "h1tls"), completion("hi"), proto="h1tls", cacert=tls_cert[0])
    assert r.version == "1.1", r
    check_routed(r, c, "/v1/completions")


def big_prompt(n):
    rng = random.Random(n)
    alphabet = string.ascii_letters + string.digits + " .,;:\u00e9\u4e2d"
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("proto", PROTOS)
def test_one_mib_prompt_intact(cluster, tls_cert, proto):
    """Long bodies move through by reference in the read buffers of each transport (plain and
    TLS) and reach the pod whole."""
    c = cluster(2, tls=tls_cert)
    body = json.dumps(completion(big_prompt(1 << 20))).encode()
    assert len(body) > 1 << 20
    r = curl(c.url("/v1/completions", proto), body, proto=proto, cacert=tls_cert[0], timeout=60)
    assert r.version == VERSION[proto], r
    obj = check_routed(r, c, "/v1/completions")
    assert obj["stub"]["body_bytes"] == len(body)
    assert obj["stub"]["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_one_mib_prompt_chunked_upload(cluster):
    c = cluster(1)
    body = json.dumps(completion(big_prompt(1 << 20))).encode()
    r = curl(c.url("/v1/completions"), body, headers=["Transfer-Encoding: chunked"], timeout=60)
    obj = check_routed(r, c, "/v1/completions")
    assert obj["stub"]["body_sha256"] == hashlib.sha256(body).hexdigest()


def chunked(body, sizes):
    """`body` in chunks of the given sizes, the rest in one, then the last chunk."""
    out, at = [], 0
    for n in sizes:
        out.append(b"%x\r\n%s\r\n" % (n, body[at:at + n]))
        at += n
    if at < len(body):
        out.append(b"%x\r\n%s\r\n" % (len(body) - at, body[at:]))
    return b"".join(out) + b"0\r\n\r\n"


@pytest.mark.parametrize("sizes", [
    [9000] + [10] * 20 + [9000],        # a long chunk, then more small ones than are moved
    [100, 9000, 7, 9000, 3, 12000],     # short and long in turn
    [8192] * 3,                         # long ones only, each moved with its buffer
    [5] * 300,                          # short ones only, all copied
], ids=["long-then-many-short", "mixed", "long", "short"])
def test_chunked_body_in_one_write_intact(cluster, sizes):
    """Every chunk of a body that arrives in one read, long ones moved with the read buffer
    and short ones copied, reaches the pod in order."""
    c = cluster(1)
    body = json.dumps(completion(big_prompt(40000))).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    conn = RawConn(c.router.port)
    conn.send(head + chunked(body, sizes))  # one write
    status, hdrs, resp = conn.read_response()
    conn.close()
    assert status == 200, (status, hdrs, resp)
    obj = json.loads(resp)
    assert obj["stub"]["body_bytes"] == len(body)
    assert obj["stub"]["body_sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("sizes", [[16384, 16384], [100, 16384, 9000, 5, 16384], [8192, 8191, 1]])
def test_h2_interleaved_bodies_intact(cluster, sizes):
    """DATA pieces of 8 KiB and more are referenced in the read buffer they arrived in, shorter
    ones copied: three streams whose DATA frames interleave, each read holding several of
    them, each reach the pod whole and in order."""
    c = cluster(1)
    h = H2Client(c.router.port)
    try:
        h.wait(lambda: h.conn.remote_settings.max_concurrent_streams <= 1 << 20,
               what="the router's SETTINGS")
        bodies, at = {}, {}
        for i in range(3):
            body = json.dumps(completion(big_prompt(90000 + i))).encode()
            sid = h.conn.get_next_available_stream_id()
            h.conn.send_headers(sid, [(":method", "POST"), (":path", "/v1/completions"),
                                      (":scheme", "http"), (":authority", "x"),
                                      ("content-type", "application/json"),
                                      ("content-length", str(len(body)))])
            h.streams[sid] = {"headers": None, "data": bytearray(), "ended": False, "reset": None}
            bodies[sid], at[sid] = body, 0
        k = 0
        while any(at[sid] < len(bodies[sid]) for sid in bodies):
            sent = False
            for sid, body in bodies.items():
                n = min(sizes[k % len(sizes)], len(body) - at[sid], h.conn.max_outbound_frame_size,
                        h.conn.local_flow_control_window(sid))
                if at[sid] >= len(body) or n <= 0:
                    continue
                h.conn.send_data(sid, body[at[sid]:at[sid] + n], end_stream=at[sid] + n >= len(body))
                at[sid] += n
                sent = True
            k += 1
            if k % 4 == 0 or not sent:
                h.flush()  # several frames of every stream in one write
            if not sent:
                h.pump(0.2)  # a window to open
        h.flush()
        h.wait(lambda: all(h.streams[sid]["ended"] for sid in bodies), timeout=30,
               what="three responses")
        for sid, body in bodies.items():
            st = h.streams[sid]
            assert st["headers"][":status"] == "200", st
            obj = json.loads(bytes(st["data"]))
            assert obj["stub"]["body_bytes"] == len(body)
            assert obj["stub"]["body_sha256"] == hashlib.sha256(body).hexdigest()
    finally:
        h.close()


def test_expect_100_continue(cluster):
    """curl sends `Expect: 100-continue` for bodies over 1 KiB and waits up to 1 s for the
    interim answer; a gateway answers it at once."""
    c = cluster(1)
    body = json.dumps(completion("x" * 4096))
    r = curl(c.url("/v1/completions"), body, expect=True, extra=["--expect100-timeout", "5"], timeout=4)
    assert r.rc == 0 and r.status == 200, r
    check_routed(r, c, "/v1/completions")


def test_pipelined_requests_answered_in_order(cluster):
    c = cluster(2)
    reqs = (http_request("POST", "/v1/completions", completion("first", tag="1", delay_ms=300))
            + http_request("POST", "/v1/completions", completion("second", tag="2"))
            + http_request("GET", "/health")
            + http_request("POST", "/v1/chat/completions",
                           chat([{"role": "user", "content": "third"}], tag="3", delay_ms=100)))
    conn = RawConn(c.router.port)
    conn.send(reqs)  # one write
    got = [conn.read_response() for _ in range(4)]
    conn.close()
    assert [s for s, _, _ in got] == [200, 200, 200, 200], got
    tags = [json.loads(got[i][2])["stub"]["tag"] for i in (0, 1, 3)]
    assert tags == ["1", "2", "3"]


def test_client_keep_alive(cluster):
    c = cluster(2)
    conn = RawConn(c.router.port)
    for i in range(5):
        conn.send(http_request("POST", "/v1/completions", completion("turn %d" % i, tag=str(i))))
        status, hdrs, body = conn.read_response()
        assert status == 200, (status, hdrs, body)
        assert "close" not in hdrs.get("connection", "").lower()
        assert json.loads(body)["stub"]["tag"] == str(i)
    conn.close()


def test_upstream_connections_pooled(cluster):
    c = cluster(1)
    s = c.stubs[0]
    s.reset()
    for i in range(8):
        r = curl(c.url("/v1/completions"), completion("reuse %d" % i))
        assert r.status == 200, r
    st = s.stats()
    assert st["requests"].get("/v1/completions") == 8, st["requests"]
    assert st["request_connections"] <= 2, \
        "8 sequential requests used %d upstream connections" % st["request_connections"]


def test_models_union(cluster):
    c = cluster(3, models=[["llama-3-8b", "shared"], ["qwen-7b", "shared"], ["shared", "llama-3-8b"]])
    r = curl(c.url("/v1/models"))
    assert r.status == 200, r
    obj = r.json()
    assert obj["object"] == "list"
    ids = [m["id"] for m in obj["data"]]
    assert sorted(ids) == ["llama-3-8b", "qwen-7b", "shared"], ids


def test_models_over_h2c(cluster):
    c = cluster(2, models=[["a"], ["b"]])
    r = curl(c.url("/v1/models"), proto="h2c")
    assert r.status == 200 and r.version == "2", r
    assert sorted(m["id"] for m in r.json()["data"]) == ["a", "b"]


def test_health_ok(cluster):
    c = cluster(2)
    r = curl(c.url("/health"))
    assert r.status == 200, r
    r2 = curl(c.url("/health"), proto="h2c")
    assert r2.status == 200, r2


def test_embeddings_forwarded(cluster):
    c = cluster(2)
    r = curl(c.url("/v1/embeddings"), {"model": "stub-model", "input": "hello world"})
    assert r.status == 200, r
    obj = r.json()
    assert obj["object"] == "list" and obj["data"][0]["object"] == "embedding"
    pod = obj["stub"]["pod"]
    assert c.by_name[pod].stats()["requests"].get("/v1/embeddings") == 1


def test_other_v1_post_forwarded(cluster):
    c = cluster(1)
    r = curl(c.url("/v1/tokenize"), {"model": "stub-model", "prompt": "hello"})
    assert r.status == 200, r
    assert r.json()["stub"]["path"] == "/v1/tokenize"


def test_metrics_counters_move(cluster):
    c = cluster(2)
    before = get_metrics(c.router)
    ok0 = metric(before, "pcrouter_requests_total", code="200") or 0
    for i in range(4):
        assert curl(c.url("/v1/completions"), completion("m%d" % i)).status == 200
    assert curl(c.url("/nope")).status == 404
    r = curl(c.url("/metrics"))
    assert r.status == 200
    assert r.header("content-type", "").startswith("text/plain"), r.headers
    text = r.body.decode()
    assert metric(text, "pcrouter_requests_total", code="200") >= ok0 + 4, text
    assert metric(text, "pcrouter_requests_total", code="404") >= 1, text
    per_backend = sum(metric(text, "pcrouter_backend_requests_total", backend=b, code="200") or 0
                      for b in ("pod-a", "pod-b"))
    assert per_backend >= 4, text
    assert metric(text, "pcrouter_backend_requests_total", backend="pod-a", code="200") >= 1, text
    assert metric(text, "pcrouter_backend_requests_total", backend="pod-b", code="200") >= 1, text
    assert metric(text, "pcrouter_requests_in_flight") is not None, text
    assert metric(text, "pcrouter_upstream_connect_errors_total", backend="pod-a") is not None, text
    assert metric(text, "pcrouter_backend_up", backend="pod-a") == 1, text
    assert metric(text, "pcrouter_backend_up", backend="pod-b") == 1, text


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("stream", [False, True])
def test_pod_cannot_forge_router_headers(cluster, tls_cert, proto, stream):
    """A pod's own X-Pcrouter-* fields (and hop-by-hop ones) never reach the client: the one
    X-Pcrouter-Backend the client sees is pcrouter's. The pod's used to go out beside it."""
    c = cluster(1, tls=tls_cert)
    forged = {"X-Pcrouter-Backend": "forged-pod", "X-Pcrouter-Route": "forged", "x-pcrouter-extra": "1",
              "Keep-Alive": "timeout=5", "Upgrade": "h2c", "X-Pod-Own": "kept"}
    r = curl(c.url("/v1/completions", proto), completion("forge", stream=stream, headers=forged),
             proto=proto, cacert=tls_cert[0])
    assert r.status == 200, r
    assert r.headers.get("x-pcrouter-backend") == [c.stubs[0].name], r.headers
    assert len(r.headers.get("x-pcrouter-route", [])) == 1 and r.header("x-pcrouter-route") != "forged", r.headers
    for name in ("x-pcrouter-extra", "keep-alive", "upgrade"):
        assert name not in r.headers, r.headers
    assert r.header("x-pod-own") == "kept", r.headers


def _tls13_health(port, ctx, session=None):
    """GET /health over HTTP/1.0 on a new TLS 1.3 connection, read to the end of the stream
    (pcrouter closes it); returns the session and whether it was resumed."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            assert data.startswith(b"HTTP/1.") and b" 200 " in data.split(b"\r\n")[0], data[:80]
            return s.session, s.session_reused


def test_tls13_session_resumed_after_router_closes(cluster, tls_cert):
    """pcrouter ends a TLS connection it closes with close_notify, so that a TLS 1.3 client
    keeps the session ticket it was sent and resumes with it."""
    c = cluster(1, tls=tls_cert)
    import ssl
    ctx = ssl.create_default_context(cafile=tls_cert[0])
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # Strict, as OpenSSL's own clients are: an end without close_notify is an error, which
    # marks the session not resumable.
    ctx.options &= ~ssl.OP_IGNORE_UNEXPECTED_EOF
    port = int(c.url("/", "h1tls").split(":")[2].split("/")[0])
    sess, reused = _tls13_health(port, ctx)
    assert not reused and sess is not None
    _, reused = _tls13_health(port, ctx, session=sess)
    assert reused
