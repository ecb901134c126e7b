"""test_access_log.py: the access log in a file, as text or one JSON object per request, and
its rotation: rename the file, send SIGUSR1, and every request's line is in one of the two
files, once."""
import http.client
import json
import os
import re
import signal
import threading
import time

from conftest import (CurlStream, RawConn, completion, curl, get_metrics, make_config, metric,
                      wait_for)

JSON_FIELDS = {
    "time": str, "client": str, "worker": int, "protocol": str, "method": str, "path": str,
    "model": (str, type(None)), "status": int, "backend": (str, type(None)),
    "route": (str, type(None)), "matched_blocks": (int, type(None)),
    "total_blocks": (int, type(None)), "predicted_cached_tokens": (int, type(None)),
    "delivered_cached_tokens": (int, type(None)), "ttfb_ms": (int, float, type(None)),
    "ttft_ms": (int, float, type(None)), "held_ms": (int, float, type(None)),
    "conn_wait_ms": (int, float, type(None)), "tokenize_ms": (int, float, type(None)),
    "prefill_ahead_tokens": (int, type(None)), "pd": (str, type(None)),
    "prefill_backend": (str, type(None)), "prefill_leg_ms": (int, float, type(None)),
    "duration_ms": (int, float), "bytes_in": int, "bytes_out": int,
    "unsent_bytes": int, "retries": int,
}


