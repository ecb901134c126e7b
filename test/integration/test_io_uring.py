"""test_io_uring.py: a worker's socket reads and writes go out in batches through io_uring (config
`io_uring`, on by default): concurrent clients share the system calls of a loop turn, and every
answer is whole; with `io_uring` false each read and write is a call of its own, and the
answers are the same. Where the kernel refuses the ring (a container runtime's seccomp profile:
Docker's and Kubernetes' RuntimeDefault refuse io_uring_setup), or refuses to run it after
giving it, the workers make their own calls and nothing is lost: those refusals are made here
with a seccomp filter on pcrouter itself."""
import errno
import http.client
import json
import os
import threading
import urllib.parse

import seccomp

from conftest import BUILD, H2Client, completion, get_metrics, metric, wait_for


def together(n, client):
    """Runs client(i, start, errors) for i < n on threads at once (`start`: a barrier of n
    they wait on before their first request); asserts none of them reported an error."""
    errors = []
    start = threading.Barrier(n)
    threads = [threading.Thread(target=client, args=(i, start, errors)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def burst(router, clients=24, each=4, tls=None):
    """`clients` keep-alive connections, each sending `each` completions at once with the others;
    the bodies of the answers, in order, per client. tls: an ssl.SSLContext, to the router's
    TLS listener."""
    u = urllib.parse.urlsplit(router.url("/"))
    out = [None] * clients

    def client(i, start, errors):
        try:
            if tls is not None:
                conn = http.client.HTTPSConnection(u.hostname, router.tls_port, timeout=30, context=tls)
            else:
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

    together(clients, client)
    return out


def test_a_turns_reads_and_writes_share_one_system_call(cluster):
    c = cluster(2, workers=1)
    before = get_metrics(c.router)
    assert metric(before, "pcrouter_io_uring_workers") == 1, "the worker has no ring"
    for _ in range(10):  # bounded: a burst almost always gives turns with several sockets ready
        assert_all_answered(burst(c.router))
        text = get_metrics(c.router)
        submits = metric(text, "pcrouter_io_uring_submits_total")
        ops = metric(text, "pcrouter_io_uring_ops_total")
        if ops > submits * 1.5:
            break
    assert ops > submits * 1.5, "no turn batched several sockets: %s ops in %s submits" % (ops, submits)


def one_at_a_time(router, n, what):
    """`n` completions on one keep-alive connection, each sent once the last is answered."""
    u = urllib.parse.urlsplit(router.url("/"))
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    for i in range(n):
        conn.request("POST", "/v1/completions", body=json.dumps(completion("%s %d" % (what, i))),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and b'"choices"' in resp.read(), resp.status
    conn.close()


def test_a_turn_with_one_operation_makes_a_plain_call(cluster):
    """A submit of one operation costs more than the call it replaces and batches nothing:
    requests one at a time (a read, then a write, on each side, each in a turn of its own) make
    no submit at all, while the ring stays up for the turns that have several."""
    # No health checks after the first: their reads and writes could share a turn.
    c = cluster(2, workers=1, health={"interval_ms": 600000})
    one_at_a_time(c.router, 6, "one at a time")
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_io_uring_workers") == 1
    assert metric(text, "pcrouter_io_uring_submits_total") == 0
    assert metric(text, "pcrouter_io_uring_ops_total") == 0
    for _ in range(10):  # bounded: a burst almost always gives turns with several sockets ready
        assert_all_answered(burst(c.router, clients=8, each=2))
        if metric(get_metrics(c.router), "pcrouter_io_uring_submits_total") > 0:
            break
    assert metric(get_metrics(c.router), "pcrouter_io_uring_ops_total") >= 2


def h2_burst(router, conns=4, streams=16):
    """`conns` h2c connections at once, each with `streams` completions in flight together;
    asserts every answer is a whole 200."""
    def client(i, start, errors):
        h = None
        try:
            h = H2Client(router.port, timeout=30)
            start.wait(timeout=30)
            sids = [h.request("POST", "/v1/completions",
                              completion("h2 client %d stream %d. " % (i, j) * 20))
                    for j in range(streams)]
            h.wait(lambda: all(h.streams[s]["ended"] or h.streams[s]["reset"] is not None
                               for s in sids), timeout=30, what="every stream's answer")
            for s in sids:
                st = h.streams[s]
                if (st["headers"] or {}).get(":status") != "200" or b'"choices"' not in st["data"]:
                    errors.append("client %d stream %d: %r %r" % (i, s, st["headers"], st["data"][:200]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("client %d: %r" % (i, e))
        finally:
            if h is not None:
                h.close()

    together(conns, client)


def test_a_busy_turns_writes_go_out_with_the_next_turns_reads(cluster):
    """A turn that read several sockets leaves what their callbacks wrote for the next turn,
    which only looks for events (a loop must not sleep while writes wait) and submits those
    writes with its own reads in one call. Under bursts over HTTP/1.1 and over h2c (many streams
    on a few connections), some submits carry both, and every answer is whole: a loop that
    slept with writes waiting, or kept looking without making its reads, would leave these
    requests unanswered."""
    c = cluster(2, workers=1)
    merged = 0
    for _ in range(10):  # bounded: a burst almost always gives turns that read several sockets
        assert_all_answered(burst(c.router))
        h2_burst(c.router)
        merged = metric(get_metrics(c.router), "pcrouter_io_uring_merged_total")
        if merged > 0:
            break
    assert merged > 0, "no submit carried a turn's writes with the next turn's reads"


def test_io_uring_false_makes_a_call_per_read_and_write(cluster):
    c = cluster(2, workers=1, io_uring=False)
    out = burst(c.router, clients=8, each=3)
    assert all(status == 200 and b'"choices"' in body for got in out for status, body in got)
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_io_uring_workers") == 0
    assert metric(text, "pcrouter_io_uring_submits_total") == 0
    assert metric(text, "pcrouter_io_uring_ops_total") == 0
    assert metric(text, "pcrouter_io_uring_merged_total") == 0


def refusing(call, err, *args):
    """A preexec_fn: pcrouter starts with `call` failing with `err`, as under a seccomp profile
    that refuses it (the filter outlives exec; every other call is allowed); `args`
    (seccomp.Arg) narrow the refusal to the calls whose arguments match."""
    def pre():
        f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        f.add_rule(seccomp.ERRNO(err), call, *args)
        f.load()
    return pre


def start_refused(cluster, call, workers):
    return cluster(2, workers=workers,
                   popen={"preexec_fn": refusing(call, errno.EPERM)}).router


def assert_all_answered(out):
    for got in out:
        for status, body in got:
            assert status == 200 and b'"choices"' in body, (status, body[:200])


def test_a_refused_ring_leaves_each_worker_to_its_own_calls(cluster):
    r = start_refused(cluster, "io_uring_setup", workers=2)
    # Said once, at start, with the kernel's reason, and not by every worker.
    assert r.stderr_text().count("io_uring: no ring (Operation not permitted)") == 1, \
        r.err.tail()
    assert_all_answered(burst(r, clients=12, each=3))
    text = get_metrics(r)
    assert metric(text, "pcrouter_io_uring_workers") == 0
    assert metric(text, "pcrouter_io_uring_submits_total") == 0
    assert metric(text, "pcrouter_io_uring_ops_total") == 0


def test_a_ring_the_kernel_will_not_run_is_given_up_without_losing_a_read(cluster):
    """The ring is made, but io_uring_enter fails: the first turn with reads of several
    clients' requests finds its submit refused. Nothing was read then, so the sockets are still
    readable; the worker gives the ring up for good and reads them with calls of their own in
    the next turn."""
    r = start_refused(cluster, "io_uring_enter", workers=1)
    assert "io_uring: no ring" not in r.stderr_text()
    assert_all_answered(burst(r, clients=12, each=3))
    wait_for(lambda: "io_uring: submitting failed (Operation not permitted)" in r.stderr_text(),
             10, 0.05, "the worker to say it gave its ring up")
    text = get_metrics(r)
    assert metric(text, "pcrouter_io_uring_workers") == 0, "the gauge still counts a ring given up"
    assert metric(text, "pcrouter_io_uring_submits_total") == 0
    # And it goes on: a second round after the give-up is answered the same.
    assert_all_answered(burst(r, clients=4, each=2))


def two_streams_in_one_read(r):
    """Four requests one at a time (round robin: two on each pod's pooled connection, each
    read and write a call of its own); then one read of an h2c connection brings two streams'
    requests, and the turn's writes, each stream's request to its pod, make the ring's first
    submit of two operations. Asserts the ring still ran after the warm-up and both streams'
    answers."""
    one_at_a_time(r, 4, "warm-up")
    assert metric(get_metrics(r), "pcrouter_io_uring_workers") == 1, \
        "the warm-up already broke the ring"
    h = H2Client(r.port)
    try:
        h.wait(lambda: h.conn.remote_settings.initial_window_size > 0, what="the router's SETTINGS")
        # Both streams' frames in one write: one read at the router.
        sids = [h.request("POST", "/v1/completions", completion("stream %d" % j), flush=False)
                for j in range(2)]
        h.flush()
        h.wait(lambda: all(h.streams[s]["ended"] or h.streams[s]["reset"] is not None
                           for s in sids), timeout=20, what="both streams' answers")
        for s in sids:
            st = h.streams[s]
            assert (st["headers"] or {}).get(":status") == "200", st
            assert b'"choices"' in st["data"], st["data"][:200]
    finally:
        h.close()


def given_up(r, why):
    wait_for(lambda: "io_uring: submitting failed (%s)" % why in r.stderr_text(),
             10, 0.05, "the worker to say it gave its ring up")
    assert metric(get_metrics(r), "pcrouter_io_uring_workers") == 0


def test_a_refused_submit_of_writes_is_given_up_and_every_write_still_goes(cluster):
    """Every submit of two operations or more is refused (io_uring_enter's count of operations,
    its second argument; one operation alone is a plain call and makes none). The warm-up makes
    no submit, so the first is the two streams' writes: refused, the worker gives the ring up,
    and the writes it held go with a call each. Both streams are answered, and what follows
    too."""
    c = cluster(2, workers=1, popen={"preexec_fn": refusing(
        "io_uring_enter", errno.EPERM, seccomp.Arg(1, seccomp.GE, 2))})
    two_streams_in_one_read(c.router)
    given_up(c.router, "Operation not permitted")
    assert_all_answered(burst(c.router, clients=4, each=2))


def completions_at_pods(c):
    return sum(s["requests"].get("/v1/completions", 0) for s in c.stats().values())


def test_a_short_submit_sends_what_it_left_once_and_what_it_made_never_again(cluster):
    """The kernel stops a submit short when it cannot allocate: the operations it took are
    done, the rest never were. Made here by a preloaded library (cut_submit.c) that holds the
    last operation of the first submit of two or more back: of the two streams' writes, the
    first goes through the ring and the second does not. The worker gives the ring up; the
    write it made must not be sent again (its pod would get the request twice) and the one it
    did not make must go: each pod gets each request once."""
    env = dict(os.environ, PCR_TEST_CUT_SUBMIT="1",
               LD_PRELOAD=os.path.join(BUILD, "test", "libpcr_cut_submit.so"),
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
    # No health checks after the first: their writes could share the first submit of two.
    c = cluster(2, workers=1, popen={"env": env}, health={"interval_ms": 600000})
    two_streams_in_one_read(c.router)
    given_up(c.router, "Cannot allocate memory")
    assert completions_at_pods(c) == 6, c.stats()
    assert_all_answered(burst(c.router, clients=4, each=2))
    assert completions_at_pods(c) == 14, c.stats()
