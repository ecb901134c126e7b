"""The light clients' reserve of a pod's connections (upstream.light_reserve_pct,
include/pcr/connshare.h): the pool's last few free connections are lent to whoever asks until a
light client (one holding few requests on pod connections) finds no other free; from then a
heavy client may not take them, so the next light client that comes while the heavy one's
answers are all still in flight finds one at once rather than waiting for one of them to end.
The heavy client's excess waits in the pool's queue and goes as connections free."""
import json

import pytest

from attack_h2 import H2Streams
from conftest import (CurlStream, H2Client, completion, curl, get_metrics, h2_all_answered,
                      make_config, metric, wait_for)


def tags_seen(pod):
    return [e.get("tag") for e in pod.stats()["log"] if e.get("tag")]


def in_flight(r, backend="pod-a"):
    return metric(get_metrics(r), "pcrouter_backend_in_flight", backend=backend)


def heavy_then_light(r, a, heavy, n, on_pod, tags_before=0):
    """`heavy` sends `n` requests that pod `a` holds (gate "h0" for the first, "h" for the
    rest), `on_pod` of them on its connections; then a first light client (HTTP/1.1) finds none
    free and waits, and gets the connection H0's end frees. Returns the heavy stream ids."""
    sids = [heavy.request("POST", "/v1/completions",
                          completion("heavy request %d says hello" % i, tag="H%d" % i,
                                     gate="h0" if i == 0 else "h"))
            for i in range(n)]
    wait_for(lambda: in_flight(r) == n and len(tags_seen(a)) == tags_before + on_pod, 15,
             what="the heavy client on all %d connections, %d waiting" % (on_pod, n - on_pod))
    first = CurlStream(r.url("/v1/completions"),
                       completion("the first light client says hello", tag="L1"), timeout=30)
    try:
        wait_for(lambda: in_flight(r) == n + 1, 15, what="the first light request waiting")
        a.release("h0")
        rc, out = first.finish(15)
    finally:
        first.kill()
    assert rc == 0 and out.startswith(b"HTTP/1.1 200"), out[:300]
    assert tags_seen(a)[tags_before + on_pod] == "L1", tags_seen(a)
    return sids


