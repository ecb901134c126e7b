"""test_precise.py: precise mode end to end, pcrouter against vllm_sim pods with --kv-events.

routing.index "events": the router follows every pod's KV-event publisher (ZMQ SUB, replay
on gaps), asks a pod for each prompt's tokens (/tokenize or the render endpoints) and routes on
what the pods said they hold. The tests put a prompt's blocks on a pod by sending it straight
to that pod, behind the router's back: only the pod's events can tell the router, so a request
routed there afterwards shows the feature at work (the approximate index would place it on the
ring). Every wait polls with a deadline.
"""
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import BUILD, PCROUTER, LineReader, make_config, wait_for

SIM = os.path.join(BUILD, "bench", "sim", "vllm_sim")
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Pods:
    """One vllm_sim process with n pods, each publishing its KV events."""

    def __init__(self, n, *extra, time_scale=100):
        argv = [SIM, "--time-scale", str(time_scale), "--kv-events", "0"] + list(extra)
        for i in range(n):
            argv += ["--port", "0", "--name", "p%d" % i]
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.err = LineReader(self.p.stderr, "vllm_sim")
        self.urls, self.pub, self.replay = {}, {}, {}
        try:
            for i in range(n):
                name = "p%d" % i
                m = self.err.wait_line(r"pod %s listening on ([\d.]+):(\d+)" % name, 30)
                assert m, self.err.text()
                self.urls[name] = "http://%s:%s" % (m[1].group(1), m[1].group(2))
                m = self.err.wait_line(r"pod %s kv-events (tcp://\S+) replay (tcp://\S+)" % name, 30)
                assert m, self.err.text()
                self.pub[name], self.replay[name] = m[1].group(1), m[1].group(2)
            assert self.err.wait_line(r"vllm-sim: ready", 30), self.err.text()
        except BaseException:
            self.stop()
            raise
        self.names = ["p%d" % i for i in range(n)]

    def backends(self, replay=True, kv=True):
        out = []
        for name in self.names:
            b = {"name": name, "url": self.urls[name]}
            if kv:
                b["kv_events"] = {"endpoint": self.pub[name]}
                if replay:
                    b["kv_events"]["replay_endpoint"] = self.replay[name]
            out.append(b)
        return out

    def post(self, name, path, obj, timeout=30):
        req = urllib.request.Request(self.urls[name] + path, data=json.dumps(obj).encode(),
                                     headers={"Content-Type": "application/json"})
        with _direct.open(req, timeout=timeout) as r:
            return json.loads(r.read())

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)


