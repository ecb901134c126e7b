"""Routing by model: what each pod serves is learned from its GET /v1/models (joined with the
config's `models`), so a request goes only to pods serving its model, and a model nobody serves
gets 404 model_not_found naming it."""
import json
import threading
import time

from attack import sanitized
from conftest import PCROUTER, QUIET_SCRAPE, assert_error, completion, curl, make_config, wait_for

# A sanitizer build runs the merge unoptimised and instrumented: its bounds are wider (the
# quadratic merge took minutes even in release).
SLOW = 6 if sanitized(PCROUTER) or sanitized(PCROUTER, "tsan") else 1


def pod_of(resp):
    assert resp.status == 200, resp
    return resp.json()["stub"]["pod"]


def test_models_learned_from_pods(cluster):
    c = cluster(2, policy="round_robin", models=[["llama-a"], ["llama-b", "lora-x"]])
    # Until a pod answers it may serve anything; once both have, only the right one is picked.
    wait_for(lambda: all(pod_of(curl(c.url("/v1/completions"), completion("q", model="lora-x"))) == "pod-b"
                         for _ in range(4)), 15, what="lora-x routed to pod-b only")
    for _ in range(6):
        assert pod_of(curl(c.url("/v1/completions"), completion("q", model="llama-a"))) == "pod-a"
        assert pod_of(curl(c.url("/v1/completions"), completion("q", model="lora-x"))) == "pod-b"
    r = curl(c.url("/v1/completions"), completion("q", model="no-such-model"))
    assert_error(r, 404, "model_not_found")
    assert "no-such-model" in r.json()["error"]["message"]
    # A request that names no model may go anywhere.
    body = {"prompt": "no model here", "max_tokens": 4}
    pods = {pod_of(curl(c.url("/v1/completions"), body)) for _ in range(6)}
    assert pods == {"pod-a", "pod-b"}, pods


def test_config_models_join_the_pods_list(stub_factory, router_factory):
    from conftest import make_config
    a = stub_factory("pod-a", ["base"])
    b = stub_factory("pod-b", ["base"])
    cfg = make_config([{"name": "pod-a", "url": a.url, "models": ["extra"]},
                       {"name": "pod-b", "url": b.url}], routing={"policy": "round_robin"})
    r = router_factory(cfg)
    # pod-b serves "extra" only until its own list (without it) is known.
    wait_for(lambda: all(pod_of(curl(r.url("/v1/completions"), completion("q", model="extra"))) == "pod-a"
                         for _ in range(4)), 15, what="extra routed to pod-a only")
    for _ in range(4):
        assert pod_of(curl(r.url("/v1/completions"), completion("q", model="extra"))) == "pod-a"


def test_models_read_again_as_pods_change(cluster):
    """A pod that starts serving a new model (a LoRA adapter loaded) gets its requests once its
    list is read again (scrape.models_interval_ms); one it stopped serving no longer reaches it."""
    c = cluster(2, policy="round_robin", models=[["base"], ["base"]],
                scrape={"models_interval_ms": 200})
    wait_for(lambda: curl(c.url("/v1/completions"), completion("q", model="lora-new")).status == 404,
             15, what="lora-new unknown everywhere")
    c.by_name["pod-b"].configure(models=["base", "lora-new"])
    wait_for(lambda: curl(c.url("/v1/completions"), completion("q", model="lora-new")).status == 200,
             15, what="lora-new learned from pod-b")
    for _ in range(4):
        assert pod_of(curl(c.url("/v1/completions"), completion("q", model="lora-new"))) == "pod-b"
    c.by_name["pod-b"].configure(models=["lora-new"])
    wait_for(lambda: all(pod_of(curl(c.url("/v1/completions"), completion("q", model="base")))
                         == "pod-a" for _ in range(4)), 15, what="base only on pod-a")


# ---- the router's own GET /v1/models against hostile pods --------------------------------

def model_list(ids):
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()


def raw_models_pod(models_answer):
    """A RawPod answering GET /v1/models with `models_answer` (bytes, or a socket writer) and
    anything else with a small completion."""
    from attack_pod import RawPod, ok_response

    def respond(req):
        if req["target"] == "/v1/models":
            if callable(models_answer):
                return models_answer
            return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % len(models_answer)) + models_answer
        return ok_response()
    return RawPod(respond)


