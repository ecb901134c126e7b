/* router/http/tokenize.h: precise mode's tokens for a request, from a pod that serves its
 * model (POST /tokenize, or the render endpoints with routing.tokenize "render"), on a small
 * pool of connections of its own per worker and backend (never the request pool), with a
 * deadline (routing.tokenize_timeout_ms) and a bounded cache, shared by the workers, of what
 * earlier prompts gave, keyed by the prompt's chained text blocks (a prompt that begins with
 * a cached one's text takes that one's blocks at once, its own asked in the background).
 * Whatever goes wrong (no pod, a timeout, an error, an answer that does not parse) routes the
 * request on its approximate key: tokenizing never fails a request. */
#ifndef PCR_ROUTER_TOKENIZE_H
#define PCR_ROUTER_TOKENIZE_H

#include "exchange_int.h"

/* For a routed request whose key is made (proxy.c): fills ex->key's token chains from the
 * cache (the whole prompt, or a prefix of it) and returns 1 (dispatch now), returns 1 too when nothing is to be asked (not in
 * precise mode, no pod, a prompt it cannot send), or starts the pod's tokenization and
 * returns 0: pcr_proxy_dispatch(ex) follows once it ends or its deadline passes. */
int pcr_tokenize_start(pcr_exchange_t *ex);
/* The exchange goes before its tokenization ended: it is cancelled, no callback follows. */
void pcr_tokenize_cancel(pcr_exchange_t *ex);
/* A worker's end: its refresh under way is cancelled. */
void pcr_tokenize_worker_free(pcr_worker_t *w);
/* The workers' cache, once they are all joined. */
void pcr_tokenize_server_free(pcr_server_t *srv);

#endif
