/* test_cpus.c: the CPUs `workers: 0` may use (router/core/cpus.c), read from fake /proc and
 * cgroup trees made in a temporary folder: cgroup v2 and v1, quotas on an ancestor, a
 * namespaced view, no quota, and files that make no sense. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpus.h"
#include "pcr_test.h"

static char root[256];

/* Writes ROOT/PATH (making its folders), content from a format. */
static void put(const char *path, const char *fmt, ...)
{
    char full[1024];
    snprintf(full, sizeof(full), "%s/%s", root, path);
    for (char *p = full + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(full, 0755);
        *p = '/';
    }
    FILE *f = fopen(full, "w");
    if (f == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void fresh(void)
{
    char cmd[300];
    if (root[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            printf("# could not remove %s\n", root);
    }
    snprintf(root, sizeof(root), "/tmp/pcr_cpus_XXXXXX");
    if (mkdtemp(root) == NULL)
        root[0] = '\0';
}

#define V2_MOUNT "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
#define V1_MOUNT "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"

static void test_v2_quota_rounds_up(void)
{
    fresh();
    put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    put("proc/self/mountinfo", V2_MOUNT);
    put("sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "150000 100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 64);
    PCR_CHECK_EQ_INT(c.affinity, 64);
    PCR_CHECK(c.quota > 1.49 && c.quota < 1.51);
    PCR_CHECK_EQ_INT(c.count, 2);
    PCR_CHECK_EQ_INT(c.source, PCR_CPUS_CGROUP);
    PCR_CHECK(strstr(c.quota_path, "kubepods/pod1/ctr/cpu.max") != NULL);
}

static void test_v2_tightest_ancestor_wins(void)
{
    fresh();
    put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    put("proc/self/mountinfo", V2_MOUNT);
    put("sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
    put("sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000\n");
    put("sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 64);
    PCR_CHECK_EQ_INT(c.count, 3);
    PCR_CHECK(strstr(c.quota_path, "kubepods/pod1/cpu.max") != NULL);
}

static void test_v1_cfs_quota(void)
{
    fresh();
    put("proc/self/cgroup", "12:memory:/x\n4:cpu,cpuacct:/kubepods/pod2\n0::/\n");
    put("proc/self/mountinfo", V1_MOUNT);
    put("sys/fs/cgroup/cpu,cpuacct/kubepods/pod2/cpu.cfs_quota_us", "50000\n");
    put("sys/fs/cgroup/cpu,cpuacct/kubepods/pod2/cpu.cfs_period_us", "100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 8);
    PCR_CHECK(c.quota > 0.49 && c.quota < 0.51);
    PCR_CHECK_EQ_INT(c.count, 1); /* half a CPU still runs one worker */
    PCR_CHECK_EQ_INT(c.source, PCR_CPUS_CGROUP);
}

static void test_v1_no_quota_is_the_affinity(void)
{
    fresh();
    put("proc/self/cgroup", "4:cpu,cpuacct:/a\n");
    put("proc/self/mountinfo", V1_MOUNT);
    put("sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us", "100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 6);
    PCR_CHECK(c.quota == 0);
    PCR_CHECK_EQ_INT(c.count, 6);
    PCR_CHECK_EQ_INT(c.source, PCR_CPUS_AFFINITY);
}

/* A quota above the affinity mask does not raise the count. */
static void test_quota_above_affinity(void)
{
    fresh();
    put("proc/self/cgroup", "0::/\n");
    put("proc/self/mountinfo", V2_MOUNT);
    put("sys/fs/cgroup/cpu.max", "800000 100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 2);
    PCR_CHECK(c.quota > 7.9);
    PCR_CHECK_EQ_INT(c.count, 2);
    PCR_CHECK_EQ_INT(c.source, PCR_CPUS_AFFINITY);
}

/* In a cgroup namespace the mount's root is the process's own cgroup: /proc/self/cgroup shows
 * a path the mount does not start with, and the mount point itself is read. */
static void test_namespaced_mount_root(void)
{
    fresh();
    put("proc/self/cgroup", "0::/elsewhere\n");
    put("proc/self/mountinfo",
        "30 25 0:26 /kubepods/pod3 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/cpu.max", "200000 100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 16);
    PCR_CHECK_EQ_INT(c.count, 2);
}

/* A mount root that prefixes the cgroup path is cut from it. */
static void test_mount_root_prefix_cut(void)
{
    fresh();
    put("proc/self/cgroup", "0::/kubepods/pod4/ctr\n");
    put("proc/self/mountinfo",
        "30 25 0:26 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/pod4/ctr/cpu.max", "100000 100000\n");
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 16);
    PCR_CHECK_EQ_INT(c.count, 1);
}

static void test_nonsense_and_missing_files(void)
{
    fresh();
    pcr_cpus_t c;
    pcr_cpus_detect(&c, root, 4); /* nothing at all */
    PCR_CHECK_EQ_INT(c.count, 4);
    put("proc/self/cgroup", "garbage\n::\n0::relative\n0::/a\n");
    put("proc/self/mountinfo", "no separator here\n" V2_MOUNT);
    put("sys/fs/cgroup/a/cpu.max", "12abc 100000\n");
    pcr_cpus_detect(&c, root, 4);
    PCR_CHECK_EQ_INT(c.count, 4);
    PCR_CHECK(c.quota == 0);
    put("sys/fs/cgroup/a/cpu.max", "-5 100000\n");
    pcr_cpus_detect(&c, root, 4);
    PCR_CHECK_EQ_INT(c.count, 4);
    put("sys/fs/cgroup/a/cpu.max", "100000 0\n");
    pcr_cpus_detect(&c, root, 4);
    PCR_CHECK_EQ_INT(c.count, 4);
}

/* cgroup v2 memory.max, for limits.max_memory_bytes "auto": the tightest of the process's
 * cgroup and its ancestors; "max", garbage, missing files and no cgroup v2 mean none. */
static void test_memory_max(void)
{
    char which[512];
    fresh();
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 0); /* nothing */
    PCR_CHECK_STR(which, "");
    put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    put("proc/self/mountinfo", V2_MOUNT);
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 0); /* no files */
    put("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 0);
    put("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "536870912\n");
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 536870912);
    PCR_CHECK(strstr(which, "kubepods/pod1/ctr/memory.max") != NULL);
    put("sys/fs/cgroup/kubepods/pod1/memory.max", "268435456\n"); /* a tighter ancestor */
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 268435456);
    PCR_CHECK(strstr(which, "kubepods/pod1/memory.max") != NULL);
    /* Hostile or odd contents count as no limit, never as a number they start with. */
    static const char *const odd[] = {"", "garbage\n", "12abc\n", "-5\n", " 100\n",
                                      "99999999999999999999999999\n", "0x1000\n"};
    put("sys/fs/cgroup/kubepods/pod1/memory.max", "max\n");
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        put("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "%s", odd[i]);
        PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 0);
    }
    /* cgroup v1 only: no v2 line in /proc/self/cgroup. */
    fresh();
    put("proc/self/cgroup", "4:memory:/kubepods/pod1\n");
    put("proc/self/mountinfo", V1_MOUNT);
    PCR_CHECK_EQ_U64(pcr_cgroup_memory_max(root, which, sizeof(which)), 0);
}

/* The real system: whatever it says, at least one CPU and never more than the mask. */
static void test_real_system(void)
{
    pcr_cpus_t c;
    pcr_cpus_detect(&c, "", 0);
    PCR_CHECK(c.affinity >= 1);
    PCR_CHECK(c.count >= 1 && c.count <= c.affinity);
}

int main(void)
{
    PCR_RUN(test_v2_quota_rounds_up);
    PCR_RUN(test_v2_tightest_ancestor_wins);
    PCR_RUN(test_v1_cfs_quota);
    PCR_RUN(test_v1_no_quota_is_the_affinity);
    PCR_RUN(test_quota_above_affinity);
    PCR_RUN(test_namespaced_mount_root);
    PCR_RUN(test_mount_root_prefix_cut);
    PCR_RUN(test_nonsense_and_missing_files);
    PCR_RUN(test_memory_max);
    PCR_RUN(test_real_system);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (root[0] && system(cmd) != 0)
        printf("# could not remove %s\n", root);
    return pcr_test_done();
}
