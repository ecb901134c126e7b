/* router/precise.h: precise mode's subscriber, run by the control thread: started when
 * routing.index is "events", told the pods to follow whenever a backend joins or leaves or a
 * reload changes their endpoints, left without pods when the mode is left. What the pods say goes to
 * every worker's policy replica over the bus (bus.h: pcr_bus_kv_*). */
#ifndef PCR_ROUTER_PRECISE_H
#define PCR_ROUTER_PRECISE_H

#include "server.h"

/* Starts or stops the subscriber as srv->cfg says, and gives it the backends' endpoints now.
 * 0, or a negative PCR_ERR_* (logged) when the subscriber could not start. Control thread. */
int pcr_precise_apply(pcr_server_t *srv);
/* The backends changed (one joined or left): the subscriber follows the new set. */
void pcr_precise_refresh(pcr_server_t *srv);
/* Stops the subscriber (shutdown, once the workers have stopped). */
void pcr_precise_stop(pcr_server_t *srv);

#endif
