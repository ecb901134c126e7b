/* router/http/tenants.h: what the process and its workers do for tenancy (tenancy.c): give
 * the tenants of a config their slots, and free a worker's flow queue. The request's side is
 * in exchange_int.h (pcr_tenancy_identify, pcr_tenancy_admit). */
#ifndef PCR_ROUTER_TENANCY_H
#define PCR_ROUTER_TENANCY_H

#include "server.h"

/* Control thread, before `cfg` is in force (start, reload): each tenant's slot in
 * srv->tenants, kept by name across reloads; makes the session table at the first call. */
void pcr_tenancy_assign(pcr_server_t *srv, pcr_config_t *cfg);

/* The worker's thread, once its sessions are closed. */
void pcr_tenancy_worker_free(pcr_worker_t *w);

#endif