@pytest.mark.parametrize("budget", [0, 1000])
def test_a_light_client_finds_a_connection_a_heavy_one_may_not_take(stub_factory, router_factory,
                                                                    budget):
    """A pod of 10 connections, whose reserve at the default 10% is one. One h2c client sends
    12 requests that the pod holds (gates): alone, it takes all 10 connections (the reserve is
    lent) and 2 wait. A first light client (HTTP/1.1) then waits too; when one heavy answer
    ends, the freed connection goes to it (fewest requests on pod connections first). From
    then the reserve is kept: when the light answer ends, its connection is not given to the
    heavy client's waiters, and a second light client is answered at once while every other
    heavy answer is still in flight. Without the reserve the heavy client's waiter took that
    connection and the second light request waited until a heavy answer ended. With a hold
    budget (the prompts are too small to be held) the queue's other order applies it too."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 10}],
                                   workers=1,
                                   routing={"policy": "cache_aware", "hold_tokens": budget}))
    heavy = H2Client(r.port, timeout=30)
    try:
        sids = heavy_then_light(r, a, heavy, 12, 10)
        second = curl(r.url("/v1/completions"),
                      completion("the second light client says hello", tag="L2"), timeout=10)
        assert second.status == 200, second
        # The gate holds the 11 other heavy answers: none of them ended, 2 still wait.
        assert in_flight(r) == 11
        assert tags_seen(a)[11] == "L2", tags_seen(a)
        a.release("h")
        h2_all_answered(heavy, sids, what="every heavy request answered")
    finally:
        heavy.close()
    assert sorted(tags_seen(a)) == sorted(["L1", "L2"] + ["H%d" % i for i in range(12)])
    wait_for(lambda: in_flight(r) == 0, 15, what="nothing in flight")


def test_a_light_client_that_needed_one_pod_keeps_the_reserve_of_every_pod(stub_factory,
                                                                          router_factory):
    """Two pods of 10 connections (a reserve of one each), serving different models. One h2c
    client takes all of both (the reserves are lent) and has two more requests waiting for
    pod-b. A light client finds pod-a taken, waits, and gets the first connection a heavy
    answer there frees. From then every pool keeps its reserve, not pod-a's only: when a heavy
    answer on pod-b ends, its connection is not given to the heavy client's waiters, and a
    light client that asks pod-b is answered at once. Kept per pool, that connection went to a
    heavy waiter, and the light client waited for pod-b's next answer to end."""
    a = stub_factory("pod-a", ["model-a"])
    b = stub_factory("pod-b", ["model-b"])
    r = router_factory(make_config([
        {"name": "pod-a", "url": a.url, "max_connections": 10, "models": ["model-a"]},
        {"name": "pod-b", "url": b.url, "max_connections": 10, "models": ["model-b"]}],
        workers=1, routing={"policy": "least_loaded"}))
    heavy = H2Client(r.port, timeout=30)
    first = None
    try:
        sids = [heavy.request("POST", "/v1/completions",
                              completion("heavy on a %d" % i, model="model-a", tag="HA%d" % i,
                                         gate="a0" if i == 0 else "h"))
                for i in range(10)]
        sids += [heavy.request("POST", "/v1/completions",
                               completion("heavy on b %d" % i, model="model-b", tag="HB%d" % i,
                                          gate="b0" if i == 0 else "h"))
                 for i in range(12)]
        wait_for(lambda: len(tags_seen(a)) == 10 and len(tags_seen(b)) == 10, 15,
                 what="the heavy client on all 20 connections, 2 waiting for pod-b")
        first = CurlStream(r.url("/v1/completions"),
                           completion("light on a", model="model-a", tag="L1"), timeout=30)
        wait_for(lambda: in_flight(r) == 11, 15, what="the light request waiting for pod-a")
        a.release("a0")
        rc, out = first.finish(15)
        assert rc == 0 and out.startswith(b"HTTP/1.1 200"), out[:300]
        assert tags_seen(a)[10] == "L1", tags_seen(a)
        # A heavy answer on pod-b ends: its connection stays free for a light client.
        b.release("b0")
        heavy.wait(lambda: heavy.streams[sids[10]]["ended"], 15, what="HB0 answered")
        second = curl(r.url("/v1/completions"),
                      completion("light on b", model="model-b", tag="L2"), timeout=10)
        assert second.status == 200, second
        assert tags_seen(b)[10] == "L2", tags_seen(b)
        assert in_flight(r, "pod-b") == 11
        a.release("h")
        b.release("h")
        h2_all_answered(heavy, sids, what="every heavy request answered")
    finally:
        heavy.close()
        if first is not None:
            first.kill()


