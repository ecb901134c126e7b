"""Routing by model: what each pod serves is learned from its GET /v1/models (joined with the
config's `models`), so a request goes only to pods serving its model, and a model nobody serves
gets 404 model_not_found naming it."""
import json

from conftest import assert_error, completion, curl, wait_for


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
