"""Deployment files, checked offline: no container engine or cluster runs on these machines.

Containerfile: two stages on Debian 12; the runtime stage installs every shared library the
built binary links to (ldd, then dpkg -S), runs as a numeric non-root user, has a HEALTHCHECK on
/health and reads the config from /etc/pcrouter/pcrouter.json.

conf/k8s/: every manifest is checked against the Kubernetes API's own object models (Debian's
python3-kubernetes, generated from the Kubernetes OpenAPI schema): each field must exist there
with the right type, and required fields must be present. Then the fields that make the
deployment work: probes, the grace period against the drain, non-root and read-only, selectors
that match labels, ports that match, and a ConfigMap config that `pcrouter --check-config`
accepts.
"""
import copy
import glob
import json
import os
import re
import shlex
import subprocess

import yaml

from conftest import PCROUTER, ROOT

CONTAINERFILE = os.path.join(ROOT, "Containerfile")
K8S = os.path.join(ROOT, "conf", "k8s")
CONFIG_IN_IMAGE = "/etc/pcrouter/pcrouter.json"


# ------------------------------------------------------------------------------------------
# Containerfile

def containerfile_stages():
    """[(from_line, [(INSTRUCTION, args)])]: the file's instructions, continuation lines joined
    and comments dropped (the whole of the syntax this file uses)."""
    with open(CONTAINERFILE) as f:
        lines = [l for l in f.read().splitlines() if not l.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    stages = []
    for line in text.splitlines():
        if not line.strip():
            continue
        instr, _, args = line.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            stages.append((args.strip(), []))
        else:
            assert stages, "instruction before FROM: %r" % line
            stages[-1][1].append((instr, args.strip()))
    return stages


def apt_installed(instructions):
    """Package names given to `apt-get install` in a stage's RUN instructions."""
    pkgs = set()
    for instr, args in instructions:
        if instr != "RUN":
            continue
        for cmd in re.split(r"&&|;", args):
            words = shlex.split(cmd)
            if "apt-get" in words and "install" in words:
                pkgs.update(w for w in words[words.index("install") + 1:] if not w.startswith("-"))
    return pkgs


def linked_packages():
    """The Debian packages of the shared libraries build/pcrouter links to (libc6 aside)."""
    out = subprocess.run(["ldd", PCROUTER], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    pkgs = set()
    sanitized = "libasan" in out or "libubsan" in out or "libtsan" in out
    for path in re.findall(r"=>\s+(/\S+)", out):
        if sanitized and re.search(r"/lib(asan|ubsan|tsan|stdc\+\+|gcc_s)\.so", path):
            continue  # the sanitizer build's runtime and what it needs: not in a release build
        real = os.path.realpath(path)
        p = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            p = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, "no package owns %s" % path
        pkgs.add(p.stdout.split(":")[0])
    return pkgs


def test_containerfile_stages_are_debian_12():
    stages = containerfile_stages()
    assert len(stages) >= 2, [s[0] for s in stages]
    for frm, _ in stages:
        image = frm.split()[0]
        assert re.fullmatch(r"debian:bookworm(-slim)?(@sha256:[0-9a-f]{64})?", image), frm
    assert re.search(r"\sAS\s+build$", stages[0][0], re.I), stages[0][0]


def test_containerfile_build_stage_has_the_build_packages():
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    build_pkgs = re.search(r"^BUILD_PKGS\s*:=(.*)$", text, re.M).group(1).split()
    stages = containerfile_stages()
    missing = set(build_pkgs) - apt_installed(stages[0][1])
    assert not missing, "the build stage misses %s" % sorted(missing)
    runs = " ".join(a for i, a in stages[0][1] if i == "RUN")
    assert "meson setup" in runs and "--prefix=/usr" in runs and "meson install" in runs, runs


def test_containerfile_runtime_stage():
    stages = containerfile_stages()
    _, runtime = stages[-1]
    instrs = {}
    for i, a in runtime:
        instrs.setdefault(i, []).append(a)
    # Slim: no compiler or -dev package in what runs.
    installed = apt_installed(runtime)
    assert not [p for p in installed if p.endswith("-dev") or p in ("gcc", "meson")], installed
    # Every shared library the binary links to.
    missing = linked_packages() - installed - {"libc6"}
    assert not missing, "the runtime stage does not install %s (ldd %s)" % (sorted(missing), PCROUTER)
    # A numeric user other than root, so Kubernetes can enforce runAsNonRoot.
    user = instrs["USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, user
    # Health check on /health, with a tool the stage installs.
    hc = " ".join(instrs.get("HEALTHCHECK", []))
    assert "/health" in hc, hc
    assert "curl" not in hc or "curl" in installed, hc
    port = re.search(r"127\.0\.0\.1:(\d+)/health", hc).group(1)
    assert port in " ".join(instrs.get("EXPOSE", [])), (port, instrs.get("EXPOSE"))
    assert instrs.get("STOPSIGNAL") == ["SIGTERM"], instrs.get("STOPSIGNAL")
    # The binary, from the build stage, runs with the mounted config.
    entry = json.loads(instrs["ENTRYPOINT"][-1]) + json.loads(instrs["CMD"][-1])
    assert entry == ["/usr/bin/pcrouter", "-c", CONFIG_IN_IMAGE], entry
    copies = instrs.get("COPY", [])
    assert any(c.startswith("--from=build") and c.endswith(" /usr/bin/pcrouter") for c in copies), copies


# ------------------------------------------------------------------------------------------
# Kubernetes: schema

def manifests():
    """[(file, object)] for every YAML document under conf/k8s (optional/ included)."""
    files = sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True))
    assert files, K8S
    out = []
    for path in files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    out.append((os.path.relpath(path, ROOT), doc))
    return out


def model_errors(value, typ, path):
    """Where `value` does not fit the Kubernetes model type `typ` (python3-kubernetes)."""
    import kubernetes.client as k8s
    errs = []
    if typ == "object":
        return errs  # IntOrString and free-form fields
    if typ in ("str", "datetime", "date"):
        return [] if isinstance(value, str) else ["%s: expected a string, got %r" % (path, value)]
    if typ == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else ["%s: expected an integer, got %r" % (path, value)]
    if typ == "bool":
        return [] if isinstance(value, bool) else ["%s: expected true/false, got %r" % (path, value)]
    m = re.fullmatch(r"list\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            return ["%s: expected a list" % path]
        for i, v in enumerate(value):
            errs += model_errors(v, m.group(1), "%s[%d]" % (path, i))
        return errs
    m = re.fullmatch(r"dict\(str, (.+)\)", typ)
    if m:
        if not isinstance(value, dict):
            return ["%s: expected a map" % path]
        for k, v in value.items():
            errs += model_errors(v, m.group(1), "%s.%s" % (path, k))
        return errs
    klass = getattr(k8s, typ, None)
    assert klass is not None, "no Kubernetes model %s" % typ
    if not isinstance(value, dict):
        return ["%s: expected an object (%s)" % (path, typ)]
    by_json = {j: a for a, j in klass.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is None:
            errs.append("%s: unknown field %r in %s" % (path, key, typ))
            continue
        kwargs[attr] = v
        errs += model_errors(v, klass.openapi_types[attr], "%s.%s" % (path, key))
    try:  # the models' setters refuse a missing required field
        klass(**kwargs)
    except ValueError as e:
        errs.append("%s: %s" % (path, e))
    return errs


KINDS = {("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "Deployment"),
         ("policy/v1", "PodDisruptionBudget")}


def test_k8s_manifests_fit_the_kubernetes_schema():
    errs = []
    for path, obj in manifests():
        api, kind = obj.get("apiVersion"), obj.get("kind")
        if (api, kind) not in KINDS:
            errs.append("%s: unexpected %s %s" % (path, api, kind))
            continue
        errs += model_errors(obj, "%s%s" % (api.split("/")[-1].capitalize(), kind),
                             "%s:%s/%s" % (path, kind, obj["metadata"].get("name")))
    assert not errs, "\n".join(errs)


def test_schema_check_catches_mistakes():
    """The check above is only worth something if it fails on a typo, a wrong type or a
    missing required field."""
    dep = copy.deepcopy(obj_of("Deployment", "pcrouter"))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["readinessProbe"]["httpGet"]["paht"] = "/health"
    c["ports"][0]["containerPort"] = "8080"
    del dep["spec"]["selector"]
    errs = "\n".join(model_errors(dep, "V1Deployment", "dep"))
    assert "unknown field 'paht'" in errs, errs
    assert "containerPort: expected an integer" in errs, errs
    assert "selector" in errs, errs


# ------------------------------------------------------------------------------------------
# Kubernetes: the fields that matter

def obj_of(kind, name):
    found = [o for _, o in manifests() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_port(container, port):
    """The containerPort a Service targetPort or probe port names (by name or number)."""
    for p in container.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    return None


def configmap_config(key="pcrouter.json"):
    return json.loads(obj_of("ConfigMap", "pcrouter-config")["data"][key])


def test_k8s_every_object_in_one_namespace_with_labels():
    names = set()
    for path, o in manifests():
        md = o["metadata"]
        assert md.get("namespace") == "llm", (path, md.get("namespace"))
        assert md.get("labels", {}).get("app.kubernetes.io/name"), path
        names.add((o["kind"], md["name"]))
    for want in (("ConfigMap", "pcrouter-config"), ("Deployment", "pcrouter"),
                 ("Service", "pcrouter"), ("PodDisruptionBudget", "pcrouter"),
                 ("Service", "vllm"), ("Deployment", "vllm"), ("Deployment", "redis"),
                 ("Service", "redis")):
        assert want in names, (want, sorted(names))


def test_k8s_router_deployment():
    dep = obj_of("Deployment", "pcrouter")
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert selects(spec["selector"]["matchLabels"], labels)
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (c,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/health", probe
        assert container_port(c, get["port"]) is not None, (probe, get["port"])
    # The grace period outlasts the preStop pause plus the drain read from the config.
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "sleep", pre
    drain_ms = configmap_config()["timeouts"]["drain_ms"]
    assert pod["terminationGracePeriodSeconds"] * 1000 > int(pre[1]) * 1000 + drain_ms, \
        (pod["terminationGracePeriodSeconds"], pre, drain_ms)
    for key in ("cpu", "memory"):
        assert key in c["resources"]["requests"], c["resources"]
    # Non-root, as the image's numeric user; read-only root; nothing to escalate to.
    with open(CONTAINERFILE) as f:
        image_uid = int(re.findall(r"^USER (\d+)", f.read(), re.M)[-1])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == image_uid != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, sc
    assert sc["capabilities"]["drop"] == ["ALL"], sc
    # The config is the ConfigMap's pcrouter.json, where the image reads it.
    assert c["args"] == ["-c", CONFIG_IN_IMAGE], c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vol = next(v for v in pod["volumes"] if v["name"] in mounts and "configMap" in v)
    m = mounts[vol["name"]]
    assert m.get("readOnly") is True and "subPath" not in m, m  # subPath never sees an update
    assert vol["configMap"]["name"] == "pcrouter-config"
    files = {m["mountPath"] + "/" + i["path"]: i["key"] for i in vol["configMap"]["items"]}
    assert files == {CONFIG_IN_IMAGE: "pcrouter.json"}, files
    # pcrouter listens on the port the container declares, on every interface.
    listen = configmap_config()["listen"][0]["address"]
    host, port = listen.rsplit(":", 1)
    assert host == "0.0.0.0" and container_port(c, int(port)) == int(port), listen


def test_k8s_services_and_pdb_select_their_pods():
    deps = {n: obj_of("Deployment", n) for n in ("pcrouter", "vllm", "redis")}
    for name, dep_name in (("pcrouter", "pcrouter"), ("vllm", "vllm"), ("redis", "redis")):
        svc = obj_of("Service", name)
        tmpl = deps[dep_name]["spec"]["template"]
        assert selects(svc["spec"]["selector"], tmpl["metadata"]["labels"]), name
        c = tmpl["spec"]["containers"][0]
        for p in svc["spec"]["ports"]:
            assert container_port(c, p["targetPort"]) is not None, (name, p)
    pdb = obj_of("PodDisruptionBudget", "pcrouter")
    router = deps["pcrouter"]["spec"]
    assert selects(pdb["spec"]["selector"]["matchLabels"], router["template"]["metadata"]["labels"])
    assert 0 < pdb["spec"]["minAvailable"] < router["replicas"], pdb["spec"]
    assert obj_of("Service", "vllm")["spec"]["clusterIP"] == "None"  # headless: DNS lists pods


def test_k8s_vllm_pool():
    dep = obj_of("Deployment", "vllm")
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    zones = [t for t in pod["topologySpreadConstraints"] if t["topologyKey"] == "topology.kubernetes.io/zone"]
    assert zones and selects(zones[0]["labelSelector"]["matchLabels"], labels), zones
    (c,) = pod["containers"]
    assert "--enable-prompt-tokens-details" in c["args"], c["args"]
    assert "--enable-prefix-caching" in c["args"], c["args"]
    with open(os.path.join(K8S, "vllm-deployment.yaml")) as f:
        assert re.search(r"^\s*#.*--kv-events-config", f.read(), re.M), "kv-events-config comment"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    assert "nvidia.com/gpu" in c["resources"]["limits"]


def test_k8s_configmap_configs_pass_check_config(tmp_path):
    for key in ("pcrouter.json", "pcrouter.redis.json"):
        path = tmp_path / key
        path.write_text(obj_of("ConfigMap", "pcrouter-config")["data"][key])
        p = subprocess.run([PCROUTER, "--check-config", str(path)], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, (key, p.stderr)


def test_k8s_config_finds_the_pool_and_answers_the_probes():
    """The running config follows the vLLM Service through DNS discovery; /health and /metrics
    are on its admin listener only, so the probes must look there; workers match the CPU the
    router requests (0 would start one per CPU of the node, each with a replica of the index)."""
    cfg = configmap_config()
    vllm = obj_of("Service", "vllm")
    (d,) = cfg["discovery"]
    assert d["dns"] == "%s.%s.svc.cluster.local" % (vllm["metadata"]["name"], vllm["metadata"]["namespace"])
    assert d["port"] in [p["port"] for p in vllm["spec"]["ports"]], d
    assert isinstance(d["interval_ms"], int) and d["interval_ms"] > 0, d
    assert "backends" not in cfg, "placeholder backends next to discovery"
    (c,) = obj_of("Deployment", "pcrouter")["spec"]["template"]["spec"]["containers"]
    host, port = cfg["admin"]["address"].rsplit(":", 1)
    assert host == "0.0.0.0", cfg["admin"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container_port(c, c[probe]["httpGet"]["port"]) == int(port), (probe, cfg["admin"])
    assert cfg["workers"] == int(c["resources"]["requests"]["cpu"]), (cfg["workers"], c["resources"])


def test_k8s_redis_config_is_the_same_config_with_redis():
    """The second config adds a redis section, pointing at optional/redis.yaml's Service, to
    the running one and says nothing else differently."""
    now, shared = configmap_config(), configmap_config("pcrouter.redis.json")
    assert {k: v for k, v in shared.items() if k != "redis"} == now
    redis = obj_of("Service", "redis")
    m = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", shared["redis"]["url"])
    assert m and m.group(1) == redis["metadata"]["name"], shared["redis"]
    assert int(m.group(2)) in [p["port"] for p in redis["spec"]["ports"]]
