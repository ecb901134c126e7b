"""The repository stands alone: what its build, tests and benchmarks use is installed by the
Makefile's package lists on a fresh Debian 12 machine, and no file points outside it.

- Every module the Python files under test/ and bench/ import is local to the repository, or
  comes from a Debian package the Makefile lists (its file is looked up with `dpkg -S`). A
  standard-library module must come from the python3 install itself: Debian moves a few of them
  (distutils, tkinter, venv, lib2to3) into packages of their own that python3 does not pull in.
- Every external command those files run is in a table below, whose package the Makefile
  lists; where the command is installed, `dpkg -S` confirms the table.
- Every pkg-config dependency of meson.build comes from a -dev package in BUILD_PKGS.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys

from conftest import ROOT

PY = "/usr/bin/python3"

# Commands the tests and benchmarks run, and the Debian package each one comes from. A new
# command in a test or benchmark fails test_every_command_is_known until it is added here
# (and its package to the Makefile).
COMMANDS = {
    "curl": "curl",
    "openssl": "openssl",
    "h2load": "nghttp2-client",
    "meson": "meson",
    "pkg-config": "pkg-config",
    "groff": "groff-base",
    "haproxy": "haproxy",
    "nginx": "nginx-light",
    "wrk": "wrk",
    "gnuplot": "gnuplot-nox",
    "perf": "linux-perf",
    "promtool": "prometheus",
    "dnsmasq": "dnsmasq-base",
    "redis-server": "redis-server",
    "nm": "binutils",
}
# Commands from Debian's Essential packages, on every Debian system: no list needs them.
ESSENTIAL_COMMANDS = {
    "taskset": "util-linux",
    "dpkg": "dpkg",
    "dpkg-query": "dpkg",
    "ldd": "libc-bin",
}
# Commands a test uses only when they are there, skipping (or answering "unknown") otherwise.
OPTIONAL_COMMANDS = {
    "git": "the commit in --version; a tarball build says 'unknown'",
    "systemd-analyze": "the service file's check is skipped where systemd is absent",
}

# Calls whose list argument is a command line, and variables that hold one.
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "start"}
ARGV_NAMES = {"argv", "args", "cmd", "command"}


def makefile_packages():
    """{"BUILD_PKGS": [...], "TEST_PKGS": [...], "BENCH_PKGS": [...], "FUZZ_PKGS": [...]}, read
    from the Makefile."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    lists = dict(re.findall(r"^([A-Z]+_PKGS)\s*:=(.*)$", text, re.M))
    assert set(lists) == {"BUILD_PKGS", "TEST_PKGS", "BENCH_PKGS", "FUZZ_PKGS"}, lists
    return {k: v.split() for k, v in lists.items()}


def all_listed():
    return {p for pkgs in makefile_packages().values() for p in pkgs}


def python_files():
    for top in ("test", "bench"):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x not in ("__pycache__", "out")]
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.join(d, f)


def local_modules():
    """Module names a file of the repository provides (scripts, conftest, packages)."""
    names = set()
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
        names.update(f[:-3] for f in files if f.endswith(".py"))
        if "__init__.py" in files:
            names.add(os.path.basename(d))
    return names


def imported_modules():
    """{top-level module: [files importing it]} over test/ and bench/ (absolute imports)."""
    found = {}
    for path in python_files():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                found.setdefault(n.split(".")[0], []).append(os.path.relpath(path, ROOT))
    return found


def dpkg_owner(path):
    """The package that installed `path` (symlinks followed), or None."""
    real = os.path.realpath(path)
    for p in (real, path):
        out = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            # A diverted file (linux-perf diverts /usr/bin/perf to its wrapper) lists the
            # diversion first; the owner is on the line of the form "package: path".
            for line in out.stdout.splitlines():
                if not line.startswith("diversion by "):
                    return line.split(":")[0].split(",")[0].strip()
    return None


