"""test_batch_wait.py: a busy worker lets events gather (config `batch_wait_us`) before it looks
for them again, so that one loop turn handles several; `pcrouter_batch_waits_total` counts those
sleeps. Under concurrent clients, over HTTP/1.1 and h2c, with batched I/O or without, the worker
gathers and every answer is whole; one client at a time (a turn with one event) never makes it
wait; 0 turns it off, and a reload turns it on again. A worker that is not busy enough
(`batch_wait_busy`) never gathers; `pcrouter_worker_cpu_seconds_total` counts its CPU time.

Clients in Python cannot keep a worker busy half the time, so the tests that want the worker to
gather set `batch_wait_busy` 0 (gather whatever the load)."""
import json
import os
import urllib.parse
import http.client

from conftest import completion, get_metrics, metric
from test_io_uring import assert_all_answered, burst, h2_burst
from test_reload import reload

# The longest wait: with the tests' clients, in Python, arrivals are far apart, and a worker
# only gathers when its last wait found two events or more within batch_wait_us.
LONGEST = 1000
ANY_LOAD = 0


def waits(router):
    return metric(get_metrics(router), "pcrouter_batch_waits_total")


def gather_under_bursts(router, tries=10):
    """Bursts of concurrent clients until the worker has gathered at least once (bounded)."""
    for _ in range(tries):
        assert_all_answered(burst(router))
        h2_burst(router)
        if waits(router) > 0:
            return True
    return False


def test_a_busy_worker_gathers_and_answers_everything(cluster):
    c = cluster(2, workers=1, batch_wait_us=LONGEST, batch_wait_busy=ANY_LOAD)
    assert waits(c.router) == 0
    assert gather_under_bursts(c.router), "the worker never let events gather under bursts"


def test_without_io_uring_the_worker_gathers_too(cluster):
    c = cluster(2, workers=1, io_uring=False, batch_wait_us=LONGEST,
                batch_wait_busy=ANY_LOAD)
    assert metric(get_metrics(c.router), "pcrouter_io_uring_workers") == 0
    assert gather_under_bursts(c.router), "the epoll loop never let events gather"


def test_one_client_at_a_time_never_waits(cluster):
    """A single keep-alive client taking turns with its pod brings one event a turn: no wait,
    so no added latency at light load. Health checks are far apart, so that their answers do
    not share a turn with the client's."""
    c = cluster(2, workers=1, batch_wait_us=LONGEST, batch_wait_busy=ANY_LOAD,
                health={"interval_ms": 60000})
    u = urllib.parse.urlsplit(c.router.url("/"))
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    for i in range(60):
        conn.request("POST", "/v1/completions",
                     body=json.dumps(completion("one client, question %d. " % i * 20)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and b'"choices"' in r.read()
    conn.close()
    assert waits(c.router) == 0


def test_zero_turns_it_off_and_a_reload_turns_it_on(cluster):
    c = cluster(2, workers=1, batch_wait_us=0, batch_wait_busy=ANY_LOAD)
    for _ in range(5):
        assert_all_answered(burst(c.router))
        h2_burst(c.router)
    assert waits(c.router) == 0, "batch_wait_us 0 still waited"
    cfg = dict(c.router.config)
    cfg["batch_wait_us"] = LONGEST
    reload(c.router, cfg)
    assert gather_under_bursts(c.router), "the reloaded batch_wait_us was not used"


def cpu_seconds(pid):
    """The process's CPU time (user and system) from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_worker_not_busy_enough_never_gathers(cluster):
    """batch_wait_busy 1: a worker would have to run all of every 10 ms to gather, which bursts
    of Python clients never make it do. The same bursts gather with 0 (the tests above), so the
    gate is what stops it. Its CPU time is counted, and is part of the process's."""
    c = cluster(2, workers=1, batch_wait_us=LONGEST, batch_wait_busy=1)
    for _ in range(5):
        assert_all_answered(burst(c.router))
        h2_burst(c.router)
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_batch_waits_total") == 0, "a worker not busy enough gathered"
    used = metric(text, "pcrouter_worker_cpu_seconds_total")
    assert used > 0, "the worker's CPU time was not counted"
    # Clock ticks round the process's figure down, by 10 ms at most.
    assert used <= cpu_seconds(c.router.proc.pid) + 0.02
    cfg = dict(c.router.config)
    cfg["batch_wait_busy"] = ANY_LOAD
    reload(c.router, cfg)
    assert gather_under_bursts(c.router), "the reloaded batch_wait_busy was not used"
