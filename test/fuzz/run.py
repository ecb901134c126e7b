#!/usr/bin/python3
"""Runs every libFuzzer target of a -Dfuzz=true build for a while: `make fuzz` calls it.

    test/fuzz/run.py BUILD SECONDS [TARGET...]
    FUZZ_RUNS=10000000 test/fuzz/run.py BUILD SECONDS [TARGET...]
    FUZZ_TIMEOUT=60 ...   (seconds one input may take: 10 by default)
    FUZZ_FORK=2 ...       (libFuzzer's fork mode: that many processes, one target on every core)

Each target fuzz_NAME runs for SECONDS (with FUZZ_RUNS, until it has run that many inputs or
SECONDS have passed, whichever comes first) (one after the other: the machine is shared) from the
seeds in test/fuzz/corpus/NAME/, read only, and writes what it finds new to a work corpus,
BUILD/fuzz/corpus/NAME/, kept between runs; test/fuzz/NAME.dict (or the family's, h1.dict for
h1_request) is its dictionary when there.
Crashes, leaks, timeouts and out-of-memory inputs go to BUILD/fuzz/crashes/NAME/ (and inputs
slower than libFuzzer's -report_slow_units, slow-unit-*, listed apart: not crashes until one
replays slowly). One line per target: executions, exec/s, corpus size, new crashes; then
where the crashes are. The exit status is 1 when any target crashed. test/fuzz/README.md says
how to minimize and keep inputs.
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ_DIR = os.path.join(ROOT, "test", "fuzz")

ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1:symbolize=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}


def targets(build):
    exe_dir = os.path.join(build, "test", "fuzz")
    names = sorted(f[len("fuzz_"):] for f in os.listdir(exe_dir)
                   if f.startswith("fuzz_") and os.access(os.path.join(exe_dir, f), os.X_OK)
                   and not f.endswith(".p"))
    return [(n, os.path.join(exe_dir, "fuzz_" + n)) for n in names]


def run_one(build, name, exe, seconds):
    work = os.path.join(build, "fuzz", "corpus", name)
    crashes = os.path.join(build, "fuzz", "crashes", name)
    log = os.path.join(build, "fuzz", "logs", name + ".log")
    for d in (work, crashes, os.path.dirname(log)):
        os.makedirs(d, exist_ok=True)
    before = set(os.listdir(crashes))
    runs = int(os.environ.get("FUZZ_RUNS", "0") or 0)
    # A machine busy with other work can stall one input past 10 s: FUZZ_TIMEOUT raises it.
    timeout = int(os.environ.get("FUZZ_TIMEOUT", "10") or 10)
    cmd = [exe, f"-max_total_time={seconds}", "-print_final_stats=1", f"-timeout={timeout}",
           "-rss_limit_mb=2048", f"-artifact_prefix={crashes}/"]
    if runs > 0:
        cmd.append(f"-runs={runs}")
    # Fork mode: N processes fuzz the target in turns of jobs; -runs counts all of theirs.
    fork = int(os.environ.get("FUZZ_FORK", "0") or 0)
    if fork > 0:
        cmd.append(f"-fork={fork}")
    # NAME.dict, or the dictionary a family of targets shares (h1.dict for h1_request, ...).
    for d in (os.path.join(FUZZ_DIR, name + ".dict"),
              os.path.join(FUZZ_DIR, name.split("_")[0] + ".dict")):
        if os.path.exists(d):
            cmd.append(f"-dict={d}")
            break
    cmd += [work, os.path.join(FUZZ_DIR, "corpus", name)]
    start = time.monotonic()
    with open(log, "w") as out:
        # A deadline past the fuzzer's own: a target stuck outside libFuzzer's control ends too.
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **ENV), timeout=seconds + 120).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    elapsed = time.monotonic() - start
    text = open(log, errors="replace").read()

    def stat(key):
        m = re.findall(r"^stat::" + key + r":\s+(\d+)", text, re.M)
        return int(m[-1]) if m else None

    execs = stat("number_of_executed_units")
    if execs is None:   # stopped by a crash: the last status line still counts them
        m = re.findall(r"^#(\d+):?\s", text, re.M)  # "#N:" in fork mode
        execs = int(m[-1]) if m else 0
    corp = re.findall(r"corp: (\d+)/(\d+\w*)", text) or \
        [(n, "-") for n in re.findall(r"corp: (\d+) ", text)]  # fork mode: files only
    new = sorted(set(os.listdir(crashes)) - before)
    # libFuzzer also writes there an input slower than its -report_slow_units (slow-unit-*),
    # and goes on: listed apart, it is a finding only if it replays slowly on an idle machine.
    slow = [f for f in new if f.startswith("slow-unit-")]
    new = [f for f in new if f not in slow]
    return {
        "name": name, "seconds": elapsed, "execs": execs,
        "rate": execs / elapsed if elapsed > 0 else 0,
        "corpus": f"{corp[-1][0]} ({corp[-1][1]})" if corp else "?",
        "crashes": [os.path.join(crashes, f) for f in new], "rc": rc, "log": log,
        "slow": [os.path.join(crashes, f) for f in slow],
    }


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    seconds = int(sys.argv[2])
    wanted = sys.argv[3:]
    exe_dir = os.path.join(build, "test", "fuzz")
    every = targets(build) if os.path.isdir(exe_dir) else []
    if not every:
        print(f"no fuzz targets in {exe_dir} (was it set up with -Dfuzz=true?)")
        return 2
    found = [t for t in every if not wanted or t[0] in wanted]
    if len(found) < len(wanted) or not found:
        print(f"targets: {' '.join(t[0] for t in every)}; asked for: {' '.join(wanted)}")
        return 2
    rel = os.path.relpath(build, ROOT)
    print(f"work corpora in {rel}/fuzz/corpus/NAME, crashes in {rel}/fuzz/crashes/NAME,"
          f" logs in {rel}/fuzz/logs/NAME.log")
    results = []
    for name, exe in found:
        print(f"fuzzing {name} for {seconds} s ...", flush=True)
        results.append(run_one(build, name, exe, seconds))
    print(f"\n{'target':<10} {'time':>7} {'executions':>12} {'exec/s':>9}  {'corpus (files, bytes)':<22} new crashes")
    for r in results:
        print(f"{r['name']:<10} {r['seconds']:>6.0f}s {r['execs']:>12} {r['rate']:>9.0f}  "
              f"{r['corpus']:<22} {len(r['crashes'])}")
    bad = [r for r in results if r["crashes"] or r["rc"] not in (0,)]
    for r in results:
        if r["slow"]:
            print(f"\n{r['name']}: {len(r['slow'])} slow input(s), not counted as crashes;"
                  " replay each to tell a busy machine from a slow path:")
            for f in r["slow"]:
                print(f"  {f}")
    for r in bad:
        print(f"\n{r['name']}: exit {r['rc']}, log {r['log']}")
        for c in r["crashes"]:
            print(f"  {c}")
    if bad:
        print(f"\nreplay one: {rel}/test/fuzz/fuzz_NAME FILE"
              " (see test/fuzz/README.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
