"""test_pd.py: prefill/decode disaggregation, vLLM's NixlConnector "pull" protocol.

Golden tests of both legs' exact bodies and headers against the protocol's field list
(recording stub pods), every failure of the prefill leg, the modes' outcomes, the config's
roles, and the whole way through vllm_sim --role, whose decode pods check the parameters.
"""
import json
import os
import re
import socket
import subprocess

import pytest

from conftest import (BUILD, PCROUTER, QUIET_SCRAPE, CurlStream, LineReader, completion, curl,
                      get_metrics, make_config, metric, sse_events, wait_for)

SIM = os.path.join(BUILD, "bench", "sim", "vllm_sim")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
REQUEST_FIELDS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
LONG = "the quick brown fox jumps over the lazy dog " * 300   # about 3400 tokens


def pd_config(prefill, decode, mode="always", **sections):
    backends = [{"name": s.name, "url": s.url, "role": "prefill"} for s in prefill]
    backends += [{"name": s.name, "url": s.url, "role": "decode"} for s in decode]
    cfg = make_config(backends, scrape=QUIET_SCRAPE, workers=1,
                      outlier={"consecutive_errors": 0, "consecutive_connect_errors": 0})
    cfg["pd"] = {"mode": mode}
    for k, v in sections.items():
        cfg[k] = dict(cfg.get(k, {}), **v)
    return cfg


def v1_log(stub):
    return [e for e in stub.stats()["log"] if e["path"].startswith("/v1/")]


def post(router, path, body, headers=None, timeout=30):
    h = ["%s: %s" % kv for kv in (headers or {}).items()]
    return curl(router.url(path), data=json.dumps(body).encode(), headers=h, timeout=timeout)


@pytest.fixture
def pods(stub_factory):
    """Two prefill stubs and one decode stub."""
    return ([stub_factory("pf-1"), stub_factory("pf-2")], [stub_factory("dc-1")])


# ---- the golden test -----------------------------------------------------------------------