def read_lines(path, writing=False):
    """The file's lines. `writing`: the router may be in the middle of a write() (a reader can
    see part of one), so an unterminated tail is left for the next read; otherwise it is a cut
    line, a failure."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    if writing:
        data = data[:data.rfind(b"\n") + 1]
    assert data == b"" or data.endswith(b"\n"), "a line was cut: %r" % data[-200:]
    return data.decode().splitlines()


def wait_lines(path, n, timeout=15):
    return wait_for(lambda: len(read_lines(path, True)) >= n and read_lines(path, True), timeout,
                    what="%d access log lines in %s" % (n, path))


def test_json_lines_carry_every_field(stub_factory, router_factory, tmp_path):
    path = str(tmp_path / "access.json")
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], routing={"policy": "cache_aware"},
                                   upstream={"request_usage": True},
                                   log={"access_log_path": path, "access_log_format": "json"}))
    prompt = "the same long system prompt, block after block. " * 40
    first = curl(r.url("/v1/completions"), completion(prompt))
    second = curl(r.url("/v1/completions"), completion(prompt), proto="h2c")
    assert first.status == 200 and second.status == 200
    s = CurlStream(r.url("/v1/chat/completions?x=%22quoted%22"),
                   {"model": "stub-model", "stream": True,
                    "messages": [{"role": "user", "content": "caf\u00e9 " * 100}]})
    rc, _ = s.finish()
    assert rc == 0
    raw = RawConn(r.port)
    raw_addr = "127.0.0.1:%d" % raw.sock.getsockname()[1]
    raw.send(b"GET /nowhere/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.read_response()[0] == 404
    raw.close()
    lines = wait_lines(path, 4)
    assert len(lines) == 4, lines
    objs = [json.loads(l) for l in lines]  # every line is one JSON object
    for o in objs:
        assert set(o) == set(JSON_FIELDS), sorted(set(o) ^ set(JSON_FIELDS))
        for k, t in JSON_FIELDS.items():
            assert isinstance(o[k], t), (k, o[k])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["time"]), o["time"]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", o["client"]), o["client"]
    a, b, c, d = objs
    assert d["client"] == raw_addr, (d["client"], raw_addr)   # the connection's own address
    assert (a["protocol"], b["protocol"]) == ("HTTP/1.1", "HTTP/2")
    assert a["method"] == "POST" and a["path"] == "/v1/completions" and a["status"] == 200
    assert a["model"] == "stub-model" and a["backend"] == "pod-a" and a["route"] == "cold"
    assert a["matched_blocks"] == 0 and a["total_blocks"] > 0
    assert a["bytes_in"] == len(json.dumps(completion(prompt)))
    assert a["bytes_out"] == len(first.body) and a["retries"] == 0
    assert a["ttfb_ms"] <= a["duration_ms"]
    # Only a stream has a first token apart from its answer; after its head, before its end.
    assert a["ttft_ms"] is None and b["ttft_ms"] is None
    assert c["ttfb_ms"] <= c["ttft_ms"] <= c["duration_ms"], c
    assert all(o["held_ms"] is None for o in objs)  # nothing waited for a pod's prefill
    assert all(o["conn_wait_ms"] is None for o in objs)  # nor for a pod connection
    assert all(o["tokenize_ms"] is None for o in objs)  # nor for tokens (approximate mode)
    # Only a stream's first token says when its prefill was done; nothing was ahead of it.
    assert a["prefill_ahead_tokens"] is None and c["prefill_ahead_tokens"] == 0
    # The repeat: the index predicted it warm, and the pod said it reused most of it.
    assert b["route"] == "warm" and b["matched_blocks"] == b["total_blocks"] > 0
    assert b["predicted_cached_tokens"] > 0
    assert b["delivered_cached_tokens"] == second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # The stream: usage read from the event pcrouter asked for, which the client never saw.
    assert c["path"] == '/v1/chat/completions?x=%22quoted%22'
    assert c["delivered_cached_tokens"] is not None
    assert stub.stats()["log"][-1]["include_usage"] is True
    # Not routed: no backend, no prediction; bytes that are not UTF-8 became '?'.
    assert d["status"] == 404 and d["backend"] is None and d["route"] is None
    assert d["predicted_cached_tokens"] is None and d["delivered_cached_tokens"] is None
    assert d["path"] == "/nowhere/??"
    assert metric(get_metrics(r), "pcrouter_access_log_dropped_total") == 0


def test_a_request_that_waited_for_a_pod_connection_says_how_long(stub_factory, router_factory,
                                                                    tmp_path):
    """The pod takes one connection; A holds it until its gate opens. B, sent while A is at the
    pod, waits in pcrouter for that connection: its line has conn_wait_ms, from its queueing to
    A's end, and A's has none."""
    path = str(tmp_path / "access.json")
    stub = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": stub.url, "max_connections": 1}],
                                   workers=1,
                                   log={"access_log_path": path, "access_log_format": "json"}))
    got = {}
    a = threading.Thread(target=lambda: got.update(a=curl(r.url("/v1/completions"),
                                                          completion("A", tag="A", gate="ga"))))
    a.start()
    wait_for(lambda: any(e.get("tag") == "A" for e in stub.stats()["log"]), 15, what="A at the pod")
    b = threading.Thread(target=lambda: got.update(b=curl(r.url("/v1/completions"),
                                                          completion("B", tag="B"))))
    b.start()
    # Both in the router, one at the pod: B waits for A's connection.
    wait_for(lambda: metric(get_metrics(r), "pcrouter_requests_in_flight") == 2, 15,
             what="B in flight beside A")
    stub.release("ga")
    a.join(15)
    b.join(15)
    assert got["a"].status == 200 and got["b"].status == 200, got
    def completions():
        got = [o for o in map(json.loads, read_lines(path, True)) if o["path"] == "/v1/completions"]
        return got if len(got) >= 2 else None
    objs = wait_for(completions, 15, what="the two completions' lines")
    assert len(objs) == 2, objs
    la = next(o for o in objs if o["bytes_in"] == len(json.dumps(completion("A", tag="A", gate="ga"))))
    lb = next(o for o in objs if o is not la)
    assert la["conn_wait_ms"] is None, la
    assert lb["conn_wait_ms"] is not None and lb["conn_wait_ms"] > 0, lb
    # Its wait, from its arrival to A's end, is part of its time in the router.
    assert lb["conn_wait_ms"] <= lb["duration_ms"], lb
    assert [e["tag"] for e in stub.stats()["log"] if e.get("tag")] == ["A", "B"]
    assert metric(get_metrics(r), "pcrouter_backend_conn_waits_total", backend="pod-a") == 1


def test_text_lines_in_a_file(cluster, tmp_path):
    path = str(tmp_path / "access.log")
    c = cluster(1, log={"access_log_path": path})
    assert curl(c.url("/v1/completions"), completion("hi")).status == 200
    line = wait_for(lambda: [l for l in read_lines(path, True) if " POST " in l], 15,
                    what="the completion's line")[0]
    assert re.fullmatch(r"\S+Z info access 127\.0\.0\.1:\d+ HTTP/1\.1 POST /v1/completions 200 \d+ "
                        r"backend=pod-a route=round_robin blocks=0/\d+ attempts=1 \d+\.\d{3}s", line), line
    assert " access " not in c.router.stderr_text()  # the file, not stderr


def test_off_writes_nothing(cluster, tmp_path):
    path = str(tmp_path / "access.log")
    c = cluster(1, log={"access_log": False, "access_log_path": path})
    assert curl(c.url("/v1/completions"), completion("hi")).status == 200
    assert curl(c.url("/metrics")).status == 200  # answered after the completion was recorded
    c.router.stop()
    assert read_lines(path) == []


def test_unwritable_path_stops_the_start(router_factory, stub_factory, tmp_path):
    stub = stub_factory("pod-a")
    try:
        router_factory(make_config([stub], log={"access_log_path": str(tmp_path / "no" / "a.log")}))
    except AssertionError as e:
        assert "log.access_log_path: cannot open" in str(e), e
    else:
        raise AssertionError("pcrouter started with an access log it cannot open")


class Load:
    """Threads sending numbered requests on keep-alive connections until stopped."""

    def __init__(self, port, threads=4):
        self.port = port
        self.next = 0
        self.lock = threading.Lock()
        self.sent = set()
        self.errors = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        body = json.dumps(completion("rotation " * 20))
        while not self.stopping.is_set():
            with self.lock:
                i = self.next
                self.next += 1
            try:
                conn.request("POST", "/v1/completions?i=%d" % i, body,
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    self.errors.append(resp.status)
                with self.lock:
                    self.sent.add(i)
            except (OSError, http.client.HTTPException) as e:
                self.errors.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def count(self):
        with self.lock:
            return len(self.sent)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(20)


def numbers(lines):
    """The request numbers of the load's lines (the fixture's own /health calls left out)."""
    out = []
    for l in lines:
        o = json.loads(l)
        m = re.fullmatch(r"/v1/completions\?i=(\d+)", o["path"])
        assert m or o["path"] == "/health", l
        if m:
            out.append(int(m.group(1)))
    return out


def test_rotation_under_load_loses_no_line(cluster, tmp_path):
    path = str(tmp_path / "access.json")
    rotated = path + ".1"
    c = cluster(2, log={"access_log_path": path, "access_log_format": "json"})
    load = Load(c.router.port)
    try:
        wait_for(lambda: load.count() >= 200, 30, what="200 requests before the rotation")
        os.rename(path, rotated)
        c.router.send_signal(signal.SIGUSR1)
        # Lines keep coming, now into a new file of the same name.
        wait_for(lambda: len(numbers(read_lines(path, writing=True))) >= 200, 30,
                 what="lines in the new file")
    finally:
        load.stop()
    assert not load.errors, load.errors[:5]
    sent = load.sent
    # Every request answered has its line, once, in one of the two files.
    wait_for(lambda: len(numbers(read_lines(rotated, True))) +
             len(numbers(read_lines(path, True))) >= len(sent), 15, what="every line written")
    old, new = numbers(read_lines(rotated)), numbers(read_lines(path))
    assert len(old) + len(new) == len(set(old) | set(new)), "a line was written twice"
    assert set(old) | set(new) == sent
    assert len(old) >= 200 and len(new) >= 200
    assert "SIGUSR1: reopening the access log" in c.router.stderr_text()
    assert metric(get_metrics(c.router), "pcrouter_access_log_dropped_total") == 0
