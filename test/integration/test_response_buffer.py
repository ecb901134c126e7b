"""Response buffering (limits.max_response_buffer_bytes, router/http/respond.c): a client that
reads slower than its pod no longer holds the pod's connection. The answer is kept in pcrouter
up to its bound (and the process's budget), the pod is read at its own pace, and its
connection goes back to the pool when its answer ends; the client still gets every byte, in
order, whenever it reads. Past the bound the pod's reading pauses as before, and a client that
never reads is cut at timeouts.client_write_ms.

The pod here allows one connection and the router runs one worker, so a second request is
served only once the first one's pod connection is free. The answers are larger than every
buffer on the way (the router's 256 KiB output watermark and the kernel's socket buffers, which
grow to a few MiB on loopback), so that without buffering the first request's pod connection
stays taken while its client reads nothing."""
import hashlib
import json
import socket
import time

import pytest

from attack_h2 import bulk_sha, h2_connect, post_headers
from conftest import (completion, curl, get_metrics, http_request, make_config, metric,
                      sse_events, wait_for)

MiB = 1 << 20
BOUND = 32 * MiB          # the per-request bound these tests run with
SIZE = 12 * MiB           # an answer that fits it
EVENTS = 60000            # an SSE stream of about 11 MiB


def start(stub_factory, router_factory, limits=None, timeouts=None, max_connections=1):
    stub = stub_factory("pod-a")
    cfg = make_config([{"name": "pod-a", "url": stub.url, "max_connections": max_connections}],
                      workers=1, log={"access_log": False},
                      limits=dict({"max_response_buffer_bytes": BOUND}, **(limits or {})),
                      timeouts=dict({"response_ms": 5000, "client_write_ms": 30000}, **(timeouts or {})))
    r = router_factory(cfg)
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, 0.05, "/health 200")
    return stub, r


def ask(kind):
    if kind == "bytes":
        return completion("kept for a slow client", bytes=SIZE)
    return completion("kept for a slow client", stream=True, events=EVENTS)


def check_answer(kind, body, size=SIZE):
    """The answer the pod sent, whole and in order."""
    if kind == "bytes":
        assert len(body) == size and hashlib.sha256(body).hexdigest() == bulk_sha(size), len(body)
        return
    events = sse_events(body)
    assert events[-1] == "[DONE]", events[-3:]
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert texts == ["tok%d " % i for i in range(EVENTS)], (len(texts), texts[:3], texts[-3:])


class SlowH1:
    """An HTTP/1.1 client that sends its request, then reads nothing until told to."""

    def __init__(self, port, body):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall(http_request("POST", "/v1/completions", body))

    def read_all(self):
        """The response's body (Content-Length or chunked), read at full speed."""
        buf, pos = bytearray(), 0

        def need(n):
            while len(buf) - pos < n:
                chunk = self.sock.recv(1 << 20)
                assert chunk, "connection closed after %d bytes" % len(buf)
                buf.extend(chunk)

        def line():
            nonlocal pos
            while buf.find(b"\r\n", pos) < 0:
                need(len(buf) - pos + 1)
            i = buf.index(b"\r\n", pos)
            out, pos = bytes(buf[pos:i]), i + 2
            return out
        status = line().decode("latin-1")
        hdrs = {}
        for l in iter(line, b""):
            k, _, v = l.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        assert " 200 " in status, (status, hdrs)
        body = bytearray()
        if "chunked" in hdrs.get("transfer-encoding", ""):
            while True:
                size = int(line().split(b";")[0], 16)
                if size == 0:
                    break
                need(size + 2)
                body += buf[pos:pos + size]
                pos += size + 2
        else:
            n = int(hdrs["content-length"])
            need(n)
            body += buf[pos:pos + n]
        return bytes(body)

    def close(self):
        self.sock.close()


class SlowH2:
    """An h2c client whose stream window is 0 (no DATA can come) until read_all() opens it."""

    def __init__(self, port, body):
        import h2.events
        self.events = h2.events
        self.port = port
        self.sock, self.conn = h2_connect(port, window=0)
        data = json.dumps(body).encode()
        self.sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(self.sid, post_headers(port, "/v1/completions", len(data)))
        self.conn.send_data(self.sid, data, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        self.status, self.body, self.ended = None, bytearray(), False

    def read_all(self, timeout=60):
        import h2.settings
        big = 2 ** 31 - 1
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: big})
        self.conn.increment_flow_control_window(big - 65535)
        self.sock.sendall(self.conn.data_to_send())
        deadline = time.monotonic() + timeout
        self.sock.settimeout(1.0)
        while not self.ended:
            assert time.monotonic() < deadline, "the stream did not end (%d bytes)" % len(self.body)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            assert data, "connection closed after %d bytes" % len(self.body)
            for e in self.conn.receive_data(data):
                if getattr(e, "stream_id", None) != self.sid:
                    continue
                if isinstance(e, self.events.ResponseReceived):
                    self.status = dict(e.headers)[b":status"].decode()
                elif isinstance(e, self.events.DataReceived):
                    self.body += e.data
                elif isinstance(e, self.events.StreamEnded):
                    self.ended = True
                elif isinstance(e, self.events.StreamReset):
                    raise AssertionError("stream reset after %d bytes" % len(self.body))
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
        assert self.status == "200", self.status
        return bytes(self.body)

    def close(self):
        self.sock.close()


SLOW = {"h1": SlowH1, "h2c": SlowH2}