def test_golden_chat_stream_both_legs(pods, router_factory):
    pf, dc = pods
    pf[1].kill()   # one prefill pod: the leg is known to go to pf-1
    for s in pf[:1] + dc:
        s.configure(defaults={})
    router = router_factory(pd_config(pf[:1], dc, upstream={"retries": 0}))
    body = {"model": "stub-model", "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 20, "max_completion_tokens": 20, "min_tokens": 2,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
            "stub": {"cached_tokens": 7}}
    r = post(router, "/v1/chat/completions", body, {"Authorization": "Bearer sk-test"})
    assert r.status == 200, r
    assert r.header("x-pcrouter-backend") == "dc-1"
    assert r.header("x-pcrouter-prefill") == "pf-1"

    (p,) = v1_log(pf[0])
    (d,) = v1_log(dc[0])
    # Leg 1: same path; max_tokens and max_completion_tokens 1, stream false, stream_options,
    # min_tokens gone, the request's kv_transfer_params; nothing else changed.
    assert p["path"] == "/v1/chat/completions"
    want = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    want.update(max_tokens=1, max_completion_tokens=1, stream=False,
                kv_transfer_params=REQUEST_FIELDS)
    assert json.loads(p["body"]) == want
    assert p["hdrs"]["authorization"] == "Bearer sk-test"
    rid = p["hdrs"]["x-request-id"]
    assert UUID.match(rid), rid
    # Leg 2: the client's body as it came, plus the prefill pod's parameters with remote_host
    # the address pcrouter reached it at; the same request id.
    assert d["path"] == "/v1/chat/completions"
    sent = json.loads(d["body"])
    params = sent.pop("kv_transfer_params")
    assert sent == body
    assert params == {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_block_ids": [1, 2, 3], "remote_engine_id": "engine-pf-1",
                      "remote_request_id": rid, "remote_host": "127.0.0.1",
                      "remote_port": 5600, "tp_size": 1}
    assert d["hdrs"]["x-request-id"] == rid
    assert d["hdrs"]["authorization"] == "Bearer sk-test"
    # Streamed as asked; the usage names the prefill pod's cached tokens (the stub's
    # cached_tokens control answers 7 on both; the decode pod's is rewritten, so check the
    # rewrite with a decode pod that says otherwise below).
    events = sse_events(r.body)
    assert events[-1] == "[DONE]"
    usage = [json.loads(e) for e in events[:-1] if '"usage"' in e and json.loads(e).get("usage")]
    assert usage and usage[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 7


def test_golden_completion_client_request_id_and_cached_rewrite(pods, router_factory, tmp_path):
    pf, dc = pods
    pf[1].kill()
    pf[0].configure(defaults={"cached_tokens": 640})
    dc[0].configure(defaults={"cached_tokens": 3392})   # what a pod that pulled would say
    log = str(tmp_path / "access.log")
    router = router_factory(pd_config(pf[:1], dc, upstream={"retries": 0},
                                      log={"access_log_path": log, "access_log_format": "json"}))
    body = {"model": "stub-model", "prompt": LONG, "max_tokens": 9}
    r = post(router, "/v1/completions", body, {"X-Request-Id": "client-id-1"})
    assert r.status == 200, r
    (p,) = v1_log(pf[0])
    (d,) = v1_log(dc[0])
    assert json.loads(p["body"]) == dict(body, max_tokens=1, stream=False,
                                         kv_transfer_params=REQUEST_FIELDS)
    assert p["hdrs"]["x-request-id"] == "client-id-1"
    assert d["hdrs"]["x-request-id"] == "client-id-1"
    assert json.loads(d["body"])["kv_transfer_params"]["remote_request_id"] == "client-id-1"
    out = json.loads(r.body)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 640
    assert out["choices"][0]["text"] == "hello from dc-1"
    m = get_metrics(router)
    assert metric(m, "pcrouter_pd_decisions_total", outcome="remote_prefill") == 1
    # Predicted against delivered: the prefill pod delivered the cache; the decode pod's
    # count of what it pulled is nobody's prediction.
    assert metric(m, "pcrouter_cached_tokens_delivered_total", backend="pf-1") == 640
    assert metric(m, "pcrouter_cached_tokens_delivered_total", backend="dc-1") in (0, None)
    # The access log says where the prompt was prefilled, and when the prefill pod answered.
    (line,) = wait_for(lambda: [o for o in (json.loads(x) for x in open(log))
                                if o["path"] == "/v1/completions"], what="the access line")
    assert line["backend"] == "dc-1" and line["pd"] == "remote_prefill"
    assert line["prefill_backend"] == "pf-1"
    assert 0 < line["prefill_leg_ms"] <= line["duration_ms"]


# ---- failures ------------------------------------------------------------------------------

def test_prefill_fails_retried_on_another(pods, router_factory):
    pf, dc = pods
    pf[0].configure(defaults={"mode": "close"})
    pf[1].configure(defaults={"mode": "close"})
    router = router_factory(pd_config(pf, dc, upstream={"retries": 1}))
    pf[1].configure(defaults={})   # one of the two answers; which is tried first is the policy's
    r = post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG, "max_tokens": 4})
    assert r.status == 200, r
    (d,) = v1_log(dc[0])
    assert json.loads(d["body"])["kv_transfer_params"]["remote_engine_id"] == "engine-pf-2"
    assert r.header("x-pcrouter-prefill") == "pf-2"
    m = get_metrics(router)
    tried_first = len(v1_log(pf[0]))
    assert metric(m, "pcrouter_pd_prefill_leg_failures_total", cause="error") == tried_first
    assert metric(m, "pcrouter_requests_total", code=200) >= 1


def test_every_prefill_fails_decode_prefills_itself(pods, router_factory):
    pf, dc = pods
    for s in pf:
        s.configure(defaults={"mode": "close"})
    router = router_factory(pd_config(pf, dc, upstream={"retries": 1}))
    body = {"model": "stub-model", "prompt": LONG, "max_tokens": 4}
    r = post(router, "/v1/completions", body)
    assert r.status == 200, r
    assert r.header("x-pcrouter-prefill") is None
    assert len(v1_log(pf[0])) + len(v1_log(pf[1])) == 2
    (d,) = v1_log(dc[0])
    assert json.loads(d["body"]) == body    # no parameters: the decode pod prefills
    m = get_metrics(router)
    assert metric(m, "pcrouter_pd_prefill_leg_failures_total", cause="error") == 2
    assert metric(m, "pcrouter_requests_total", code=200) == 1


