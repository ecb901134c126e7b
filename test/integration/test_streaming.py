"""Streaming: SSE passes through event by event, a client that goes away closes the
upstream request, and one HTTP/2 connection carries 200 concurrent streams."""
import json
import re
import subprocess
import time

import pytest

from conftest import (CurlStream, H2Client, completion, chat, curl, get_metrics, metric,
                      split_head, sse_events, wait_for)


def only_active(c):
    """(stub, stats) of the one stub holding an active request."""
    found = [(s, st) for s in c.stubs for st in [s.stats()] if st["active"] > 0]
    return found[0] if len(found) == 1 else None


@pytest.mark.parametrize("proto", ["h1", "h2c"])
@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_sse_first_event_before_backend_finishes(cluster, proto, kind):
    c = cluster(2)
    gate = "sse-%s-%s" % (proto, kind)
    if kind == "chat":
        path, body = "/v1/chat/completions", chat([{"role": "user", "content": "stream"}], stream=True, gate=gate, events=5)
    else:
        path, body = "/v1/completions", completion("stream please", stream=True, gate=gate, events=5)
    cs = CurlStream(c.url(path), body, proto=proto)
    try:
        out = cs.wait_output(b"data: {", timeout=15)
        # The backend is still generating: it holds the rest until released.
        stub, st = wait_for(lambda: only_active(c), 5, what="one stub with the stream active")
        assert st["outcomes"].get("completed", 0) == 0
        assert b"[DONE]" not in out
        status, hdrs, _ = split_head(out)
        assert " 200" in status, status
        assert hdrs.get("content-type", "").startswith("text/event-stream"), hdrs
        assert hdrs.get("x-pcrouter-backend") == stub.name, hdrs
        if proto == "h1":
            assert "chunked" in hdrs.get("transfer-encoding", "").lower(), hdrs
            assert "content-length" not in hdrs
        stub.release(gate)
        rc, out = cs.finish(30)
    finally:
        cs.kill()
    assert rc == 0, out
    _, _, body_out = split_head(out)
    events = sse_events(body_out)
    assert events[-1] == "[DONE]", events
    assert len(events) == 6, events
    first = json.loads(events[0])
    assert first["system_fingerprint"] == stub.name


def test_sse_slow_stream_events_arrive_one_by_one(cluster):
    """Events spaced 150 ms apart reach the client spread out, not in one lump at the end."""
    c = cluster(1)
    cs = CurlStream(c.url("/v1/completions"), completion("slow", stream=True, events=4, interval_ms=150))
    seen = []
    try:
        for i in range(4):
            cs.wait_output(b'"tok%d ' % i, 15)
            seen.append(time.monotonic())
        rc, out = cs.finish(30)
    finally:
        cs.kill()
    assert rc == 0
    assert seen[-1] - seen[0] >= 0.3, "events arrived together: %r" % seen
    assert sse_events(split_head(out)[2])[-1] == "[DONE]"


def test_h1_client_disconnect_closes_upstream(cluster):
    c = cluster(2)
    cs = CurlStream(c.url("/v1/completions"), completion("long", stream=True, gate="never", events=50))
    try:
        cs.wait_output(b"data: {", 15)
        stub, _ = wait_for(lambda: only_active(c), 5, what="a stub with the stream active")
    finally:
        cs.kill()  # the client goes away mid-stream
    st = wait_for(lambda: (lambda s: s if s["aborted"] >= 1 else None)(stub.stats()), 10,
                  what="the stub to see its connection closed")
    assert st["outcomes"].get("completed", 0) == 0, st["outcomes"]
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_requests_in_flight") == 0, 10,
             what="pcrouter_requests_in_flight back to 0")
    assert curl(c.url("/health")).status == 200


def test_h2_rst_stream_closes_upstream(cluster):
    c = cluster(2)
    h = H2Client(c.router.port)
    try:
        sid = h.request("POST", "/v1/completions", completion("long", stream=True, gate="never", events=50))
        h.wait(lambda: b"data: {" in h.streams[sid]["data"], 15, "the first SSE event over h2c")
        assert h.streams[sid]["headers"][":status"] == "200"
        stub, _ = wait_for(lambda: only_active(c), 5, what="a stub with the stream active")
        h.reset(sid)  # RST_STREAM(CANCEL); the connection stays open
        st = wait_for(lambda: (lambda s: s if s["aborted"] >= 1 else None)(stub.stats()), 10,
                      what="the stub to see its connection closed after RST_STREAM")
        assert st["outcomes"].get("completed", 0) == 0
        # The connection survives the reset: another stream on it works.
        sid2 = h.request("POST", "/v1/completions", completion("after reset"))
        h.wait(lambda: h.streams[sid2]["ended"], 15, "a second stream on the same connection")
        assert h.streams[sid2]["headers"][":status"] == "200"
        assert json.loads(h.streams[sid2]["data"])["stub"]["path"] == "/v1/completions"
    finally:
        h.close()


def test_h2_connection_close_mid_stream_closes_upstream(cluster):
    c = cluster(1)
    h = H2Client(c.router.port)
    sid = h.request("POST", "/v1/chat/completions",
                    chat([{"role": "user", "content": "x"}], stream=True, gate="never"))
    try:
        h.wait(lambda: b"data: {" in h.streams[sid]["data"], 15, "the first SSE event")
    finally:
        h.sock.close()
    wait_for(lambda: c.stubs[0].stats()["aborted"] >= 1, 10, what="upstream closed")


def test_200_concurrent_h2_streams_one_connection(cluster, tmp_path):
    c = cluster(2)
    body = tmp_path / "body.json"
    body.write_text(json.dumps(completion("concurrent " * 50, delay_ms=400)))
    t0 = time.monotonic()
    p = subprocess.run(["h2load", "-n", "200", "-c", "1", "-m", "200", "-T", "60", "-N", "60",
                        "-d", str(body), "-H", "content-type: application/json",
                        c.url("/v1/completions")], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    assert m, out
    assert int(m.group(4)) == 200, out
    sc = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    assert sc and int(sc.group(1)) == 200, out
    stats = c.stats()
    assert sum(st["requests"].get("/v1/completions", 0) for st in stats.values()) == 200
    # They were handled concurrently, not one after another (200 x 400 ms = 80 s serially).
    assert max(st["max_active"] for st in stats.values()) >= 20, {k: v["max_active"] for k, v in stats.items()}
    assert elapsed < 40, elapsed
