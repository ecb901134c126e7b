/* router/memguard.c: owns the memory account's tick (memguard.h). The parts are counts other
 * code keeps with relaxed atomics: the bytes of request bodies and kept responses, each
 * worker's index replica and tokenize cache, its requests in flight and its connections by
 * protocol (each times its cost, core/memacct.c), libevent's blocks in use beyond the
 * bodies' and responses' bytes (core/evmem.c), and nghttp2's sessions (core/memcount.h). The
 * workers apply the actions: the body budget stops granting (budget.c), new requests and
 * streams get 503 (exchange.c), the listeners pause (conn.c, from each worker's tick and its
 * next accept). */
#include <inttypes.h>

#include "cpus.h"
#include "log.h"
#include "memguard.h"

/* The limit for the config in force: an explicit number, or "auto"'s share of the cgroup's
 * memory.max (read now: at start and at each reload, never on a hot path). */
static uint64_t resolve_limit(const pcr_config_t *cfg)
{
    size_t want = cfg->limits.max_memory_bytes;
    if (want != PCR_MEMORY_AUTO) {
        if (want != 0)
            pcr_log_info("memory: limits.max_memory_bytes %zu bytes", want);
        return want;
    }
    char which[512];
    uint64_t cg = pcr_cgroup_memory_max("", which, sizeof(which));
    if (cg == 0) {
        pcr_log_info("memory: limits.max_memory_bytes \"auto\" and no cgroup memory.max: off");
        return 0;
    }
    uint64_t limit = (uint64_t)((double)cg * PCR_MEMORY_AUTO_SHARE);
    pcr_log_info("memory: limits.max_memory_bytes \"auto\": %" PRIu64 " bytes, %.0f%% of %s (%"
                 PRIu64 ")", limit, PCR_MEMORY_AUTO_SHARE * 100, which, cg);
    return limit;
}

/* Fills every part; returns the sum of those counted as they change (pcr_mem_fresh_parts). */
static uint64_t account(const pcr_server_t *srv, uint64_t parts[PCR_MEM__COUNT])
{
    for (int i = 0; i < PCR_MEM__COUNT; i++)
        parts[i] = 0;
    parts[PCR_MEM_TOKENIZE_CACHE] = PCR_LOAD(srv->tokcache_bytes);
    for (unsigned k = 0; k < srv->nworkers; k++) {
        const pcr_worker_t *w = &srv->workers[k];
        parts[PCR_MEM_INDEX] += PCR_LOAD(w->metrics.index_bytes);
        parts[PCR_MEM_REQUESTS] += PCR_LOAD(w->nexchanges) * PCR_MEM_REQUEST_COST +
                                   PCR_LOAD(w->nreaders) * PCR_MEM_READER_COST;
        for (int c = 0; c < PCR_CONN__COUNT; c++)
            parts[PCR_MEM_CONNECTIONS] += PCR_LOAD(w->nconns[c]) * pcr_mem_conn_cost[c];
    }
    return pcr_mem_fresh_parts(srv, parts);
}

void pcr_memguard_tick(pcr_server_t *srv)
{
    if (srv->mem_cfg != srv->cfg) {
        srv->mem_cfg = srv->cfg;
        PCR_STORE(srv->mem_limit, resolve_limit(srv->cfg));
    }
    uint64_t parts[PCR_MEM__COUNT], total = 0;
    uint64_t fresh = account(srv, parts);
    for (int i = 0; i < PCR_MEM__COUNT; i++) {
        PCR_STORE(srv->mem_parts[i], parts[i]);
        total += parts[i];
    }
    /* What the actions read afresh (memacct.c) is left out of the slow parts. */
    PCR_STORE(srv->mem_slow, total - parts[PCR_MEM_REQUEST_BODIES] - parts[PCR_MEM_RESPONSES]);
    PCR_STORE(srv->mem_static, total - fresh);
    uint64_t limit = PCR_LOAD(srv->mem_limit);
    unsigned was = PCR_LOAD(srv->overload);
    unsigned now = pcr_overload_decide(total, limit, was);
    if (now == was)
        return;
    PCR_STORE(srv->overload, now);
    for (int a = 0; a < PCR_OVERLOAD__COUNT; a++) {
        unsigned bit = PCR_OVERLOAD_BIT(a);
        if ((now & bit) == (was & bit))
            continue;
        const char *name = pcr_overload_action_name((pcr_overload_action_t)a);
        if (now & bit)
            pcr_log_warn("memory: %" PRIu64 " of %" PRIu64 " bytes accounted (limits."
                         "max_memory_bytes): %s on", total, limit, name);
        else
            pcr_log_info("memory: %" PRIu64 " of %" PRIu64 " bytes accounted: %s off", total,
                         limit, name);
    }
}