@pytest.fixture
def pods():
    made = []

    def make(n, *extra, **kw):
        p = Pods(n, *extra, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def config(pods, index="events", replay=True, workers=2, scrape_ms=100, **routing):
    r = {"policy": "cache_aware", "index": index}
    r.update(routing)
    return make_config(pods.backends(replay=replay), routing=r, workers=workers,
                       scrape={"interval_ms": scrape_ms, "models_interval_ms": 0})


def complete(router, prompt, max_tokens=1):
    body = json.dumps({"model": "sim-8b", "prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(router.url("/v1/completions"), data=body,
                                 headers={"Content-Type": "application/json"})
    with _direct.open(req, timeout=30) as r:
        out = json.loads(r.read())
        return r.status, r.headers.get("x-pcrouter-backend"), out


def chat(router, messages):
    body = json.dumps({"model": "sim-8b", "messages": messages, "max_tokens": 1}).encode()
    req = urllib.request.Request(router.url("/v1/chat/completions"), data=body,
                                 headers={"Content-Type": "application/json"})
    with _direct.open(req, timeout=30) as r:
        return r.status, r.headers.get("x-pcrouter-backend"), json.loads(r.read())


def metrics(router):
    with _direct.open(router.url("/metrics"), timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def metric(router, name, default=0.0):
    return metrics(router).get(name, default)


def kv_blocks(router, pod, medium="gpu"):
    return metric(router, 'pcrouter_backend_kv_blocks{backend="%s",medium="%s"}' % (pod, medium))


def prompt_of(tag, nbytes=2048):
    """A prompt of whole 64-byte blocks (16 toy tokens each), distinct per tag."""
    base = ("%s:" % tag) * (nbytes // (len(tag) + 1) + 1)
    return base[:nbytes]


def subscribed(pods, router, names=None):
    """Waits until the router follows each pod: ZMQ's PUB drops what it sends before a
    subscription is connected, so a warm-up request goes to the pod until one of its batches
    reaches the router (the router then asks the pod's replay buffer for the earlier ones)."""
    for name in names or pods.names:
        key = 'pcrouter_backend_kv_blocks{backend="%s",medium="gpu"}' % name
        n = [0]

        def seen():
            n[0] += 1
            seed(pods, name, "warm-up %s %d " % (name, n[0]) * 8)
            return metric(router, key) > 0

        wait_for(seen, timeout=10, interval=0.05, what="the router subscribed to %s" % name)
    return router


def seed(pods, pod, prompt):
    """Puts the prompt's blocks in the pod's cache, behind the router's back."""
    pods.post(pod, "/v1/completions", {"model": "sim-8b", "prompt": prompt, "max_tokens": 1})


def test_requests_follow_the_pods_events(pods, router_factory):
    p = pods(4)
    r = subscribed(p, router_factory(config(p, workers=1)))
    prompts = {name: prompt_of("follow-%s" % name) for name in p.names}
    for name, text in prompts.items():
        seed(p, name, text)
    # Each pod's events reach the index: 2048 bytes are 32 blocks of 16 tokens.
    for name in p.names:
        wait_for(lambda name=name: kv_blocks(r, name) >= 32, timeout=5,
                 what="the index to hold what %s said it stored" % name)
    for name, text in prompts.items():
        status, backend, out = complete(r, text)
        assert status == 200
        assert backend == name, "a prompt only %s holds went to %s" % (name, backend)
    m = metrics(r)
    assert m["pcrouter_precise_decisions_total"] >= 4
    assert m["pcrouter_tokenize_requests_total"] >= 4
    assert m["pcrouter_kv_events_total"] > 0
    assert m["pcrouter_kv_event_batches_total"] > 0
    assert m['pcrouter_route_decision_seconds_count{phase="tokenize"}'] >= 4
    # The same prompt again: its tokens come from the worker's cache, not the pod.
    calls = m["pcrouter_tokenize_requests_total"]
    status, backend, _ = complete(r, prompts["p2"])
    assert backend == "p2"
    m = metrics(r)
    assert m["pcrouter_tokenize_cache_hits_total"] >= 1
    assert m["pcrouter_tokenize_requests_total"] == calls


def test_the_workers_share_one_cache_of_tokens(pods, router_factory, tmp_path):
    """A prompt one worker tokenized is not asked again by the other: each request on a new
    connection, until the access log shows both workers served it, and one tokenization in
    all. (A conversation's turns come on connections of their own, to any worker.)"""
    p = pods(2)
    log = tmp_path / "access.log"
    cfg = config(p, workers=2)
    cfg["log"] = {"access_log_path": str(log), "access_log_format": "json"}
    r = router_factory(cfg)
    text = prompt_of("shared-by-workers")

    def lines():
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()
                if '"/v1/completions"' in line]

    sent = [0]

    def both():
        assert complete(r, text)[0] == 200
        sent[0] += 1
        got = wait_for(lambda: len(lines()) == sent[0] and lines(), timeout=5,
                       what="the access log's line")
        return len({line["worker"] for line in got}) == 2

    wait_for(both, timeout=30, interval=0, what="a request on each worker")
    m = metrics(r)
    assert m["pcrouter_tokenize_requests_total"] == 1
    assert m["pcrouter_tokenize_cache_hits_total"] == sent[0] - 1


def test_tokenize_cache_is_bounded_in_bytes(pods, router_factory):
    """routing.tokenize_cache_bytes bounds the token blocks and text blocks (8 bytes each) the
    cache holds. A full cache still takes a new prompt: an older one makes room, and is asked
    again when it comes back. A prompt larger than the bound alone is never kept."""
    p = pods(2)
    # 32 token blocks and 7 text blocks (all but the last of 2048 bytes) are 312 bytes: 400
    # keeps one such prompt, not two. 8192 bytes are 128 + 31 blocks, 1272 bytes: never.
    r = router_factory(config(p, workers=1, tokenize_cache_bytes=400))
    first, second, large = prompt_of("bound-a"), prompt_of("bound-b"), prompt_of("big", 8192)
    asked = [1, 0, 1, 0, 1, 1, 1, 0]
    for i, text in enumerate((first, first, second, second, first, large, large, first)):
        before = metric(r, "pcrouter_tokenize_requests_total")
        assert complete(r, text)[0] == 200
        assert metric(r, "pcrouter_tokenize_requests_total") - before == asked[i], i


def test_chat_and_render(pods, router_factory):
    p = pods(3)
    r = subscribed(p, router_factory(config(p, tokenize="render")), ["p1"])
    msgs = [{"role": "system", "content": prompt_of("chat-system", 1536)},
            {"role": "user", "content": "hello there"}]
    p.post("p1", "/v1/chat/completions", {"model": "sim-8b", "messages": msgs, "max_tokens": 1})
    wait_for(lambda: kv_blocks(r, "p1") >= 16, timeout=5, what="p1's chat blocks in the index")
    status, backend, _ = chat(r, msgs)
    assert status == 200 and backend == "p1"
    assert metric(r, "pcrouter_precise_decisions_total") >= 1


def test_pod_restart_clears_its_entries(pods, router_factory):
    p = pods(2)
    # A slow scrape: the pod's events tell of its restart long before its metrics do.
    r = subscribed(p, router_factory(config(p, scrape_ms=3000)), ["p1"])
    scraped = 'pcrouter_backend_restarts_total{backend="p1"}'
    usage = 'pcrouter_backend_kv_cache_usage_ratio{backend="p1"}'
    wait_for(lambda: usage in metrics(r), timeout=10, what="p1 scraped once")
    seed(p, "p1", prompt_of("restart"))
    wait_for(lambda: kv_blocks(r, "p1") >= 32, timeout=5, what="p1's blocks in the index")
    before = metric(r, scraped)
    p.post("p1", "/sim/restart", {})
    # AllBlocksCleared and a sequence back at 0: the index forgets p1 at once.
    t0 = time.monotonic()
    wait_for(lambda: kv_blocks(r, "p1") == 0, timeout=5, what="p1's entries gone after restart")
    assert time.monotonic() - t0 < 1.5
    # Its new life is followed from there (once the subscription has connected to the new
    # publisher: what it sends before is lost, as from any PUB socket).
    wait_for(lambda: _alive(p, "p1"), timeout=10, what="p1 back")
    subscribed(p, r, ["p1"])
    seed(p, "p1", prompt_of("after-restart"))
    # (A generous deadline: under ThreadSanitizer the pod and the router both run slowly.)
    wait_for(lambda: kv_blocks(r, "p1") >= 32, timeout=20, what="p1 followed after its restart")
    # The scrape sees the restart later: it drops the router's guesses of p1, never what the
    # new life published (usually before then, with this slow scrape). A batch published after
    # the scrape's drop reaches each replica after it, so both prompts' blocks are counted.
    wait_for(lambda: metric(r, scraped) > before, timeout=15, what="the scrape saw p1 restart")
    seed(p, "p1", prompt_of("after-scrape"))
    wait_for(lambda: kv_blocks(r, "p1") >= 64, timeout=20,
             what="p1's blocks of its new life kept through the scrape's restart")
    for tag in ("after-restart", "after-scrape"):
        status, backend, _ = complete(r, prompt_of(tag))
        assert status == 200 and backend == "p1"


def _alive(p, name):
    try:
        p.post(name, "/tokenize", {"model": "sim-8b", "prompt": "x"}, timeout=2)
        return True
    except (urllib.error.URLError, OSError):
        return False


def test_gaps_are_replayed_and_counted(pods, router_factory):
    p = pods(2, "--kv-events-drop", "0.5", "--seed", "7")
    r = subscribed(p, router_factory(config(p)), ["p0"])
    names = ["gap-%d" % i for i in range(12)]
    base = kv_blocks(r, "p0")
    for tag in names:
        seed(p, "p0", prompt_of(tag, 1024))
    # Batches left out show as gaps once a later one arrives; the replay socket fills them.
    # A batch left out last shows only at the next one: small requests follow until the
    # index holds every seeded block (each filler adds its own, never what a lost batch had;
    # the routing below checks that nothing was lost).
    n = [0]

    def caught_up():
        n[0] += 1
        seed(p, "p0", "filler %d " % n[0] * 16)
        return kv_blocks(r, "p0") >= base + 16 * 12

    wait_for(caught_up, timeout=10, interval=0.05, what="every seeded block indexed")
    m = metrics(r)
    assert m["pcrouter_kv_event_gaps_total"] >= 1
    assert m['pcrouter_kv_event_replays_total{result="ok"}'] >= 1
    assert m["pcrouter_kv_event_clears_total"] == 0
    for tag in names:
        assert complete(r, prompt_of(tag, 1024))[1] == "p0"
    assert metric(r, "pcrouter_precise_decisions_total") >= 12


def test_gap_without_replay_rebuilds(pods, router_factory):
    p = pods(2, "--kv-events-drop", "0.5", "--seed", "3")
    r = subscribed(p, router_factory(config(p, replay=False)), ["p0"])
    for i in range(10):
        seed(p, "p0", prompt_of("norep-%d" % i, 1024))
    wait_for(lambda: metric(r, "pcrouter_kv_event_gaps_total") >= 1, timeout=5,
             what="a gap seen")
    # No replay: the pod's entries are dropped and rebuilt from what follows.
    assert metric(r, "pcrouter_kv_event_clears_total") >= 1
    seed(p, "p0", prompt_of("norep-after", 1024))
    wait_for(lambda: kv_blocks(r, "p0") >= 16, timeout=5, what="rebuilt from the next events")


def test_tokenize_timeout_falls_back(pods, router_factory):
    # 100 ms of model time at scale 1: past the router's 20 ms deadline.
    p = pods(2, "--tokenize-delay-ms", "300", time_scale=1)
    r = router_factory(config(p, tokenize_timeout_ms=20))
    t0 = time.monotonic()
    status, backend, out = complete(r, prompt_of("slow-tokenizer"))
    assert status == 200 and backend in p.names
    m = metrics(r)
    assert m['pcrouter_tokenize_failures_total{reason="timeout"}'] >= 1
    assert m["pcrouter_precise_decisions_total"] == 0
    assert time.monotonic() - t0 < 5


def test_the_access_log_gives_each_requests_tokenize_time(pods, router_factory, tmp_path):
    """tokenize_ms: the wait for a pod's tokenizer (300 ms here) on the first request, the
    cache's answer on the second; null where nothing was tokenized (approximate mode)."""
    p = pods(2, "--tokenize-delay-ms", "300", time_scale=1)
    logs = {}
    for index in ("events", "approximate"):
        logs[index] = tmp_path / ("%s.log" % index)
        cfg = config(p, index=index, workers=1, tokenize_timeout_ms=5000)
        cfg["log"] = {"access_log_path": str(logs[index]), "access_log_format": "json"}
        r = router_factory(cfg)
        text = prompt_of("logged-%s" % index)
        for _ in range(2):
            assert complete(r, text)[0] == 200

    def lines(index):
        if not logs[index].exists():
            return []
        return [json.loads(line) for line in logs[index].read_text().splitlines()
                if '"/v1/completions"' in line]

    got = wait_for(lambda: len(lines("events")) == 2 and lines("events"), timeout=5,
                   what="the events router's two lines")
    assert got[0]["tokenize_ms"] >= 250 and got[0]["ttfb_ms"] >= got[0]["tokenize_ms"]
    assert got[1]["tokenize_ms"] is not None and got[1]["tokenize_ms"] < 50
    got = wait_for(lambda: len(lines("approximate")) == 2 and lines("approximate"), timeout=5,
                   what="the approximate router's two lines")
    assert all(line["tokenize_ms"] is None for line in got)


@pytest.mark.parametrize("reuse", [True, False])
def test_a_prompt_that_extends_a_tokenized_one_is_routed_without_waiting(pods, router_factory,
                                                                         reuse):
    """A conversation's next turn begins with the text of a prompt the worker tokenized: it is
    routed at once on that prompt's token blocks (routing.tokenize_reuse_prefix, the default),
    to the pod that holds them, while its own tokens are asked for the cache in the background.
    The pods' tokenizers answer after 3 s: with the reuse off, the turn waits for its own."""
    p = pods(3, "--tokenize-delay-ms", "3000", time_scale=1)
    r = subscribed(p, router_factory(config(p, workers=1, tokenize_timeout_ms=10000,
                                            tokenize_reuse_prefix=reuse)))
    first = prompt_of("turn-1")
    status, x, _ = complete(r, first)
    assert status == 200
    # Only another pod holds the first turn now: x comes back empty, y gets it and more, behind
    # the router's back, so that only the pods' events and the cached tokens can lead there.
    y = next(n for n in p.names if n != x)
    p.post(x, "/sim/restart", {})
    wait_for(lambda: kv_blocks(r, x) == 0, timeout=5, what="%s's entries gone" % x)
    seed(p, y, first + prompt_of("turn-2", 1024))
    wait_for(lambda: kv_blocks(r, y) >= 48, timeout=5, what="%s's blocks in the index" % y)
    before = metrics(r)
    nxt = first + prompt_of("turn-2", 1024) + prompt_of("turn-3", 512)
    t0 = time.monotonic()
    status, backend, _ = complete(r, nxt)
    took = time.monotonic() - t0
    m = metrics(r)
    assert status == 200 and backend == y
    assert m["pcrouter_precise_decisions_total"] == before["pcrouter_precise_decisions_total"] + 1
    assert m['pcrouter_tokenize_failures_total{reason="timeout"}'] == 0
    hits = m["pcrouter_tokenize_cache_prefix_hits_total"]
    if not reuse:
        assert hits == 0 and m["pcrouter_tokenize_refreshes_total"] == 0
        assert took >= 3.0, "the turn was routed before its tokens came (%.2f s)" % took
        return
    assert hits == 1
    assert took < 2.5, "the turn waited %.2f s for the pod's tokenizer" % took
    # Its own tokens were asked once, for the cache: once they are in, the same turn is a
    # whole hit, and no second refresh was asked meanwhile.
    assert m["pcrouter_tokenize_refreshes_total"] == 1
    whole = before["pcrouter_tokenize_cache_hits_total"]
    wait_for(lambda: complete(r, nxt)[1] == y and
             metric(r, "pcrouter_tokenize_cache_hits_total") > whole,
             timeout=15, interval=0.3, what="the refreshed tokens in the cache")
    assert metric(r, "pcrouter_tokenize_refreshes_total") == 1


def test_a_turn_after_an_untokenized_one_follows_its_text(pods, router_factory):
    """The second turn of a conversation is routed on the first's tokens (a prefix hit); its own
    are still on their way for the cache (the pods' tokenizers answer after 5 s) when the third
    comes. The router has tokens for the first turn only, but its approximate index knows it sent
    the second's text to x, and x still holds the first's blocks: the third goes to x at once, on
    its text, with no pod asked. Without this it would wait for its own tokens, since x was sent
    more of it than the tokens the router has cover."""
    p = pods(3, "--tokenize-delay-ms", "5000", time_scale=1)
    r = subscribed(p, router_factory(config(p, workers=1, tokenize_timeout_ms=20000)))
    first = prompt_of("turn-1")
    status, x, _ = complete(r, first)
    assert status == 200
    wait_for(lambda: kv_blocks(r, x) >= 32, timeout=5, what="%s's blocks in the index" % x)
    second = first + prompt_of("turn-2", 1024)
    t0 = time.monotonic()
    status, backend, _ = complete(r, second)
    assert status == 200 and backend == x and time.monotonic() - t0 < 4
    before = metrics(r)
    t0 = time.monotonic()
    status, backend, _ = complete(r, second + prompt_of("turn-3", 512))
    took = time.monotonic() - t0
    m = metrics(r)
    assert status == 200 and backend == x
    assert took < 4, "the turn waited %.2f s for the pod's tokenizer" % took
    assert m["pcrouter_tokenize_prefix_text_total"] == \
        before["pcrouter_tokenize_prefix_text_total"] + 1
    for name in ("pcrouter_tokenize_requests_total", "pcrouter_precise_decisions_total",
                 "pcrouter_tokenize_cache_prefix_hits_total"):
        assert m[name] == before[name], name


def tails(router):
    m = metrics(router)
    out = {k: m['pcrouter_tokenize_unknown_tail_total{outcome="%s"}' % k]
           for k in ("paid", "unpaid", "went")}
    out.update({"checked_" + k: m['pcrouter_tokenize_unknown_tail_checked_total{outcome="%s"}' % k]
                for k in ("paid", "unpaid")})
    return out


def test_pods_that_serve_others_too_are_seen(pods, router_factory):
    """Whether the pods serve others than this router (another replica, a client that calls
    them directly) is judged from their own count of finished requests against this router's
    answers from them: requests through the router alone make them private; as many again sent
    to a pod directly, shared."""
    p = pods(2)
    r = router_factory(config(p, workers=1))
    gauge = "pcrouter_pods_shared"
    assert metric(r, gauge) == 0
    sent = [0]

    def through_router():
        assert complete(r, prompt_of("mine-%d" % sent[0], 256))[0] == 200
        sent[0] += 1
        return metric(r, gauge) == 1
    wait_for(through_router, timeout=60, interval=0, what="the pods judged private")

    def also_directly():
        assert complete(r, prompt_of("mine-%d" % sent[0], 256))[0] == 200
        seed(p, "p0", prompt_of("theirs-%d" % sent[0], 256))
        sent[0] += 1
        return metric(r, gauge) == 2
    wait_for(also_directly, timeout=60, interval=0, what="the pods judged shared")


def test_an_unknown_tail_is_waited_for_while_such_waits_pay(pods, router_factory):
    """A prompt begins with a system prompt two pods hold, whose tokens the router has, and no
    pod was sent more of it: only a pod this router never sent it to could hold more (another
    replica's conversation). In a pool that serves this router alone, until that has been
    seen, such prompts go at once on the system
    prompt's tokens, and their own tokens, asked in the background, check whether waiting
    would have paid: the pod the prompt went to, which now holds it all, does not count. Then
    another sender's conversations appear: a check finds one,
    and from then on every such prompt waits for its own tokens, and goes to its
    conversation's pod."""
    p = pods(3)
    # A check that times out reports nothing: the counts below need every answer (TSan is slow).
    r = subscribed(p, router_factory(config(p, workers=1, tokenize_timeout_ms=20000)))
    # Until the router knows its pods serve it alone, unknown tails wait at first (pods that
    # serve another replica too: test_pods_that_serve_others_too_are_seen).
    sent = [0]

    def private():
        assert complete(r, prompt_of("warm-%d" % sent[0], 256))[0] == 200
        sent[0] += 1
        return metric(r, "pcrouter_pods_shared") == 1
    wait_for(private, timeout=60, interval=0, what="the pods judged to serve this router alone")
    system = prompt_of("system")
    held = {n: kv_blocks(r, n) for n in p.names}
    status, x, _ = complete(r, system)
    assert status == 200
    y = next(n for n in p.names if n != x)
    seed(p, y, system)
    for name in (x, y):
        wait_for(lambda name=name: kv_blocks(r, name) >= held[name] + 32, timeout=5,
                 what="%s's system prompt in the index" % name)
    zero = {"paid": 0, "unpaid": 0, "went": 0, "checked_paid": 0, "checked_unpaid": 0}
    for i in range(20):
        status, backend, _ = complete(r, system + prompt_of("user-%d" % i, 1024))
        assert status == 200
        # Each check ends before the next prompt: the worker makes one at a time.
        want = dict(zero, went=i + 1, checked_unpaid=i + 1)
        wait_for(lambda: tails(r) == want, timeout=10, what="the check of tail %d" % i)
    # Another sender's conversations, one pod after another: a prompt that goes on where one
    # left off goes to that pod, once a check found one (unless that pod is over its share of
    # this router's requests: a spill, which the policy counts as such).
    spill = 'pcrouter_route_decisions_total{policy="cache_aware",reason="overload_spill"}'

    def other_turn(tag, i):
        z = p.names[i % len(p.names)]
        other = system + prompt_of("%s-%d" % (tag, i), 1024)
        held = kv_blocks(r, z)
        seed(p, z, other)
        wait_for(lambda: kv_blocks(r, z) >= held + 16, timeout=5,
                 what="%s's conversation in the index" % z)
        before, spilled = tails(r), metric(r, spill)
        status, backend, _ = complete(r, other + prompt_of("next-%s-%d" % (tag, i), 512))
        assert status == 200
        return tails(r)["paid"] - before["paid"], backend == z or metric(r, spill) == spilled + 1

    def checked():
        t = tails(r)
        return t["checked_paid"] + t["checked_unpaid"] == t["went"]
    tries = 0
    while tails(r)["checked_paid"] == 0:
        # It goes at once; its check pays unless it went to that pod anyway.
        assert tries < 40, "no check found another sender's conversation: %s" % tails(r)
        other_turn("other", tries)
        wait_for(checked, timeout=10, what="the check of other turn %d" % tries)
        tries += 1
    for i in range(4):
        assert other_turn("again", i) == (1, True)


IDS = ",".join(str(i) for i in range(1, 33))   # two blocks of 16 tokens
GOOD_ANSWERS = [
    '{"count":32,"max_model_len":1000,"tokens":[%s],"token_strs":null}' % IDS,
    '[{"tokens":[%s]}]' % IDS,                                  # a list of one, as a render
    '{"tokens":[7],"x":{"tokens":"deeper: not it"},"tokens":[%s]}' % IDS,   # the last wins
    '{"tokens":[%s,4294967295,0]}' % IDS,
]
BAD_ANSWERS = [
    '{"tokens":[%s,-1]}' % IDS, '{"tokens":[%s,4294967296]}' % IDS,
    '{"tokens":[%s,2.5]}' % IDS, '{"tokens":[%s,"2"]}' % IDS, '{"tokens":[%s,null]}' % IDS,
    '{"tokens":[%s,[1]]}' % IDS, '{"tokens":[%s,99999999999999999999999]}' % IDS,
    '{"tokens":5}', '{"count":32}', '[{"tokens":[%s]},{"tokens":[1]}]' % IDS, '[]', '"tokens"',
    '{"tokens":[%s]} x' % IDS, '{"tokens":[%s' % IDS, '', '[' * 100 + ']' * 100,
    '{"a":' * 100 + '1' + '}' * 100,
]


def test_tokenize_answers_are_read_strictly(stub_factory, router_factory):
    """The pod's answer is read as it arrives, keeping only the ids: every well-formed shape
    (a list of one, unknown and nested fields, a repeated key, the whole u32 range) gives a
    precise decision; anything else (an id out of range or not an integer, no ids array, two
    objects, truncated, trailing bytes, nesting past the bound) routes on the text key,
    counted as a bad answer. A hostile pod gets no further."""
    pod = stub_factory("tk", models=["sim-8b"])
    r = router_factory(make_config([pod], routing={"policy": "cache_aware", "index": "events"},
                                   workers=1))
    for i, answer in enumerate(GOOD_ANSWERS + BAD_ANSWERS):
        pod.configure(tokenize_answer=answer)
        before = metrics(r)
        status, backend, _ = complete(r, prompt_of("answer-%d" % i))
        assert status == 200 and backend == "tk"
        after = metrics(r)
        bad = after.get('pcrouter_tokenize_failures_total{reason="answer"}', 0) - \
            before.get('pcrouter_tokenize_failures_total{reason="answer"}', 0)
        precise = after["pcrouter_precise_decisions_total"] - \
            before.get("pcrouter_precise_decisions_total", 0)
        assert (bad, precise) == ((0, 1) if answer in GOOD_ANSWERS else (1, 0)), answer[:80]
    assert pod.stats()["tokenize_calls"] == len(GOOD_ANSWERS) + len(BAD_ANSWERS)


def post_raw(router, path, raw):
    req = urllib.request.Request(router.url(path), data=raw.encode(),
                                 headers={"Content-Type": "application/json"})
    with _direct.open(req, timeout=30) as r:
        r.read()
        return r.status


QUESTIONS = [
    # (path, the request's body as sent, the question the pod must get)
    ("/v1/completions",
     '{"stream": true, "prompt" : "caf\\u00e9 \\"quoted\\" \\n %s", "model":"sim-8b",'
     ' "max_tokens": 1, "stream_options": {"include_usage": true}}' % ("x" * 3000),
     {"model": "sim-8b", "prompt": 'caf\u00e9 "quoted" \n %s' % ("x" * 3000)}),
    ("/v1/completions",   # spaces and newlines between the tokens, the model last
     '{\n "prompt"\t:\n "second %s" ,\n "max_tokens" : 1 , "model" : "sim-8b"\n}' % ("z" * 3000),
     {"model": "sim-8b", "prompt": "second %s" % ("z" * 3000)}),
    ("/v1/chat/completions",
     '{"model":"sim-8b","max_tokens":1,"messages":[{"role":"user","content":"\\u00fcber %s"}],'
     '"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],'
     '"add_generation_prompt":false}' % ("w" * 3000),
     {"model": "sim-8b", "messages": [{"role": "user", "content": "\u00fcber %s" % ("w" * 3000)}],
      "add_generation_prompt": False,
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("/v1/chat/completions",   # no add_generation_prompt, or not a boolean: true
     '{"model":"sim-8b","messages":[{"role":"user","content":"v %s"}],'
     '"add_generation_prompt":"yes"}' % ("v" * 3000),
     {"model": "sim-8b", "messages": [{"role": "user", "content": "v %s" % ("v" * 3000)}],
      "add_generation_prompt": True}),
]


@pytest.mark.parametrize("path,raw,want", QUESTIONS,
                         ids=["completion", "spaces", "chat", "chat-default-generation-prompt"])
def test_the_tokenize_question_is_the_requests_own_fields(stub_factory, router_factory, path,
                                                          raw, want):
    """The question to /tokenize is made of the request's own fields, as it sent them
    (escapes, non-ASCII, spaces between the tokens), and nothing else: not its stream
    options, not its sampling fields. (A repeated key never gets this far: the router refuses
    the request.)"""
    pod = stub_factory("tq", models=["sim-8b"])
    pod.configure(tokenize_answer=GOOD_ANSWERS[0])
    r = router_factory(make_config([pod], routing={"policy": "cache_aware", "index": "events"},
                                   workers=1))
    assert post_raw(r, path, raw) == 200
    where, body = pod.stats()["tokenize_last"]
    assert where == "/tokenize"
    assert json.loads(body) == want


def test_two_replicas_route_alike(pods, router_factory):
    p = pods(4)
    r1 = subscribed(p, router_factory(config(p)))
    r2 = subscribed(p, router_factory(config(p)))
    prompts = {name: prompt_of("two-%s" % name) for name in p.names}
    for name, text in prompts.items():
        seed(p, name, text)
    for r in (r1, r2):
        for name in p.names:
            wait_for(lambda r=r, name=name: kv_blocks(r, name) >= 32, timeout=5,
                     what="both replicas subscribed")
    for name, text in prompts.items():
        assert complete(r1, text)[1] == name
        assert complete(r2, text)[1] == name


def test_approximate_mode_ignores_events(pods, router_factory):
    """The control: the same setup in approximate mode does not know what the pods hold."""
    p = pods(2)
    r = router_factory(config(p, index="approximate"))
    seed(p, "p1", prompt_of("control"))
    m = metrics(r)
    assert m["pcrouter_kv_events_total"] == 0
    assert 'pcrouter_backend_kv_blocks{backend="p1",medium="gpu"}' not in m
    assert m["pcrouter_tokenize_requests_total"] == 0
    complete(r, prompt_of("control"))
    assert metric(r, "pcrouter_precise_decisions_total") == 0


def test_reload_turns_events_on(pods, router_factory):
    p = pods(2)
    cfg = config(p, index="approximate")
    r = router_factory(cfg)
    seed(p, "p1", prompt_of("reload-on"))
    cfg["routing"]["index"] = "events"
    with open(r.path, "w") as f:
        json.dump(cfg, f)
    import signal
    r.send_signal(signal.SIGHUP)
    wait_for(lambda: metric(r, 'pcrouter_config_reloads_total{result="ok"}') >= 1, timeout=10,
             what="the reload")
    # The subscriber starts; at the pod's first batch it asks the replay buffer for what the
    # pod stored before, the prompt seeded while the router did not follow events included.
    subscribed(p, r, ["p1"])
    wait_for(lambda: kv_blocks(r, "p1") >= 32, timeout=5, what="events followed after reload")
    assert complete(r, prompt_of("reload-on"))[1] == "p1"


def test_reload_of_the_block_size_drops_the_cached_tokens(pods, router_factory):
    """Cached token chains are cut at routing.kv_block_tokens: after a reload that changes it,
    a prompt cached before is tokenized again (chains of the old size would name blocks no pod
    stores), and then comes from the cache; so does a prompt that extends it."""
    p = pods(2)
    cfg = config(p, workers=1)
    r = router_factory(cfg)
    text = prompt_of("block-size")
    asked = lambda: metric(r, "pcrouter_tokenize_requests_total")
    assert complete(r, text)[0] == 200 and asked() == 1
    assert complete(r, text)[0] == 200 and asked() == 1
    cfg["routing"]["kv_block_tokens"] = 32
    with open(r.path, "w") as f:
        json.dump(cfg, f)
    import signal
    r.send_signal(signal.SIGHUP)
    wait_for(lambda: metric(r, 'pcrouter_config_reloads_total{result="ok"}') >= 1, timeout=10,
             what="the reload")
    # The workers take the new block size from the bus at their next turn: until then the
    # cached chains are still of the size in force.
    wait_for(lambda: complete(r, text)[0] == 200 and asked() == 2, timeout=10,
             what="the prompt tokenized again")
    assert complete(r, text)[0] == 200 and asked() == 2
    hits = metric(r, "pcrouter_tokenize_cache_prefix_hits_total")
    assert complete(r, text + " and a tail" * 100)[0] == 200
    assert metric(r, "pcrouter_tokenize_cache_prefix_hits_total") == hits + 1


def check_config(tmp_path, cfg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([PCROUTER, "--check-config", str(path)], capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["routing"].update(index="exact"),
     r'routing\.index: unknown value "exact"; expected one of "approximate", "events"'),
    (lambda c: c["routing"].update(tokenize="bpe"),
     r'routing\.tokenize: unknown value "bpe"'),
    (lambda c: c["routing"].update(policy="round_robin"),
     r'routing\.index: "events" needs routing\.policy "cache_aware"'),
    (lambda c: c["backends"][0].update(kv_events={"endpoint": "http://127.0.0.1:5557"}),
     r'backends\[0\]\.kv_events\.endpoint: expected "tcp://HOST:PORT".*must start with tcp://'),
    (lambda c: c["backends"][0].update(kv_events={"endpoint": "tcp://127.0.0.1"}),
     r'backends\[0\]\.kv_events\.endpoint: .*the port is missing'),
    (lambda c: c["backends"][0].update(kv_events={"replay_endpoint": "tcp://127.0.0.1:5558"}),
     r'backends\[0\]\.kv_events: missing required key "endpoint"'),
    (lambda c: c["backends"][0].update(kv_events={"endpoint": "tcp://a:1", "replay_endpont": "x"}),
     r'backends\[0\]\.kv_events\.replay_endpont: unknown key .*did you mean "replay_endpoint"'),
    (lambda c: c.update(discovery=[{"dns": "pods.local", "kv_events": {"port": 0}}]),
     r'discovery\[0\]\.kv_events\.port: must be between 1 and 65535, got 0'),
    (lambda c: c["routing"].update(tokenize_timeout_ms=0),
     r'routing\.tokenize_timeout_ms: must be between 1 and 60000'),
])
def test_config_errors(tmp_path, edit, needle):
    cfg = {"listen": [{"address": "127.0.0.1:0"}],
           "backends": [{"name": "a", "url": "http://127.0.0.1:1"}],
           "routing": {"index": "events"}}
    edit(cfg)
    p = check_config(tmp_path, cfg)
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(needle, p.stdout + p.stderr), p.stdout + p.stderr


def test_config_accepts_precise_keys(tmp_path):
    cfg = {"listen": [{"address": "127.0.0.1:0"}],
           "backends": [{"name": "a", "url": "http://127.0.0.1:1",
                         "kv_events": {"endpoint": "tcp://127.0.0.1:5557",
                                       "replay_endpoint": "tcp://[::1]:5558"}}],
           "discovery": [{"dns": "pods.local", "kv_events": {"port": 5557, "replay_port": 5558}}],
           "routing": {"index": "events", "tokenize": "render", "tokenize_timeout_ms": 50}}
    p = check_config(tmp_path, cfg)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("encoding", ["map", "map-batch"])
def test_other_encodings(pods, router_factory, encoding):
    """vLLM 0.26's map events (replay answers with a topic frame), and the batch itself a map
    (replay answers without one): both followed, the replay included."""
    p = pods(3, "--kv-events-encoding", encoding)
    r = router_factory(config(p))
    # Seeded before the router follows the pods: only the replay asked at the first live
    # batch (from the warm-up) brings it.
    seed(p, "p2", prompt_of("enc-" + encoding))
    subscribed(p, r, ["p2"])
    wait_for(lambda: kv_blocks(r, "p2") >= 32, timeout=5, what="p2's blocks, replayed")
    assert metric(r, "pcrouter_kv_event_decode_errors_total") == 0
    assert complete(r, prompt_of("enc-" + encoding))[1] == "p2"


def sim_metric(pods, name, needle):
    with _direct.open(pods.urls[name] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(l.rpartition(" ")[2]) for l in text.splitlines()
               if l.startswith(needle) and 'pod="%s"' % name in l)


@pytest.mark.parametrize("index", ["events", "approximate"])
def test_pod_that_evicts_on_its_own_no_longer_attracts(pods, router_factory, index):
    """Pods whose caches other traffic churns (--foreign-load): a prompt the router sent to a pod
    and the pod then evicted. In events mode the pod's BlockRemoved tells the router, and the
    prompt is placed afresh (cold); the approximate index still believes the pod holds it
    (the control run shows it would: `warm`)."""
    p = pods(2, "--capacity-tokens", "2048", "--foreign-load", "5", "--foreign-tokens", "1024",
             time_scale=10)
    r = router_factory(config(p, index=index, workers=1))
    if index == "events":
        subscribed(p, r)
    text = prompt_of("evicted", 2048)   # 512 tokens: a quarter of a pod's cache
    status, first, _ = complete(r, text)
    assert status == 200
    if index == "events":
        wait_for(lambda: metric(r, 'pcrouter_backend_kv_speculative_blocks{backend="%s"}'
                                % first) == 0, timeout=10, what="speculation confirmed or gone")
    # Two foreign prompts of 1024 tokens after it leave no room for it in 2048.
    seen = sim_metric(p, first, "vllm_sim:foreign_requests_total")
    wait_for(lambda: sim_metric(p, first, "vllm_sim:foreign_requests_total") >= seen + 4,
             timeout=10, what="foreign traffic through %s" % first)
    if index == "events":
        # Every batch the pods made by now has reached the router (live, or replayed).
        made = sum(sim_metric(p, n, 'vllm_sim:kv_event_batches_total{kind="made"') for n in p.names)
        wait_for(lambda: metric(r, "pcrouter_kv_event_batches_total") >= made, timeout=10,
                 what="the router caught up with the pods' events")
    req = urllib.request.Request(r.url("/v1/completions"), data=json.dumps(
        {"model": "sim-8b", "prompt": text, "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json"})
    with _direct.open(req, timeout=30) as resp:
        route = resp.headers.get("x-pcrouter-route")
    if index == "events":
        assert route == "cold", "the router still believed %s held an evicted prompt" % first
        assert metric(r, "pcrouter_kv_events_total") > 0
    else:
        assert route == "warm"