def test_a_client_that_left_an_answer_unread_is_heavy(stub_factory, router_factory):
    """A client whose answer was reset because it read none of it for client_write_ms counts
    as heavy for a while, whatever it holds: it may not take the kept reserve. Without that,
    a reader of zero-window streams, all reset at once, held nothing for a moment and its
    next streams took the reserve as a light client's. Here it holds no request when it asks
    again, so it would be light: it waits instead, and a light client is answered at once."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 10}],
                                   workers=1, routing={"policy": "cache_aware"},
                                   timeouts={"client_write_ms": 1000}))
    # Its streams' window is 0 and never given back: no DATA of its answers can come.
    reader = H2Streams(r.port, window=0, ack=False)
    heavy = H2Client(r.port, timeout=30)
    try:
        reader.open("/v1/completions", json.dumps(completion(
            "a reader that never reads", stream=True, tag="S0", gate="never", events=4)).encode())
        wait_for(lambda: metric(get_metrics(r), "pcrouter_client_write_timeouts_total") == 1, 20,
                 what="the reader's stream reset at client_write_ms")
        wait_for(lambda: in_flight(r) == 0, 15, what="its pod request cancelled")
        sids = heavy_then_light(r, a, heavy, 10, 10, tags_before=1)
        # The reserve is kept and free. The reader asks again, holding nothing: it waits.
        reader.open("/v1/completions", json.dumps(completion(
            "the reader again", stream=True, tag="S1", gate="never", events=4)).encode())
        wait_for(lambda: in_flight(r) == 10, 15, what="the reader's second request waiting")
        second = curl(r.url("/v1/completions"),
                      completion("the second light client says hello", tag="L2"), timeout=10)
        assert second.status == 200, second
        assert tags_seen(a)[11:] == ["L1", "L2"], tags_seen(a)
        a.release("h")
        h2_all_answered(heavy, sids, what="every heavy request answered")
    finally:
        heavy.close()
        reader.close()


def test_a_client_that_can_take_no_answer_byte_never_gets_the_reserve(stub_factory,
                                                                     router_factory):
    """An h2c client that announced an initial window of 0, and opened no stream's window
    since, can take no byte of any answer: what a pod answers it waits on the pod's connection
    until the client opens a window or client_write_ms resets the stream. It never takes a
    pool's reserve, kept or not, and such clients together hold no more of a pool than the
    reserve counts. Here no light client has needed the reserve yet: the reader's 12 requests
    take 1 of the pod's 10 connections (its reserve), and the first light client is answered
    at once. Before, the reader took all 10 and the first light client waited for its reset
    (a minute here); with the first rule alone it took 9."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 10}],
                                   workers=1, routing={"policy": "cache_aware"},
                                   timeouts={"client_write_ms": 60000}))
    reader = H2Streams(r.port, window=0, ack=False)
    try:
        for i in range(12):
            reader.open("/v1/completions", json.dumps(completion(
                "a reader that never reads, %d" % i, stream=True, tag="S%d" % i, gate="never",
                events=4)).encode())
        wait_for(lambda: in_flight(r) == 12 and len(tags_seen(a)) == 1, 15,
                 what="the reader on 1 connection, 11 waiting")
        light = curl(r.url("/v1/completions"),
                     completion("the first light client says hello", tag="L1"), timeout=10)
        assert light.status == 200, light
        assert tags_seen(a)[1:] == ["L1"], tags_seen(a)
        # Free connections, and still none of them the reader's.
        assert in_flight(r) == 12
        assert len(tags_seen(a)) == 2
    finally:
        reader.close()
    wait_for(lambda: in_flight(r) == 0, 15, what="the reader's requests cancelled")


def conn_of(pod, tag):
    """The stub pod's connection number that carried the request tagged `tag`."""
    return [e["conn"] for e in pod.stats()["log"] if e.get("tag") == tag][0]


def test_a_client_that_can_take_no_answer_byte_leaves_the_idle_connections(stub_factory,
                                                                           router_factory):
    """A light request leaves its pod connection idle in the pool. A reader that gave its
    streams no window then asks the same pod: it opens a fresh connection, and the next light
    request finds the warm one. Before, the reader took the idle connection (its answer waits on
    it anyway), and the light request paid a connect, behind the reader's own connects at the
    pod."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 10}],
                                   workers=1, routing={"policy": "cache_aware"},
                                   timeouts={"client_write_ms": 60000}))
    first = curl(r.url("/v1/completions"), completion("a light client says hello", tag="L1"),
                 timeout=10)
    assert first.status == 200, first
    reader = H2Streams(r.port, window=0, ack=False)
    try:
        reader.open("/v1/completions", json.dumps(completion(
            "a reader that never reads", stream=True, tag="S0", gate="never",
            events=4)).encode())
        wait_for(lambda: "S0" in tags_seen(a), 15, what="the reader's request at the pod")
        light = curl(r.url("/v1/completions"),
                     completion("a light client says hello again", tag="L2"), timeout=10)
        assert light.status == 200, light
        assert conn_of(a, "S0") != conn_of(a, "L1"), a.stats()["log"]
        assert conn_of(a, "L2") == conn_of(a, "L1"), a.stats()["log"]
    finally:
        reader.close()
    wait_for(lambda: in_flight(r) == 0, 15, what="the reader's request cancelled")
