"""The command line: --version, --help, --check-config, and -c refusing a bad config."""
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import PCROUTER, ROOT, make_config, SANITIZER_MARKERS


def run(*args, timeout=30):
    return subprocess.run([PCROUTER] + list(args), capture_output=True, text=True, timeout=timeout)


def no_sanitizer(p):
    for m in SANITIZER_MARKERS:
        assert m not in p.stderr, p.stderr


def version_fields(text):
    """`--version` lines after the first, as {"libevent": "2.1.12-stable", ...}."""
    out = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"^([\w-]+):\s+(\S.*)$", line)
        assert m, "unexpected --version line %r in:\n%s" % (line, text)
        out[m.group(1)] = m.group(2)
    return out


def test_version():
    p = run("--version")
    assert p.returncode == 0, p
    assert re.match(r"pcrouter 0\.1\.0\n", p.stdout), p
    f = version_fields(p.stdout)
    assert set(f) == {"commit", "libevent", "nghttp2", "OpenSSL", "jansson", "cJSON", "c-ares", "hiredis",
                      "http-parser", "xxHash", "yajl", "simdjson"}, f
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown", f["commit"]), f
    no_sanitizer(p)


def test_version_commit_is_a_real_commit():
    """Built from a git checkout, the commit names a commit of this repository."""
    f = version_fields(run("--version").stdout)
    if f["commit"] == "unknown":
        inside = shutil.which("git") and subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--git-dir"], capture_output=True).returncode == 0
        assert not inside, "built from a git checkout, yet --version says commit unknown"
        pytest.skip("not built from a git checkout")
    sha = f["commit"].split("-")[0]
    p = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", sha + "^{commit}"], capture_output=True)
    assert p.returncode == 0, "commit %s is not in this repository: %s" % (sha, p.stderr)


