"""The routing benchmark's tools: bench/workloads.py (seeded workloads in Mooncake format) and
bench/sim/routing_offline (the policies before simulated pods in virtual time).

Workloads: the same seed gives the same rows, rows are well formed, and each workload has the
shape it claims (groups sharing a system prompt, chats whose turns extend their history).
routing_offline: two runs of the same trace give the same figures, the pods' names are their
placement on the rings, cache_aware keeps more of the ceiling than round robin, unstreamed rows
free the hold budget at their expected first token, the step engine's prefill slows the streams
beside it, zones add the round trip and count what crossed, and bad input is refused with a
message. Binaries come from $PCR_BUILD (default build/); every run is bounded in
time."""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import workloads  # noqa: E402

BUILD = os.path.abspath(os.environ.get("PCR_BUILD") or os.path.join(ROOT, "build"))
OFFLINE = os.path.join(BUILD, "bench", "sim", "routing_offline")


def test_workloads_are_seeded_and_well_formed():
    for name in workloads.WORKLOADS:
        a = workloads.generate(name, "light", seed=1)
        assert a == workloads.generate(name, "light", seed=1), name
        assert a[0]["timestamp"] == 0
        assert all(x["timestamp"] <= y["timestamp"] for x, y in zip(a, a[1:])), name
        for r in a:
            assert len(r["hash_ids"]) == math.ceil(r["input_length"] / workloads.BLOCK), (name, r)
            assert r["output_length"] >= 1
        if name not in ("conversation", "mooncake"):   # the real traces have no seed
            assert a != workloads.generate(name, "light", seed=2), name


def test_shared_prefix_groups_share_their_system_prompt():
    rows = workloads.generate("shared_prefix", "light")
    shared = 6000 // workloads.BLOCK   # the system prompt's full blocks
    by_head = {}
    for r in rows:
        by_head.setdefault(r["hash_ids"][0], set()).add(tuple(r["hash_ids"]))
    for prompts in by_head.values():
        assert len(prompts) <= 5                           # prompts per group
        assert len({p[:shared] for p in prompts}) == 1     # one system prompt per group
        if len(prompts) > 1:
            assert len({p[shared:] for p in prompts}) == len(prompts)   # their own questions
    assert len(by_head) > 100


def test_chat_turns_extend_their_history():
    rows = workloads.generate("chat", "light")
    seen = set()
    extends = 0
    for r in rows:
        ids = tuple(r["hash_ids"])
        # an earlier turn of the same chat: its full blocks are a prefix of this prompt
        extends += any(ids[:k] in seen for k in range(len(ids) - 1, 4, -1))
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
    assert extends > len(rows) // 2, (extends, len(rows))


