"""Routing in the router: 4 stub pods that say which one answered.

cache_aware (the default policy) keeps a conversation on one pod, keeps each shared system
prompt on its pod while load allows, spreads prompts over all pods, spills away from an
overloaded warm pod; round_robin spreads the same traffic evenly. Prompt contents come from
fixed seeds, so every run sends the same bytes."""
import random

from conftest import CurlStream, chat, completion, curl, get_metrics, metric, split_head, wait_for

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu kernel cache "
         "prefix token router backend latency throughput shard replica tensor matrix vector").split()


def text(rng, nbytes):
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def send(c, path, body):
    r = curl(c.url(path), body)
    assert r.status == 200, r
    pod = r.header("x-pcrouter-backend")
    assert pod == r.json()["stub"]["pod"], r
    return pod, r.header("x-pcrouter-route")


def test_conversation_turns_stay_on_one_backend(cluster):
    c = cluster(4, policy=None)  # the default policy: cache_aware
    rng = random.Random(3)
    convs = [[{"role": "system", "content": "conv %d: %s" % (i, text(rng, 1024))}] for i in range(6)]
    placed = [[] for _ in convs]
    for turn in range(10):
        for i, msgs in enumerate(convs):
            msgs.append({"role": "user", "content": text(rng, 1536)})
            pod, route = send(c, "/v1/chat/completions", chat(msgs, tag="c%d-t%d" % (i, turn)))
            placed[i].append((pod, route))
            msgs.append({"role": "assistant", "content": text(rng, 512)})
    for i, turns in enumerate(placed):
        pods = {p for p, _ in turns}
        assert len(pods) == 1, "conversation %d moved between pods: %r" % (i, turns)
        assert turns[0][1] == "cold", turns
        assert all(r == "warm" for _, r in turns[1:]), turns
    homes = {turns[0][0] for turns in placed}
    assert len(homes) >= 2, "6 conversations all placed on one pod: %r" % homes
    m = get_metrics(c.router)
    assert (metric(m, "pcrouter_route_decisions_total", policy="cache_aware", reason="warm") or 0) >= 54, m


def test_completion_prompt_extensions_stay_on_one_backend(cluster):
    c = cluster(4, policy="cache_aware")
    rng = random.Random(4)
    prompt = text(rng, 3072)
    pods = []
    for turn in range(10):
        prompt += "\nUser: " + text(rng, 1024) + "\nAssistant:"
        pods.append(send(c, "/v1/completions", completion(prompt)))
        prompt += " " + text(rng, 256)
    assert len({p for p, _ in pods}) == 1, pods
    assert all(r == "warm" for _, r in pods[1:]), pods


def system_prompt_traffic(seed, nprompts=8, users=6):
    rng = random.Random(seed)
    systems = ["system prompt %d: %s" % (i, text(rng, 4096)) for i in range(nprompts)]
    reqs = [(i, u, text(rng, 300 + rng.randrange(700))) for i in range(nprompts) for u in range(users)]
    rng.shuffle(reqs)
    return systems, reqs


def test_system_prompts_stay_on_their_backend(cluster):
    c = cluster(4, policy="cache_aware")
    systems, reqs = system_prompt_traffic(5)
    where = {}
    for i, u, question in reqs:
        msgs = [{"role": "system", "content": systems[i]}, {"role": "user", "content": "user %d: %s" % (u, question)}]
        where.setdefault(i, []).append(send(c, "/v1/chat/completions", chat(msgs)))
    for i, placed in where.items():
        assert len({p for p, _ in placed}) == 1, "system prompt %d moved: %r" % (i, placed)
        assert all(r == "warm" for _, r in placed[1:]), placed
    homes = [placed[0][0] for placed in where.values()]
    assert len(set(homes)) >= 2, homes
    assert max(homes.count(h) for h in set(homes)) <= 5, "one pod is home to most prompts: %r" % homes
    m = get_metrics(c.router)
    assert metric(m, "pcrouter_prefix_blocks_matched_total") > 0, m


def hold(c, path, body, expect_active):
    """Starts a request the pods hold (gate "hold"), waits until it reached a pod."""
    cs = CurlStream(c.url(path), body)
    wait_for(lambda: sum(s.stats()["active"] for s in c.stubs) >= expect_active, 15,
             what="%d requests held by the pods" % expect_active)
    return cs


def collect(streams):
    out = []
    for cs in streams:
        rc, raw = cs.finish(30)
        status, hdrs, body = split_head(raw)
        assert rc == 0 and " 200" in status, raw[:500]
        out.append((hdrs.get("x-pcrouter-backend"), hdrs.get("x-pcrouter-route")))
    return out


