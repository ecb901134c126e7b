#!/usr/bin/python3
"""Runs every test of pcrouter and prints one closing line: `N passed, N failed`.

Suites, for each build folder given (default: build, build-asan and build-tsan):
  unit         every TAP executable meson registered (test/unit/...), one count per case
  integration  the pytest files under test/integration, run against that build's binaries

The sanitizer builds run the same suites, so a leak, an overflow, undefined behaviour or a data
race found by AddressSanitizer, UndefinedBehaviorSanitizer or ThreadSanitizer fails a test
instead of passing unnoticed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT_TIMEOUT = 300

SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
    "LSAN_OPTIONS": "exitcode=88",
    # test/tsan.supp says why each suppression is there.
    "TSAN_OPTIONS": "halt_on_error=0:exitcode=66:second_deadlock_stack=1:suppressions="
                    + os.path.join(ROOT, "test", "tsan.supp"),
}


def run_unit(build):
    out = subprocess.run(["meson", "introspect", "--tests", build], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    passed = failed = 0
    env = dict(os.environ, **SAN_ENV)
    for t in json.loads(out):
        name = t["name"]
        try:
            p = subprocess.run(t["cmd"], capture_output=True, text=True, env=env,
                               cwd=t.get("workdir") or ROOT, timeout=UNIT_TIMEOUT)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = (e.stdout or b"").decode(errors="replace") + "\n# timed out", -1
        oks = re.findall(r"^ok \d+ - (.*)$", text, re.M)
        bad = re.findall(r"^not ok \d+ - (.*)$", text, re.M)
        passed += len(oks)
        failed += len(bad)
        for case in bad:
            print(f"FAIL [{build}] unit {name}: {case}")
        # A crash, a sanitizer report or a missing plan fails the executable as a whole.
        plan = re.search(r"^1\.\.(\d+)$", text, re.M)
        if rc != 0 and not bad or plan is None:
            failed += 1
            print(f"FAIL [{build}] unit {name}: exit {rc}, plan {'present' if plan else 'missing'}")
        if (rc != 0 or bad) and text:
            print("\n".join("    " + l for l in text.splitlines()[-40:]))
    return passed, failed


def run_integration(build, extra):
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, PCR_BUILD=os.path.join(ROOT, build), **SAN_ENV)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", xml,
               os.path.join(ROOT, "test", "integration")] + extra
        subprocess.run(cmd, cwd=ROOT, env=env)
        if not os.path.exists(xml):
            return 0, 1
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        tests = sum(int(s.get("tests", 0)) for s in suites)
        bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
        skipped = sum(int(s.get("skipped", 0)) for s in suites)
        return tests - bad - skipped, bad


def main():
    args = sys.argv[1:]
    builds = [a for a in args if not a.startswith("-")] or ["build", "build-asan", "build-tsan"]
    extra = [a for a in args if a.startswith("-")]
    total_p = total_f = 0
    for b in builds:
        if not os.path.isdir(os.path.join(ROOT, b)):
            print(f"FAIL: build folder {b} is missing (run make first)")
            total_f += 1
            continue
        for suite, fn in (("unit", lambda: run_unit(b)),
                          ("integration", lambda: run_integration(b, extra))):
            p, f = fn()
            print(f"[{b}] {suite}: {p} passed, {f} failed")
            total_p += p
            total_f += f
    print(f"{total_p} passed, {total_f} failed")
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