def installed_closure(roots):
    """The installed packages that `roots` bring in through Depends and Pre-Depends."""
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    deps, providers = {}, {}
    for line in out.splitlines():
        name, status, dep, prov = (line.split("\t") + ["", "", ""])[:4]
        if not status.startswith("ii"):
            continue
        deps[name] = dep
        providers.setdefault(name, set()).add(name)
        for p in prov.split(","):
            if p.strip():
                providers.setdefault(p.split()[0], set()).add(name)
    seen, todo = set(), [r for r in roots if r in deps]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for clause in deps[p].split(","):
            for alt in clause.split("|"):
                words = alt.split()
                if words:
                    todo.extend(providers.get(words[0].split(":")[0], ()))
    return seen


def module_origins(names):
    """{module: file or "built-in" or None}, as /usr/bin/python3 would find them."""
    code = ("import importlib.util, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try:\n"
            "        s = importlib.util.find_spec(n)\n"
            "    except Exception:\n"
            "        s = None\n"
            "    out[n] = None if s is None else (s.origin or (list(s.submodule_search_locations or [''])[0]))\n"
            "print(json.dumps(out))\n")
    out = subprocess.run([PY, "-c", code] + sorted(names), capture_output=True, text=True,
                         check=True, timeout=60, cwd="/")
    return json.loads(out.stdout)


def test_python_is_debians():
    assert os.path.realpath(PY).startswith("/usr/bin/python3"), PY
    for path in python_files():
        with open(path) as f:
            first = f.readline()
        if first.startswith("#!"):
            assert first.strip() == "#!" + PY, "%s: shebang %r (use %s)" % (path, first, PY)


def test_every_imported_module_is_installed_by_the_makefile():
    imports = imported_modules()
    assert {"pytest", "h2", "json"} <= set(imports), sorted(imports)  # the walk sees the tests
    local = local_modules()
    stdlib = set(sys.stdlib_module_names)
    listed = all_listed()
    python_own = installed_closure(["python3"])
    assert python_own, "dpkg knows no python3 package"
    wanted = sorted(n for n in imports if n not in local)
    origins = module_origins(wanted)
    bad = []
    for name in wanted:
        where = ", ".join(sorted(set(imports[name]))[:3])
        origin = origins.get(name)
        if origin is None:
            bad.append("%s (imported by %s) is not installed for %s" % (name, where, PY))
            continue
        if origin in ("built-in", "frozen"):
            continue
        pkg = dpkg_owner(origin)
        if name in stdlib:
            if pkg is not None and pkg not in python_own and pkg not in listed:
                bad.append("%s (standard library, imported by %s) comes from %s, which python3 "
                           "does not install: list it in the Makefile" % (name, where, pkg))
        elif pkg is None:
            bad.append("%s (imported by %s) is at %s, which no Debian package installed"
                       % (name, where, origin))
        elif pkg not in listed:
            bad.append("%s (imported by %s) comes from %s, which the Makefile does not list"
                       % (name, where, pkg))
    assert not bad, "\n".join(bad)


def commands_run():
    """{command: [files]}: the first word of every literal command line in test/ and bench/."""
    found = {}

    def first_word(node):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            e = node.elts[0]
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                return e.value
        return None

    for path in python_files():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        rel = os.path.relpath(path, ROOT)
        for node in ast.walk(tree):
            cands = []
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if name in RUNNERS:
                    cands.extend(node.args)
                if name == "which":
                    for a in node.args:
                        if isinstance(a, ast.Constant) and isinstance(a.value, str):
                            found.setdefault(a.value, set()).add(rel)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in ARGV_NAMES for t in node.targets):
                cands.append(node.value)
            for c in list(cands):
                if isinstance(c, ast.BinOp):
                    cands.extend([c.left, c.right])
            for c in cands:
                w = first_word(c)
                if w and not w.startswith("-"):
                    found.setdefault(w, set()).add(rel)
    return found


