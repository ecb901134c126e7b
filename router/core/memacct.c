/* router/core/memacct.c: the names and per-item costs of the memory account (memacct.h), and
 * the overload actions as a request's admission or a body's budget grant sees them. */
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

uint64_t pcr_mem_accounted_now(const pcr_server_t *srv)
{
    return PCR_LOAD(srv->mem_slow) + PCR_LOAD(srv->body_buffered) + PCR_LOAD(srv->resp_buffered);
}

/* libevent's blocks hold the bodies and responses: `buffers` is what they hold beyond them. */
uint64_t pcr_mem_accounted_fresh(const pcr_server_t *srv)
{
    uint64_t bytes = PCR_LOAD(srv->body_buffered) + PCR_LOAD(srv->resp_buffered);
    uint64_t blocks = pcr_evmem_in_use();
    return PCR_LOAD(srv->mem_static) + (blocks > bytes ? blocks : bytes) +
           pcr_memcount_sum(PCR_MEMCOUNT_NGHTTP2);
}

unsigned pcr_mem_actions_now(const pcr_server_t *srv)
{
    uint64_t limit = PCR_LOAD(srv->mem_limit);
    if (limit == 0)
        return 0;
    return pcr_overload_decide(pcr_mem_accounted_now(srv), limit, PCR_LOAD(srv->overload));
}

unsigned pcr_mem_actions_fresh(const pcr_server_t *srv)
{
    uint64_t limit = PCR_LOAD(srv->mem_limit);
    if (limit == 0)
        return 0;
    return pcr_overload_decide(pcr_mem_accounted_fresh(srv), limit, PCR_LOAD(srv->overload));
}
