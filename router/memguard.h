/* router/memguard.h: the memory account against limits.max_memory_bytes, added up on the control
 * thread's tick (memguard.c); core/memacct.h says what it is made of, pcr/overload.h which
 * actions it sets off. */
#ifndef PCR_ROUTER_MEMGUARD_H
#define PCR_ROUTER_MEMGUARD_H

#include "server.h"

/* Every outlier.probe_ms, on the control thread: resolves the limit when the config changed
 * (start, reload: "auto" reads the cgroup's memory.max then), adds up the account, decides the
 * actions and publishes both for the workers and /metrics; logs each action that starts or
 * ends. */
void pcr_memguard_tick(pcr_server_t *srv);

#endif