def test_every_command_is_known():
    cmds = commands_run()
    assert {"curl", "openssl", "h2load", "wrk", "haproxy"} <= set(cmds), sorted(cmds)
    known = set(COMMANDS) | set(ESSENTIAL_COMMANDS) | set(OPTIONAL_COMMANDS)
    unknown = {c: sorted(f) for c, f in cmds.items() if c not in known}
    assert not unknown, ("commands run by tests or benchmarks with no package in COMMANDS "
                         "(add it here and to the Makefile): %s" % unknown)


def test_every_command_package_is_listed_and_right():
    lists = makefile_packages()
    listed = all_listed()
    closure = installed_closure(sorted(listed))
    bad = []
    for cmd, pkg in sorted(COMMANDS.items()):
        if pkg not in listed:
            bad.append("%s: package %s is not in the Makefile's lists" % (cmd, pkg))
            continue
        path = shutil.which(cmd)
        if path is None:
            # make test installs the build and test lists; the bench list only for benchmarks.
            if pkg not in lists["BENCH_PKGS"]:
                bad.append("%s: not installed although %s is in the build or test list" % (cmd, pkg))
            continue
        owner = dpkg_owner(path)
        if owner != pkg and owner not in closure:
            bad.append("%s: %s comes from %s, not from %s or what it installs" % (cmd, path, owner, pkg))
    assert not bad, "\n".join(bad)


def test_essential_commands_are_essential():
    bad = []
    for cmd, pkg in sorted(ESSENTIAL_COMMANDS.items()):
        ess = subprocess.run(["dpkg-query", "-W", "-f", "${Essential}", pkg], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        path = shutil.which(cmd)
        if ess != "yes" or path is None or dpkg_owner(path) != pkg:
            bad.append("%s: %s is not an installed Essential package's (%s, %s)" % (cmd, pkg, ess, path))
    assert not bad, "\n".join(bad)


def test_build_dependencies_come_from_listed_dev_packages():
    with open(os.path.join(ROOT, "meson.build")) as f:
        text = f.read()
    deps = re.findall(r"\bdependency\(\s*'([^']+)'", text)
    assert {"libevent", "libnghttp2", "openssl", "jansson"} <= set(deps), deps
    build_pkgs = set(makefile_packages()["BUILD_PKGS"])
    bad = []
    for d in deps:
        pcdir = subprocess.run(["pkg-config", "--variable=pcfiledir", d], capture_output=True,
                               text=True, timeout=30).stdout.strip()
        pc = os.path.join(pcdir, d + ".pc")
        owner = dpkg_owner(pc) if pcdir else None
        if owner not in build_pkgs:
            bad.append("%s: %s comes from %s, not a package in BUILD_PKGS" % (d, pc, owner))
    # http-parser has no .pc file in Debian: meson finds it by header and library.
    owner = dpkg_owner("/usr/include/http_parser.h")
    if owner not in build_pkgs:
        bad.append("http_parser.h comes from %s, not a package in BUILD_PKGS" % owner)
    assert not bad, "\n".join(bad)


def repo_files():
    """Every file of the repository (git's list when it is a checkout, else a walk)."""
    p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True) \
        if shutil.which("git") else None
    if p is not None and p.returncode == 0 and p.stdout:
        return [f for f in p.stdout.decode().split("\0") if f]
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "__pycache__"]
        out.extend(os.path.relpath(os.path.join(d, f), ROOT) for f in files)
    return out


# Spelled in pieces so this file does not match itself.
OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "/" + "work/"]))
ISSUE_REF = re.compile(r"\b" + "issue" + r"s?\s+#?\d+", re.I)


def test_no_file_points_outside_the_repo_or_to_the_tracker():
    bad = []
    for rel in repo_files():
        if rel.endswith(".jsonl") or os.path.basename(rel).startswith("LICENSE"):
            continue
        try:
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for rx, what in ((OUTSIDE, "a path outside the repository"), (ISSUE_REF, "an issue number")):
            m = rx.search(text)
            if m:
                line = text.count("\n", 0, m.start()) + 1
                bad.append("%s:%d: %s (%r)" % (rel, line, what, m.group(0)))
    assert not bad, "\n".join(bad)
