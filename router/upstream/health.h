/* router/upstream/health.h: the active health checks of one backend (control thread): GET
 * health.path every health.interval_ms on the check connection (probe.h), each result moving the
 * backend's up/down state (pcr_backend_check_result). An ejected backend is checked on each probe
 * tick too (control.c), and one ejected for failed connects comes back when a check succeeds. */
#ifndef PCR_ROUTER_HEALTH_H
#define PCR_ROUTER_HEALTH_H

typedef struct pcr_backend pcr_backend_t;

/* Makes the backend's check timer when checks are on; 0 or PCR_ERR_NOMEM. */
int pcr_health_init(pcr_backend_t *be);
/* The first check, at once: a dead pod is known within one timeout. */
void pcr_health_first(pcr_backend_t *be);
/* Sends one check now, unless one is in flight (a probe of an ejected backend). */
void pcr_health_start(pcr_backend_t *be);
/* A reload set health.interval_ms: 0 stops the checks; otherwise a backend whose checks are not
 * running (never started, or stopped by an earlier reload) is checked after one interval. */
void pcr_health_retime(pcr_backend_t *be);
/* The backend left: no further check is scheduled (one in flight ends on its own). */
void pcr_health_stop(pcr_backend_t *be);
/* Whether a check is in flight. */
int pcr_health_busy(const pcr_backend_t *be);
/* Frees the timer and cancels a check in flight. */
void pcr_health_dispose(pcr_backend_t *be);

#endif
