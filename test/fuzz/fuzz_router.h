/* test/fuzz/fuzz_router.h: the router under test, as the fuzz targets that drive it over a
 * socket run it (fuzz_h1_request.c, fuzz_h2_request.c): a server from config text, its
 * backends, one worker built as pcrouter builds it (pcr_worker_init: event base, policy
 * replica, tick, pools) and never started as a thread (the target runs its loop, fuzz_run),
 * and one client connection, a socketpair whose router end is a plain socket. */
#ifndef PCR_FUZZ_ROUTER_H
#define PCR_FUZZ_ROUTER_H

#include "config.h"
#include "server.h"
#include "sock.h"
#include "worker.h"

typedef struct {
    pcr_config_t *cfg;
    pcr_server_t srv;
    pcr_worker_t w;
    pcr_listen_plan_t plan;
} fuzz_router_t;

/* Parses `config` (JSON text) and builds the server; returns the router's end of the client
 * connection, for the target to start its session on, and the client's in *client_fd. */
pcr_sock_t *fuzz_router_start(fuzz_router_t *r, const char *config, int *client_fd);
void fuzz_router_stop(fuzz_router_t *r);
/* Every count the state machine keeps is back to zero once nothing is left: sessions,
 * requests in flight, body bytes against the budget, the backends' loads and connections,
 * the pools. */
void fuzz_router_check_accounting(fuzz_router_t *r);

#endif
