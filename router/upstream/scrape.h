/* router/upstream/scrape.h: reads the pods' own /metrics (queue length, delivered prefix-cache
 * hits). */
#ifndef PCR_ROUTER_SCRAPE_H
#define PCR_ROUTER_SCRAPE_H

struct evbuffer;
typedef struct pcr_backend pcr_backend_t;

/* Starts one scrape of `be` unless one is running; results land in the backend's pod_* fields. */
void pcr_scrape_start(pcr_backend_t *be);
void pcr_scrape_cancel(pcr_backend_t *be);

/* Reads a Prometheus text body (consumed) into the backend's pod_* fields. */
void pcr_scrape_parse(pcr_backend_t *be, struct evbuffer *body);

#endif
