"""Behaviour under stress a gateway user relies on: backpressure towards a slow client,
one slow backend not delaying others, timeouts inside a stream, a backend dying mid-stream, idle
client connections, Connection: close, the access log."""
import hashlib
import select
import socket
import time

import pytest

from conftest import (CurlStream, H2Client, RawConn, completion, curl, http_request,
                      split_head, sse_events, wait_for)

PATTERN = b"0123456789abcdef"


def bulk_written(stub):
    e = stub.stats()["last"]
    return (e or {}).get("written", 0)


def wait_stalled(stub, timeout=30):
    """Polls the stub's write progress until it stops moving (the router stopped reading)."""
    hist = []

    def still():
        hist.append(bulk_written(stub))
        return len(hist) >= 6 and hist[-1] > 0 and len(set(hist[-6:])) == 1
    wait_for(still, timeout, 0.1, "the pod's writes to block")
    return hist[-1]


def expected_sha(n):
    h = hashlib.sha256()
    piece = PATTERN * 4096
    left = n
    while left:
        h.update(piece[:left])
        left -= min(left, len(piece))
    return h.hexdigest()


def drain_h1_body(sock, head_rest, hdrs):
    """Reads a (possibly chunked) body off a raw socket into a hash; returns (length, sha)."""
    h, n = hashlib.sha256(), 0
    buf = bytearray(head_rest)
    sock.settimeout(30)

    def fill():
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise EOFError("closed mid-body after %d bytes" % n)
        buf.extend(chunk)
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        while True:
            while b"\r\n" not in buf:
                fill()
            i = buf.index(b"\r\n")
            size = int(bytes(buf[:i]).split(b";")[0], 16)
            del buf[:i + 2]
            if size == 0:
                break
            while len(buf) < size + 2:
                fill()
            h.update(buf[:size])
            n += size
            del buf[:size + 2]
    else:
        total = int(hdrs["content-length"])
        while n < total:
            if not buf:
                fill()
            take = min(len(buf), total - n)
            h.update(buf[:take])
            n += take
            del buf[:take]
    return n, h.hexdigest()


