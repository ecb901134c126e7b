"""test_io_uring.py: a worker's socket reads and writes go out in batches through io_uring (config
`io_uring`, on by default): concurrent clients share the system calls of a loop turn, and every
answer is whole; with `io_uring` false each read and write is a call of its own, and the
answers are the same."""
import http.client
import json
import threading
import urllib.parse

from conftest import completion, get_metrics, metric


def burst(router, clients=24, each=4):
    """`clients` keep-alive connections, each sending `each` completions at once with the others;
    the bodies of the answers, in order, per client."""
    u = urllib.parse.urlsplit(router.url("/"))
    out, errors = [None] * clients, []
    start = threading.Barrier(clients)

    def client(i):
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            start.wait(timeout=30)
            got = []
            for j in range(each):
                body = completion("client %d asks question %d. " % (i, j) * 20)
                conn.request("POST", "/v1/completions", body=json.dumps(body),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                got.append((r.status, r.read()))
            conn.close()
            out[i] = got
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("client %d: %r" % (i, e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def test_a_turns_reads_and_writes_share_one_system_call(cluster):
    c = cluster(2, workers=1)
    before = get_metrics(c.router)
    assert metric(before, "pcrouter_io_uring_workers") == 1, "the worker has no ring"
    n = 0
    for _ in range(10):  # bounded: a burst almost always gives turns with several sockets ready
        out = burst(c.router)
        for got in out:
            for status, body in got:
                assert status == 200 and b'"choices"' in body, (status, body[:200])
                n += 1
        text = get_metrics(c.router)
        submits = metric(text, "pcrouter_io_uring_submits_total")
        ops = metric(text, "pcrouter_io_uring_ops_total")
        if ops > submits * 1.5:
            break
    # Each request is at least a read and a write on each side, all of them through the ring.
    assert ops >= 4 * n, (ops, n)
    assert ops > submits * 1.5, "no turn batched several sockets: %s ops in %s submits" % (ops, submits)


def test_io_uring_false_makes_a_call_per_read_and_write(cluster):
    c = cluster(2, workers=1, io_uring=False)
    out = burst(c.router, clients=8, each=3)
    assert all(status == 200 and b'"choices"' in body for got in out for status, body in got)
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_io_uring_workers") == 0
    assert metric(text, "pcrouter_io_uring_submits_total") == 0
    assert metric(text, "pcrouter_io_uring_ops_total") == 0
