"""`workers: 0`: one worker per CPU the process may use, the smaller of its affinity mask and
its cgroup's CPU quota (a Kubernetes CPU limit). The tests start pcrouter inside a cgroup they
create, with a quota, and read the chosen count and its reason from the log and /metrics."""
import os
import re
import uuid

import pytest

from conftest import get_metrics, make_config


def _cpu_mount():
    """(path, version) of a cgroup hierarchy with the cpu controller this test may write, or None."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ") for line in f if " - " in line]
    for head, tail in mounts:
        fstype, _src, opts = (tail.split() + ["", ""])[:3]
        point = head.split()[4]
        if fstype == "cgroup" and "cpu" in opts.split(","):
            return point, 1
    for head, tail in mounts:
        point = head.split()[4]
        if tail.split()[0] == "cgroup2":
            try:
                with open(os.path.join(point, "cgroup.controllers")) as f:
                    if "cpu" in f.read().split():
                        return point, 2
            except OSError:
                pass
    return None


@pytest.fixture
def cpu_cgroup():
    """Makes a child cgroup; yields set_quota(cpus) -> preexec function that moves the child."""
    found = _cpu_mount()
    if found is None:
        pytest.skip("no cgroup hierarchy with the cpu controller")
    point, version = found
    path = os.path.join(point, "pcrouter-test-" + uuid.uuid4().hex[:8])
    try:
        os.mkdir(path)
        if version == 2:
            with open(os.path.join(point, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
    except OSError as e:
        pytest.skip("cannot create a cgroup here: %s" % e)

    def set_quota(cpus):
        period = 100000
        if version == 1:
            with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                f.write(str(period))
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(int(cpus * period)) if cpus else "-1")
        else:
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write("%s %d" % (int(cpus * period) if cpus else "max", period))
        procs = os.path.join(path, "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return enter

    yield set_quota
    try:
        os.rmdir(path)
    except OSError:
        pass


def _workers(router):
    text = get_metrics(router)
    m = re.search(r'^pcrouter_workers\{source="([a-z_]+)"\} (\d+)$', text, re.M)
    q = re.search(r"^pcrouter_cpu_quota ([0-9.]+)$", text, re.M)
    a = re.search(r"^pcrouter_cpu_affinity (\d+)$", text, re.M)
    assert m and q and a, text
    return m.group(1), int(m.group(2)), float(q.group(1)), int(a.group(1))


def test_workers_follow_the_cgroup_quota(cpu_cgroup, stub_factory, router_factory):
    ncpu = len(os.sched_getaffinity(0))
    if ncpu < 2:
        pytest.skip("one CPU: a quota cannot be smaller than the affinity mask")
    stub = stub_factory("p0")
    r = router_factory(make_config([stub], workers=0), preexec_fn=cpu_cgroup(0.5))
    source, n, quota, affinity = _workers(r)
    assert (source, n) == ("cgroup_quota", 1)
    assert abs(quota - 0.5) < 0.01 and affinity == ncpu
    assert re.search(r"workers: 1, the cgroup CPU quota \(0\.50 CPUs", r.stderr_text())


def test_a_fractional_quota_rounds_up(cpu_cgroup, stub_factory, router_factory):
    ncpu = len(os.sched_getaffinity(0))
    if ncpu < 3:
        # 1.5 CPUs round up to 2: with 2 CPUs that is the affinity mask; the count still shows it.
        stub = stub_factory("p0")
        r = router_factory(make_config([stub], workers=0), preexec_fn=cpu_cgroup(1.5))
        source, n, quota, _ = _workers(r)
        assert n == min(2, ncpu) and abs(quota - 1.5) < 0.01
        return
    stub = stub_factory("p0")
    r = router_factory(make_config([stub], workers=0), preexec_fn=cpu_cgroup(1.5))
    assert _workers(r)[:2] == ("cgroup_quota", 2)


def test_no_quota_uses_the_affinity_mask(cpu_cgroup, stub_factory, router_factory):
    enter = cpu_cgroup(None)

    def pinned():
        enter()
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    stub = stub_factory("p0")
    r = router_factory(make_config([stub], workers=0), preexec_fn=pinned)
    source, n, quota, affinity = _workers(r)
    assert (source, n, quota, affinity) == ("affinity", 1, 0.0, 1)


def test_a_configured_count_wins(cpu_cgroup, stub_factory, router_factory):
    stub = stub_factory("p0")
    r = router_factory(make_config([stub], workers=3), preexec_fn=cpu_cgroup(0.5))
    source, n, quota, _ = _workers(r)
    assert (source, n) == ("config", 3) and abs(quota - 0.5) < 0.01
