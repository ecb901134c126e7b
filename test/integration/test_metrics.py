"""test_metrics.py: /metrics under scripted scenarios, each metric moving the way it should:
a repeated prompt raises matched blocks and delivered cached tokens, a killed pod drops
backend_up, a small capacity makes the index evict, a pod's KV usage shows; the exposition
passes `promtool check metrics` after traffic; docs/METRICS.md lists every metric, once."""
import os
import re
import subprocess
import sys

import pytest

from conftest import (BUILD, CurlStream, PCROUTER, ROOT, completion, curl, get_metrics,
                      make_config, metric, parse_metrics, sse_events, wait_for)

sys.path.insert(0, os.path.join(ROOT, "bench"))
import routing  # noqa: E402


def families(text):
    """{name: type} from the # TYPE lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def traffic(url_of):
    """A bit of everything: routed and not, streamed and not, h1 and h2c, errors."""
    prompt = "a shared system prompt that many requests repeat. " * 30
    for proto in ("h1", "h2c", "h1"):
        assert curl(url_of("/v1/completions"), completion(prompt), proto=proto).status == 200
    s = CurlStream(url_of("/v1/chat/completions"),
                   {"model": "stub-model", "stream": True, "messages": [{"role": "user", "content": prompt}]})
    assert s.finish()[0] == 0
    assert curl(url_of("/v1/embeddings"), {"model": "stub-model", "input": "x"}).status == 200
    assert curl(url_of("/v1/models")).status == 200
    assert curl(url_of("/v1/completions"), {"model": "stub-model"}).status == 400
    assert curl(url_of("/nowhere")).status == 404


def promtool_check(text):
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True,
                       timeout=60)
    return p.returncode, (p.stdout + p.stderr).decode()


def test_promtool_accepts_the_exposition_after_traffic(stub_factory, router_factory):
    a, b = stub_factory("pod-a"), stub_factory('pod "b"\\')  # a name that needs escaping
    a.configure(kv_usage=0.5)
    r = router_factory(make_config([a, b], routing={"policy": "cache_aware"},
                                   upstream={"request_usage": True}))
    traffic(r.url)
    text = wait_for(lambda: (lambda t: "pcrouter_backend_kv_cache_usage_ratio{" in t and t)(get_metrics(r)),
                    10, what="the KV usage scraped")
    rc, out = promtool_check(text)
    assert rc == 0 and out.strip() == "", out
    assert metric(text, "pcrouter_backend_up", backend='pod \\"b\\"\\\\') == 1, "label not escaped"
    # Every histogram's buckets are cumulative and end with +Inf = _count.
    for name, kind in families(text).items():
        if kind != "histogram":
            continue
        series = {}
        for n, labels, v in parse_metrics(text):
            if n == name + "_bucket":
                key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                series.setdefault(key, []).append((labels["le"], v))
        assert series, name
        for key, buckets in series.items():
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (name, key)
            assert buckets[-1][0] == "+Inf"
            assert metric(text, name + "_count", **dict(key)) == counts[-1], (name, key)


def test_build_info_names_this_binary(cluster):
    c = cluster(1)
    text = get_metrics(c.router)
    out = subprocess.run([PCROUTER, "--version"], capture_output=True, text=True).stdout
    version = re.match(r"pcrouter (\S+)", out).group(1)
    commit = re.search(r"commit:\s+(\S+)", out).group(1)
    assert metric(text, "pcrouter_build_info", version=version, commit=commit) == 1


def test_repeated_prompt_raises_matched_blocks_and_delivered_tokens(cluster):
    c = cluster(2, policy="cache_aware")
    prompt = "you are a careful assistant; here are the rules. " * 60
    before = get_metrics(c.router)
    assert metric(before, "pcrouter_prefix_blocks_matched_total") == 0
    r1 = curl(c.url("/v1/completions"), completion(prompt))
    pod = r1.header("x-pcrouter-backend")
    t1 = get_metrics(c.router)
    assert metric(t1, "pcrouter_cached_tokens_delivered_total", backend=pod) == 0
    assert metric(t1, "pcrouter_prompt_tokens_total", backend=pod) == r1.json()["usage"]["prompt_tokens"]
    r2 = curl(c.url("/v1/completions"), completion(prompt))
    assert r2.header("x-pcrouter-backend") == pod and r2.header("x-pcrouter-route") == "warm"
    t2 = get_metrics(c.router)
    delivered = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert delivered > 0
    assert metric(t2, "pcrouter_prefix_blocks_matched_total") > 0
    assert metric(t2, "pcrouter_cached_tokens_delivered_total", backend=pod) == delivered
    predicted = metric(t2, "pcrouter_cached_tokens_predicted_total", backend=pod)
    assert predicted >= delivered > 0
    # Two observations; the first (cold, nothing predicted or delivered) is an error of 0.
    assert metric(t2, "pcrouter_cached_tokens_error_count") == 2
    assert metric(t2, "pcrouter_cached_tokens_error_sum") == predicted - delivered
    assert metric(t2, "pcrouter_cached_tokens_error_bucket", le="0") >= 1
    # Every routed request's decision was timed, in each phase.
    for phase in ("parse", "hash", "match", "cost", "total"):
        assert metric(t2, "pcrouter_route_decision_seconds_count", phase=phase) == 2
        assert metric(t2, "pcrouter_route_decision_seconds_sum", phase=phase) > 0
    # total runs from the last body byte: the reader's last step (hash), then the policy.
    assert (metric(t2, "pcrouter_route_decision_seconds_sum", phase="total") >=
            metric(t2, "pcrouter_route_decision_seconds_sum", phase="hash") +
            metric(t2, "pcrouter_route_decision_seconds_sum", phase="match") +
            metric(t2, "pcrouter_route_decision_seconds_sum", phase="cost") - 1e-6)


def test_a_pod_that_says_less_than_predicted_shows_as_error(cluster):
    c = cluster(1, policy="cache_aware")
    prompt = "a prefix the pod has forgotten. " * 80
    assert curl(c.url("/v1/completions"), completion(prompt)).status == 200
    r = curl(c.url("/v1/completions"), completion(prompt, cached_tokens=0))  # the pod lost it
    assert r.header("x-pcrouter-route") == "warm"
    text = get_metrics(c.router)
    predicted = metric(text, "pcrouter_cached_tokens_predicted_total", backend="pod-a")
    assert predicted > 256
    assert metric(text, "pcrouter_cached_tokens_delivered_total", backend="pod-a") == 0
    assert metric(text, "pcrouter_cached_tokens_error_sum") == predicted
    assert metric(text, "pcrouter_cached_tokens_error_bucket", le="256") == 1  # the cold one
    # A pod that reports no prompt_tokens_details is no observation at all.
    assert curl(c.url("/v1/completions"), completion(prompt, usage="plain")).status == 200
    assert metric(get_metrics(c.router), "pcrouter_cached_tokens_error_count") == 2


@pytest.mark.parametrize("feedback", [True, False])
def test_a_mispredicted_pod_makes_the_index_forget(cluster, feedback):
    """A pod that delivers less than predicted evicted the missing blocks, and everything it
    used before them (its cache is an LRU): with feedback the index forgets those for it, so an
    older prefix is no longer sent as warm; without, the index goes on believing it."""
    c = cluster(1, policy="cache_aware", routing={"feedback": feedback})
    older = "an older system prompt the pod served first. " * 60
    newer = "a newer system prompt the pod served next, then lost. " * 60
    assert curl(c.url("/v1/completions"), completion(older)).status == 200
    assert curl(c.url("/v1/completions"), completion(newer)).status == 200
    r = curl(c.url("/v1/completions"), completion(newer, cached_tokens=0))
    assert r.status == 200 and r.header("x-pcrouter-route") == "warm"
    again = curl(c.url("/v1/completions"), completion(older))
    assert again.status == 200
    assert again.header("x-pcrouter-route") == ("cold" if feedback else "warm"), again.headers
    # The request that was served whole is known again: the pod computed and now holds it.
    assert curl(c.url("/v1/completions"), completion(newer)).header("x-pcrouter-route") == "warm"


def test_a_short_answer_while_its_prefix_is_on_the_way_is_no_eviction(cluster):
    """The request that brings a prefix is still in the pod's queue (its prefill gate is shut)
    when another with the same prefix comes back with nothing cached: the pod had not computed
    the prefix yet, which says nothing of what it evicted, so the index keeps the older prefixes
    the pod served first. Once the bringer has its first token, the same answer is an eviction
    again, and an older prefix is forgotten."""
    c = cluster(1, policy="cache_aware")
    stub = c.stubs[0]
    older = "an older system prompt the pod served first. " * 60
    other = "another older system prompt, served next. " * 60
    shared = "a system prompt on its way to the pod, still queued there. " * 60
    assert curl(c.url("/v1/completions"), completion(older)).status == 200
    assert curl(c.url("/v1/completions"), completion(other)).status == 200
    bringer = CurlStream(c.url("/v1/completions"),
                         completion(shared + "the first user", stream=True, tag="bringer",
                                    prefill_gate="g"))
    try:
        wait_for(lambda: any(e.get("tag") == "bringer" for e in stub.stats()["log"]), 15,
                 what="the bringer at the pod")
        r = curl(c.url("/v1/completions"), completion(shared + "the second", cached_tokens=0))
        assert r.status == 200 and r.header("x-pcrouter-route") == "warm", r.headers
        again = curl(c.url("/v1/completions"), completion(older))
        assert again.header("x-pcrouter-route") == "warm", again.headers
    finally:
        stub.release("g")
        rc, out = bringer.finish(30)
    assert rc == 0 and b"[DONE]" in out
    r = curl(c.url("/v1/completions"), completion(shared + "the third", cached_tokens=0))
    assert r.status == 200 and r.header("x-pcrouter-route") == "warm", r.headers
    # `other` was last sent before the second request, the last to use the shared prefix.
    again = curl(c.url("/v1/completions"), completion(other))
    assert again.header("x-pcrouter-route") == "cold", again.headers


def test_request_usage_reads_streams_the_client_never_asked_about(cluster):
    c = cluster(1, policy="cache_aware", upstream={"request_usage": True})
    stub = c.stubs[0]
    prompt = "stream me the answer, and count my cached tokens. " * 40
    for proto in ("h1", "h2c"):
        s = CurlStream(c.url("/v1/completions"), completion(prompt, stream=True), proto=proto)
        rc, out = s.finish()
        assert rc == 0
        events = sse_events(out.split(b"\r\n\r\n", 1)[1])
        assert events[-1] == "[DONE]" and len(events) == 5, events
        assert all("usage" not in e for e in events), events  # what it would have got without
        assert stub.stats()["log"][-1]["include_usage"] is True
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_cached_tokens_error_count") == 2
    assert metric(text, "pcrouter_cached_tokens_delivered_total", backend="pod-a") > 0
    # A client that asked for usage gets it, untouched.
    body = completion(prompt, stream=True)
    body["stream_options"] = {"include_usage": True}
    rc, out = CurlStream(c.url("/v1/completions"), body).finish()
    events = sse_events(out.split(b"\r\n\r\n", 1)[1])
    assert '"choices": []' in events[-2] and '"cached_tokens"' in events[-2], events
    assert metric(get_metrics(c.router), "pcrouter_cached_tokens_error_count") == 3


def test_without_request_usage_streams_are_left_alone(cluster):
    c = cluster(1, policy="cache_aware")
    stub = c.stubs[0]
    s = CurlStream(c.url("/v1/completions"), completion("plain stream " * 50, stream=True))
    rc, out = s.finish()
    assert rc == 0
    assert stub.stats()["log"][-1]["include_usage"] is False
    assert stub.stats()["log"][-1]["body_bytes"] == len(
        __import__("json").dumps(completion("plain stream " * 50, stream=True)))
    assert metric(get_metrics(c.router), "pcrouter_cached_tokens_error_count") == 0


def test_killed_pod_drops_backend_up(cluster):
    c = cluster(2)
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_backend_up", backend="pod-a") == 1
    assert metric(text, "pcrouter_backend_up", backend="pod-b") == 1
    c.by_name["pod-b"].close()
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_backend_up", backend="pod-b") == 0, 15,
             what="pod-b down")
    assert metric(get_metrics(c.router), "pcrouter_backend_up", backend="pod-a") == 1


def test_small_capacity_makes_the_index_evict(stub_factory, router_factory):
    stub = stub_factory("pod-a")
    # 256 tokens of capacity: 4 blocks of 256 bytes.
    r = router_factory(make_config([{"name": "pod-a", "url": stub.url, "capacity_tokens": 256}],
                                   routing={"policy": "cache_aware"}))
    assert metric(get_metrics(r), "pcrouter_index_evictions_total") == 0
    for i in range(3):
        assert curl(r.url("/v1/completions"), completion(("prompt %d " % i) * 300)).status == 200
    # Each prompt holds more than 4 blocks: all but 4 of them were evicted, counted on a tick.
    wait_for(lambda: metric(get_metrics(r), "pcrouter_index_evictions_total") >= 3 * 9 - 4, 10,
             what="evictions counted")
    assert metric(get_metrics(r), "pcrouter_index_blocks", backend="pod-a") <= 4


def test_kv_cache_usage_follows_the_pod(cluster):
    c = cluster(2)
    a = c.by_name["pod-a"]
    assert "pcrouter_backend_kv_cache_usage_ratio{" not in get_metrics(c.router)  # no pod says
    a.configure(kv_usage=0.25)
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_backend_kv_cache_usage_ratio",
                            backend="pod-a") == 0.25, 10, what="the usage scraped")
    a.configure(kv_usage=0.875)
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_backend_kv_cache_usage_ratio",
                            backend="pod-a") == 0.875, 10, what="the new usage scraped")
    assert metric(get_metrics(c.router), "pcrouter_backend_kv_cache_usage_ratio", backend="pod-b") is None


def test_simulated_pods_deliver_cached_tokens_through_streams(tmp_path):
    """The same through vllm_sim, which reports usage as vLLM does, streaming and not."""
    sims = router = None
    try:
        sims = routing.Sims(BUILD, ["sim-a", "sim-b"], 50)
        cfg = routing.router_config(sims.urls, "cache_aware")
        cfg["upstream"] = {"request_usage": True}
        cfg["scrape"] = {"interval_ms": 100}
        router = routing.Router(BUILD, cfg, str(tmp_path))
        prompt = "a long agent system prompt, with tools and rules. " * 100
        for stream in (False, True, True):
            body = {"model": "sim-8b", "prompt": prompt, "max_tokens": 4}
            if stream:
                body["stream"] = True
                rc, out = CurlStream(router.url + "/v1/completions", body).finish()
                assert rc == 0 and b"usage" not in out, out[-500:]
            else:
                resp = curl(router.url + "/v1/completions", body)
                assert resp.status == 200, resp
        text = curl(router.url + "/metrics").body.decode()
        delivered = sum(v for n, l, v in parse_metrics(text) if n == "pcrouter_cached_tokens_delivered_total")
        prompt_tokens = sum(v for n, l, v in parse_metrics(text) if n == "pcrouter_prompt_tokens_total")
        assert metric(text, "pcrouter_cached_tokens_error_count") == 3
        assert 0 < delivered < prompt_tokens
        wait_for(lambda: (lambda t: all(metric(t, "pcrouter_backend_kv_cache_usage_ratio", backend=n) is not None
                                        for n in sims.urls))(curl(router.url + "/metrics").body.decode()),
                 10, what="both pods' KV usage")
    finally:
        if router:
            router.stop()
        if sims:
            sims.stop()


def readme_metrics():
    """The metric names docs/METRICS.md's tables list (first column, labels left out), in
    order, one entry per mention."""
    with open(os.path.join(ROOT, "docs", "METRICS.md")) as f:
        text = f.read()
    names = []
    for row in text.splitlines():
        if row.startswith("| `pcrouter_"):
            names += re.findall(r"`(pcrouter_[a-z0-9_]+)", row.split("|")[1])
    return names


def test_metrics_doc_lists_every_metric_once(cluster):
    c = cluster(1, policy="cache_aware")
    traffic(c.url)
    exported = set(families(get_metrics(c.router)))
    mentions = readme_metrics()
    listed = set(mentions)
    twice = sorted({n for n in mentions if mentions.count(n) > 1})
    assert not twice, "listed more than once in docs/METRICS.md: %s" % twice
    assert exported - listed == set(), "not in docs/METRICS.md's tables: %s" % sorted(exported - listed)
    assert listed - exported == set(), "in docs/METRICS.md but not exported: %s" % sorted(listed - exported)


def test_a_pod_claiming_absurd_cached_tokens_is_bounded_by_the_prompt(cluster):
    """A pod reporting 1e12 cached tokens for a small prompt: the per-request figures (the
    delivered counter, the error histogram) take at most the prompt's tokens."""
    c = cluster(1, policy="cache_aware")
    assert curl(c.url("/v1/completions"), completion("small prompt", cached_tokens=10 ** 12)).status == 200
    text = get_metrics(c.router)
    prompt = metric(text, "pcrouter_prompt_tokens_total", backend="pod-a")
    assert 0 < prompt < 100, text
    assert metric(text, "pcrouter_cached_tokens_delivered_total", backend="pod-a") == prompt, text