def test_system_prompts_spread_over_all_backends(cluster):
    """Two users of each of 8 system prompts arrive while the earlier ones are still being
    answered. The ring places each new prompt under routing.load_factor (1.25) on blocks held:
    a pod takes one only while it holds at most 1.25 times the mean, so the first four go to four
    pods and none is home to more than 3 of the 8. The second users follow their prompt warm:
    16 in flight are far under the in-flight bound (inflight_factor 3: 12 a pod), so a pod holds
    exactly its prompts' users, up to 6.

    Each request waits for the one before it to reach its pod and for its prefill, as the router
    reckons it, to be done (the queued prefill gauge at 0). A prompt's prefill still counted
    queued makes a cold prompt pass its pod over and may move a warm one off it, so without the
    wait the placements would follow the machine's speed (hashring test_policy.c runs both)."""
    c = cluster(4, policy="cache_aware")
    systems, _ = system_prompt_traffic(6)
    streams = []

    def prefill_done():
        return metric(get_metrics(c.router), "pcrouter_backend_queued_prefill_tokens") == 0

    try:
        for u in range(2):
            for i, sp in enumerate(systems):
                msgs = [{"role": "system", "content": sp}, {"role": "user", "content": "user %d of %d" % (u, i)}]
                streams.append(hold(c, "/v1/chat/completions", chat(msgs, gate="hold"), len(streams) + 1))
                wait_for(prefill_done, 15, what="the router's queued prefill at 0")
        active = {s.name: s.stats()["active"] for s in c.stubs}
        c.release_all()
        placed = collect(streams)
    finally:
        c.release_all()
        for cs in streams:
            cs.kill()
    first, second = placed[:len(systems)], placed[len(systems):]
    assert all(r == "cold" for _, r in first), placed
    homes = {n: [p for p, _ in first].count(n) for n in c.by_name}
    assert len({p for p, _ in first[:4]}) == 4, "the first 4 prompts did not go to 4 pods: %r" % placed
    assert all(1 <= h <= 3 for h in homes.values()), "prompts over the blocks-held bound: %r" % homes
    assert second == [(p, "warm") for p, _ in first], "a second user left its prompt's pod: %r" % placed
    assert active == {n: 2 * h for n, h in homes.items()}, (active, placed)


def test_overloaded_warm_backend_spills(cluster):
    c = cluster(4, policy="cache_aware")
    rng = random.Random(7)
    shared = "shared context: " + text(rng, 8192)
    home, route = send(c, "/v1/completions", completion(shared + " warmup"))
    again, route2 = send(c, "/v1/completions", completion(shared + " second"))
    assert again == home and route2 == "warm", (home, again, route2)
    streams = []
    try:
        for k in range(8):
            streams.append(hold(c, "/v1/completions", completion(shared + " slow user %d" % k, gate="hold"), k + 1))
        held = {s.name: s.stats()["active"] for s in c.stubs}
        c.release_all()
        placed = collect(streams)
    finally:
        c.release_all()
        for cs in streams:
            cs.kill()
    assert placed[0] == (home, "warm"), placed
    assert held[home] < 8, "all 8 slow requests piled onto the warm pod %s: %r" % (home, held)
    spilled = [p for p in placed if p[0] != home]
    assert spilled, placed
    assert any(r == "overload_spill" for _, r in placed), placed
    m = get_metrics(c.router)
    assert metric(m, "pcrouter_route_decisions_total", policy="cache_aware", reason="overload_spill") >= 1, m
    # Once the load is gone, the prefix goes back to a pod that holds it.
    pod, route = send(c, "/v1/completions", completion(shared + " after the burst"))
    assert route == "warm", (pod, route)