@pytest.mark.parametrize("ctl,cause", [({"kv_params": "none"}, "no_params"),
                                       ({"status": 500}, "status"),
                                       ({"bytes": 2 << 20}, "too_large")])
def test_prefill_answer_without_params(pods, router_factory, ctl, cause):
    pf, dc = pods
    pf[1].kill()
    pf[0].configure(defaults=ctl)
    router = router_factory(pd_config(pf[:1], dc, upstream={"retries": 1}))
    body = {"model": "stub-model", "prompt": LONG, "max_tokens": 4, "stream": True}
    r = post(router, "/v1/completions", body)
    assert r.status == 200, r
    assert sse_events(r.body)[-1] == "[DONE]"
    assert len(v1_log(pf[0])) == 1          # not retried: the pod answered
    (d,) = v1_log(dc[0])
    assert json.loads(d["body"]) == body
    m = get_metrics(router)
    assert metric(m, "pcrouter_pd_prefill_leg_failures_total", cause=cause) == 1
    assert metric(m, "pcrouter_requests_total", code=200) == 1


def test_decode_fails_retried_without_params(pods, stub_factory, router_factory):
    pf, dc = pods
    pf[1].kill()
    dc.append(stub_factory("dc-2"))
    dc[0].configure(defaults={"mode": "close"})
    router = router_factory(pd_config(pf[:1], dc, upstream={"retries": 1}))
    n = [0]

    def one():
        n[0] += 1
        body = {"model": "stub-model", "prompt": "%d %s" % (n[0], LONG), "max_tokens": 4}
        r = post(router, "/v1/completions", body)
        assert r.status == 200 and r.header("x-pcrouter-backend") == "dc-2", r
        return v1_log(dc[0]) and (r, body)
    r, body = wait_for(one, what="a decode leg that went to the failing pod first")
    # The retry went without the parameters (they were for one pull) and without the
    # prefill pod's cached tokens: the pod that answered prefilled itself.
    assert json.loads(v1_log(dc[1])[-1]["body"]) == body
    assert r.header("x-pcrouter-prefill") is None


def test_client_leaving_during_prefill_cancels_it(pods, router_factory):
    pf, dc = pods
    pf[1].kill()
    pf[0].configure(defaults={"gate": "held"})
    router = router_factory(pd_config(pf[:1], dc))
    payload = json.dumps({"model": "stub-model", "prompt": LONG, "max_tokens": 4}).encode()
    s = socket.create_connection(("127.0.0.1", router.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    wait_for(lambda: pf[0].stats()["active"] == 1, what="the prefill leg at the pod")
    s.close()
    wait_for(lambda: pf[0].stats()["aborted"] == 1, what="the prefill leg cancelled")
    wait_for(lambda: metric(get_metrics(router), "pcrouter_requests_total", code=499) == 1,
             what="the request counted as the client's leaving")
    assert v1_log(dc[0]) == []              # no decode leg for a client that left


# ---- modes ---------------------------------------------------------------------------------

def test_modes_never_auto(pods, router_factory):
    pf, dc = pods
    pf[1].kill()
    router = router_factory(pd_config(pf[:1], dc, mode="never"))
    assert post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG}).status == 200
    assert v1_log(pf[0]) == []
    assert metric(get_metrics(router), "pcrouter_pd_decisions_total", outcome="local_mode") == 1
    router.stop()

    router = router_factory(pd_config(pf[:1], dc, mode="auto"))
    # A short prompt: little to prefill, the decode pod does it.
    assert post(router, "/v1/completions", {"model": "stub-model", "prompt": "hi"}).status == 200
    assert v1_log(pf[0]) == []
    # A long one, prefill pods idle: remote.
    assert post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG}).status == 200
    assert len(v1_log(pf[0])) == 1
    m = get_metrics(router)
    assert metric(m, "pcrouter_pd_decisions_total", outcome="local_cached") == 1
    assert metric(m, "pcrouter_pd_decisions_total", outcome="remote_prefill") == 1


