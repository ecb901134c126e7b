"""The light clients' reserve of a pod's connections (upstream.light_reserve_pct,
include/pcr/connshare.h): the pool's last few free connections are lent to whoever asks until a
light client (one holding few requests on pod connections) finds no other free; from then a
heavy client may not take them, so the next light client that comes while the heavy one's
answers are all still in flight finds one at once rather than waiting for one of them to end.
The heavy client's excess waits in the pool's queue and goes as connections free."""
import pytest

from conftest import (CurlStream, H2Client, completion, curl, get_metrics, make_config, metric,
                      wait_for)


def tags_seen(pod):
    return [e.get("tag") for e in pod.stats()["log"] if e.get("tag")]


def in_flight(r):
    return metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a")


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
    first = None
    try:
        sids = [heavy.request("POST", "/v1/completions",
                              completion("heavy request %d says hello" % i, tag="H%d" % i,
                                         gate="h0" if i == 0 else "h"))
                for i in range(12)]
        wait_for(lambda: in_flight(r) == 12 and len(tags_seen(a)) == 10, 15,
                 what="the heavy client alone on all 10 connections, 2 waiting")
        first = CurlStream(r.url("/v1/completions"),
                           completion("the first light client says hello", tag="L1"), timeout=30)
        wait_for(lambda: in_flight(r) == 13, 15, what="the first light request waiting")
        a.release("h0")
        rc, out = first.finish(15)
        assert rc == 0 and out.startswith(b"HTTP/1.1 200"), out[:300]
        assert tags_seen(a)[10] == "L1", tags_seen(a)
        second = curl(r.url("/v1/completions"),
                      completion("the second light client says hello", tag="L2"), timeout=10)
        assert second.status == 200, second
        # The gate holds the 11 other heavy answers: none of them ended, 2 still wait.
        assert in_flight(r) == 11
        assert tags_seen(a)[11] == "L2", tags_seen(a)
        a.release("h")
        heavy.wait(lambda: all(heavy.streams[s]["ended"] for s in sids), 30,
                   what="every heavy request answered")
        for s in sids:
            assert heavy.streams[s]["headers"][":status"] == "200", heavy.streams[s]
    finally:
        heavy.close()
        if first is not None:
            first.kill()
    assert sorted(tags_seen(a)) == sorted(["L1", "L2"] + ["H%d" % i for i in range(12)])
    wait_for(lambda: in_flight(r) == 0, 15, what="nothing in flight")