@pytest.mark.parametrize("kind", ["bytes", "sse"])
@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_slow_reader_frees_the_pod_connection(stub_factory, router_factory, proto, kind):
    """A client that reads nothing: its answer (unstreamed, or an SSE stream) fits the bound,
    so pcrouter reads it all from the pod, whose one connection goes back to the pool at the
    answer's end; a second request is served at once. The slow client then reads its answer
    whole and in order, and the kept bytes leave the budget."""
    stub, r = start(stub_factory, router_factory)
    slow = SLOW[proto](r.port, ask(kind))
    try:
        # The pod's answer ended while pcrouter still kept part of it for the client.
        wait_for(lambda: metric(get_metrics(r), "pcrouter_responses_buffered_total") == 1, 30,
                 0.1, "the pod's answer ended, kept for the client")
        text = get_metrics(r)
        assert metric(text, "pcrouter_response_buffered_bytes") > 0, text
        assert metric(text, "pcrouter_backend_in_flight", backend="pod-a") == 0, text
        t0 = time.monotonic()
        second = curl(r.url("/v1/completions"), completion("next one"), timeout=10)
        assert second.status == 200, second
        assert time.monotonic() - t0 < 3, "the second request waited for the pod's connection"
        assert stub.stats()["request_connections"] == 1, "not the same pod connection, reused"
        check_answer(kind, slow.read_all())
    finally:
        slow.close()
    wait_for(lambda: metric(get_metrics(r), "pcrouter_response_buffered_bytes") == 0, 10,
             what="the kept bytes released")
    text = get_metrics(r)
    assert metric(text, "pcrouter_response_backpressure_total") == 0, text
    assert metric(text, "pcrouter_client_write_timeouts_total") == 0, text


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_answer_over_the_bound_applies_backpressure(stub_factory, router_factory, proto):
    """Past its bound an answer is no longer kept: the pod's reading pauses (its connection
    waits for the client, as without buffering), what is kept stays within the bound, and a
    client that never reads is cut at client_write_ms, its pod request cancelled and what was
    kept released."""
    bound = 1 * MiB
    stub, r = start(stub_factory, router_factory, limits={"max_response_buffer_bytes": bound},
                    timeouts={"client_write_ms": 1500})
    slow = SLOW[proto](r.port, completion("over the bound", bytes=256 * MiB))
    try:
        wait_for(lambda: (metric(get_metrics(r), "pcrouter_response_backpressure_total") or 0) >= 1,
                 30, 0.05, "the pod's reading paused")
        kept = metric(get_metrics(r), "pcrouter_response_buffered_bytes")
        assert bound <= kept <= bound + 64 * 1024, kept
        assert stub.stats()["completed"].get("/v1/completions", 0) == 0
        wait_for(lambda: metric(get_metrics(r), "pcrouter_client_write_timeouts_total") == 1, 20,
                 what="the client cut at client_write_ms")
        wait_for(lambda: stub.stats()["aborted"] >= 1, 10, what="the pod request cancelled")
    finally:
        slow.close()
    text = get_metrics(r)
    assert metric(text, "pcrouter_response_buffered_bytes") == 0, text
    assert metric(text, "pcrouter_responses_buffered_total") == 0, text
    assert curl(r.url("/v1/completions"), completion("next")).status == 200


def test_budget_bounds_what_all_keep(stub_factory, router_factory):
    """limits.max_buffered_response_bytes bounds what all requests keep together: two slow
    clients whose answers each fit their own bound, not both the budget, keep no more than the
    budget (plus a read each), and the reading of at least one pauses."""
    budget, size = 16 * MiB, 24 * MiB
    stub, r = start(stub_factory, router_factory, max_connections=2,
                    limits={"max_response_buffer_bytes": budget, "max_buffered_response_bytes": budget})
    slow = [SlowH1(r.port, completion("budget %d" % i, bytes=size)) for i in range(2)]
    try:
        wait_for(lambda: (metric(get_metrics(r), "pcrouter_response_backpressure_total") or 0) >= 1,
                 30, 0.05, "a pod's reading paused at the budget")
        kept = []

        def steady():
            kept.append(metric(get_metrics(r), "pcrouter_response_buffered_bytes"))
            return len(kept) >= 5 and len(set(kept[-5:])) == 1
        wait_for(steady, 20, 0.1, "what is kept to settle")
        assert budget <= kept[-1] <= budget + 2 * 64 * 1024, kept[-1]
        for s in slow:
            check_answer("bytes", s.read_all(), size)
    finally:
        for s in slow:
            s.close()
    wait_for(lambda: metric(get_metrics(r), "pcrouter_response_buffered_bytes") == 0, 10,
             what="the kept bytes released")


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_reader_that_never_reads_is_cut(stub_factory, router_factory, proto):
    """An answer that fits is read whole from the pod, but a client that never takes any of it
    still loses it at client_write_ms: the connection (h1) or the stream (h2) is cut, and what
    was kept for it leaves the budget. The pod's request completed: nothing was cancelled.
    (client_write_ms counts from the first byte queued for the client, so it must leave the
    pod time to send the whole answer, under the sanitizers too.)"""
    stub, r = start(stub_factory, router_factory, timeouts={"client_write_ms": 5000})
    slow = SLOW[proto](r.port, ask("bytes"))
    try:
        wait_for(lambda: metric(get_metrics(r), "pcrouter_responses_buffered_total") == 1, 30,
                 0.1, "the pod's answer ended, kept for the client")
        wait_for(lambda: metric(get_metrics(r), "pcrouter_client_write_timeouts_total") == 1, 20,
                 what="the client cut at client_write_ms")
        wait_for(lambda: metric(get_metrics(r), "pcrouter_response_buffered_bytes") == 0, 10,
                 what="the kept bytes released")
    finally:
        slow.close()
    st = stub.stats()
    assert st["completed"].get("/v1/completions") == 1 and st["aborted"] == 0, st["outcomes"]
    assert metric(get_metrics(r), "pcrouter_requests_in_flight") == 0
