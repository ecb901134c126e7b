/* router/obs/metrics.h: GET /metrics, the Prometheus text exposition of every worker's counters
 * (counters.h), the backends' shared ones, the bus, the access log and the sharing. */
#ifndef PCR_ROUTER_METRICS_H
#define PCR_ROUTER_METRICS_H

#include "counters.h"

struct pcr_worker;
struct evbuffer;

/* Appends the whole exposition text to `out`, summed over every worker; `w` is the worker
 * answering (its replica of the index gives the per-backend block counts). */
void pcr_metrics_render(struct pcr_worker *w, struct evbuffer *out);

#endif
