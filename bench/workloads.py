#!/usr/bin/python3
"""bench/workloads.py: the routing benchmark's workloads, as Mooncake-format traces.

Every workload is a list of rows {"timestamp" (ms), "input_length", "output_length",
"hash_ids"}: what bench/sim/replay and bench/sim/routing_offline read. A hash id names 512
tokens of prompt text and everything before them (bench/sim/synth.c turns each id into its
text), so two prompts that share their first k ids share their first k*512 tokens, and a pod
can serve those from its cache. The synthetic workloads are generated from a seed
(random.Random: the same seed gives the same bytes on any machine); the real traces are read
from bench/traces and compressed in time.

  shared_prefix  inference-perf's shared-prefix data: groups of prompts that share a system
                 prompt, each prompt a system prompt and a question, Poisson arrivals
  chat           multi-turn chat: sessions whose every turn resends the whole history (system
                 prompt, earlier questions and answers) plus a new question
  agentic        agents: a long tool prompt shared by every session of an agent type, steps
                 that append tool results, sub-agents that branch off the context and return
  conversation   the Mooncake FAST'25 conversation trace (first 4000 requests)
  mooncake       the 1000-request Mooncake arXiv excerpt (conversations and tool prompts)

Each has three loads: "light", "knee" (near where round robin's time to first token starts to
climb) and "past" (beyond it), and the pool it runs on (pods, KV cache per pod), chosen so the
working set does not fit one pod. `python3 bench/workloads.py NAME LOAD FILE` writes one.
"""
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 512          # tokens per hash id, as in the Mooncake traces


class Ids:
    """Hands out fresh hash ids (distinct from every id handed out before)."""

    def __init__(self, start=1 << 32):
        self.next = start

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


