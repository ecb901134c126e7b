/* router/core/memacct.c: the names and per-item costs of the memory account (memacct.h), the
 * parts counted as they change (read by the tick and afresh), and the overload actions as an
 * accept, a request's admission, a body's budget grant or an answer chunk sees them. */
#include "evmem.h"
#include "memacct.h"
#include "memcount.h"

#include "server.h"

const char *const pcr_mem_part_names[PCR_MEM__COUNT] = {
    "request_bodies", "responses", "index", "tokenize_cache", "requests", "connections",
    "buffers", "http2",
};

/* An h2 connection's cost is its hibernated one, without nghttp2's session, which the account
 * counts apart (PCR_MEM_HTTP2). HTTP/2 without TLS was not measured apart: HTTP/2 over TLS
 * less what TLS adds to HTTP/1.1. */
const uint64_t pcr_mem_conn_cost[PCR_CONN__COUNT] = {
    [PCR_CONN_H1] = 1102,
    [PCR_CONN_H1_TLS] = 16549,
    [PCR_CONN_H2] = 19390 - (16549 - 1102),
    [PCR_CONN_H2_TLS] = 19390,
};

uint64_t pcr_mem_fresh_parts(const pcr_server_t *srv, uint64_t parts[PCR_MEM__COUNT])
{
    parts[PCR_MEM_REQUEST_BODIES] = PCR_LOAD(srv->body_buffered);
    parts[PCR_MEM_RESPONSES] = PCR_LOAD(srv->resp_buffered);
    /* Bodies and kept responses are libevent chains too, counted by their bytes: the blocks
     * beyond them are what a busy connection holds that its cost leaves out. */
    uint64_t bytes = parts[PCR_MEM_REQUEST_BODIES] + parts[PCR_MEM_RESPONSES];
    uint64_t blocks = pcr_evmem_in_use();
    parts[PCR_MEM_BUFFERS] = blocks > bytes ? blocks - bytes : 0;
    parts[PCR_MEM_HTTP2] = pcr_memcount_sum(PCR_MEMCOUNT_NGHTTP2);
    return bytes + parts[PCR_MEM_BUFFERS] + parts[PCR_MEM_HTTP2];
}

uint64_t pcr_mem_accounted_now(const pcr_server_t *srv)
{
    return PCR_LOAD(srv->mem_slow) + PCR_LOAD(srv->body_buffered) + PCR_LOAD(srv->resp_buffered);
}

uint64_t pcr_mem_accounted_fresh(const pcr_server_t *srv)
{
    uint64_t parts[PCR_MEM__COUNT];
    return PCR_LOAD(srv->mem_static) + pcr_mem_fresh_parts(srv, parts);
}

/* The limit is read first: with none in force (the default without a cgroup limit) nothing
 * else is, a fresh sum over the threads' counters included. */
static unsigned actions(const pcr_server_t *srv, int fresh)
{
    uint64_t limit = PCR_LOAD(srv->mem_limit);
    if (limit == 0)
        return 0;
    uint64_t accounted = fresh ? pcr_mem_accounted_fresh(srv) : pcr_mem_accounted_now(srv);
    return pcr_overload_decide(accounted, limit, PCR_LOAD(srv->overload));
}

unsigned pcr_mem_actions_now(const pcr_server_t *srv) { return actions(srv, 0); }

unsigned pcr_mem_actions_fresh(const pcr_server_t *srv) { return actions(srv, 1); }