def test_version_libraries_match_the_installed_ones():
    """The versions printed are the ones the libraries report; on a machine where the binary was
    built, they equal what pkg-config says of the installed development packages."""
    f = version_fields(run("--version").stdout)
    for field, pc in (("libevent", "libevent"), ("nghttp2", "libnghttp2"), ("OpenSSL", "openssl"),
                      ("jansson", "jansson"), ("cJSON", "libcjson"), ("hiredis", "hiredis"),
                      ("xxHash", "libxxhash")):
        want = subprocess.run(["pkg-config", "--modversion", pc], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert want, pc
        assert "built with" not in f[field], f
        assert re.search(r"(^|\s)%s(\s|$)" % re.escape(want), f[field]), (field, want, f[field])
    # http-parser's Debian package has no .pc file: its header says the version.
    with open("/usr/include/http_parser.h") as h:
        parts = dict(re.findall(r"#define HTTP_PARSER_VERSION_(MAJOR|MINOR|PATCH) (\d+)", h.read()))
    assert f["http-parser"] == "%s.%s.%s" % (parts["MAJOR"], parts["MINOR"], parts["PATCH"]), f


def test_help_names_options():
    p = run("--help")
    assert p.returncode == 0, p
    text = p.stdout + p.stderr
    for opt in ("--config", "--check-config", "--version"):
        assert opt in text, text
    no_sanitizer(p)


# Each line number below matters: the errors must point at them.
BAD_CONFIG = """{
  "listen": [{"address": "nohost"}],
  "backends": [
    {"name": "pod-a", "url": "http://127.0.0.1:8001"},
    {"name": "pod-b", "url": "ftp://nowhere"},
    {"name": "pod-a", "url": "http://127.0.0.1:8003"}
  ],
  "routing": {"policy": "round_robin", "bogus_key": 1},
  "health": {"interval_ms": "fast"}
}
"""


def test_check_config_reports_every_error_with_position(tmp_path):
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write(BAD_CONFIG)
    p = run("--check-config", path)
    assert p.returncode == 1, p
    err = p.stderr
    pre = re.escape(path)
    expect = [
        (2, r"listen\[0\]\.address"),
        (5, r"backends\[1\]\.url"),
        (6, r"backends\[2\](\.name)?"),
        (8, r"routing\.bogus_key"),
        (9, r"health\.interval_ms"),
    ]
    for line, key in expect:
        assert re.search(r"^%s:%d:\d+: %s: \S" % (pre, line, key), err, re.M), \
            "missing error for %s at line %d in:\n%s" % (key, line, err)
    no_sanitizer(p)


def test_check_config_not_json(tmp_path):
    path = str(tmp_path / "broken.json")
    with open(path, "w") as f:
        f.write('{\n  "listen": [\n    {"address": "127.0.0.1:0"\n  ]\n}\n')
    p = run("--check-config", path)
    assert p.returncode == 1, p
    assert re.search(r"^%s:\d+:\d+: " % re.escape(path), p.stderr, re.M), p.stderr
    no_sanitizer(p)


def test_check_config_missing_file(tmp_path):
    path = str(tmp_path / "absent.json")
    p = run("--check-config", path)
    assert p.returncode == 1, p
    assert path in p.stderr, p.stderr
    no_sanitizer(p)


def test_check_config_valid(tmp_path):
    path = str(tmp_path / "good.json")
    cfg = make_config([("pod-a", "http://127.0.0.1:8001"), ("pod-b", "http://127.0.0.1:8002")],
                      routing={"policy": "cache_aware"}, limits={"max_body_bytes": 1048576})
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    p = run("--check-config", path)
    assert p.returncode == 0, p
    assert re.search(r"\bok\b", (p.stdout + p.stderr).lower()), p
    no_sanitizer(p)


def test_config_flag_refuses_bad_config(tmp_path):
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write(BAD_CONFIG)
    for flag in ("-c", "--config"):
        p = run(flag, path)
        assert p.returncode != 0, p
        assert "ready" not in p.stderr, p.stderr
        assert re.search(r"^%s:5:\d+: backends\[1\]\.url: " % re.escape(path), p.stderr, re.M), p.stderr
        no_sanitizer(p)


def test_long_config_flag_starts(tmp_path, stub_factory):
    """`--config FILE` works like -c (the fixture uses -c)."""
    import signal
    import subprocess as sp
    from conftest import LineReader
    s = stub_factory("pod-a")
    path = str(tmp_path / "ok.json")
    with open(path, "w") as f:
        json.dump(make_config([s]), f)
    proc = sp.Popen([PCROUTER, "--config", path], stdout=sp.DEVNULL, stderr=sp.PIPE)
    err = LineReader(proc.stderr, "pcrouter")
    try:
        got = err.wait_line(r"\bready\b", 30)
        assert got is not None, err.tail()
        assert err.wait_line(r"listening on 127\.0\.0\.1:[1-9]\d*", 1) is not None, err.tail()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    err.thread.join(5)
    assert rc == 0, err.tail()
    for m in SANITIZER_MARKERS:
        assert m not in err.text(), err.text()


# ---- conf/README.md against the loader ---------------------------------------------------

# Every object the config may hold, as a key-path prefix, and where a stray key goes in a
# config that has them all (the loader then names each object's keys: "allowed: ...").
CONFIG_OBJECTS = {
    "": "zzz",
    "listen[].": 'listen[0]',
    "listen[].tls.": 'listen[0].tls',
    "backends[].": 'backends[0]',
    "backends[].tls.": 'backends[0].tls',
    "backends[].kv_events.": 'backends[0].kv_events',
    "discovery[].": 'discovery[0]',
    "discovery[].tls.": 'discovery[0].tls',
    "discovery[].kv_events.": 'discovery[0].kv_events',
    **{s + ".": s for s in ("dns", "routing", "limits", "timeouts", "upstream", "health", "scrape",
                            "outlier", "log", "admin", "redis", "pd", "auth", "flow_control")},
    "auth.keys[].": "auth.keys[0]",
    "tenants.NAME.": "tenants.NAME",
}


def loader_keys(tmp_path):
    """Every key path the loader accepts ("routing.policy", "listen[].tls.cert", ...), from its
    own "unknown key" errors: one stray key in each object of a config that has them all."""
    cfg = {"listen": [{"address": "127.0.0.1:0", "tls": {"cert": "/dev/null", "key": "/dev/null",
                                                          "zzz": 1}, "zzz": 1}],
           "backends": [{"name": "a", "url": "https://127.0.0.1:1", "tls": {"zzz": 1}, "zzz": 1,
                         "kv_events": {"endpoint": "tcp://127.0.0.1:1", "zzz": 1}}],
           "discovery": [{"dns": "pods.example", "tls": {"zzz": 1}, "zzz": 1,
                          "kv_events": {"port": 1, "zzz": 1}}],
           "admin": {"address": "127.0.0.1:0", "zzz": 1},
           "redis": {"url": "redis://127.0.0.1", "zzz": 1},
           "auth": {"keys": [{"sha256": "0" * 64, "zzz": 1}], "zzz": 1},
           "tenants": {"NAME": {"zzz": 1}}, "zzz": 1}
    for s in ("dns", "routing", "limits", "timeouts", "upstream", "health", "scrape", "outlier", "log",
              "pd", "flow_control"):
        cfg[s] = {"zzz": 1}
    path = tmp_path / "every.json"
    path.write_text(json.dumps(cfg))
    p = run("--check-config", str(path))
    keys = set()
    for prefix, where in CONFIG_OBJECTS.items():
        at = where if where == "zzz" else where + ".zzz"
        m = re.search(r"^[^\n]*:\d+:\d+: %s: unknown key \"zzz\" \(allowed: ([^)]*)\)$" % re.escape(at),
                      p.stderr, re.M)
        assert m, "no list of the keys of %r in:\n%s" % (where, p.stderr)
        keys |= {prefix + k for k in m.group(1).split(", ")}
    return keys


def readme_key_rows():
    """conf/README.md's keys table: {key path: default cell}; a row naming several keys
    ("`discovery[].zone`, `.weight`") gives each the row's default."""
    with open(os.path.join(ROOT, "conf", "README.md")) as f:
        section = f.read().split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        first = names[0]
        for n in names:
            key = first.rsplit(".", 1)[0] + n if n.startswith(".") else n
            assert key not in rows, "%s documented twice" % key
            rows[key] = cells[2]
    return rows


def full_json_value(full, key):
    """The value of `key` ("listen[].tls.cert") in conf/pcrouter.full.json, KeyError when absent."""
    v = full
    for part in key.split("."):
        if part.endswith("[]"):
            v = v[part[:-2]][0]
        else:
            v = v[part]
    return v


def lineage(key):
    """`key` and the objects it is in: "listen[].tls.cert", "listen[].tls", "listen"."""
    out = [key]
    while "." in key:
        key = key.rsplit(".", 1)[0]
        out.append(key[:-2] if key.endswith("[]") else key)
    return out


def test_conf_readme_documents_every_key_and_no_other(tmp_path):
    code = loader_keys(tmp_path)
    rows = readme_key_rows()
    sections = {k.rsplit(".", 1)[0] for k in rows if "." in k} | {k.split("[]")[0] for k in rows}
    missing = {k for k in code if k not in rows and k not in sections}
    assert not missing, "keys the loader takes that conf/README.md does not document: %s" % sorted(missing)
    extra = set(rows) - code
    assert not extra, "keys conf/README.md documents that the loader refuses: %s" % sorted(extra)


def test_conf_readme_defaults_are_the_full_example(tmp_path):
    """Each default the keys table gives as a value is the value conf/pcrouter.full.json sets
    (test_config.c checks that file loads into the loader's own defaults), and the example sets
    every key but those whose default is to be absent or that are required."""
    code = loader_keys(tmp_path)
    rows = readme_key_rows()
    with open(os.path.join(ROOT, "conf", "pcrouter.full.json")) as f:
        full = json.load(f)

    def literal(key):
        m = re.match(r"`([^`]*)`", rows[key])
        if m is None:
            return None
        token = m.group(1)
        if token in code:                  # "the default is that other key's"
            return literal(token)
        return json.loads(token)

    for key in sorted(code):
        if key not in rows:
            continue                       # a section, documented by its keys
        try:
            value = full_json_value(full, key)
        except (KeyError, IndexError):
            # Absent from the example: it, or the object it belongs to, has no default value.
            assert any(rows.get(k, "").startswith(("absent", "(required")) for k in lineage(key)), \
                "conf/pcrouter.full.json does not set %s" % key
            continue
        want = literal(key)
        if want is not None:
            assert value == want, "%s: conf/README.md says %r, conf/pcrouter.full.json %r" % (key, want, value)