def run_offline(tmp_path, trace, *extra):
    out = tmp_path / ("r%d.json" % len(list(tmp_path.iterdir())))
    p = subprocess.run([OFFLINE, "--trace", str(trace), "--pods", "8", "--capacity-tokens",
                        "200000", "--quiet", "--json", str(out)] + list(extra),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        return {r["label"]: r for r in json.load(f)["results"]}


def test_offline_is_deterministic_and_cache_aware_keeps_the_cache(tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    with open(trace, "w") as f:
        for r in workloads.generate("mooncake", "light")[:300]:
            f.write(json.dumps(r) + "\n")
    policies = "round_robin,consistent_hash,cache_aware,haproxy_hash"
    a = run_offline(tmp_path, trace, "--policies", policies,
                    "--variant", 'learning={"observe": true, "feedback": true}')
    b = run_offline(tmp_path, trace, "--policies", policies,
                    "--variant", 'learning={"observe": true, "feedback": true}')
    assert a == b
    assert set(a) == set(policies.split(",")) | {"learning"}
    for r in a.values():
        assert r["completed"] == 300 and r["errors"] == 0, r
        assert 0 < r["ttft_ms_model"]["p50"] <= r["ttft_ms_model"]["p99"], r
    assert a["cache_aware"]["hit_rate"] > a["round_robin"]["hit_rate"], a
    assert a["cache_aware"]["fraction_of_ceiling"] > 0.9, a["cache_aware"]
    assert a["round_robin"]["predicted_tokens"] == 0   # no index, no prediction


def test_offline_names_place_the_pods(tmp_path):
    """--names is the pods' placement on the rings: the same names give the same figures, other
    names move the hashing policies (which pod a prefix lands on) but not round robin."""
    trace = tmp_path / "mooncake.jsonl"
    with open(trace, "w") as f:
        for r in workloads.generate("mooncake", "light")[:300]:
            f.write(json.dumps(r) + "\n")
    policies = ["--policies", "round_robin,consistent_hash,haproxy_hash"]
    a = run_offline(tmp_path, trace, *policies)
    assert a == run_offline(tmp_path, trace, "--names", "pod-", *policies)
    others = [run_offline(tmp_path, trace, "--names", "vllm-%d-" % k, *policies)
              for k in range(3)]
    for b in others:
        assert b["round_robin"] == a["round_robin"]
    moved = lambda p: {b[p]["share_max_over_mean"] for b in others + [a]}  # noqa: E731
    assert len(moved("consistent_hash")) > 1 and len(moved("haproxy_hash")) > 1
    p = subprocess.run([OFFLINE, "--trace", str(trace), "--names", ""], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "bad value for --names" in p.stderr, p.stderr


def test_offline_refuses_bad_input(tmp_path):
    p = subprocess.run([OFFLINE, "--trace", str(tmp_path / "none.jsonl")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "cannot open" in p.stderr, p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')
    p = subprocess.run([OFFLINE, "--trace", str(bad)], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1 and "bad.jsonl:1: not a Mooncake row" in p.stderr, p.stderr
    for args, why in ((["--routing", '{"load_wieght": 1}'], 'unknown routing key "load_wieght"'),
                      (["--routing", '{"load_factor": 0.5}'], '"load_factor" must be a number'),
                      (["--variant", "nojson"], "bad value for --variant"),
                      (["--slowdown", "1,x"], "bad --slowdown value x")):
        p = subprocess.run([OFFLINE, "--trace", str(bad)] + args, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 2 and why in p.stderr, (args, p.stderr)


def test_offline_counts_each_pods_prefill(tmp_path):
    """work_max_over_mean is the busiest pod's prefilled prompt tokens over the mean: one prompt
    sent sixteen times, far apart, is prefilled once on every pod under round robin (1), and
    once on one pod under consistent hashing, which sends it there every time (8 pods: 8)."""
    trace = tmp_path / "one_prompt.jsonl"
    with open(trace, "w") as f:
        for k in range(16):
            f.write(json.dumps({"timestamp": k * 20000, "input_length": 4 * workloads.BLOCK,
                                "output_length": 1, "hash_ids": [1, 2, 3, 4]}) + "\n")
    a = run_offline(tmp_path, trace, "--policies", "round_robin,consistent_hash")
    assert a["round_robin"]["work_max_over_mean"] == 1.0, a["round_robin"]
    assert a["consistent_hash"]["work_max_over_mean"] == 8.0, a["consistent_hash"]
    assert a["consistent_hash"]["share_max_over_mean"] == 8.0, a["consistent_hash"]


def unstreamed_draw(i):
    """rt_unstreamed's draw for row i (splitmix64 of the index), as replay and routing_offline
    compute it: a row asks for a whole answer when its draw is under the fraction."""
    m = (1 << 64) - 1
    z = (i + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return (z >> 11) / 9007199254740992.0


def one_long_answer_then_streams(tmp_path):
    """Three tiny requests at 0, then at 130 ms a 2048-token prompt with a 4000-token answer
    (row 3), then six 2048-token streams 10 ms apart. Returns the trace and an --unstreamed
    fraction that picks row 3 alone."""
    draws = [unstreamed_draw(i) for i in range(10)]
    assert min(range(10), key=draws.__getitem__) == 3   # row 3 alone, at the fraction below
    trace = tmp_path / "unstreamed.jsonl"
    with open(trace, "w") as f:
        for i in range(10):
            big = i >= 3
            f.write(json.dumps({
                "timestamp": 0 if i < 3 else 100 + 10 * i,
                "input_length": 4 * workloads.BLOCK if big else 64,
                "output_length": 4000 if i == 3 else 1,
                "hash_ids": [100 * i + k for k in range(4 if big else 1)]}) + "\n")
    return trace, (draws[3] + sorted(draws)[1]) / 2


def test_offline_unstreamed_rows_free_the_budget_at_their_expected_first_token(tmp_path):
    """--unstreamed F: the rows whose draw is under F ask for whole answers (the same rows as
    the replayer's). They count in the hit rate, not in TTFT, and their prefill leaves the hold
    budget at the policy's expected first token, not at the end of the answer: one pod, a budget
    of 1000 tokens, an unstreamed 2048-token prompt with a 4000-token answer (over a minute of
    decoding), then six streams that must wait for its prefill. Their TTFT stays far below the
    answer's decoding time, where holding them until the answer would put all six past it."""
    trace, frac = one_long_answer_then_streams(tmp_path)
    args = ["--pods", "1", "--policies", "cache_aware", "--routing", '{"hold_tokens": 1000}']
    a = run_offline(tmp_path, trace, *args, "--unstreamed", str(frac))["cache_aware"]
    assert a["completed"] == 10 and a["completed_streams"] == 9 and a["errors"] == 0, a
    assert a["ttft_ms_model"]["p99"] < 5000, a
    assert a["makespan_s"] > 30, a   # the answer did take that long
    # The expected first token against the true one, which the pod knows and the router not.
    assert abs(a["expected_first_token_error_ms"]["mean"]) < 100, a
    b = run_offline(tmp_path, trace, *args)["cache_aware"]
    assert b["completed"] == 10 and b["completed_streams"] == 10, b
    assert "expected_first_token_error_ms" not in b, b
    # Every row unstreamed: no TTFT at all, and nothing lost.
    c = run_offline(tmp_path, trace, *args, "--unstreamed", "1")["cache_aware"]
    assert c["completed"] == 10 and c["completed_streams"] == 0, c
    assert c["ttft_ms_model"]["p50"] is None, c
    p = subprocess.run([OFFLINE, "--trace", str(trace), "--unstreamed", "1.5"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "bad value for --unstreamed" in p.stderr, p.stderr


def test_offline_requests_file_has_each_request_as_the_access_log_would(tmp_path):
    """--requests FILE: one JSON line per finished request and policy, with the time it was held
    at the router, so a live run's access log can be compared with the simulator's request by
    request. In the trace above, with a budget of 1000 tokens, the six streams wait for the long
    prompt's prefill (held, then their first token after), and the tiny ones never wait."""
    trace, frac = one_long_answer_then_streams(tmp_path)
    out = tmp_path / "requests.jsonl"
    a = run_offline(tmp_path, trace, "--pods", "1", "--policies", "cache_aware,round_robin",
                    "--routing", '{"hold_tokens": 1000}', "--unstreamed", str(frac),
                    "--requests", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for label in ("cache_aware", "round_robin"):
        mine = {r["row"]: r for r in rows if r["label"] == label}
        assert sorted(mine) == list(range(10)) and a[label]["completed"] == 10, mine
        assert [mine[i]["stream"] for i in range(10)] == [i != 3 for i in range(10)]
        for i, r in mine.items():
            assert r["pod"] == 0 and 0 <= r["held_ms"] <= r["ttft_ms"] <= r["e2e_ms"], r
            assert r["prompt_tokens"] == (2048 if i >= 3 else 64), r
        assert all(mine[i]["held_ms"] == 0 for i in range(4)), mine
    ca = {r["row"]: r for r in rows if r["label"] == "cache_aware"}
    assert all(ca[i]["held_ms"] > 0 for i in range(4, 10)), ca   # held behind row 3
    assert max(ca[i]["held_ms"] for i in range(4, 10)) < 5000, ca  # not until its answer
    assert ca[3]["e2e_ms"] > 30000, ca[3]
    assert ca[4]["route"] == "cold" and ca[4]["uncached_prefill"] == 2048, ca[4]
    p = subprocess.run([OFFLINE, "--trace", str(trace), "--quiet", "--requests",
                        str(tmp_path / "no" / "such" / "dir")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "cannot write" in p.stderr, p.stderr


def stream_beside_prefills(path, prefills):
    """One stream (512-token prompt, 400 tokens out) at 0, then `prefills` prompts of 16k
    tokens that want one token each, one every 50 ms from 1 s: what they prefill is computed in
    the steps that carry the stream's tokens."""
    rows = [{"timestamp": 0, "input_length": 512, "output_length": 400, "hash_ids": [1]}]
    for k in range(prefills):
        rows.append({"timestamp": 1000 + 50 * k, "input_length": 16384, "output_length": 1,
                     "hash_ids": list(range(100 + 32 * k, 132 + 32 * k))})
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def test_offline_step_engine_prefill_slows_the_streams_beside_it(tmp_path):
    """--engine step: prefill and decode share each engine step, so a stream's inter-token
    latency grows with the prefill beside it on its pod (the latency model decodes apart and
    reports no ITL); the figures a load generator reports are there, and the same run gives
    the same figures."""
    alone = stream_beside_prefills(tmp_path / "alone.jsonl", 0)
    busy = stream_beside_prefills(tmp_path / "busy.jsonl", 8)
    step = ["--pods", "1", "--policies", "round_robin", "--engine", "step"]
    a = run_offline(tmp_path, alone, *step)["round_robin"]
    b = run_offline(tmp_path, busy, *step)["round_robin"]
    assert b == run_offline(tmp_path, busy, *step)["round_robin"]
    for r in (a, b):
        assert r["errors"] == 0, r
        for k in ("itl_ms_model", "tpot_ms_model", "e2e_ms_model", "output_tokens"):
            assert set(r[k]) == {"p50", "p90", "p99", "mean"}, (k, r[k])
        assert 0 < r["itl_ms_model"]["p50"] <= r["itl_ms_model"]["p99"], r
        assert r["output_tokens_per_s"] > 0 and r["requests_per_s"] > 0, r
        assert r["itl_mean_ms"] == r["itl_ms_model"]["mean"], r
    # Alone, a decode step of one short sequence: a few ms (7.4 ms base by default).
    assert 5 < a["itl_ms_model"]["p99"] < 20, a["itl_ms_model"]
    assert a["output_tokens_total"] == 400
    assert a["itl_ms_model"]["p99"] < 1.01 * a["itl_ms_model"]["p50"], a   # only its context grows
    # Beside 8 x 16k tokens of prefill in 8192-token chunks: steps of half a second.
    assert b["itl_ms_model"]["p99"] > 10 * a["itl_ms_model"]["p99"], (a, b)
    assert b["itl_ms_model"]["mean"] > a["itl_ms_model"]["mean"], (a, b)
    assert b["tpot_ms_model"]["mean"] > a["tpot_ms_model"]["mean"], (a, b)
    old = run_offline(tmp_path, busy, "--pods", "1", "--policies", "round_robin")["round_robin"]
    assert "itl_ms_model" not in old   # the latency model's report is unchanged
    p = subprocess.run([OFFLINE, "--trace", str(busy), "--engine", "steps"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "bad value for --engine" in p.stderr, p.stderr


def test_offline_zones_count_what_crossed_and_add_the_round_trip(tmp_path):
    """--zones: requests to the far half of the pods reach them a round trip later, and the
    report counts the requests and bytes that crossed. Round robin sends half across whatever
    the zones; its TTFT grows by the round trip for those. cache_aware with the router's zone
    keeps light traffic home; zone-blind, it crosses as much as round robin."""
    trace = tmp_path / "chat.jsonl"
    with open(trace, "w") as f:
        for r in workloads.generate("chat", "light")[:600]:
            f.write(json.dumps(r) + "\n")
    common = ["--pods", "4", "--capacity-tokens", "300000", "--policies",
              "round_robin,cache_aware", "--variant", 'blind={"zone_aware": false}']
    one = run_offline(tmp_path, trace, *common)
    two = run_offline(tmp_path, trace, *common, "--zones", "500")
    assert "cross_zone_request_share" not in one["round_robin"]
    rr = two["round_robin"]
    assert rr["cross_zone_request_share"] == 0.5, rr
    assert 0.3 < rr["cross_zone_byte_share"] < 0.7, rr
    assert rr["ttft_ms_model"]["mean"] > one["round_robin"]["ttft_ms_model"]["mean"] + 200
    assert two["cache_aware"]["cross_zone_request_share"] < 0.1, two["cache_aware"]
    assert two["blind"]["cross_zone_request_share"] > 0.3, two["blind"]
    far = subprocess.run([OFFLINE, "--trace", str(trace), "--pods", "4", "--zones", "20",
                          "--far-pods", "4"], capture_output=True, text=True, timeout=30)
    assert far.returncode == 2 and "needs pods in both zones" in far.stderr, far.stderr