class Stream:
    """A growing text (a conversation, an agent's context) as hash ids: its first blocks may be
    shared with other streams (a system prompt, a parent agent's context), the rest are its
    own. prompt(tokens) gives the ids of its first `tokens` tokens."""

    def __init__(self, ids, shared):
        self.ids_src = ids
        self.ids = list(shared)

    def prompt(self, tokens):
        need = -(-tokens // BLOCK)
        if need > len(self.ids):
            self.ids += self.ids_src.take(need - len(self.ids))
        return self.ids[:need]

    def fork(self, tokens):
        """A new stream sharing this one's full blocks among its first `tokens` tokens (a
        partial block differs: the branch's text goes on differently from there)."""
        self.prompt(tokens)
        return Stream(self.ids_src, self.ids[:tokens // BLOCK])


def poisson_times(rng, rate, duration_s, start_s=0.0):
    t, out = start_s, []
    while True:
        t += rng.expovariate(rate)
        if t >= start_s + duration_s:
            return out
        out.append(t)


def lognormal(rng, mean, sigma, lo, hi):
    """A lognormal draw with the given mean, clamped to [lo, hi]."""
    mu = math.log(mean) - sigma * sigma / 2
    return int(min(hi, max(lo, rng.lognormvariate(mu, sigma))))


def row(t_s, tokens, output, ids):
    return {"timestamp": int(round(t_s * 1000)), "input_length": int(tokens),
            "output_length": int(output), "hash_ids": ids}


# ---- shared prefix (inference-perf) ----------------------------------------------------------

def shared_prefix(rng, qps, duration_s=180, groups=150, prompts_per_group=5,
                  system_prompt_len=6000, question_len=1200, output_len=1000):
    """inference-perf's shared_prefix data with one Poisson stage at `qps`: groups *
    prompts_per_group prompts, each the group's system prompt then its own question; every
    request picks one of them at random."""
    ids = Ids()
    prompts = []
    for _ in range(groups):
        sysp = Stream(ids, [])
        for _ in range(prompts_per_group):
            s = sysp.fork(system_prompt_len)
            prompts.append(s.prompt(system_prompt_len + question_len))
    rows = []
    for t in poisson_times(rng, qps, duration_s):
        rows.append(row(t, system_prompt_len + question_len, output_len, rng.choice(prompts)))
    return rows


# ---- multi-turn chat -------------------------------------------------------------------------

def chat(rng, sessions_per_s, duration_s=600, apps=4, system_tokens=2048, mean_turns=6,
         document_tokens=3000, question_tokens=250, answer_tokens=400, think_s=30.0):
    """Sessions start as a Poisson process, each on one of `apps` system prompts; a session has
    a geometric number of turns, a think time between them, and each turn's prompt is the
    previous one, its answer and a new question. The first question carries a document (a
    pasted file, a web page) half the time."""
    ids = Ids()
    systems = [Stream(ids, []).prompt(system_tokens) for _ in range(apps)]
    rows = []
    for t0 in poisson_times(rng, sessions_per_s, duration_s):
        s = Stream(ids, rng.choice(systems))
        length, t = system_tokens, t0
        if rng.random() < 0.5:
            length += lognormal(rng, document_tokens, 0.8, 100, 30000)
        turns = 1 + int(rng.expovariate(1.0 / (mean_turns - 1)))
        for _ in range(min(turns, 30)):
            length += lognormal(rng, question_tokens, 0.8, 8, 4000)
            out = lognormal(rng, answer_tokens, 0.7, 8, 2000)
            if t < duration_s:
                rows.append(row(t, length, out, s.prompt(length)))
            length += out
            t += rng.expovariate(1.0 / think_s) + out * 0.02   # reading, then typing
    return rows


# ---- agents ----------------------------------------------------------------------------------

def agentic(rng, sessions_per_s, duration_s=600, agent_types=3, tool_prompt_tokens=(8192, 12288,
            16384), task_tokens=600, mean_steps=8, branch_p=0.15, tool_result_tokens=1200,
            call_tokens=150, tool_s=2.0):
    """Agent sessions: a long tool prompt shared by every session of its type, a task, then
    steps: the model answers with a tool call (short output), the tool's result is appended and
    the next step starts after the tool ran. At a step a sub-agent may branch off: it starts
    from the parent's context, runs its own steps, and the parent goes on with its result
    appended when it returns."""
    ids = Ids()
    tools = [Stream(ids, []).prompt(tool_prompt_tokens[k % len(tool_prompt_tokens)])
             for k in range(agent_types)]
    rows = []

    def run(stream, length, t, steps, depth):
        for _ in range(steps):
            out = lognormal(rng, call_tokens, 0.6, 8, 1500)
            if t < duration_s:
                rows.append(row(t, length, out, stream.prompt(length)))
            length += out
            t += out * 0.015 + rng.expovariate(1.0 / tool_s)
            if depth == 0 and rng.random() < branch_p:
                child = stream.fork(length)
                sub_len = length - length % BLOCK + lognormal(rng, 300, 0.5, 16, 2000)
                t, result = run(child, sub_len, t, 2 + int(rng.expovariate(1 / 2.0)), 1)
                length += min(result, 3000)
            length += lognormal(rng, tool_result_tokens, 1.0, 16, 12000)
        return t, length

    for t0 in poisson_times(rng, sessions_per_s, duration_s):
        k = rng.randrange(agent_types)
        s = Stream(ids, tools[k])
        run(s, len(tools[k]) * BLOCK + lognormal(rng, task_tokens, 0.5, 32, 4000), t0,
            1 + int(rng.expovariate(1.0 / (mean_steps - 1))), 0)
    return rows


# ---- real traces -----------------------------------------------------------------------------

def trace(name, speed, limit=None):
    """A trace from bench/traces, its clock `speed` times faster."""
    rows = []
    with open(os.path.join(HERE, "traces", name)) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            r["timestamp"] = int(round(r["timestamp"] / speed))
            rows.append(r)
            if limit and len(rows) == limit:
                break
    return rows


# ---- the table -------------------------------------------------------------------------------

# For each workload: the pool (pods x KV tokens each), the time scale real runs use (model time
# per wall second, as low as this 2-core machine can keep up with), and each load's generator
# argument (requests, sessions per second, or the trace's speed-up).
WORKLOADS = {
    "shared_prefix": dict(pods=8, capacity_tokens=400000, time_scale=4,
                          loads={"light": 8, "knee": 15, "past": 25},
                          make=lambda rng, x: shared_prefix(rng, x)),
    "chat": dict(pods=4, capacity_tokens=300000, time_scale=10,
                 loads={"light": 1.0, "knee": 2.5, "past": 3.5},
                 make=lambda rng, x: chat(rng, x)),
    "agentic": dict(pods=4, capacity_tokens=400000, time_scale=10,
                    loads={"light": 0.2, "knee": 0.6, "past": 0.8},
                    make=lambda rng, x: agentic(rng, x)),
    "conversation": dict(pods=8, capacity_tokens=1000000, time_scale=20, trace=True,
                         loads={"light": 1.0, "knee": 2.0, "past": 3.0},
                         make=lambda rng, x: trace("conversation_trace.jsonl", x, 4000)),
    "mooncake": dict(pods=8, capacity_tokens=200000, time_scale=10, trace=True,
                     loads={"light": 0.5, "knee": 1.5, "past": 2.5},
                     make=lambda rng, x: trace("mooncake_trace_1000.jsonl", x)),
}
LOADS = ("light", "knee", "past")


# Run k of a workload and load, for judging a policy on more than one draw (bench/sweep.py
# --runs): a generated workload takes seed + k; a real trace, which has one draw, is replayed
# this much faster or slower instead (run 0 is the workload itself).
TRACE_SPEEDS = (1.0, 0.93, 1.07, 0.96, 1.04)


def generate(name, load, seed=1, run=0):
    """The rows of one workload at one load, sorted by time, the first at 0."""
    w = WORKLOADS[name]
    x = w["loads"][load]
    if w.get("trace"):
        x *= TRACE_SPEEDS[run % len(TRACE_SPEEDS)]
    else:
        seed += run
    rng = random.Random("%s/%s/%d" % (name, load, seed))
    rows = w["make"](rng, x)
    rows.sort(key=lambda r: r["timestamp"])
    t0 = rows[0]["timestamp"] if rows else 0
    for r in rows:
        r["timestamp"] -= t0
    return rows


def write(name, load, path, seed=1, run=0):
    rows = generate(name, load, seed, run)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(", ", ": ")) + "\n")
    return rows


def main(argv):
    if len(argv) < 4 or argv[1] not in WORKLOADS or argv[2] not in LOADS:
        print("usage: workloads.py {%s} {%s} FILE [SEED]" % ("|".join(WORKLOADS),
                                                             "|".join(LOADS)), file=sys.stderr)
        return 2
    rows = write(argv[1], argv[2], argv[3], int(argv[4]) if len(argv) > 4 else 1)
    span = rows[-1]["timestamp"] / 1000 if rows else 0
    print("%s %s: %d requests over %.0f s, mean prompt %.0f tokens, mean output %.0f" % (
        argv[1], argv[2], len(rows), span,
        sum(r["input_length"] for r in rows) / max(1, len(rows)),
        sum(r["output_length"] for r in rows) / max(1, len(rows))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