def test_decode_leg_counts_no_prefill(pods, router_factory):
    """A decode leg with parameters pulls its prompt: the decode pod prefills none of it, so
    none stands in its queue, and it is never held behind the pod's prefill budget. Two long
    prompts whose decode legs wait for their first event both reach the decode pod, which
    counts nothing queued, under a budget either prompt alone would fill."""
    pf, dc = pods
    pf[1].kill()
    router = router_factory(pd_config(pf[:1], dc, upstream={"retries": 0},
                                      routing={"hold_tokens": 1000}))
    streams = []
    try:
        for tag in ("one", "two"):
            prompt = ("%s: " % tag + LONG)
            streams.append(CurlStream(router.url("/v1/completions"),
                                      completion(prompt, stream=True, tag=tag,
                                                 prefill_gate="first")))
        wait_for(lambda: len(v1_log(dc[0])) == 2, what="both decode legs at the decode pod")
        assert len(v1_log(pf[0])) == 2
        m = get_metrics(router)
        assert metric(m, "pcrouter_backend_queued_prefill_tokens", backend="dc-1") == 0
        assert metric(m, "pcrouter_backend_held_requests", backend="dc-1") in (0, None)
        dc[0].release("first")
        for s in streams:
            rc, out = s.finish(30)
            assert rc == 0 and b"[DONE]" in out, out[-500:]
    finally:
        for s in streams:
            s.kill()


def test_prefill_pods_down_fall_back(pods, router_factory):
    pf, dc = pods
    for s in pf:
        s.kill()
    router = router_factory(pd_config(pf, dc, health={"interval_ms": 100, "fall": 1}))
    wait_for(lambda: "backend pf-1 is down" in router.stderr_text() and
             "backend pf-2 is down" in router.stderr_text(), what="the prefill pods down")
    assert post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG}).status == 200
    assert metric(get_metrics(router), "pcrouter_pd_decisions_total", outcome="fallback") == 1


def test_prefill_pod_never_decodes(pods, router_factory):
    """Requests that are not prompts (no prefill leg) never go to a prefill pod either."""
    pf, dc = pods
    router = router_factory(pd_config(pf, dc, mode="never"))
    for _ in range(6):
        r = post(router, "/v1/embeddings", {"model": "stub-model", "input": "x"})
        assert r.status == 200 and r.header("x-pcrouter-backend") == "dc-1", r
    assert v1_log(pf[0]) == [] and v1_log(pf[1]) == []


# ---- config --------------------------------------------------------------------------------

def check_config(tmp_path, cfg):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    p = subprocess.run([PCROUTER, "--check-config", str(path)], capture_output=True,
                       text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def test_config_roles(tmp_path):
    base = {"listen": [{"address": "127.0.0.1:0"}]}
    rc, out = check_config(tmp_path, dict(base, backends=[
        {"name": "p", "url": "http://127.0.0.1:1", "role": "prefill"}]))
    assert rc == 1 and "backends[0].role: prefill pods need a pod that decodes" in out, out
    rc, out = check_config(tmp_path, dict(base, backends=[
        {"name": "p", "url": "http://127.0.0.1:1", "role": "prefil"}]))
    assert rc == 1 and 'unknown role "prefil"' in out, out
    rc, out = check_config(tmp_path, dict(base, backends=[
        {"name": "p", "url": "http://127.0.0.1:1", "role": "prefill"},
        {"name": "b", "url": "http://127.0.0.1:2"}], pd={"mode": "auto"}))
    assert rc == 0, out
    rc, out = check_config(tmp_path, dict(base, backends=[
        {"name": "b", "url": "http://127.0.0.1:2"}], pd={"mode": "sometimes"}))
    assert rc == 1 and 'pd.mode: unknown mode "sometimes"' in out, out


def test_reload_applies_roles_and_mode(pods, router_factory):
    pf, dc = pods
    cfg = pd_config(pf, dc, mode="never")
    router = router_factory(cfg)
    assert post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG}).status == 200
    assert v1_log(pf[0]) == [] and v1_log(pf[1]) == []
    cfg["pd"]["mode"] = "always"
    cfg["backends"][1]["role"] = "decode"   # pf-2 decodes from now on
    with open(router.path, "w") as f:
        json.dump(cfg, f)
    router.send_signal(1)
    wait_for(lambda: "config reloaded" in router.stderr_text(), what="the reload")
    # The workers take the new config at their next turn: poll until one request shows it.
    n = [0]

    def remote():
        n[0] += 1
        r = post(router, "/v1/completions", {"model": "stub-model", "prompt": LONG + str(n[0])})
        assert r.status == 200, r
        return r.header("x-pcrouter-prefill")
    assert wait_for(remote, what="a remote prefill after the reload") == "pf-1"
    assert metric(get_metrics(router), "pcrouter_pd_decisions_total", outcome="remote_prefill") >= 1


