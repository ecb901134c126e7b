/* router/upstream/probe.h: one GET to a pod on the control thread's check connections (the
 * backend's check_pool: one for each kind of probe, so none waits behind another), with a
 * deadline: what health checks, scrapes and model lists share. The answer
 * comes back as it arrives (head, body chunks) and then its end, once: complete, or not (an
 * error, or the deadline, after which nothing of it is used). */
#ifndef PCR_ROUTER_PROBE_H
#define PCR_ROUTER_PROBE_H

#include <stddef.h>

typedef struct pcr_backend pcr_backend_t;
typedef struct pcr_probe pcr_probe_t;

typedef struct {
    void (*on_head)(void *ctx, int status);
    void (*on_body)(void *ctx, const char *data, size_t len);     /* optional */
    /* The probe is gone when this runs: `complete` is 1 when the whole answer came in time. */
    void (*on_end)(void *ctx, int complete);
} pcr_probe_cbs_t;

/* Sends "GET path" with `agent` as its User-Agent (and `accept` as Accept, unless NULL), ends it
 * after `timeout_ms`, or as soon as its body passes `max_bytes` (not complete then: the read
 * stops there and its connection is closed, counted in the backend's probes_too_large).
 * NULL when out of memory (no callback is made then). Callbacks never run inside this call. */
pcr_probe_t *pcr_probe_get(pcr_backend_t *be, const char *path, const char *agent,
                           const char *accept, unsigned timeout_ms, size_t max_bytes,
                           const pcr_probe_cbs_t *cbs, void *ctx);
/* Ends the probe now; no callback follows. */
void pcr_probe_cancel(pcr_probe_t *p);

#endif
