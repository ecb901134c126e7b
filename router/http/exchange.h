/* router/http/exchange.h: one request/response pair, independent of the client's protocol.
 *
 * A protocol session (h1_server.c, h2_server.c) creates an exchange when a request begins,
 * feeds it the method, path, headers and body, then calls pcr_exchange_run(). The exchange
 * routes it (local endpoint, or policy + upstream) and answers through the session's ops. The
 * session owns the exchange and frees it with pcr_exchange_free(), never from inside one of
 * its own ops: ops only queue output, the session frees later (deferred free). */
#ifndef PCR_ROUTER_EXCHANGE_H
#define PCR_ROUTER_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "body.h"
#include "server.h"
#include "upstream.h"

typedef struct pcr_exchange pcr_exchange_t;

typedef struct {
    /* Starts the response; content_length is -1 when unknown (streamed). Names may be any case. */
    void (*send_head)(pcr_exchange_t *ex, int status, const pcr_hdr_t *hdrs, size_t n,
                      int64_t content_length);
    void (*send_body)(pcr_exchange_t *ex, const char *data, size_t len);
    void (*send_end)(pcr_exchange_t *ex);
    /* The response broke after its head was sent: reset the stream / close the connection. */
    void (*send_abort)(pcr_exchange_t *ex);
    /* Bytes queued toward the client for this exchange and not yet written. */
    size_t (*pending)(pcr_exchange_t *ex);
} pcr_exchange_ops_t;

/* Past this many queued bytes the exchange keeps the answer's further bytes itself (up to
 * limits.max_response_buffer_bytes; past that the upstream pauses); the session calls
 * pcr_exchange_on_writable() whenever its output drained (to PCR_WRITE_LOW, or for HTTP/2 as
 * each DATA frame takes a stream's bytes), and the exchange moves kept bytes on. */
#define PCR_WRITE_HIGH (256 * 1024)
#define PCR_WRITE_LOW (64 * 1024)
/* The high mark in force (respond.c): PCR_WRITE_HIGH, or PCR_WRITE_LOW while the memory
 * account shrinks windows (pcr/overload.h). An HTTP/2 session fills its connection's output to
 * it too, as its streams' answers wait in their own buffers. */
size_t pcr_write_high(const pcr_worker_t *w);

pcr_exchange_t *pcr_exchange_new(pcr_worker_t *w, const pcr_exchange_ops_t *ops, void *sess,
                                 const char *proto);
void pcr_exchange_free(pcr_exchange_t *ex);  /* NULL is a no-op; cancels any upstream work */
/* Freed exchanges are kept for the next pcr_exchange_new() on the same thread (a few per
 * thread); a thread that made exchanges calls this before it ends, to free the ones kept. */
void pcr_exchange_cache_clear(void);

int pcr_exchange_set_method(pcr_exchange_t *ex, const char *method, size_t len);
int pcr_exchange_set_path(pcr_exchange_t *ex, const char *path, size_t len);
/* The client's address, for the access log; whether it came through the admin listener (then
 * only /metrics and /health are served); and its connection's standing with the pools (its
 * count of requests on pod connections, which this one's pod request keeps: pcr_session_t.load,
 * the pools' fair share and light clients' reserve; NULL: none). */
void pcr_exchange_set_client(pcr_exchange_t *ex, const char *peer, int admin,
                             pcr_light_client_t *load);
/* Adds a request header as received. PCR_ERR_INVAL when the name is not an RFC 9110 token or
 * the value holds CR, LF or NUL; PCR_ERR_TOO_LARGE past PCR_MAX_REQ_HEADERS. */
int pcr_exchange_add_header(pcr_exchange_t *ex, const char *name, size_t nlen, const char *value,
                            size_t vlen);
/* Appends request body bytes; PCR_ERR_TOO_LARGE past limits.max_body_bytes. The bytes count
 * against limits.max_buffered_body_bytes (server.h) until the exchange is freed. */
int pcr_exchange_add_body(pcr_exchange_t *ex, const char *data, size_t len);

/* add_body in two steps, for a transport that can hand over the buffer the bytes are in:
 * see_body checks and reads them where they are (same results as add_body), then the bytes
 * join the request's body without a copy. HTTP/1.1 calls take_body, which moves that many
 * bytes from the front of `src` to the body, whole chains by reference; HTTP/2 adds a
 * reference to them in their read chain (evbuffer_add_reference on pcr_exchange_body, which
 * keeps the chain until the body is freed). Every byte seen must join the body, in order,
 * before the request runs. */
struct evbuffer;
int pcr_exchange_see_body(pcr_exchange_t *ex, const char *data, size_t len);
/* The shortest body piece a transport hands over in its read buffer rather than copying. A
 * read buffer holds up to 32 KiB, so a piece that long is at least a quarter of the buffer it
 * keeps alive: the memory held stays within 4x the body bytes carried, which are what
 * limits.max_buffered_body_bytes counts. Shorter pieces cost as little to copy. */
#define PCR_BODY_TAKE_MIN 8192
int pcr_exchange_take_body(pcr_exchange_t *ex, struct evbuffer *src, size_t len);
/* The request's body as taken so far (for a transport that copies some bytes itself after
 * see_body, in order with the ones it takes). */
struct evbuffer *pcr_exchange_body(pcr_exchange_t *ex);

/* The request is complete: route and answer it. */
void pcr_exchange_run(pcr_exchange_t *ex);

/* Answers with an OpenAI-style error body {"error": {"message", "type", "code"}}. Also refuses
 * a request the session could not take whole (400, 408, 413, 431): it is counted like any other. */
void pcr_exchange_error(pcr_exchange_t *ex, int status, const char *type, const char *code,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Refuses a request whose body got no budget (budget.h) within timeouts.client_idle_ms: 503,
 * counted in pcrouter_request_body_budget_refusals_total. */
void pcr_exchange_budget_refused(pcr_exchange_t *ex);

/* Whether a new request is to be refused for memory (the overload action refuse_requests,
 * pcr/overload.h): 1 while it is on, for every request but the router's own endpoints
 * (/metrics, /health and the admin listener's), which stay answered. Needs the method and path. */
int pcr_exchange_overloaded(pcr_exchange_t *ex);
/* Refuses such a request: 503 server_overloaded / memory_pressure with Retry-After, counted in
 * pcrouter_overload_refusals_total{action="refuse_requests"}. */
void pcr_exchange_overload_refused(pcr_exchange_t *ex);

/* Answers with a complete body. */
void pcr_exchange_reply(pcr_exchange_t *ex, int status, const char *content_type,
                        const char *body, size_t len, const pcr_hdr_t *extra, size_t nextra);

void pcr_exchange_on_writable(pcr_exchange_t *ex);

int pcr_exchange_responded(const pcr_exchange_t *ex);  /* the head went out */
int pcr_exchange_finished(const pcr_exchange_t *ex);   /* the end went out (or the response broke) */
int pcr_exchange_running(const pcr_exchange_t *ex);    /* the request is complete (or refused) */
size_t pcr_exchange_body_bytes(const pcr_exchange_t *ex); /* request body buffered so far */
/* A request refused before its body was complete: the body held so far (and its parse) is
 * freed now, not when the exchange is, which waits for the client to take the answer. */
void pcr_exchange_drop_body(pcr_exchange_t *ex);

/* Session back-pointer (the h1 session or the h2 stream). */
void *pcr_exchange_session(const pcr_exchange_t *ex);

#endif
