"""Installing pcrouter: `meson install` puts the binary, the manual page and the example config
where an operator looks for them, and nothing else; the manual page renders without a warning
and documents every option the binary has; the systemd unit runs what was installed and
passes `systemd-analyze verify`."""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from conftest import BUILD, PCROUTER, ROOT, SANITIZER_MARKERS

MAN_SRC = os.path.join(ROOT, "docs", "pcrouter.1")


def meson_options():
    out = subprocess.run(["meson", "introspect", "--buildoptions", BUILD], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


def under(prefix, d):
    """An install folder as meson resolves it: relative ones are under the prefix."""
    return d if os.path.isabs(d) else os.path.join(prefix, d)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("destdir"))
    p = subprocess.run(["meson", "install", "-C", BUILD, "--no-rebuild", "--destdir", dest],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    o = meson_options()
    prefix = o["prefix"]
    paths = {
        "bin": under(prefix, o["bindir"]) + "/pcrouter",
        "man": under(prefix, o["mandir"]) + "/man1/pcrouter.1",
        "conf": under(prefix, o["sysconfdir"]) + "/pcrouter/pcrouter.json",
    }
    return dest, {k: dest + v for k, v in paths.items()}


def test_install_puts_three_files_and_nothing_else(installed):
    dest, paths = installed
    found = set()
    for d, _, files in os.walk(dest):
        found.update(os.path.join(d, f) for f in files)
    assert found == set(paths.values()), sorted(found)
    assert os.access(paths["bin"], os.X_OK)
    assert "/bin/" in paths["bin"] and "/share/man/man1/" in paths["man"], paths
    assert paths["conf"].endswith("etc/pcrouter/pcrouter.json"), paths


def test_installed_files_work(installed):
    _, paths = installed
    p = subprocess.run([paths["bin"], "--version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("pcrouter "), p
    p = subprocess.run([paths["bin"], "--check-config", paths["conf"]], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p
    assert "OK" in p.stdout, p
    for m in SANITIZER_MARKERS:
        assert m not in p.stderr, p.stderr
    with open(paths["man"], "rb") as a, open(MAN_SRC, "rb") as b:
        assert a.read() == b.read()


def render_man():
    """The page as `man` shows it, in plain text (-P-cbou: no overstrike for bold or underline,
    so the checks read words); -ww turns on every warning groff has."""
    return subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-rLL=100n", "-P-cbou", MAN_SRC],
                          capture_output=True, text=True, timeout=30)


def test_man_page_renders_without_warnings():
    p = render_man()
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    heads = re.findall(r"^([A-Z][A-Z ]+)$", p.stdout, re.M)
    for want in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SIGNALS", "CONFIGURATION",
                 "EXIT STATUS", "FILES", "EXAMPLES"):
        assert want in heads, (want, heads)


def test_man_page_matches_the_binary():
    """Same version as the build, and every option `--help` names is documented."""
    with open(MAN_SRC) as f:
        src = f.read()
    proj = json.loads(subprocess.run(["meson", "introspect", "--projectinfo", BUILD],
                                     capture_output=True, text=True, check=True).stdout)
    th = re.search(r'^\.TH PCROUTER 1 "[^"]*" "pcrouter ([^"]+)"', src, re.M)
    assert th and th.group(1) == proj["version"], (th and th.group(1), proj["version"])
    text = render_man().stdout
    help_text = subprocess.run([PCROUTER, "--help"], capture_output=True, text=True).stdout
    opts = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+|-[a-zA-Z])\b", help_text))
    assert {"--config", "--check-config", "--version", "--help"} <= opts, opts
    for opt in opts:
        assert re.search(r"(?<![\w-])%s\b" % re.escape(opt), text), "%s is not in the man page" % opt
    for sig in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"):
        assert sig in text, sig
    # Every top-level key the loader takes has its paragraph: the loader lists them itself
    # when it meets one it does not know.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "stray.json")
        with open(path, "w") as f:
            json.dump({"listen": [{"address": "127.0.0.1:0"}], "zzz": 1}, f)
        err = subprocess.run([PCROUTER, "--check-config", path], capture_output=True, text=True).stderr
    m = re.search(r'unknown key "zzz" \(allowed: ([^)]*)\)', err)
    assert m, err
    for section in m.group(1).split(", "):
        assert re.search(r"^\s+%s\b" % section, text, re.M), "%s has no paragraph in the man page" % section


# ------------------------------------------------------------------------------------------
# the systemd unit

UNIT = os.path.join(ROOT, "conf", "systemd", "pcrouter.service")


def unit_settings():
    """{(section, key): [values]} of the unit (keys may repeat, as SystemCallFilter does)."""
    out, section = {}, None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            k, _, v = line.partition("=")
            out.setdefault((section, k.strip()), []).append(v.strip())
    return out


def makefile_prefix():
    with open(os.path.join(ROOT, "Makefile")) as f:
        return re.search(r"^PREFIX\s*\?=\s*(\S+)", f.read(), re.M).group(1)


def test_unit_settings():
    s = unit_settings()

    def one(key, section="Service"):
        v = s.get((section, key))
        assert v and len(v) == 1, (key, v)
        return v[0]

    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    assert int(one("LimitNOFILE")) >= 65536
    for key, want in (("DynamicUser", "yes"), ("ProtectSystem", "strict"),
                      ("NoNewPrivileges", "yes"), ("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
                      ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"), ("ProtectHome", "yes"),
                      ("PrivateDevices", "yes"), ("KillSignal", "SIGTERM")):
        assert one(key) == want, (key, one(key))
    assert one("WantedBy", "Install") == "multi-user.target"
    # systemd must not cut the drain short: its stop timeout outlasts timeouts.drain_ms.
    with open(os.path.join(ROOT, "conf", "pcrouter.full.json")) as f:
        drain_ms = json.load(f)["timeouts"]["drain_ms"]
    assert int(one("TimeoutStopSec")) * 1000 > drain_ms, (one("TimeoutStopSec"), drain_ms)


def test_unit_paths_are_the_installed_ones():
    """ExecStart runs the binary and config that `make install` (its default PREFIX) puts in
    place: bindir under the prefix, and sysconfdir as meson places it (/etc under /usr)."""
    s = unit_settings()
    prefix = makefile_prefix()
    bindir = meson_options()["bindir"]
    etc = "/etc" if prefix == "/usr" else prefix + "/etc"
    binary = under(prefix, bindir) + "/pcrouter"
    config = etc + "/pcrouter/pcrouter.json"
    assert s[("Service", "ExecStart")] == ["%s -c %s" % (binary, config)], s[("Service", "ExecStart")]
    assert s[("Service", "ExecStartPre")] == ["%s --check-config %s" % (binary, config)]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(installed, tmp_path):
    """`systemd-analyze verify` with the unit pointing at the binary and config of a real
    install (in a DESTDIR), and man finding the installed page for Documentation=. Warnings
    count as failures: verify reports an unknown key or a bad value but still exits 0."""
    _, paths = installed
    s = unit_settings()
    binary, config = s[("Service", "ExecStart")][0].split(" -c ")
    with open(UNIT) as f:
        text = f.read().replace(binary, paths["bin"]).replace(config, paths["conf"])
    unit = tmp_path / "pcrouter.service"
    unit.write_text(text)
    env = dict(os.environ, MANPATH=os.path.dirname(os.path.dirname(paths["man"])))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       env=env, timeout=60, cwd=str(tmp_path))
    assert p.returncode == 0 and p.stderr.strip() == "" and p.stdout.strip() == "", p


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_exposure_is_ok():
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT], capture_output=True,
                       text=True, timeout=60)
    m = re.search(r"Overall exposure level for pcrouter\.service: ([\d.]+) (\w+)", p.stdout + p.stderr)
    assert m, p
    assert float(m.group(1)) < 2.0 and m.group(2) in ("SAFE", "OK"), m.group(0)
