"""Hardening: pods that misbehave: a status outside 100-599, a 101 nobody asked for, 1 MiB of
headers, broken chunking, a Transfer-Encoding a proxy could read differently, a head that never
ends. The client gets a 502 or 504 (or, once the head has gone out, a cut response), the router
lives on, its metrics stay sane; and 499 is recorded only when the client left, not when the
pod cut the response."""
import socket
import threading
import time

import pytest

from attack_pod import RawPod, ok_response
from conftest import (QUIET_SCRAPE, CurlStream, RawConn, assert_error, completion, curl, get_metrics,
                      make_config, parse_metrics, sse_events, split_head, wait_for)

BODY = b'{"choices":[{"text":"from the raw pod"}]}'


def status_response(code):
    return b"HTTP/1.1 %03d Weird\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        code, len(BODY), BODY)


BAD = {
    "status_0": status_response(0),
    "status_99": status_response(99),
    "status_600": status_response(600),
    "status_700": status_response(700),
    "status_999": status_response(999),
    "switching_101": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    "headers_1mib": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20) + b"\r\nContent-Length: 2\r\n\r\n{}",
    "te_list": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "te_obs_fold_leading": b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "te_space_before_colon": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding : chunked\r\nContent-Length: 6\r\n\r\n"
                              b"2\r\n{}\r\n0\r\n\r\n"),
}


def codes(text):
    """{(metric, backend or None, code): value} for the per-status counters."""
    out = {}
    for name, labels, v in parse_metrics(text):
        if name in ("pcrouter_requests_total", "pcrouter_backend_requests_total"):
            out[(name, labels.get("backend"), int(labels["code"]))] = v
    return out


