"""Graceful shutdown: SIGTERM/SIGINT stop accepting, let in-flight requests finish
(bounded by timeouts.drain_ms) and exit 0 (under ASan: with no leak)."""
import json
import signal
import socket
import time

import pytest

from conftest import CurlStream, RawConn, completion, http_request, split_head, sse_events, wait_for


def not_serving_new(port):
    """True once a new client is no longer served: refused, or closed without an answer."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return True
    try:
        s.sendall(http_request("GET", "/health"))
        data = s.recv(4096)
        return data == b"" or data.startswith(b"HTTP/1.1 503")
    except socket.timeout:
        return False  # accepted but left hanging: still listening, not refusing
    except OSError:
        return True
    finally:
        s.close()


def active_stub(c):
    return next((s for s in c.stubs if s.stats()["active"] > 0), None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_lets_in_flight_request_finish(cluster, sig):
    c = cluster(2, timeouts={"drain_ms": 20000})
    cs = CurlStream(c.url("/v1/completions"), completion("finish me", gate="drain", tag="inflight"))
    try:
        stub = wait_for(lambda: active_stub(c), 10, what="the request to reach a pod")
        c.router.send_signal(sig)
        wait_for(lambda: not_serving_new(c.router.port), 10, 0.05, "the listener to stop accepting")
        assert c.router.alive(), "pcrouter exited with a request in flight"
        stub.release("drain")
        rc, out = cs.finish(30)
    finally:
        cs.kill()
    assert rc == 0, out
    status, hdrs, body = split_head(out)
    assert " 200" in status, out
    assert json.loads(body)["stub"]["tag"] == "inflight"
    c.router.wait_stopped(20)  # the exit already under way: 0 and no leak


def test_shutdown_lets_in_flight_stream_finish(cluster):
    c = cluster(1, timeouts={"drain_ms": 20000})
    cs = CurlStream(c.url("/v1/completions"), completion("stream", stream=True, gate="drain-sse", events=6),
                    proto="h2c")
    try:
        cs.wait_output(b"data: {", 15)
        c.router.send_signal(signal.SIGTERM)
        wait_for(lambda: not_serving_new(c.router.port), 10, 0.05, "the listener to stop accepting")
        c.stubs[0].release("drain-sse")
        rc, out = cs.finish(30)
    finally:
        cs.kill()
    assert rc == 0, out
    events = sse_events(split_head(out)[2])
    assert len(events) == 7 and events[-1] == "[DONE]", events
    c.router.wait_stopped(20)


def test_drain_timeout_bounds_shutdown(cluster):
    c = cluster(1, timeouts={"drain_ms": 500})
    cs = CurlStream(c.url("/v1/completions"), completion("never ends", mode="stall"))
    try:
        wait_for(lambda: c.stubs[0].stats()["active"] > 0, 10, what="the request to reach the pod")
        t0 = time.monotonic()
        c.router.stop(timeout=15)
        elapsed = time.monotonic() - t0
    finally:
        cs.kill()
    assert elapsed < 5, "drain_ms 500 but shutdown took %.1fs" % elapsed


def test_idle_keepalive_connection_does_not_delay_shutdown(cluster):
    c = cluster(1, timeouts={"drain_ms": 20000})
    conn = RawConn(c.router.port)
    conn.send(http_request("GET", "/health"))
    assert conn.read_response()[0] == 200
    t0 = time.monotonic()
    try:
        c.router.stop(timeout=25)
    finally:
        conn.close()
    assert time.monotonic() - t0 < 5, "an idle keep-alive client held shutdown for the whole drain"
