"""Holding completions at the router (routing.hold_tokens, include/pcr/hold.h): while a pod
has that many uncached prompt tokens sent and not yet at their first event, further ones wait
in pcrouter and go highest response ratio first (a non-streamed completion's prefill counts
until its expected first token); other requests never wait for the budget; a held request
ends with a clear 503 at timeouts.response_ms, and a client that leaves gives its place back.

The stub pod's `prefill_gate` keeps a stream's first event back (its head goes at once, as
vLLM's does), so the test decides when a prefill ends. Prompts are 4 bytes a token, and no two
share a prefix, so a prompt of N bytes is N / 4 tokens of uncached prefill."""
import json
import time

import pytest

from conftest import (CurlStream, H2Client, completion, curl, get_metrics, h2_all_answered,
                      make_config, metric, wait_for)

BUDGET = 1000  # tokens


def text(tag, nbytes):
    """A prompt of about `nbytes` bytes that shares no 256-byte block with another tag's."""
    unit = "%s says hello. " % tag
    return (unit * (nbytes // len(unit) + 1))[:nbytes]


def held(r):
    return metric(get_metrics(r), "pcrouter_backend_held_requests", backend="pod-a")


def access_lines(path):
    """The completions' JSON access lines written so far."""
    with open(path) as f:
        return [o for o in (json.loads(l) for l in f if l.endswith("\n"))
                if o["path"] == "/v1/completions"]


def tags_seen(pod):
    return [e.get("tag") for e in pod.stats()["log"] if e.get("tag")]


@pytest.fixture
def streams():
    """The test's streaming clients (start() adds them), killed at its end whatever happened."""
    started = []
    yield started
    for s in started:
        s.kill()


def start(streams, r, tag, nbytes, **stub):
    s = CurlStream(r.url("/v1/completions"),
                   completion(text(tag, nbytes), stream=True, tag=tag, **stub))
    streams.append(s)
    return s


def all_done(streams):
    """Every stream ran to [DONE]."""
    for s in streams:
        rc, out = s.finish(30)
        assert rc == 0 and b"[DONE]" in out, out[-500:]


def one_pod(stub_factory, router_factory, **sections):
    a = stub_factory("pod-a")
    routing = {"policy": "cache_aware", "hold_tokens": BUDGET}
    routing.update(sections.pop("routing", {}))
    r = router_factory(make_config([{"name": "pod-a", "url": a.url}], workers=1,
                                   routing=routing, **sections))
    return a, r


def test_held_streams_go_highest_response_ratio_first(stub_factory, router_factory, streams):
    """A fills the budget; B (25000 tokens) then C (1100) are held; when A's prefill ends, C
    goes first although it came second, and fills the budget again, so B waits for C."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start(streams, r, "B", 100000, prefill_gate="gb")
    wait_for(lambda: held(r) == 1, 15, what="B held")
    start(streams, r, "C", 4400, prefill_gate="gc")
    wait_for(lambda: held(r) == 2, 15, what="C held")
    assert tags_seen(a) == ["A"]
    a.release("ga")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent once A's prefill ended")
    assert tags_seen(a) == ["A", "C"]
    assert held(r) == 1
    a.release("gc")
    wait_for(lambda: "B" in tags_seen(a), 15, what="B sent once C's prefill ended")
    a.release("gb")
    all_done(streams)
    text_m = get_metrics(r)
    assert metric(text_m, "pcrouter_backend_held_requests", backend="pod-a") == 0
    assert metric(text_m, "pcrouter_backend_held_total", backend="pod-a") == 2
    assert metric(text_m, "pcrouter_backend_queued_prefill_tokens", backend="pod-a") == 0


def test_a_stream_with_almost_nothing_to_prefill_is_not_held(stub_factory, router_factory,
                                                             streams):
    """A fills the budget and C (1100 tokens) is held. B is A's prompt and 50 tokens more: its
    own prefill on pod-a is those 50, less than a first token's fixed part, so it goes at once
    although the budget is spent and C waits. Held, it would have spared the pod nothing, and
    given it time to evict the prefix B counts on (pcr_hold_small)."""
    a, r = one_pod(stub_factory, router_factory)
    prompt = text("A", 8000)
    streams.append(CurlStream(r.url("/v1/completions"),
                              completion(prompt, stream=True, tag="A", prefill_gate="ga")))
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start(streams, r, "C", 4400, prefill_gate="gc")
    wait_for(lambda: held(r) == 1, 15, what="C held")
    streams.append(CurlStream(r.url("/v1/completions"),
                              completion(prompt + text("B", 200), stream=True, tag="B")))
    wait_for(lambda: "B" in tags_seen(a), 15, what="B at the pod while the budget is spent")
    assert tags_seen(a) == ["A", "B"] and held(r) == 1, (tags_seen(a), held(r))
    a.release("ga")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent once A's prefill ended")
    a.release("gc")
    all_done(streams)
    assert metric(get_metrics(r), "pcrouter_backend_held_total", backend="pod-a") == 1


def b_held_and_c_behind_it(stub_factory, router_factory, streams, **c_stub):
    """A (gated at its prefill) fills the budget of one pod; B (2048 tokens, gated by gb) is
    held, and so is C, B's prompt and 100 tokens more, which counts on the blocks B brings."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    prompt = text("B", 8192)
    streams.append(CurlStream(r.url("/v1/completions"),
                              completion(prompt, stream=True, tag="B", prefill_gate="gb")))
    wait_for(lambda: held(r) == 1, 15, what="B held")
    streams.append(CurlStream(r.url("/v1/completions"),
                              completion(prompt + text("C", 400), stream=True, tag="C",
                                         **c_stub)))
    wait_for(lambda: held(r) == 2, 15, what="C held")
    return a, r


def test_a_held_stream_goes_before_one_that_counts_on_what_it_brings(stub_factory,
                                                                   router_factory, streams):
    """A fills the budget. B (2048 tokens) is held: it is routed to pod-a with a prompt the pod
    does not have, so it brings those blocks. C is B's prompt and 100 tokens more: the index
    counts B's blocks as cached on pod-a, so C's own prefill is 100 tokens and its rank passes
    B's at once. Sent first, C would prefill B's blocks itself and B would find them after it.
    When A's prefill ends, B goes, and C waits for B's prefill (B fills the budget): small as
    its own prefill is (pcr_hold_small), C was held for B, and sent beside it on another
    connection it could reach the pod first."""
    a, r = b_held_and_c_behind_it(stub_factory, router_factory, streams, prefill_gate="gc")
    a.release("ga")
    wait_for(lambda: len(tags_seen(a)) >= 2, 15, what="a held stream sent")
    assert tags_seen(a) == ["A", "B"], tags_seen(a)
    assert held(r) == 1
    a.release("gb")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent once B's prefill ended")
    a.release("gc")
    all_done(streams)


def test_a_small_stream_does_not_take_a_held_one_it_counts_on_past_the_budget(stub_factory,
                                                                            router_factory,
                                                                            streams):
    """A fills the budget; B (2048 tokens) is held, and C, B's prompt and 100 tokens more, is
    held behind it: too small to hold on its own, it counts on B's blocks. A request that is not
    a stream then ends, and its connection's return looks for who may go. Neither does while
    the budget is spent: not C, which waits for B's prefill, and not B through C's turn (its
    rank stands for both). B goes once A's prefill ends, C once B's."""
    a, r = b_held_and_c_behind_it(stub_factory, router_factory, streams)
    resp = curl(r.url("/v1/completions"), completion(text("N", 400), tag="N"), timeout=10)
    assert resp.status == 200, resp
    assert held(r) == 2 and tags_seen(a) == ["A", "N"], (held(r), tags_seen(a))
    a.release("ga")
    wait_for(lambda: "B" in tags_seen(a), 15, what="B sent once A's prefill ended")
    assert tags_seen(a) == ["A", "N", "B"] and held(r) == 1, (tags_seen(a), held(r))
    a.release("gb")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent once B's prefill ended")
    all_done(streams)


def test_the_access_log_says_how_long_a_stream_was_held(stub_factory, router_factory, streams,
                                                        tmp_path):
    """held_ms: how long a stream waited in pcrouter, at least the time between the test seeing
    it held and releasing the prefill ahead of it; null for the stream that went at once."""
    path = str(tmp_path / "access.log")
    a, r = one_pod(stub_factory, router_factory,
                   log={"access_log_path": path, "access_log_format": "json"})
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start(streams, r, "B", 4400)
    wait_for(lambda: held(r) == 1, 15, what="B held")
    t_held = time.monotonic()
    # The time B is held is what is measured: the test lets some pass before the release.
    time.sleep(0.3)
    waited = time.monotonic() - t_held
    a.release("ga")
    all_done(streams)

    got = wait_for(lambda: len(access_lines(path)) == 2 and access_lines(path), 15,
                   what="two completions' lines")
    by_size = sorted(got, key=lambda o: o["bytes_in"])
    b, a_line = by_size   # B's prompt is the shorter
    assert a_line["held_ms"] is None, a_line
    assert b["held_ms"] is not None and b["held_ms"] >= 1000 * waited, (b, waited)
    assert b["held_ms"] <= b["ttfb_ms"], b
    assert b["held_ms"] <= b["ttft_ms"] <= b["duration_ms"], b


def in_flight(r):
    return metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a")


def test_a_streams_prefill_ahead_is_what_its_pod_had_when_it_went(stub_factory, router_factory,
                                                                  streams, tmp_path):
    """prefill_ahead_tokens (access log), which cache_aware learns each pod's prefill rate
    against: the uncached prefill the pod had been sent and not finished when the stream went,
    counted at the send. A (2000 tokens) is at the pod, its prefill gated; B, sent at once, has
    A's 2000 ahead of it. C finds the pod's one connection taken: when its turn comes, A is
    done, and nothing is ahead of it, although A's prefill was queued when C was routed.
    Counted at the decision, C would have 2000 ahead and its pod would look fast."""
    path = str(tmp_path / "access.log")
    a, r = one_pod(stub_factory, router_factory, routing={"hold_tokens": 0},
                   upstream={"max_connections": 2},
                   log={"access_log_path": path, "access_log_format": "json"})
    start(streams, r, "A", 8000, prefill_gate="ga", gate="ge")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start(streams, r, "B", 4400, gate="gb")
    wait_for(lambda: tags_seen(a) == ["A", "B"], 15, what="B at the pod")
    start(streams, r, "C", 4000)
    wait_for(lambda: in_flight(r) == 3, 15, what="C routed, waiting for a connection")
    assert tags_seen(a) == ["A", "B"]
    a.release("ga")
    a.release("ge")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent once A's connection was free")
    a.release("gb")
    all_done(streams)
    got = wait_for(lambda: len(access_lines(path)) == 3 and access_lines(path), 15,
                   what="three completions' lines")
    ahead = {o["bytes_in"]: o["prefill_ahead_tokens"] for o in got}
    by_size = [ahead[k] for k in sorted(ahead)]   # C, B, A
    assert by_size == [0, 2000, 0], got


def test_time_to_first_token_is_the_first_event_not_the_head(stub_factory, router_factory,
                                                             streams, tmp_path):
    """The pod sends a stream's head at once and its first event after the prefill (vLLM does
    so too): pcrouter_time_to_first_token_seconds and the access log's ttft_ms count to the
    first event, pcrouter_time_to_first_byte_seconds and ttfb_ms to the head. A request that is
    not a stream has no first token apart from its answer: no ttft_ms, no observation."""
    path = str(tmp_path / "access.log")
    a, r = one_pod(stub_factory, router_factory,
                   log={"access_log_path": path, "access_log_format": "json"})
    start(streams, r, "A", 400, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    t_sent = time.monotonic()
    # The prefill's length is what is measured: the test lets some time pass before it ends.
    time.sleep(0.3)
    gated = time.monotonic() - t_sent
    a.release("ga")
    all_done(streams)
    assert curl(r.url("/v1/completions"), json.dumps(completion(text("B", 400)))).status == 200
    got = wait_for(lambda: len(access_lines(path)) == 2 and access_lines(path), 15,
                   what="two completions' lines")
    stream, plain = sorted(got, key=lambda o: o["ttft_ms"] is None)
    assert stream["ttfb_ms"] < 1000 * gated <= stream["ttft_ms"] <= stream["duration_ms"], stream
    assert plain["ttft_ms"] is None, plain
    m = get_metrics(r)
    assert metric(m, "pcrouter_time_to_first_token_seconds_count") == 1
    assert metric(m, "pcrouter_time_to_first_token_seconds_bucket", le="0.25") == 0
    assert metric(m, "pcrouter_time_to_first_byte_seconds_count") == 2


def test_the_budget_is_the_pods_not_split_between_workers(stub_factory, router_factory):
    """With two workers, one worker's streams may use the whole budget while the other sends
    the pod nothing. A (600 tokens), B (300), C (600) and D (300) come over one h2c
    connection, so to one worker: A, B and C go (the pod has 0, 600, then 900 tokens of
    prefill, under 1000), D is held (1500). Split between the workers (500 each), B would have
    been held behind A."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url}], workers=2,
                                   routing={"policy": "cache_aware", "hold_tokens": BUDGET}))
    c = H2Client(r.port, timeout=30)
    try:
        sids = [c.request("POST", "/v1/completions",
                          completion(text(tag, 4 * tokens), stream=True, tag=tag,
                                     prefill_gate="g" + tag))
                for tag, tokens in (("A", 600), ("B", 300), ("C", 600), ("D", 300))]
        c.wait(lambda: len(tags_seen(a)) >= 3 and held(r) == 1, 15,
               what="three streams at the pod, one held")
        assert sorted(tags_seen(a)) == ["A", "B", "C"], tags_seen(a)
        for tag in "ABCD":
            a.release("g" + tag)
        c.wait(lambda: all(c.streams[s]["ended"] for s in sids), 30, what="every stream ended")
        assert all(b"[DONE]" in c.streams[s]["data"] for s in sids)
    finally:
        c.close()
    assert sorted(tags_seen(a)) == ["A", "B", "C", "D"]


def two_workers(stub_factory, router_factory, tmp_path):
    a = stub_factory("pod-a")
    log = str(tmp_path / "access.log")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url}], workers=2,
                                   routing={"policy": "cache_aware", "hold_tokens": BUDGET},
                                   log={"access_log_path": log, "access_log_format": "json"}))
    r.access_log = log
    return a, r


def send(client, tag, tokens):
    """A stream of `tokens` uncached tokens on an h2c connection, gated at the pod by g<tag>."""
    return client.request("POST", "/v1/completions",
                          completion(text(tag, 4 * tokens), stream=True, tag=tag,
                                     prefill_gate="g" + tag))


def worker_of(r, client):
    """The worker serving an h2c connection, from the access line of a short request on it."""
    sid = client.request("POST", "/v1/completions", completion("which worker"))
    client.wait(lambda: client.streams[sid]["ended"], 15, what="the probe's answer")
    me = "127.0.0.1:%d" % client.sock.getsockname()[1]
    line = wait_for(lambda: next((o for o in access_lines(r.access_log) if o["client"] == me),
                                 None), 15, what="the probe's access line")
    return line["worker"]


def connections_on_two_workers(r, clients):
    """Two h2c connections served by different workers (the kernel picks each one's)."""
    x = H2Client(r.port, timeout=60)
    clients.append(x)
    wx = worker_of(r, x)
    for _ in range(30):
        y = H2Client(r.port, timeout=60)
        clients.append(y)
        if worker_of(r, y) != wx:
            return x, y
        y.close()
    pytest.fail("30 connections in a row went to the first one's worker")


def a_over_the_budget_from_one_worker(stub_factory, router_factory, tmp_path, clients):
    """Two workers, a connection on each (x, y), and A (1500 tokens) at the pod from x: the
    pod's budget is spent."""
    a, r = two_workers(stub_factory, router_factory, tmp_path)
    x, y = connections_on_two_workers(r, clients)
    sa = send(x, "A", 1500)
    x.wait(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    return a, r, x, y, sa


def h2_all_done(streams):
    """Every (client, stream) ran to [DONE]."""
    for c, sid in streams:
        c.wait(lambda: c.streams[sid]["ended"], 30, what="every stream ended")
        assert b"[DONE]" in c.streams[sid]["data"], c.streams[sid]["data"][-300:]


def test_a_first_token_on_one_worker_sends_what_another_holds(stub_factory, router_factory,
                                                              tmp_path):
    """The budget is the pod's, so a prefill that ends on one worker may be what another's held
    stream waits for. A (1500 tokens) fills the budget from one worker; the other holds B and C
    (300 tokens each, more than a stream too small to hold: pcr_hold_small). When A's prefill
    ends, both go: A's worker has nothing of its own held, and
    nothing of the other's is at the pod to release them."""
    clients = []
    try:
        a, r, x, y, sa = a_over_the_budget_from_one_worker(stub_factory, router_factory,
                                                           tmp_path, clients)
        sb, sc = send(y, "B", 300), send(y, "C", 300)
        y.wait(lambda: held(r) == 2, 15, what="B and C held")
        a.release("gA")
        y.wait(lambda: sorted(tags_seen(a)) == ["A", "B", "C"], 15,
               what="B and C sent once A's prefill ended")
        assert held(r) == 0
        for tag in "BC":
            a.release("g" + tag)
        h2_all_done([(x, sa), (y, sb), (y, sc)])
    finally:
        for c in clients:
            c.close()


def test_held_streams_go_in_one_rank_order_over_the_workers(stub_factory, router_factory,
                                                            tmp_path):
    """The order is the pod's too. A (1500 tokens) is at the pod from one worker, which then
    holds L (100000 tokens); the other worker holds C (1100). When A's prefill ends, the budget
    has room for one of them: C, whose rank (waited / (prefill + 256)) is the higher although
    it came after L and A's worker holds L. C fills the budget again, so L waits for C's
    prefill. Split by worker, A's worker would have sent L, and C would still be held."""
    clients = []
    try:
        a, r, x, y, sa = a_over_the_budget_from_one_worker(stub_factory, router_factory,
                                                           tmp_path, clients)
        sl = send(x, "L", 100000)
        x.wait(lambda: held(r) == 1, 15, what="L held")
        sc = send(y, "C", 1100)
        y.wait(lambda: held(r) == 2, 15, what="C held")
        # C's rank passes L's once C has waited 1/75 of L's wait: the time between the two
        # being held is a few ms; this makes it so whatever the machine's pace.
        time.sleep(0.2)
        a.release("gA")
        y.wait(lambda: "C" in tags_seen(a), 15, what="C sent once A's prefill ended")
        assert "L" not in tags_seen(a) and held(r) == 1, tags_seen(a)
        a.release("gC")
        x.wait(lambda: "L" in tags_seen(a), 15, what="L sent once C's prefill ended")
        a.release("gL")
        h2_all_done([(x, sa), (x, sl), (y, sc)])
    finally:
        for c in clients:
            c.close()


def test_a_long_wait_lifts_a_long_prompt(stub_factory, router_factory, streams):
    """A long prompt that has waited long enough goes before a short one that just came: the
    rank is the wait over the prefill, so nothing waits forever behind shorter prompts."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start(streams, r, "B", 4400, prefill_gate="gb")   # 1100 tokens
    wait_for(lambda: held(r) == 1, 15, what="B held")
    # B's rank (its wait over 1100 + 256 tokens) is to pass that of the 300-token prompt
    # C (its wait over 556; a smaller one would not be held: pcr_hold_small): B must have
    # waited 2.4 times as long as C, and C waits from its start to A's release. That is a
    # wait the test has to let pass, not a synchronisation.
    time.sleep(1.5)
    start(streams, r, "C", 1200, prefill_gate="gc")   # 300 tokens
    wait_for(lambda: held(r) == 2, 15, what="C held")
    a.release("ga")
    wait_for(lambda: len(tags_seen(a)) >= 2, 15, what="one held stream sent")
    assert tags_seen(a)[:2] == ["A", "B"], tags_seen(a)
    a.release("gb")
    a.release("gc")
    all_done(streams)


def test_time_held_in_pcrouter_is_not_taken_for_the_pods_slowness(stub_factory, router_factory,
                                                                  streams):
    """cache_aware learns a pod's prefill rate from its streams' first tokens
    (pcrouter_backend_prefill_tokens_per_second). A held stream reaches its first token late by
    the time it waited in pcrouter, which is not the pod's doing, so that time is not counted:
    A fills the budget and leaves before its first token (no time of its own); B, held
    meanwhile, then goes and answers at once. Counted from B's arrival, the pod would look ten
    times slower than the prior; from B's send, it looks as fast or faster."""
    a, r = one_pod(stub_factory, router_factory)
    speed = lambda: metric(get_metrics(r), "pcrouter_backend_prefill_tokens_per_second",
                           backend="pod-a")
    prior = speed()
    assert prior == 14286
    blocker = start([], r, "A", 8000, prefill_gate="ga")
    try:
        wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
        start(streams, r, "B", 2000)   # 500 tokens: not too small to hold (pcr_hold_small)
        wait_for(lambda: held(r) == 1, 15, what="B held")
        # The time B is held is the point: the test lets some pass before A leaves.
        time.sleep(1.5)
    finally:
        blocker.kill()
    all_done(streams)   # B's first token was observed before its [DONE] (one worker)
    assert speed() > prior / 2, speed()


def test_a_non_streamed_completion_is_held_as_a_stream_is(stub_factory, router_factory,
                                                         streams):
    """A non-streamed completion's prefill is in the pod's queue as a stream's is: N (2000
    tokens) is held while A fills the budget, and goes when A's first token comes. A request
    that is not a completion (no prompt, nothing to prefill) goes through meanwhile."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    n = CurlStream(r.url("/v1/completions"), completion(text("N", 8000), tag="N"))
    streams.append(n)
    wait_for(lambda: held(r) == 1, 15, what="N held")
    other = curl(r.url("/v1/embeddings"), {"model": "stub-model", "input": "hi"}, timeout=10)
    assert other.status != 503 and held(r) == 1, other
    assert tags_seen(a) == ["A"]
    a.release("ga")
    rc, out = n.finish(30)
    assert rc == 0 and b" 200 " in out.split(b"\r\n", 1)[0], out[:300]
    assert tags_seen(a) == ["A", "N"]
    all_done(streams[:1])


def queued(r):
    return metric(get_metrics(r), "pcrouter_backend_queued_prefill_tokens", backend="pod-a")


# An unstreamed prompt of 50000 tokens: at the policy's starting rate (70 us a token, 20 ms
# more), its first token is expected 3.5 s after its send.
LONG = 200000


def test_an_unstreamed_prefill_counts_until_its_expected_first_token(stub_factory,
                                                                     router_factory, streams,
                                                                     tmp_path):
    """A non-streamed completion's answer comes whole, after its generation, yet its prefill
    is in the pod's queue as a stream's is. N (50000 tokens, its answer gated) counts in the
    pod's queued prefill and in the prefill ahead of B, a stream sent after it. When the time
    the policy expects N's first token has passed, N leaves both, while its answer is still
    to come: C, sent then, has nothing ahead of it. Counted until its answer, a long
    generation would keep its prefill in its pod's queue for the decisions throughout."""
    path = str(tmp_path / "access.log")
    a, r = one_pod(stub_factory, router_factory, routing={"hold_tokens": 0},
                   log={"access_log_path": path, "access_log_format": "json"})
    n = CurlStream(r.url("/v1/completions"), completion(text("N", LONG), tag="N", gate="gn"))
    streams.append(n)
    wait_for(lambda: tags_seen(a) == ["N"], 15, what="N at the pod")
    assert queued(r) == LONG // 4
    start(streams, r, "B", 2000)
    wait_for(lambda: len(access_lines(path)) == 1, 15, what="B answered")
    wait_for(lambda: queued(r) == 0, 30, what="N's prefill out of the queue")
    start(streams, r, "C", 2000)
    wait_for(lambda: len(access_lines(path)) == 2, 15, what="C answered")
    assert not n.done, "N was answered before its gate opened"
    got = access_lines(path)
    assert [o["prefill_ahead_tokens"] for o in got] == [LONG // 4, 0], got
    a.release("gn")
    rc, out = n.finish(30)
    assert rc == 0 and b" 200 " in out.split(b"\r\n", 1)[0], out[:300]


def test_an_unstreamed_prefill_holds_streams_until_its_expected_first_token(stub_factory,
                                                                            router_factory,
                                                                            streams):
    """N's 50000 tokens fill the pod's budget of 1000 as a stream's would: B, a stream sent
    after it, is held. When N's first token is expected, B goes, with N's answer still to
    come. Uncounted, B would have gone at once behind 50000 tokens of prefill."""
    a, r = one_pod(stub_factory, router_factory)
    n = CurlStream(r.url("/v1/completions"), completion(text("N", LONG), tag="N", gate="gn"))
    streams.append(n)
    wait_for(lambda: tags_seen(a) == ["N"], 15, what="N at the pod")
    start(streams, r, "B", 4400)
    wait_for(lambda: held(r) == 1, 15, what="B held behind N's prefill")
    assert tags_seen(a) == ["N"]
    wait_for(lambda: tags_seen(a) == ["N", "B"], 30, what="B sent at N's expected first token")
    all_done(streams[1:])
    assert not n.done, "N was answered before its gate opened"
    a.release("gn")
    rc, out = n.finish(30)
    assert rc == 0, out[:300]


def test_a_held_stream_gets_a_clear_503_at_the_response_timeout(stub_factory, router_factory,
                                                                 streams, tmp_path):
    """Held past timeouts.response_ms, a stream is answered 503 naming the pod and the budget,
    and its place is given back."""
    path = str(tmp_path / "access.log")
    a, r = one_pod(stub_factory, router_factory, timeouts={"response_ms": 1500},
                   log={"access_log_path": path, "access_log_format": "json"})
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    t0 = time.monotonic()
    resp = curl(r.url("/v1/completions"), completion(text("B", 4000), stream=True, tag="B"),
                timeout=20)
    waited = time.monotonic() - t0
    assert resp.status == 503, resp
    err = resp.json()["error"]
    assert err["code"] == "backend_busy", err
    assert "pod-a" in err["message"] and "routing.hold_tokens (1000)" in err["message"], err
    assert waited >= 1.4, waited
    assert held(r) == 0
    assert tags_seen(a) == ["A"]
    a.release("ga")
    all_done(streams)
    line = wait_for(lambda: [o for o in access_lines(path) if o["status"] == 503], 15,
                    what="the 503's access line")[0]
    assert line["held_ms"] == 1500, line


def test_a_client_that_leaves_gives_its_place_back(stub_factory, router_factory, streams):
    """A held stream whose client goes away never reaches the pod, and the next stream goes
    when the budget opens."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    gone = start([], r, "B", 4400)
    try:
        wait_for(lambda: held(r) == 1, 15, what="B held")
    finally:
        gone.kill()
    wait_for(lambda: held(r) == 0, 15, what="B's place given back")
    start(streams, r, "C", 4400, prefill_gate="gc")
    wait_for(lambda: held(r) == 1, 15, what="C held")
    a.release("ga")
    wait_for(lambda: "C" in tags_seen(a), 15, what="C sent")
    a.release("gc")
    all_done(streams)
    assert "B" not in tags_seen(a)


def test_hold_tokens_zero_sends_at_once(stub_factory, router_factory, streams):
    """routing.hold_tokens 0 turns holding off: every stream goes to the pod at once."""
    a, r = one_pod(stub_factory, router_factory, routing={"hold_tokens": 0})
    start(streams, r, "A", 8000, prefill_gate="ga")
    start(streams, r, "B", 12000, prefill_gate="gb")
    wait_for(lambda: sorted(tags_seen(a)) == ["A", "B"], 15, what="both at the pod")
    assert held(r) == 0
    a.release("ga")
    a.release("gb")
    all_done(streams)


def test_a_request_that_waited_for_a_connection_keeps_it(stub_factory, router_factory, streams):
    """A request that waited for a pool slot is not failed later by the deadline of that wait:
    once it has a connection, only the connection's own deadlines apply."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 1}],
                                   workers=1, routing={"policy": "cache_aware", "hold_tokens": 0},
                                   timeouts={"response_ms": 1500}))
    x = start(streams, r, "X", 400, gate="gx")
    x.wait_output(b"tok0")
    t0 = time.monotonic()
    y = start(streams, r, "Y", 400, gate="gy")
    wait_for(lambda: a.stats()["log"][-1].get("tag") == "X" and
             metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a") == 2,
             15, what="Y waiting for the one connection")
    a.release("gx")
    y.wait_output(b"tok0")
    # Past the deadline Y's wait for a slot had: a deadline has to pass.
    time.sleep(max(0.0, t0 + 2.0 - time.monotonic()))
    a.release("gy")
    all_done(streams)


@pytest.mark.parametrize("budget", [0, BUDGET])
def test_a_freed_connection_goes_to_the_client_that_holds_fewest(stub_factory, router_factory,
                                                                 streams, budget):
    """Fair share of a pod's connections between clients. One h2c client has two requests on
    the pod's two connections and three more waiting; another client's request then waits
    too. When one of the first two ends, the freed connection goes to the other client (none
    on the pod) before the first client's older waiters (one on the pod). Without the fair
    share they went first, oldest (or, with a hold budget, longest-waiting) first, and a
    client with many streams kept every connection of the pod from everyone else."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 2}],
                                   workers=1,
                                   routing={"policy": "cache_aware", "hold_tokens": budget}))
    greedy = H2Client(r.port, timeout=30)
    try:
        sids = [greedy.request("POST", "/v1/completions",
                               completion(text("G%d" % i, 400), tag="G%d" % i,
                                          gate="g%d" % min(i, 3)))
                for i in range(1, 6)]
        wait_for(lambda: sorted(tags_seen(a)) == ["G1", "G2"] and
                 metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a") == 5,
                 15, what="G1 and G2 at the pod, G3 to G5 waiting")
        b = start(streams, r, "B", 400)
        wait_for(lambda: metric(get_metrics(r), "pcrouter_backend_in_flight",
                                backend="pod-a") == 6, 15, what="B waiting")
        a.release("g1")
        wait_for(lambda: len(tags_seen(a)) >= 3, 15, what="a third request at the pod")
        seen = tags_seen(a)
        assert sorted(seen[:2]) == ["G1", "G2"] and seen[2] == "B", seen
        all_done(streams)
        # One release at a time: G2's end and G3's would free two connections at once, and
        # which of the two next requests reached the pod first would be a race of the pod's.
        wait_for(lambda: len(tags_seen(a)) >= 4, 15, what="a fourth request at the pod")
        a.release("g2")
        wait_for(lambda: len(tags_seen(a)) >= 5, 15, what="a fifth request at the pod")
        a.release("g3")
        h2_all_answered(greedy, sids, what="every greedy request answered")
    finally:
        greedy.close()
    assert tags_seen(a)[3:] == ["G3", "G4", "G5"], tags_seen(a)
    assert metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a") == 0


def test_a_flood_of_held_streams_drains_and_a_vanished_client_leaves_none(stub_factory,
                                                                         router_factory, streams):
    """Attack: 200 streams of mixed sizes held on one pod over one h2c connection all reach it
    and end as the budget frees; 100 more held over a second connection that then vanishes
    leave nothing held, and none of them reaches the pod."""
    a, r = one_pod(stub_factory, router_factory)
    start(streams, r, "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    flood = H2Client(r.port, timeout=60)
    gone = H2Client(r.port, timeout=60)
    try:
        sids = [flood.request("POST", "/v1/completions",
                              completion(text("F%d" % i, 1100 + 97 * (i % 50)), stream=True,
                                         tag="F%d" % i))
                for i in range(200)]
        flood.wait(lambda: held(r) == 200, 30, what="200 streams held")
        for i in range(100):
            gone.request("POST", "/v1/completions",
                         completion(text("G%d" % i, 4000), stream=True, tag="G%d" % i))
        flood.wait(lambda: held(r) == 300, 30, what="300 streams held")
        gone.sock.close()   # vanishes: no GOAWAY, no RST_STREAM
        flood.wait(lambda: held(r) == 200, 30, what="the vanished client's 100 let go")
        a.release("ga")
        flood.wait(lambda: all(flood.streams[s]["ended"] for s in sids), 60,
                   what="every held stream ended")
        for s in sids:
            st = flood.streams[s]
            assert st["headers"][":status"] == "200" and b"[DONE]" in st["data"], st
        all_done(streams)
    finally:
        flood.close()
        gone.close()
    seen = tags_seen(a)
    assert sum(t.startswith("F") for t in seen) == 200
    assert not any(t.startswith("G") for t in seen)
    text_m = get_metrics(r)
    assert metric(text_m, "pcrouter_backend_held_requests", backend="pod-a") == 0
    assert metric(text_m, "pcrouter_backend_queued_prefill_tokens", backend="pod-a") == 0
    assert metric(text_m, "pcrouter_backend_in_flight", backend="pod-a") == 0


def test_streams_held_for_a_pod_that_goes_down_are_routed_again(stub_factory, router_factory,
                                                                streams):
    """A stream held for a pod whose health checks start failing does not wait for that pod's
    prefill queue (which may never drain): it is routed to another pod at once. Nothing of it
    reached the first pod, so the retry is safe."""
    pods = {"pod-a": stub_factory("pod-a"), "pod-b": stub_factory("pod-b")}
    r = router_factory(make_config([{"name": n, "url": p.url} for n, p in pods.items()],
                                   workers=1,
                                   routing={"policy": "consistent_hash", "hold_tokens": BUDGET},
                                   health={"interval_ms": 100, "timeout_ms": 300, "fall": 1}))
    shared = text("S", 5000)   # consistent_hash keys on the first 4 KiB: one pod for both
    first = CurlStream(r.url("/v1/completions"),
                       completion(shared + text("A", 3000), stream=True, tag="A",
                                  prefill_gate="ga"))
    streams.append(first)
    wait_for(lambda: any("A" in tags_seen(p) for p in pods.values()), 15, what="A at a pod")
    name = "pod-a" if "A" in tags_seen(pods["pod-a"]) else "pod-b"
    other = "pod-b" if name == "pod-a" else "pod-a"
    second = CurlStream(r.url("/v1/completions"),
                        completion(shared + text("B", 400), stream=True, tag="B"), timeout=20)
    streams.append(second)
    wait_for(lambda: metric(get_metrics(r), "pcrouter_backend_held_requests", backend=name) == 1,
             15, what="B held for " + name)
    pods[name].configure(health_status=503)
    rc, out = second.finish(20)
    assert rc == 0 and b"[DONE]" in out, out[-500:]
    assert ("x-pcrouter-backend: %s" % other).encode() in out, out[:600]
    assert "B" in tags_seen(pods[other]) and "B" not in tags_seen(pods[name])
    assert metric(get_metrics(r), "pcrouter_backend_held_requests", backend=name) == 0
    pods[name].release("ga")
    all_done([first])


TENANTS = {"routing": {"tenant_header": "x-tenant"},
           "tenants": {"batch": {"priority": 0}, "chat": {"priority": 10}}}


def start_as(streams, r, tenant, tag, nbytes, **stub):
    s = CurlStream(r.url("/v1/completions"),
                   completion(text(tag, nbytes), stream=True, tag=tag, **stub),
                   extra=["-H", "x-tenant: " + tenant])
    streams.append(s)
    return s


def test_a_held_interactive_request_goes_before_held_batch_ones(stub_factory, router_factory,
                                                                streams):
    """The hold queue orders by the tenants' priority bands before the rank: batch's A fills the
    budget, its B1 and B2 are held, then the interactive tenant's I, of the same size, is held
    too; when A's prefill ends, I goes first although B1 and B2 have waited longer (their
    rank is higher), and fills the budget again, so they wait for it."""
    a, r = one_pod(stub_factory, router_factory, **TENANTS)
    start_as(streams, r, "batch", "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    for n, tag in enumerate(("B1", "B2")):
        start_as(streams, r, "batch", tag, 4400, prefill_gate="g" + tag)
        wait_for(lambda: held(r) == n + 1, 15, what=tag + " held")
    start_as(streams, r, "chat", "I", 4400, prefill_gate="gi")
    wait_for(lambda: held(r) == 3, 15, what="I held")
    a.release("ga")
    wait_for(lambda: len(tags_seen(a)) == 2, 15, what="one held stream sent once A's ended")
    assert tags_seen(a) == ["A", "I"] and held(r) == 2, tags_seen(a)
    a.release("gi")
    wait_for(lambda: len(tags_seen(a)) == 3, 15, what="B1 sent once I's prefill ended")
    a.release("gB1")
    wait_for(lambda: len(tags_seen(a)) == 4, 15, what="B2 sent once B1's prefill ended")
    assert tags_seen(a) == ["A", "I", "B1", "B2"]
    a.release("gB2")
    all_done(streams)
    assert metric(get_metrics(r), "pcrouter_backend_held_requests", backend="pod-a") == 0


def test_the_prefill_a_pod_preempts_for_a_request_does_not_hold_it(stub_factory, router_factory,
                                                                     streams):
    """With pod priorities, a pod serves the interactive tenant's request before the batch
    tenant's, preempting their prefill: so the budget an interactive request sees leaves the
    batch prefill out. Batch's A fills the budget and its B is held; the interactive I goes to
    the pod at once, B still waits for A's prefill."""
    sections = {"routing": TENANTS["routing"],
                "tenants": {"batch": {"priority": 0, "pod_priority": 10},
                            "chat": {"priority": 10, "pod_priority": 0}}}
    a, r = one_pod(stub_factory, router_factory, **sections)
    start_as(streams, r, "batch", "A", 8000, prefill_gate="ga")
    wait_for(lambda: tags_seen(a) == ["A"], 15, what="A at the pod")
    start_as(streams, r, "batch", "B", 4400, prefill_gate="gb")
    wait_for(lambda: held(r) == 1, 15, what="B held")
    start_as(streams, r, "chat", "I", 4400, prefill_gate="gi")
    wait_for(lambda: "I" in tags_seen(a), 15, what="I at the pod while batch fills the budget")
    assert tags_seen(a) == ["A", "I"] and held(r) == 1
    # I's own prefill now counts for everyone: B waits for both.
    a.release("ga")
    a.release("gi")
    wait_for(lambda: "B" in tags_seen(a), 15, what="B sent once the prefill ahead ended")
    a.release("gb")
    all_done(streams)
    assert metric(get_metrics(r), "pcrouter_backend_held_total", backend="pod-a") == 1
