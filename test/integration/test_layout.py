"""The floor plan of router/: its folders form a ladder, each using only those before it
(docs/ARCHITECTURE.md, "The ladder"). Every `#include "..."` of router/**/*.c|h is read, and
with a build (PCR_BUILD) every call between the library's objects too (nm): a file that
includes a header, or calls a function, of a folder later in the ladder fails the test, unless
the pair is one of the exceptions named below with its reason. No process is started."""
import glob
import os
import re
import subprocess

import pytest

from conftest import BUILD, ROOT

ROUTER = os.path.join(ROOT, "router")
# Lowest first; "" is router/ itself: the process (main, control, worker, reload).
LADDER = ["config", "core", "net", "body", "kv", "upstream", "share", "obs", "http", ""]
TOP_FILES = {"main.c", "control.c", "control.h", "worker.c", "worker.h", "reload.c", "reload.h",
             "precise.c", "precise.h", "memguard.c", "memguard.h",
             "meson.build"}
# (file, what it uses) -> why this dependency runs back up. Keep it short; docs/ARCHITECTURE.md
# names the same ones.
EXCEPTIONS = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources():
    out = []
    for path in sorted(glob.glob(os.path.join(ROUTER, "**", "*"), recursive=True)):
        if os.path.isfile(path) and path.endswith((".c", ".h", ".cpp")):
            out.append(os.path.relpath(path, ROUTER))
    return out


def folder(rel):
    return os.path.dirname(rel)


def rank(rel):
    return LADDER.index(folder(rel))


def headers():
    """Header base name -> its path under router/ (names are unique across the folders)."""
    by_name = {}
    for rel in sources():
        if rel.endswith(".h"):
            assert os.path.basename(rel) not in by_name, "two headers named %s" % rel
            by_name[os.path.basename(rel)] = rel
    return by_name


def test_every_file_has_its_place_on_the_ladder():
    files = sources()
    assert files, "no source under %s" % ROUTER
    for rel in files:
        assert folder(rel) in LADDER, "%s: folder %r is not on the ladder" % (rel, folder(rel))
        if folder(rel) == "":
            assert os.path.basename(rel) in TOP_FILES, \
                "%s sits at the top of router/: only the process does (%s)" % (rel, TOP_FILES)
    # A ladder of one rung would pass every check below: each folder must hold code.
    for f in LADDER[:-1]:
        assert any(folder(rel) == f and rel.endswith((".c", ".cpp")) for rel in files), \
            "router/%s/ holds no source" % f


def test_no_include_runs_back_up():
    by_name = headers()
    bad = []
    for rel in sources():
        text = open(os.path.join(ROUTER, rel), encoding="utf-8").read()
        for name in INCLUDE.findall(text):
            target = by_name.get(os.path.basename(name))
            if target is None:
                continue  # include/pcr/, a system header, or version_gen.h (generated)
            if rank(target) > rank(rel) and (rel, target) not in EXCEPTIONS:
                bad.append("%s includes %s" % (rel, target))
    assert not bad, "dependencies that run back up the ladder:\n  " + "\n  ".join(bad)


def objects():
    """Object file -> the source it was built from, for the router library in BUILD."""
    objdir = os.path.join(BUILD, "router", "libpcrrouter.a.p")
    if not os.path.isdir(objdir):
        return {}
    # meson names an object after its path with '/' as '_': router/upstream/backend.c is
    # upstream_backend.c.o.
    by_obj = {}
    for rel in sources():
        if rel.endswith((".c", ".cpp")):
            by_obj[rel.replace("/", "_") + ".o"] = rel
    return {os.path.join(objdir, o): rel for o, rel in by_obj.items()
            if os.path.exists(os.path.join(objdir, o))}


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBR":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


def test_no_call_runs_back_up():
    objs = objects()
    if not objs:
        pytest.skip("no router library in %s (build it first)" % BUILD)
    lib = [rel for rel in sources() if rel.endswith((".c", ".cpp")) and rel != "main.c"]
    assert len(objs) == len(lib), "objects missing for: %s" % sorted(set(lib) - set(objs.values()))
    owner, needs = {}, {}
    for obj, rel in objs.items():
        defined, undefined = symbols(obj)
        for s in defined:
            owner[s] = rel
        needs[rel] = undefined
    bad = []
    for rel, undefined in sorted(needs.items()):
        for s in sorted(undefined):
            target = owner.get(s)
            if target and rank(target) > rank(rel) and (rel, target) not in EXCEPTIONS:
                bad.append("%s calls %s (%s)" % (rel, s, target))
    assert not bad, "calls that run back up the ladder:\n  " + "\n  ".join(bad)
