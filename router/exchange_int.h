/* router/exchange_int.h: the exchange's fields, shared by exchange.c (routing and proxying)
 * and endpoints.c (the router's own endpoints). Nothing else includes this. */
#ifndef PCR_ROUTER_EXCHANGE_INT_H
#define PCR_ROUTER_EXCHANGE_INT_H

#include <event2/buffer.h>

#include "backend.h"
#include "exchange.h"

#define PCR_MAX_REQ_HEADERS 100

typedef struct pcr_models_fanout pcr_models_fanout_t;

struct pcr_exchange {
    pcr_server_t *srv;
    const pcr_exchange_ops_t *ops;
    void *sess;
    const char *proto;                /* "HTTP/1.1", "HTTP/2" */

    /* The request. Header names and values live in `hbuf` at the offsets below. */
    char method[16];
    char *path;
    char *hbuf;
    size_t hlen, hcap;
    size_t hoff[PCR_MAX_REQ_HEADERS * 2], hsz[PCR_MAX_REQ_HEADERS * 2];
    size_t nh;
    struct evbuffer *body;

    /* Routing. */
    pcr_body_t req;                   /* parsed body (model, canonical key) */
    pcr_key_t key;
    int has_key;
    pcr_decision_t decision;
    uint32_t added_from;
    int committed;                    /* the index holds the speculative entry */
    pcr_backend_t *be;                /* current attempt's backend */
    uint64_t prefill_charged;         /* what this attempt added to be->queued_prefill */
    int charged;                      /* be->inflight counts this attempt */
    unsigned char *tried;             /* per backend: already failed this request */
    unsigned attempts;
    pcr_up_error_t last_error;
    pcr_upreq_t *up;
    int paused;
    pcr_models_fanout_t *fanout;

    /* Response state. */
    int running, responded, finished, aborted;
    int status;
    uint64_t resp_bytes;
    uint64_t t_start, t_head;
};

/* endpoints.c */
void pcr_endpoint_health(pcr_exchange_t *ex);
void pcr_endpoint_metrics(pcr_exchange_t *ex);
int pcr_endpoint_models(pcr_exchange_t *ex);   /* starts the fan-out */
void pcr_endpoint_models_cancel(pcr_exchange_t *ex);

#endif
