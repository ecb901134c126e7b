/* router/reload.h: applying a new config without a restart (SIGHUP), on the control thread. */
#ifndef PCR_ROUTER_RELOAD_H
#define PCR_ROUTER_RELOAD_H

#include "server.h"

/* Starts a reload of srv->cfg->path (one at a time: a SIGHUP during one starts another after
 * it). Refused as a whole, with its errors logged, when anything in it is wrong. */
void pcr_reload_start(pcr_server_t *srv);
/* Frees what the last reload replaced, once every worker has switched (control tick). */
void pcr_reload_collect(pcr_server_t *srv);
void pcr_reload_dispose(pcr_server_t *srv);

#endif