# ---- through vllm_sim --role ------------------------------------------------------------------

class Sim:
    def __init__(self, *args):
        self.p = subprocess.Popen([SIM, *args], stderr=subprocess.PIPE)
        self.err = LineReader(self.p.stderr, "vllm_sim")
        assert self.err.wait_line(r"ready", 15) is not None, self.err.text()
        self.ports = [int(m.group(1)) for m in
                      (re.search(r"listening on 127\.0\.0\.1:(\d+)", l) for l in self.err.lines) if m]

    def metrics(self, i):
        return curl("http://127.0.0.1:%d/metrics" % self.ports[i]).body.decode()

    def close(self):
        self.p.terminate()
        self.p.wait(10)


@pytest.fixture
def sim():
    s = Sim("--port", "0", "--port", "0", "--port", "0", "--role", "prefill,decode,decode",
            "--kv-advertise-host", "10.255.255.1", "--time-scale", "20", "--engine", "step")
    yield s
    s.close()


def test_sim_decode_pulls_what_prefill_computed(sim, router_factory):
    names = ["sp", "sd1", "sd2"]
    roles = ["prefill", "decode", "decode"]
    cfg = make_config([{"name": n, "url": "http://127.0.0.1:%d" % p, "role": r}
                       for n, p, r in zip(names, sim.ports, roles)], workers=1)
    cfg["pd"] = {"mode": "always"}
    router = router_factory(cfg)
    wait_for(lambda: all("backend %s serves 1 model" % n in router.stderr_text() for n in names),
             what="the pods' model lists")
    body = {"model": "sim-8b", "prompt": LONG, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    r = post(router, "/v1/completions", body)
    assert r.status == 200, r
    usage = json.loads(sse_events(r.body)[-2])["usage"]
    decode = names.index(r.header("x-pcrouter-backend"))
    dm = sim.metrics(decode)
    # The decode pod pulled every full block of the prompt, with the parameters it checked
    # (remote_host the address pcrouter used: the prefill pod advertised 10.255.255.1).
    assert metric(dm, "vllm_sim:kv_pulls_total") == 1
    assert metric(dm, "vllm_sim:kv_pull_invalid_total") == 0
    assert metric(dm, "vllm_sim:kv_pulled_tokens_total") == usage["prompt_tokens"] // 16 * 16
    assert metric(sim.metrics(0), "vllm_sim:kv_handed_total") == 1
    # The client hears the prefill pod's cached tokens (a cold prompt: none), not the pull.
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    # The same parameters straight to the decode pod, with the advertised host: refused, and
    # the pod prefills itself.
    bad = dict(body, kv_transfer_params={
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1],
        "remote_engine_id": "sim-engine-pod-0", "remote_request_id": "cmpl-pod-0-1",
        "remote_host": "10.255.255.1", "remote_port": sim.ports[0], "tp_size": 1})
    r = curl("http://127.0.0.1:%d/v1/completions" % sim.ports[decode],
             data=json.dumps(bad).encode())
    assert r.status == 200
    assert metric(sim.metrics(decode), "vllm_sim:kv_pull_invalid_total") == 1
    assert metric(sim.metrics(decode), "vllm_sim:kv_pulls_total") == 1
