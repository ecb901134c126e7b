/* router/core/memacct.h: the memory pcrouter accounts for, against limits.max_memory_bytes, and
 * the overload actions it sets off (pcr/overload.h decides them; router/memguard.c adds the
 * account up on the control thread's tick; the sessions, the body budget and the listeners
 * apply them).
 *
 * The account is made of parts the code already counts, each with relaxed atomics: request
 * bodies held and responses kept for slow clients (bytes, exact), the prefix index (bytes, the
 * library's own count, every worker's replica), the tokenize cache (bytes), requests in flight
 * and client connections (a count times a cost per item, below), libevent's blocks in use
 * beyond the bodies' and responses' bytes (what busy connections hold: counted by the
 * allocator libevent is given, core/evmem.c), and nghttp2's sessions (counted by the
 * allocator nghttp2 is given, http/h2_server.c). What it does not see (the allocator's own
 * overhead and fragmentation, libevent's and OpenSSL's internals beyond the per-connection
 * costs, thread stacks, the binary) is the fixed overhead over the
 * bound that docs/ARCHITECTURE.md describes. */
#ifndef PCR_ROUTER_MEMACCT_H
#define PCR_ROUTER_MEMACCT_H

#include <stdint.h>

#include "pcr/overload.h"

typedef enum {
    PCR_MEM_REQUEST_BODIES = 0,  /* request body bytes held (body_buffered) */
    PCR_MEM_RESPONSES,           /* response bytes kept for slow clients (resp_buffered) */
    PCR_MEM_INDEX,               /* the prefix index, all worker replicas */
    PCR_MEM_TOKENIZE_CACHE,      /* precise mode's cache of token chains, all workers */
    PCR_MEM_REQUESTS,            /* requests alive (receiving, waiting, answered) x their cost */
    PCR_MEM_CONNECTIONS,         /* client connections x their cost by protocol */
    PCR_MEM_BUFFERS,             /* libevent's blocks in use (evmem.h: reads waiting in a
                                  * connection's input, bodies' and answers' chains rounded
                                  * to their blocks), less the two byte counts above */
    PCR_MEM_HTTP2,               /* nghttp2's sessions: every block it holds (memcount.h) */
    PCR_MEM__COUNT
} pcr_mem_part_t;

extern const char *const pcr_mem_part_names[PCR_MEM__COUNT];

/* A client connection's protocol, for its cost in the account. A handshake counts as HTTP/1.1
 * over its transport until the protocol is known. */
typedef enum {
    PCR_CONN_H1 = 0,
    PCR_CONN_H1_TLS,
    PCR_CONN_H2,
    PCR_CONN_H2_TLS,
    PCR_CONN__COUNT
} pcr_conn_kind_t;

/* What one item costs in the account, in bytes: an idle connection's memory and a waiting
 * request's, as measured (docs/BENCHMARKS.md; docs/ARCHITECTURE.md names the runs). */
extern const uint64_t pcr_mem_conn_cost[PCR_CONN__COUNT];
#define PCR_MEM_REQUEST_COST 4365u
/* And a request's body reader (router/body/body.h), from its first body byte until the body is
 * read (or the request ends), which the request's cost leaves out: malloc's bytes in use for
 * one and its blocks from router/core/evmem.c (PCR_MEMCOUNT_READERS, which the buffers part
 * leaves out), at the default routing sizes (test_body.c measures it). */
#define PCR_MEM_READER_COST 41360u

#endif
