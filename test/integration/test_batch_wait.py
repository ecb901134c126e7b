"""test_batch_wait.py: a busy worker lets events gather (config `batch_wait_us`) before it looks
for them again, so that one loop turn handles several; `pcrouter_batch_waits_total` counts those
sleeps. Under concurrent clients, over HTTP/1.1 and h2c, with batched I/O or without, the worker
gathers and every answer is whole; one client at a time (a turn with one event) never makes it
wait; 0 turns it off, and a reload turns it on again."""
import json
import urllib.parse
import http.client

from conftest import completion, get_metrics, metric
from test_io_uring import assert_all_answered, burst, h2_burst
from test_reload import reload

# The longest wait: with the tests' clients, in Python, arrivals are far apart, and a worker
# only gathers when its last wait found two events or more within batch_wait_us.
LONGEST = 1000


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
    c = cluster(2, workers=1, batch_wait_us=LONGEST)
    assert waits(c.router) == 0
    assert gather_under_bursts(c.router), "the worker never let events gather under bursts"


def test_without_io_uring_the_worker_gathers_too(cluster):
    c = cluster(2, workers=1, io_uring=False, batch_wait_us=LONGEST)
    assert metric(get_metrics(c.router), "pcrouter_io_uring_workers") == 0
    assert gather_under_bursts(c.router), "the epoll loop never let events gather"


def test_one_client_at_a_time_never_waits(cluster):
    """A single keep-alive client taking turns with its pod brings one event a turn: no wait,
    so no added latency at light load. Health checks are far apart, so that their answers do
    not share a turn with the client's."""
    c = cluster(2, workers=1, batch_wait_us=LONGEST, health={"interval_ms": 60000})
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
    c = cluster(2, workers=1, batch_wait_us=0)
    for _ in range(5):
        assert_all_answered(burst(c.router))
        h2_burst(c.router)
    assert waits(c.router) == 0, "batch_wait_us 0 still waited"
    cfg = dict(c.router.config)
    cfg["batch_wait_us"] = LONGEST
    reload(c.router, cfg)
    assert gather_under_bursts(c.router), "the reloaded batch_wait_us was not used"
