"""test_dashboards.py: what the people who watch pcrouter use. The alert rules pass
`promtool check rules` and their unit tests (`promtool test rules`), the scrape config passes
`promtool check config`, and the Grafana dashboard is valid JSON whose every query parses as
PromQL and names only metrics pcrouter exports (or the pods' own vllm: ones)."""
import json
import os
import re
import subprocess

import yaml

from conftest import ROOT, get_metrics

PROM = os.path.join(ROOT, "conf", "prometheus")
DASHBOARD = os.path.join(ROOT, "conf", "grafana", "pcrouter.json")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "bool", "offset", "le", "inf", "nan"}


def promtool(*args):
    p = subprocess.run(["promtool"] + list(args), capture_output=True, text=True, timeout=120,
                       cwd=PROM)
    return p.returncode, p.stdout + p.stderr


def metric_names(expr):
    """The metric names a PromQL expression reads: label matchers, ranges, strings, grouping
    clauses and function calls taken out, what is left are series names."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in KEYWORDS:
            continue  # a function
        if re.fullmatch(r"\d*e\d*", m.group(0)):
            continue
        names.add(m.group(0))
    return names


def exported(cluster):
    c = cluster(1, policy="cache_aware")
    text = get_metrics(c.router)
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        out.add(name)
        if kind == "histogram":
            out |= {name + "_bucket", name + "_sum", name + "_count"}
    return out


def check_names(exprs, known):
    bad = {}
    for e in exprs:
        unknown = {n for n in metric_names(e) if n not in known and not n.startswith("vllm:")}
        if unknown:
            bad[e] = sorted(unknown)
    assert not bad, "queries naming metrics pcrouter does not export: %s" % bad


def test_alert_rules_check_and_pass_their_unit_tests():
    rc, out = promtool("check", "rules", "alerts.yml")
    assert rc == 0, out
    assert "5 rules found" in out, out
    rc, out = promtool("test", "rules", "alerts_test.yml")
    assert rc == 0 and "SUCCESS" in out, out
    # Every alert has a unit test.
    with open(os.path.join(PROM, "alerts.yml")) as f:
        alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    with open(os.path.join(PROM, "alerts_test.yml")) as f:
        tested = {t["alertname"] for c in yaml.safe_load(f)["tests"] for t in c["alert_rule_test"]}
    assert alerts == tested, alerts ^ tested
    assert {"PcrouterNoUsablePod", "PcrouterDeliveredHitRateFarBelowPredicted",
            "PcrouterPodEjectedRepeatedly", "PcrouterTTFTP99High"} <= alerts


def test_alert_rules_name_only_exported_metrics(cluster):
    with open(os.path.join(PROM, "alerts.yml")) as f:
        exprs = [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    check_names(exprs, exported(cluster))


def test_scrape_config_checks():
    rc, out = promtool("check", "config", "prometheus.yml")
    assert rc == 0, out
    with open(os.path.join(PROM, "prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["rule_files"] == ["alerts.yml"]
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert {"pcrouter", "vllm"} <= jobs, jobs


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def panel_exprs(d):
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append(t["expr"])
    return out


def test_dashboard_is_a_grafana_dashboard():
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "gauge", "heatmap"), p["type"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "instance"} <= names


def test_dashboard_queries_parse(tmp_path):
    """Each query, with Grafana's variables given values, as a recording rule: promtool parses
    every expression of a rules file."""
    exprs = panel_exprs(dashboard())
    rules = [{"record": "dashboard:q%d" % i,
              "expr": e.replace("$__rate_interval", "5m").replace("$instance", ".*")}
             for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_dashboard_names_only_exported_metrics_and_shows_what_it_should(cluster):
    exprs = panel_exprs(dashboard())
    check_names(exprs, exported(cluster))
    used = set().union(*(metric_names(e) for e in exprs))
    # Predicted against delivered, TTFT p50 and p99, decisions by reason, per-pod load,
    # health and KV usage.
    for m in ("pcrouter_cached_tokens_predicted_total", "pcrouter_cached_tokens_delivered_total",
              "pcrouter_time_to_first_token_seconds_bucket", "pcrouter_route_decisions_total",
              "pcrouter_backend_in_flight", "pcrouter_backend_up", "pcrouter_backend_ejected",
              "pcrouter_backend_kv_cache_usage_ratio"):
        assert m in used, m
    ttft = [e for e in exprs if "time_to_first_token" in e]
    assert any("0.5," in e for e in ttft) and any("0.99," in e for e in ttft), ttft
    assert any("by (reason)" in e for e in exprs)


def test_the_name_reader_is_not_fooled():
    assert metric_names('sum by (backend) (rate(a_total{x="y(z)"}[5m])) / on(i) b') == {"a_total", "b"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m]))) > 1e3") == {"h_bucket"}