def diff(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_pod_response_is_502(stub_factory, router_factory, case):
    """pod-raw answers every request with the bad bytes, pod-a is healthy; round robin with no
    retry sends two requests to each (one worker: each worker keeps its own turn). Before the fix a status of 600 and more wrote past the
    per-status counters (604 overwrote a backend's config pointer)."""
    raw = RawPod(lambda req: (BAD[case], True))
    try:
        good = stub_factory("pod-a")
        r = router_factory(make_config([("pod-raw", raw.url), good],
                                       routing={"policy": "round_robin"}, upstream={"retries": 0},
                                       health={"interval_ms": 0}, scrape=QUIET_SCRAPE,
                                       workers=1))  # one round-robin counter
        before = codes(get_metrics(r))
        got = sorted(curl(r.url("/v1/completions"), completion("m%d" % i), timeout=15).status
                     for i in range(4))
        assert got == [200, 200, 502, 502], got
        assert len(raw.snapshot()["requests"]) == 2
        r502 = curl(r.url("/v1/completions"), completion("again"), timeout=15)
        if r502.status == 502:
            assert_error(r502, 502, "bad_gateway", "upstream_error")
        assert r.alive(), r.err.tail()
        after = codes(get_metrics(r))
        assert all(100 <= code <= 599 for (_, _, code) in after), after
        d = diff(before, after)
        # The two 502s are the router's own answers: counted in total, not per backend.
        assert d.get(("pcrouter_requests_total", None, 502), 0) >= 2, d
        assert d.get(("pcrouter_backend_requests_total", "pod-a", 200), 0) >= 2, d
        assert not any(b == "pod-raw" for (_, b, _) in d), d
        assert "malformed response" in r.err.text()
    finally:
        raw.close()


CHUNK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("proto", ["h1", "h2c"])
@pytest.mark.parametrize("before", [b"", b"5\r\nhello\r\n"], ids=["at_once", "after_a_chunk"])
def test_broken_chunking_cuts_the_response(router_factory, proto, before):
    """A bad chunk size after the head: the head has reached the client, so the response is cut
    (curl sees an incomplete transfer), promptly. When the bad size came in the same read as
    the head, the HTTP/1.1 head was never flushed and the connection hung until the client gave
    up (the close waited for a drain no write event would report)."""
    raw = RawPod(lambda req: (CHUNK_HEAD + before + b"zz\r\nxx\r\n0\r\n\r\n", True))
    try:
        r = router_factory(make_config([("pod-raw", raw.url)], health={"interval_ms": 0}, scrape=QUIET_SCRAPE))
        res = curl(r.url("/v1/completions"), completion("chunks"), proto=proto, timeout=8)
        assert res.rc not in (0, 28), "expected a cut response, got rc %d: %r" % (res.rc, res)
        assert res.status in (200, 502), res
        assert res.body == before[3:8], res.body
        text = get_metrics(r)
        open("/tmp/hostile_m.txt", "w").write(text)
        assert codes(text).get(("pcrouter_requests_total", None, 499)) is None, text
        assert curl(r.url("/health")).status == 200
    finally:
        raw.close()


def test_499_only_when_the_client_left(cluster):
    """A stream the pod cuts is recorded with the status it had (and as an aborted response);
    one whose client leaves is recorded as 499."""
    c = cluster(1)
    before = get_metrics(c.router)
    cs = CurlStream(c.url("/v1/completions"), completion("cut", stream=True, events=6, abort_after=2))
    try:
        rc, out = cs.finish(20)
    finally:
        cs.kill()
    # Two events, then the router's error event for the cut (an SSE client sees why it ended).
    events = sse_events(split_head(out)[2])
    assert len(events) == 3 and "response_cut" in events[2] and rc != 0, (rc, out)
    mid = get_metrics(c.router)
    d = diff(codes(before), codes(mid))
    assert ("pcrouter_requests_total", None, 499) not in d, d
    # (the first scrape is itself a 200 in the total: the pod's counter is the exact one)
    assert d.get(("pcrouter_backend_requests_total", "pod-a", 200)) == 1, d
    aborted = [v for n, _, v in parse_metrics(mid) if n == "pcrouter_responses_aborted_total"]
    assert aborted == [1.0], aborted

    cs = CurlStream(c.url("/v1/completions"), completion("leaves", stream=True, gate="never", events=4))
    try:
        cs.wait_output(b"data: {", 15)
    finally:
        cs.kill()
    wait_for(lambda: codes(get_metrics(c.router)).get(("pcrouter_requests_total", None, 499)) == 1,
             10, what="the client who left recorded as 499")
    wait_for(lambda: c.stubs[0].stats()["aborted"] >= 1, 10, what="the pod request cancelled")


class DribblingPod:
    """A pod that answers the first request with `first`, then `piece` every 50 ms, forever
    (until closed): a response head that never ends, or 1xx after 1xx."""

    def __init__(self, first, piece):
        self.first, self.piece = first, piece
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.stop = threading.Event()
        self.closed_by_router = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            c, _ = self.lsock.accept()
        except OSError:
            return
        with c:
            c.settimeout(10)
            c.recv(65536)
            c.sendall(self.first)
            while not self.stop.wait(0.05):  # the pod's own pace
                try:
                    c.sendall(self.piece)
                except OSError:
                    self.closed_by_router.set()
                    return

    def close(self):
        self.stop.set()
        self.lsock.close()


@pytest.mark.parametrize("first,piece", [(b"HTTP/1.1 200 OK\r\nX-Slow: ", b"a"),
                                         (b"", b"HTTP/1.1 100 Continue\r\n\r\n")],
                         ids=["dribbled_head", "endless_1xx"])
def test_pod_that_never_finishes_its_head_gets_504(router_factory, first, piece):
    """timeouts.response_ms bounds the wait for a response head. Every byte from the pod used to
    restart it, so a pod dribbling its head (or sending 1xx after 1xx) held the request for
    good."""
    pod = DribblingPod(first, piece)
    try:
        r = router_factory(make_config([("pod-slow", pod.url)], health={"interval_ms": 0}, scrape=QUIET_SCRAPE,
                                       timeouts={"response_ms": 800}))
        t0 = time.monotonic()
        res = curl(r.url("/v1/completions"), completion("slow head"), timeout=15)
        assert_error(res, 504, "upstream_timeout", "timeout")
        assert time.monotonic() - t0 < 10
        assert pod.closed_by_router.wait(10), "the router kept the pod connection"
    finally:
        pod.close()


BODILESS = {
    "100_with_content_length": b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n" + ok_response(),
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "204_with_content_length": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "304_with_content_length": b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(BODILESS))
def test_bodiless_statuses_end_at_their_head(router_factory, case):
    """1xx, 204 and 304 end at the blank line, whatever their Content-Length says (RFC 9112,
    6.3). The router waited for the body such a pod response announced (until stream_idle_ms cut
    it), and framed a 204 for the client as chunked: the client took its last chunk for the
    start of the next response. Here the next request on the connection is answered, at once,
    and every byte the client gets belongs to a response. Found by the h1 fuzz targets."""
    raw = RawPod(lambda req: ok_response() if req["target"] == "/v1/next" else BODILESS[case])
    ok = b'{"choices":[{"text":"ok"}]}'
    try:
        r = router_factory(make_config([("pod-raw", raw.url)], health={"interval_ms": 0},
                                       scrape=QUIET_SCRAPE, timeouts={"stream_idle_ms": 60000}))
        conn = RawConn(r.port, timeout=10)  # a router waiting for stream_idle_ms fails here
        try:
            conn.send(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                      b"POST /v1/next HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            status = int(conn._line().split(b" ")[1])
            hdrs = {}
            while True:
                line = conn._line().decode("latin-1")
                if not line:
                    break
                hdrs[line.split(":", 1)[0].strip().lower()] = line.split(":", 1)[1].strip()
            want = 200 if case.startswith("100") else int(case[:3])
            assert status == want and "transfer-encoding" not in hdrs, (status, hdrs)
            if want == 200:  # the 1xx dropped, its would-be body not taken for the response
                assert conn._exact(int(hdrs["content-length"])) == ok
            else:
                assert ("content-length" in hdrs) == (want == 304), hdrs
            status, _, body = conn.read_response()
            assert status == 200 and body == ok, (status, body)
        finally:
            conn.close()
        assert len(raw.snapshot()["requests"]) == 2
    finally:
        raw.close()


def test_long_connection_field_still_names_hop_by_hop_fields(router_factory):
    """Every field a pod's Connection names is the pod's hop-by-hop field, never forwarded,
    however long the list: the router joined the values into 1 KiB and skipped a field that
    did not fit, so whatever it named reached the client. Found by the h1_request fuzz
    target."""
    names = b", ".join(b"x-%d" % i for i in range(250))
    answer = (b"HTTP/1.1 200 OK\r\nConnection: " + names + b"\r\nX-249: secret\r\nX-Kept: yes\r\n"
              b"Content-Length: 2\r\n\r\n{}")
    raw = RawPod(lambda req: answer)
    try:
        r = router_factory(make_config([("pod-raw", raw.url)], health={"interval_ms": 0},
                                       scrape=QUIET_SCRAPE))
        conn = RawConn(r.port, timeout=10)
        try:
            conn.send(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            status, hdrs, body = conn.read_response()
        finally:
            conn.close()
        assert status == 200 and body == b"{}", (status, body)
        assert "x-249" not in hdrs and hdrs.get("x-kept") == "yes", hdrs
    finally:
        raw.close()


def test_endless_metrics_page_is_cut_at_the_cap(stub_factory, router_factory):
    """A pod whose /metrics never ends: the scrape stops reading at its 4 MiB cap (connection
    closed, counted), long before scrape.timeout_ms; the control thread keeps checking the other
    pod (it goes down when its health fails). The scrape used to read on until its deadline."""
    from attack_pod import EndlessBody
    from conftest import metric
    endless = EndlessBody(head=b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n",
                          first=b"# endless\n", piece=b"vllm:num_requests_waiting 1\n" * 2340)

    def respond(req):
        if req["target"] == "/metrics":
            return endless
        if req["target"] == "/health":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    pod = RawPod(respond)
    other = stub_factory("pod-b")
    try:
        r = router_factory(make_config([("pod-raw", pod.url), other],
                                       health={"interval_ms": 100, "fall": 1, "rise": 1},
                                       scrape={"interval_ms": 100, "timeout_ms": 60000,
                                               "models_interval_ms": 0}))
        assert endless.ended.wait(15), "the scrape is still reading: %d bytes" % endless.sent
        assert endless.error in ("BrokenPipeError", "ConnectionResetError"), endless.error
        assert endless.sent < 16 << 20, endless.sent
        wait_for(lambda: metric(get_metrics(r), "pcrouter_backend_probes_too_large_total",
                                backend="pod-raw") >= 1, 10, what="the cut scrape counted")
        # Health checks go on meanwhile (the next scrapes of the endless page too).
        other.configure(health_status=503)
        wait_for(lambda: metric(get_metrics(r), "pcrouter_backend_up", backend="pod-b") == 0, 10,
                 what="pod-b down")
        assert metric(get_metrics(r), "pcrouter_backend_up", backend="pod-raw") == 1
    finally:
        pod.close()