def test_round_robin_spreads_same_traffic_evenly(cluster):
    # Round robin rotates per worker: an exact 1/4 split needs one.
    c = cluster(4, policy="round_robin", workers=1)
    systems, reqs = system_prompt_traffic(5, users=4)
    counts = {n: 0 for n in c.by_name}
    where = {}
    for i, u, question in reqs:
        msgs = [{"role": "system", "content": systems[i]}, {"role": "user", "content": "user %d: %s" % (u, question)}]
        pod, route = send(c, "/v1/chat/completions", chat(msgs))
        assert route == "round_robin", route
        counts[pod] += 1
        where.setdefault(i, set()).add(pod)
    assert set(counts.values()) == {len(reqs) // 4}, counts
    assert any(len(p) > 1 for p in where.values()), "round_robin kept prompts on one pod: %r" % where
    m = get_metrics(c.router)
    assert metric(m, "pcrouter_route_decisions_total", policy="round_robin", reason="round_robin") >= len(reqs), m


def test_prefix_metrics_grow(cluster):
    c = cluster(4, policy="cache_aware")
    rng = random.Random(9)
    m0 = get_metrics(c.router)
    matched0 = metric(m0, "pcrouter_prefix_blocks_matched_total") or 0
    total0 = metric(m0, "pcrouter_prefix_blocks_total") or 0
    base = text(rng, 4096)
    home, _ = send(c, "/v1/completions", completion(base))
    m1 = get_metrics(c.router)
    blocks1 = metric(m1, "pcrouter_prefix_blocks_total")
    assert blocks1 is not None and blocks1 >= total0 + 16, m1  # 4 KiB / 256-byte blocks
    for k in range(3):
        send(c, "/v1/completions", completion(base + " more %d" % k))
    m2 = get_metrics(c.router)
    matched = metric(m2, "pcrouter_prefix_blocks_matched_total")
    assert matched is not None and matched >= matched0 + 3 * 16, m2
    assert metric(m2, "pcrouter_prefix_blocks_total") >= blocks1 + 3 * 16, m2
    assert metric(m2, "pcrouter_index_bytes") > 0, m2
    assert metric(m2, "pcrouter_index_blocks", backend=home) >= 16, m2
    assert metric(m2, "pcrouter_route_decisions_total", policy="cache_aware", reason="cold") >= 1, m2
    assert metric(m2, "pcrouter_route_decisions_total", policy="cache_aware", reason="warm") >= 3, m2


def test_structured_prompts_route_consistently(cluster):
    """Token-id prompts, multi-part chat content and tools still give a stable prefix key."""
    c = cluster(4, policy="cache_aware")
    rng = random.Random(11)
    tokens = [rng.randrange(50000) for _ in range(2000)]
    first = send(c, "/v1/completions", completion(tokens))
    second = send(c, "/v1/completions", completion(tokens + [1, 2, 3]))
    assert second == (first[0], "warm"), (first, second)

    tools = [{"type": "function", "function": {"name": "lookup", "description": text(rng, 1500),
                                               "parameters": {"type": "object", "properties": {}}}}]
    parts = [{"type": "text", "text": text(rng, 2048)},
             {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
             {"type": "text", "text": text(rng, 1024)}]
    msgs = [{"role": "system", "content": text(rng, 512)}, {"role": "user", "content": parts}]
    body1 = chat(msgs)
    body1["tools"] = tools
    a = send(c, "/v1/chat/completions", body1)
    body2 = chat(msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}])
    body2["tools"] = tools
    b = send(c, "/v1/chat/completions", body2)
    assert b == (a[0], "warm"), (a, b)


def test_models_do_not_share_prefixes(cluster):
    c = cluster(4, policy="cache_aware", models=[["model-one", "model-two"]] * 4)
    prompt = text(random.Random(12), 4096)
    send(c, "/v1/completions", completion(prompt, model="model-one"))
    assert send(c, "/v1/completions", completion(prompt + " x", model="model-one"))[1] == "warm"
    assert send(c, "/v1/completions", completion(prompt + " x", model="model-two"))[1] == "cold"


def test_consistent_hash_policy(cluster):
    c = cluster(4, policy="consistent_hash")
    rng = random.Random(13)
    # Long shared prefixes (16 KiB), short different suffixes: the ring is keyed on the prefix.
    prompts = [text(rng, 16384) for _ in range(12)]
    homes = []
    for p in prompts:
        pod, route = send(c, "/v1/completions", completion(p))
        assert route == "hash", route
        homes.append(pod)
        assert send(c, "/v1/completions", completion(p)) == (pod, "hash")
        for k in range(2):
            assert send(c, "/v1/completions", completion(p + " again %d" % k)) == (pod, "hash")
    assert len(set(homes)) >= 2, homes


def test_least_loaded_policy(cluster):
    c = cluster(2, policy="least_loaded")
    cs = CurlStream(c.url("/v1/completions"), completion("busy", gate="hold"))
    try:
        busy = wait_for(lambda: next((s for s in c.stubs if s.stats()["active"]), None), 10, what="the held request")
        for i in range(4):
            pod, route = send(c, "/v1/completions", completion("light %d" % i))
            assert route == "least_loaded", route
            assert pod != busy.name, "least_loaded sent work to the pod holding a request"
        busy.release("hold")
        rc, _ = cs.finish(30)
        assert rc == 0
    finally:
        c.release_all()
        cs.kill()
