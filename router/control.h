/* router/control.h: the control thread's ticks over the backends (control.c): their health
 * checks, the probes of ejected ones, the scrapes and model lists, and the collection of what
 * backends and reloads left behind. */
#ifndef PCR_ROUTER_CONTROL_H
#define PCR_ROUTER_CONTROL_H

#include "server.h"

/* Resolves and adds the config's backends, each with its checks started, then starts the
 * ticks (before the workers run). 0, or PCR_ERR_* (logged). */
int pcr_backends_init(pcr_server_t *srv);
/* Stops the ticks and frees every backend. */
void pcr_backends_dispose(pcr_server_t *srv);
/* A reload changed the intervals: the ticks and the health checks take them. */
void pcr_backends_retime(pcr_server_t *srv);

#endif
