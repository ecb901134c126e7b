"""Installing pcrouter: `meson install` puts the binary, the manual page and the example config
where an operator looks for them, and nothing else; the manual page renders without a warning
and documents every option the binary has."""
import json
import os
import re
import subprocess

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


def test_install_honours_prefix_for_sysconfdir():
    """Under /usr the config goes to /etc (meson's rule), elsewhere under the prefix: the
    manual page's FILES section and the service file rely on it."""
    o = meson_options()
    if o["prefix"] == "/usr":
        assert o["sysconfdir"] == "/etc", o["sysconfdir"]
    else:
        assert not os.path.isabs(o["sysconfdir"]), o["sysconfdir"]


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
    for section in ("listen", "backends", "routing", "limits", "timeouts", "upstream", "health",
                    "log"):
        assert re.search(r"^\s+%s\b" % section, text, re.M), section
