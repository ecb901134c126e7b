/* test/fuzz/fuzz_router.h: the router under test, as the fuzz targets that drive it over a
 * socket run it (fuzz_h1_request.c, fuzz_h2_request.c): a server from config text, its
 * backends, one worker built as pcrouter builds it (pcr_worker_init: event base, policy
 * replica, tick, pools) and never started as a thread (the target runs its loop, fuzz_run),
 * and a client connection per input, a socketpair whose router end is a plain socket.
 *
 * The server is kept. A target has a few config variants; the server of each is built the
 * first time an input asks for it, serves every later input that asks for the same variant,
 * and is freed at exit (so LeakSanitizer sees everything freed). Building one costs far more
 * than an input (the config loader, the backends, the policy replica, the event base), and
 * a kept server checks more: each input must leave it as it found it, every count back at
 * zero (fuzz_router_check_accounting), or the next input's check fails. What an input leaves
 * on purpose is history the next must not inherit, put back by fuzz_router_reset: the
 * backends' outlier state (a pod's errors in one input would count towards ejecting it in the
 * next, and an ejection, which only the control thread ends, would outlive its input). The
 * policy's index and the metrics carry over; the targets' checks do not read them. */
#ifndef PCR_FUZZ_ROUTER_H
#define PCR_FUZZ_ROUTER_H

#include "config.h"
#include "fuzz_pod.h"
#include "server.h"
#include "sock.h"
#include "worker.h"

#define FUZZ_ROUTER_VARIANTS 8

typedef struct {
    pcr_config_t *cfg;
    pcr_server_t srv;
    pcr_worker_t w;
    pcr_listen_plan_t plan;
} fuzz_router_t;

/* The server of config variant `variant` (< FUZZ_ROUTER_VARIANTS): built from `config` (JSON
 * text) on the first call for it, the same one after; call with the virtual clock running
 * (fuzz_net.h). Every variant's config must stay the same text for the whole process. */
fuzz_router_t *fuzz_router_get(unsigned variant, const char *config);
/* Puts back what an input may leave besides counts (see above); at the start of an input. */
void fuzz_router_reset(fuzz_router_t *r);
/* A new client connection: the router's end, for the target to start its session on, and the
 * client's in *client_fd. */
pcr_sock_t *fuzz_router_connect(fuzz_router_t *r, int *client_fd);
/* The end of an input: the pod closes its connections, `run(arg)` (the target's turns until
 * quiet) lets the router's idle ones notice, then every count is checked
 * (fuzz_router_check_accounting). */
void fuzz_router_end_input(fuzz_router_t *r, fuzz_pods_t *pods, void (*run)(void *), void *arg);
/* Every count the state machine keeps is back to zero once nothing is left: sessions,
 * requests in flight, body bytes against the budget, the backends' loads and connections,
 * the pools. */
void fuzz_router_check_accounting(fuzz_router_t *r);

#endif
