"""The light clients' reserve of a pod's connections (upstream.light_reserve_pct,
include/pcr/connshare.h): a client connection holding many requests on pod connections may not
take the pool's last few free connections, so a light client that comes while the heavy one's
answers are all still in flight finds one at once rather than waiting for one of them to end;
the heavy client's excess waits in the pool's queue and goes as connections free."""
import pytest

from conftest import H2Client, completion, curl, get_metrics, make_config, metric, wait_for


def tags_seen(pod):
    return [e.get("tag") for e in pod.stats()["log"] if e.get("tag")]


def in_flight(r):
    return metric(get_metrics(r), "pcrouter_backend_in_flight", backend="pod-a")


@pytest.mark.parametrize("budget", [0, 1000])
def test_a_light_client_finds_a_connection_a_heavy_one_may_not_take(stub_factory, router_factory,
                                                                    budget):
    """One h2c client sends 12 requests that the pod holds (a gate) to a pod of 10 connections,
    whose reserve at the default 10% is one: 9 reach the pod and 3 wait. A plain HTTP/1.1
    client's request then takes the reserved connection and is answered while every one of
    the heavy client's answers is still in flight. Without the reserve the heavy client took
    all 10 and the light request waited until one of them ended. With a hold budget (the
    prompts are too small to be held) the queue's other order applies the reserve too."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 10}],
                                   workers=1,
                                   routing={"policy": "cache_aware", "hold_tokens": budget}))
    heavy = H2Client(r.port, timeout=30)
    try:
        sids = [heavy.request("POST", "/v1/completions",
                              completion("heavy request %d says hello" % i, tag="H%d" % i,
                                         gate="h"))
                for i in range(12)]
        wait_for(lambda: in_flight(r) == 12 and len(tags_seen(a)) >= 9, 15,
                 what="the heavy client's 12 requests at the pod or waiting")
        light = curl(r.url("/v1/completions"), completion("the light client says hello", tag="L"),
                     timeout=10)
        assert light.status == 200, light
        assert not any(heavy.streams[s]["ended"] for s in sids), "a heavy answer ended first"
        seen = tags_seen(a)
        assert len(seen) == 10 and seen[-1] == "L", seen
        a.release("h")
        heavy.wait(lambda: all(heavy.streams[s]["ended"] for s in sids), 30,
                   what="every heavy request answered")
        for s in sids:
            assert heavy.streams[s]["headers"][":status"] == "200", heavy.streams[s]
    finally:
        heavy.close()
    assert sorted(tags_seen(a)) == sorted(["L"] + ["H%d" % i for i in range(12)])
    wait_for(lambda: in_flight(r) == 0, 15, what="nothing in flight")
