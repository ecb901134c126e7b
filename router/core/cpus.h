/* router/core/cpus.h: how many CPUs this process may use, for `workers: 0`.
 *
 * Two limits apply, and the smaller one wins:
 *   - the affinity mask (sched_getaffinity): the CPUs the kernel lets the process run on;
 *   - the cgroup CPU quota: cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD"), cgroup v1
 *     `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none). A Kubernetes CPU limit is such a
 *     quota, and the affinity mask inside the pod still shows every core of the node.
 * The quota is read on the process's own cgroup and each of its ancestors up to the mount's
 * root (the tightest one wins), from the paths /proc/self/cgroup and /proc/self/mountinfo give.
 * A fractional quota is rounded up: 1.5 CPUs run 2 workers. */
#ifndef PCR_ROUTER_CPUS_H
#define PCR_ROUTER_CPUS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PCR_CPUS_AFFINITY = 0,  /* the affinity mask was the limit (or no quota was set) */
    PCR_CPUS_CGROUP,        /* the cgroup quota was smaller */
} pcr_cpus_source_t;

typedef struct {
    unsigned affinity;         /* CPUs in the affinity mask (at least 1) */
    double quota;              /* the cgroup quota in CPUs; 0 when there is none */
    unsigned count;            /* min(affinity, ceil(quota)), at least 1 */
    pcr_cpus_source_t source;
    char quota_path[512];      /* the cgroup file the quota came from ("" without one) */
} pcr_cpus_t;

/* Fills `out`. `root` prefixes every path read ("" for the real system; a test passes a folder
 * holding proc/self/cgroup, proc/self/mountinfo and the cgroup files). `affinity` is the
 * affinity mask's CPU count, or 0 to ask the kernel. Never fails: what cannot be read is
 * treated as no limit. */
void pcr_cpus_detect(pcr_cpus_t *out, const char *root, unsigned affinity);

/* The tightest cgroup v2 memory.max (bytes) on the process's cgroup and its ancestors, found as
 * the CPU quota is (same `root`), or 0 where none is set: no cgroup v2, "max", a file missing
 * or holding anything but a number. `which` gets the file it came from ("" without one). Reads
 * a few small files: for the start and reloads, not for an event loop's hot path. */
uint64_t pcr_cgroup_memory_max(const char *root, char *which, size_t wlen);

/* "affinity" or "cgroup_quota". */
const char *pcr_cpus_source_name(pcr_cpus_source_t s);

#endif