def test_slow_h1_client_backpressure(cluster):
    c = cluster(1)
    stub = c.stubs[0]
    total = 128 << 20
    s = socket.create_connection(("127.0.0.1", c.router.port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(http_request("POST", "/v1/completions", completion("bulk", bytes=total)))
    written = wait_stalled(stub)  # the client reads nothing meanwhile
    assert written < 48 << 20, "pcrouter kept reading from the pod (%d MiB) while the client read nothing" % (written >> 20)
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(65536)
    head, _, rest = head.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert " 200" in lines[0], lines
    hdrs = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    n, digest = drain_h1_body(s, rest, hdrs)
    s.close()
    assert n == total and digest == expected_sha(total)


def test_slow_h2_client_backpressure(cluster):
    c = cluster(1)
    stub = c.stubs[0]
    total = 64 << 20
    h = H2Client(c.router.port)
    try:
        sid = h.request("POST", "/v1/completions", completion("bulk", bytes=total))
        written = wait_stalled(stub)  # no WINDOW_UPDATE from us meanwhile
        assert written < 40 << 20, "pcrouter buffered %d MiB for a client that granted 64 KiB" % (written >> 20)
        h.wait(lambda: h.streams[sid]["ended"], 60, "the whole body")
        assert h.streams[sid]["headers"][":status"] == "200"
        data = h.streams[sid]["data"]
        assert len(data) == total and hashlib.sha256(data).hexdigest() == expected_sha(total)
    finally:
        h.close()


def test_slow_backend_does_not_delay_others(cluster):
    c = cluster(2, policy="round_robin")
    cs = CurlStream(c.url("/v1/completions"), completion("slow one", gate="slow"))
    try:
        slow = wait_for(lambda: next((s for s in c.stubs if s.stats()["active"]), None), 10, what="the slow request")
        for i in range(6):
            t0 = time.monotonic()
            r = curl(c.url("/v1/completions"), completion("quick %d" % i), timeout=10)
            assert r.status == 200, r
            assert time.monotonic() - t0 < 5
        assert slow.stats()["active"] == 1
        slow.release("slow")
        rc, out = cs.finish(30)
        assert rc == 0 and b" 200" in out.split(b"\r\n", 1)[0], out[:300]
    finally:
        cs.kill()


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_stream_idle_timeout_ends_stream(cluster, proto):
    c = cluster(1, timeouts={"stream_idle_ms": 400})
    cs = CurlStream(c.url("/v1/completions"), completion("stalls", stream=True, gate="never", events=5), proto=proto)
    try:
        cs.wait_output(b"data: {", 15)
        rc, out = cs.finish(15)  # bounded: pcrouter must end it
    finally:
        cs.kill()
    assert b"[DONE]" not in out
    assert rc != 0, "a stream cut by a timeout must not look complete to the client (curl rc 0)"
    wait_for(lambda: c.stubs[0].stats()["aborted"] >= 1, 10, what="the stalled upstream closed")


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_backend_dies_mid_stream(cluster, proto):
    c = cluster(2, policy="round_robin", upstream={"retries": 1})
    cs = CurlStream(c.url("/v1/completions"), completion("dies", stream=True, events=10, abort_after=2), proto=proto)
    try:
        rc, out = cs.finish(20)
    finally:
        cs.kill()
    events = sse_events(split_head(out)[2])
    assert "[DONE]" not in events, events
    if proto == "h1":
        # What arrived, then an SSE error event, then the connection closes mid-chunked-body.
        assert len(events) == 3 and '"code":"response_cut"' in events[2], events
    else:
        assert len(events) == 2, events  # then RST_STREAM
    assert rc != 0, "a truncated stream must not look complete to the client"
    # Bytes had reached the client: no retry on the other pod.
    hits = {s.name: s.stats()["requests"].get("/v1/completions", 0) for s in c.stubs}
    assert sorted(hits.values()) == [0, 1], hits
    assert curl(c.url("/v1/completions"), completion("next")).status == 200


def test_client_idle_timeout_closes_connection(cluster):
    c = cluster(1, timeouts={"client_idle_ms": 300})
    conn = RawConn(c.router.port)
    conn.send(http_request("GET", "/health"))
    assert conn.read_response()[0] == 200
    t0 = time.monotonic()
    conn.sock.settimeout(10)
    try:
        data = conn.sock.recv(100)
    except ConnectionResetError:
        data = b""
    assert data == b"", data
    assert 0.2 <= time.monotonic() - t0 < 10
    conn.close()


def test_connection_close_honoured(cluster):
    c = cluster(1)
    conn = RawConn(c.router.port)
    conn.send(http_request("POST", "/v1/completions", completion("bye"), headers=["Connection: close"]))
    status, hdrs, body = conn.read_response()
    assert status == 200
    conn.sock.settimeout(10)
    assert conn.sock.recv(100) == b""
    conn.close()


def test_access_log_line(cluster):
    c = cluster(1, log={"access_log": True})
    start = len(c.router.err.lines)
    assert curl(c.url("/v1/chat/completions"), {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}).status == 200
    got = c.router.err.wait_line(r"/v1/chat/completions.*\b200\b|\b200\b.*/v1/chat/completions", 10, start)
    assert got is not None, c.router.err.tail()
    assert "pod-a" in got[1].string, got[1].string


def test_pipelined_flood_is_not_buffered_without_bound(cluster):
    """While one request is answered, a client that keeps pipelining more is read only up to a
    bound (1 MiB): then pcrouter stops reading, TCP pushes back, and the client's sends block,
    instead of pcrouter buffering whatever it is sent."""
    c = cluster(1)
    stub = c.stubs[0]
    conn = RawConn(c.router.port)
    conn.send(http_request("POST", "/v1/completions",
                           completion("held", stream=True, gate="flood", events=2)))
    wait_for(lambda: stub.stats()["active"] >= 1, 10, what="the held request at the pod")
    one = http_request("POST", "/v1/completions", completion("x" * 60000))
    conn.sock.setblocking(False)
    sent, limit = 0, 64 << 20
    while sent < limit:
        # Writable within a second, or pcrouter has stopped reading (the limit is what is tested).
        _, writable, _ = select.select([], [conn.sock], [], 1.0)
        if not writable:
            break
        try:
            sent += conn.sock.send(one)
        except BlockingIOError:
            pass
    # Loopback socket buffers hold a few MiB; pcrouter itself holds at most about 1 MiB more.
    assert sent < 24 << 20, "pcrouter read %d bytes of pipelined requests while answering" % sent
    conn.sock.setblocking(True)
    stub.release("flood")
    status, hdrs, body = conn.read_response()
    assert status == 200
    assert conn.read_response()[0] == 200  # the pipelined ones are answered once it is their turn
    conn.close()
