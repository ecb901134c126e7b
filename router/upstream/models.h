/* router/upstream/models.h: the models each pod serves, from its GET /v1/models (control thread).
 */
#ifndef PCR_ROUTER_MODELS_H
#define PCR_ROUTER_MODELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct pcr_backend pcr_backend_t;

/* Asks the pod now (unless a question is out). */
void pcr_models_fetch(pcr_backend_t *be);
/* Asks again when scrape.models_interval_ms has passed since the last time. */
void pcr_models_tick(pcr_backend_t *be, uint64_t now_us);
void pcr_models_cancel(pcr_backend_t *be);
/* Reads an OpenAI model list into hashes of its ids (at most `max`): 0, or -1 when it is not one. */
int pcr_models_parse(const char *text, size_t len, uint64_t *hashes, size_t max, size_t *n);

#endif
