/* router/core/cpus.c: the CPUs `workers: 0` may use, from the affinity mask and the cgroup
 * quota (once at start, before any thread), and the cgroup's memory limit for
 * limits.max_memory_bytes "auto" (at start and at each reload, on the control thread). Both
 * read files plainly (see cpus.h). */
#include "cpus.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_BYTES 4096

/* Reads the first line of ROOT/PATH into buf; 0 or -1. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    char *got = fgets(buf, (int)len, f);
    fclose(f);
    if (got == NULL)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* The quota in CPUs set in cgroup folder `dir` (v2: cpu.max; v1: cpu.cfs_quota_us over
 * cpu.cfs_period_us), or 0 when it sets none. */
static double dir_quota(const char *dir, int v2, char *which, size_t wlen)
{
    char path[2300], line[128];
    long long quota = -1, period = 0;
    if (v2) {
        snprintf(path, sizeof(path), "%s/cpu.max", dir);
        char q[32];
        if (read_line(path, line, sizeof(line)) != 0 || sscanf(line, "%31s %lld", q, &period) != 2 ||
            strcmp(q, "max") == 0)
            return 0;
        char *end;
        quota = strtoll(q, &end, 10);
        if (*end != '\0')
            return 0;
    } else {
        char ppath[2300];
        snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
        snprintf(ppath, sizeof(ppath), "%s/cpu.cfs_period_us", dir);
        if (read_line(path, line, sizeof(line)) != 0 || sscanf(line, "%lld", &quota) != 1)
            return 0;
        if (read_line(ppath, line, sizeof(line)) != 0 || sscanf(line, "%lld", &period) != 1)
            return 0;
    }
    if (quota <= 0 || period <= 0)
        return 0;
    snprintf(which, wlen, "%s", path);
    return (double)quota / (double)period;
}

/* Undoes mountinfo's octal escapes (\040 is a space) in place. */
static void unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* Whether the comma-separated `list` holds `word`. */
static int has_word(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && memcmp(p, word, n) == 0)
            return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

/* Finds the mount of the hierarchy (v2, or v1's cpu controller): its mount point and root. */
static int find_mount(const char *root, int v2, char *mnt, size_t mlen, char *mroot, size_t rlen)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/proc/self/mountinfo", root);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    char line[LINE_MAX_BYTES];
    int found = -1;
    while (found < 0 && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        /* id parent maj:min root mountpoint options [optional...] - fstype source superopts */
        char *sep = strstr(line, " - ");
        if (sep == NULL)
            continue;
        *sep = '\0';
        char fstype[32], source[256], super[512] = "";
        if (sscanf(sep + 3, "%31s %255s %511s", fstype, source, super) < 2)
            continue;
        if (v2 ? strcmp(fstype, "cgroup2") != 0
               : (strcmp(fstype, "cgroup") != 0 || !has_word(super, "cpu")))
            continue;
        char r[1024], m[1024];
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", r, m) != 2)
            continue;
        unescape(r);
        unescape(m);
        snprintf(mnt, mlen, "%s%s", root, m);
        snprintf(mroot, rlen, "%s", r);
        found = 0;
    }
    fclose(f);
    return found;
}

/* One cgroup folder's limit (> 0), or 0 when it sets none; `w` gets the file it came from. */
typedef double (*dir_limit_fn)(const char *dir, int v2, char *w, size_t wlen);

/* The tightest limit `read` finds on the cgroup `cgpath` of one hierarchy and its ancestors. */
static double hierarchy_min(const char *root, int v2, const char *cgpath, dir_limit_fn read,
                            char *which, size_t wlen)
{
    char mnt[1024], mroot[1024];
    if (find_mount(root, v2, mnt, sizeof(mnt), mroot, sizeof(mroot)) != 0)
        return 0;
    /* The cgroup path is relative to the hierarchy's root; the mount shows it from mroot on. */
    char rel[1024];
    size_t rl = strlen(mroot);
    if (strcmp(mroot, "/") == 0)
        snprintf(rel, sizeof(rel), "%s", cgpath);
    else if (strncmp(cgpath, mroot, rl) == 0 && (cgpath[rl] == '/' || cgpath[rl] == '\0'))
        snprintf(rel, sizeof(rel), "%s", cgpath + rl);
    else
        rel[0] = '\0'; /* a namespaced view: the mount is the process's own cgroup */
    double best = 0;
    for (;;) {
        char dir[2200], w[2300] = "";
        int n = snprintf(dir, sizeof(dir), "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
        double q = n > 0 && (size_t)n < sizeof(dir) ? read(dir, v2, w, sizeof(w)) : 0;
        if (q > 0 && (best == 0 || q < best)) {
            best = q;
            snprintf(which, wlen, "%s", w);
        }
        char *slash = strrchr(rel, '/');
        if (slash == NULL || rel[0] == '\0')
            break;
        *slash = '\0';
    }
    return best;
}

void pcr_cpus_detect(pcr_cpus_t *out, const char *root, unsigned affinity)
{
    memset(out, 0, sizeof(*out));
    if (affinity == 0) {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
            affinity = (unsigned)CPU_COUNT(&set);
        else {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            affinity = n > 0 ? (unsigned)n : 1;
        }
    }
    out->affinity = affinity;

    char path[512], line[LINE_MAX_BYTES];
    snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        /* ID:CONTROLLERS:PATH; v2 is "0::PATH", v1's cpu controller lists "cpu". */
        while (fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\n")] = '\0';
            char *c1 = strchr(line, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2 == NULL || c2[1] != '/')
                continue;
            *c1 = '\0';
            *c2 = '\0';
            int v2 = strcmp(line, "0") == 0 && c1[1] == '\0';
            if (!v2 && !has_word(c1 + 1, "cpu"))
                continue;
            char which[512] = "";
            double q = hierarchy_min(root, v2, c2 + 1, dir_quota, which, sizeof(which));
            if (q > 0 && (out->quota == 0 || q < out->quota)) {
                out->quota = q;
                snprintf(out->quota_path, sizeof(out->quota_path), "%s", which);
            }
        }
        fclose(f);
    }
    out->count = affinity;
    out->source = PCR_CPUS_AFFINITY;
    if (out->quota > 0) {
        double up = ceil(out->quota - 1e-9);
        unsigned q = up < 1 ? 1 : (unsigned)up;
        if (q < out->count) {
            out->count = q;
            out->source = PCR_CPUS_CGROUP;
        }
    }
}

/* The memory.max in cgroup v2 folder `dir`, or 0 when it sets none ("max") or cannot be read
 * as a plain number of bytes. */
static double dir_memory_max(const char *dir, int v2, char *w, size_t wlen)
{
    char line[128];
    snprintf(w, wlen, "%s/memory.max", dir);
    if (read_line(w, line, sizeof(line)) != 0 || line[0] < '0' || line[0] > '9')
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    return (double)v;
}

uint64_t pcr_cgroup_memory_max(const char *root, char *which, size_t wlen)
{
    if (wlen > 0)
        which[0] = '\0';
    char path[512], line[LINE_MAX_BYTES], cg[LINE_MAX_BYTES] = "";
    snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    while (cg[0] == '\0' && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "0::/", 4) == 0)
            snprintf(cg, sizeof(cg), "%s", line + 3);
    }
    fclose(f);
    if (cg[0] == '\0')
        return 0;
    return (uint64_t)hierarchy_min(root, 1, cg, dir_memory_max, which, wlen);
}

const char *pcr_cpus_source_name(pcr_cpus_source_t s)
{
    return s == PCR_CPUS_CGROUP ? "cgroup_quota" : "affinity";
}
