/* router/core/memacct.c: the names and per-item costs of the memory account (memacct.h), and
 * the overload actions as a request's admission or a body's budget grant sees them. */
#include "memacct.h"

#include "server.h"

const char *const pcr_mem_part_names[PCR_MEM__COUNT] = {
    "request_bodies", "responses", "index", "tokenize_cache", "requests", "connections",
    "buffers",
};

/* HTTP/2 without TLS was not measured apart: HTTP/2 over TLS less what TLS adds to HTTP/1.1. */
const uint64_t pcr_mem_conn_cost[PCR_CONN__COUNT] = {
    [PCR_CONN_H1] = 1102,
    [PCR_CONN_H1_TLS] = 16549,
    [PCR_CONN_H2] = 28847 - (16549 - 1102),
    [PCR_CONN_H2_TLS] = 28847,
};

uint64_t pcr_mem_accounted_now(const pcr_server_t *srv)
{
    return PCR_LOAD(srv->mem_slow) + PCR_LOAD(srv->body_buffered) + PCR_LOAD(srv->resp_buffered);
}

unsigned pcr_mem_actions_now(const pcr_server_t *srv)
{
    uint64_t limit = PCR_LOAD(srv->mem_limit);
    if (limit == 0)
        return 0;
    return pcr_overload_decide(pcr_mem_accounted_now(srv), limit, PCR_LOAD(srv->overload));
}
