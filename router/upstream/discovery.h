/* router/discovery.h: DNS discovery (config discovery[]), on the control thread: each entry's
 * name is resolved every interval_ms, and the backends follow the answer: one per address,
 * named "ADDRESS:PORT" (its ring position stays put as long as the pod's address does), added
 * when it appears, removed (drained) when it is gone. A lookup that fails for a reason other
 * than "no such name" changes nothing: a DNS hiccup does not empty the pool. */
#ifndef PCR_ROUTER_DISCOVERY_H
#define PCR_ROUTER_DISCOVERY_H

#include "server.h"

void pcr_discovery_start(pcr_server_t *srv);
void pcr_discovery_stop(pcr_server_t *srv);     /* lookups end; the backends stay */
/* After a reload: entries that left take their backends with them; the others start again. */
void pcr_discovery_reload(pcr_server_t *srv);

#endif