def timed_get(url, timeout=30):
    t0 = time.monotonic()
    r = curl(url, timeout=timeout)
    return r, time.monotonic() - t0


def test_models_merge_of_100k_lists_is_fast(router_factory):
    """Two pods listing 100,000 models each, half of them shared: the union (150,000 ids, each
    once, in the pods' order) comes within 10 s (release), and a one-worker router serves completions
    meanwhile. The merge compared every id with every id kept so far (a worker pinned for
    minutes)."""
    a = raw_models_pod(model_list("m%06d" % i for i in range(100000)))
    b = raw_models_pod(model_list("m%06d" % i for i in range(50000, 150000)))
    try:
        r = router_factory(make_config([("pod-a", a.url), ("pod-b", b.url)], workers=1,
                                       health={"interval_ms": 0}, scrape=QUIET_SCRAPE))
        out = {}
        t = threading.Thread(target=lambda: out.update(zip(("resp", "secs"),
                                                           timed_get(r.url("/v1/models")))))
        t.start()
        slowest = 0.0
        while t.is_alive():
            t0 = time.monotonic()
            assert curl(r.url("/v1/completions"), completion("meanwhile"), timeout=30).status == 200
            slowest = max(slowest, time.monotonic() - t0)
        t.join()
        resp = out["resp"]
        assert resp.status == 200 and out["secs"] < 10 * SLOW, (resp.status, out["secs"])
        ids = [m["id"] for m in resp.json()["data"]]
        assert ids == ["m%06d" % i for i in range(150000)], (len(ids), ids[:3], ids[-3:])
        assert slowest < 5 * SLOW, "a completion waited %.1f s behind the merge" % slowest
    finally:
        a.close()
        b.close()


def test_models_pod_that_never_answers_is_left_out(stub_factory, router_factory):
    """A pod that never answers GET /v1/models: the answer comes at scrape.models_timeout_ms
    with the other pod's list (it waited for the pod's response_ms, ten minutes by default)."""
    from attack_pod import stall_until_closed
    good = stub_factory("pod-a", ["good-model"])
    bad = raw_models_pod(stall_until_closed)
    try:
        r = router_factory(make_config([good, ("pod-b", bad.url)], health={"interval_ms": 0},
                                       scrape={"interval_ms": 0, "models_interval_ms": 0,
                                               "models_timeout_ms": 500}))
        resp, secs = timed_get(r.url("/v1/models"), timeout=20)
        assert resp.status == 200 and secs < 5, (resp, secs)
        assert [m["id"] for m in resp.json()["data"]] == ["good-model"], resp.body
    finally:
        bad.close()
    # None answering: 504.
    only = raw_models_pod(stall_until_closed)
    try:
        r = router_factory(make_config([("pod-c", only.url)], health={"interval_ms": 0},
                                       scrape={"interval_ms": 0, "models_interval_ms": 0,
                                               "models_timeout_ms": 300}))
        resp, secs = timed_get(r.url("/v1/models"), timeout=20)
        assert_error(resp, 504, "gateway_timeout")
        assert secs < 5, secs
    finally:
        only.close()


def test_models_endless_body_is_cut_at_the_cap(stub_factory, router_factory):
    """A pod whose /v1/models body never ends: the read stops at the 4 MiB cap (the connection
    closed, the pod's writes fail), and the answer comes with the other pod's list. The router
    used to read on until the pod stopped."""
    from attack_pod import EndlessBody
    good = stub_factory("pod-a", ["good-model"])
    endless = EndlessBody()
    bad = raw_models_pod(endless)
    try:
        r = router_factory(make_config([good, ("pod-b", bad.url)], health={"interval_ms": 0},
                                       scrape={"interval_ms": 0, "models_interval_ms": 0,
                                               "models_timeout_ms": 30000}))
        resp, secs = timed_get(r.url("/v1/models"), timeout=20)
        assert resp.status == 200 and secs < 10, (resp, secs)
        assert [m["id"] for m in resp.json()["data"]] == ["good-model"], resp.body
        assert endless.ended.wait(10), "the pod is still writing: %d bytes" % endless.sent
        assert endless.error in ("BrokenPipeError", "ConnectionResetError"), endless.error
        assert endless.sent < 16 << 20, endless.sent
    finally:
        bad.close()
