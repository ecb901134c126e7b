/* pcr/overload.h: what pcrouter does as the memory it accounts for nears limits.max_memory_bytes.
 *
 * The router adds up the memory it can see (request bodies, buffered responses, the index,
 * requests in flight, client connections, the tokenize cache) and asks pcr_overload_decide
 * which actions are on. Each action has a threshold, a share of the limit; it starts when the
 * account reaches its threshold and ends only once the account falls PCR_OVERLOAD_MARGIN
 * below it, so an account that hovers at a threshold does not flap the action on and off.
 * An action implies the ones below it: refusing requests without also holding back request
 * bodies would let the requests already admitted fill what was freed.
 *
 *   0 ---------------- 80% ------------ 90% ------- 95% ------- 100% of the limit
 *                      shrink_windows   refuse_requests stop_accepting
 *        (each ends 5 points below where it starts)
 *
 * Pure (no I/O, no clock): the router measures and applies (router/overload.c). */
#ifndef PCR_OVERLOAD_H
#define PCR_OVERLOAD_H

#include <stdint.h>

typedef enum {
    PCR_OVERLOAD_SHRINK_WINDOWS = 0, /* no request-body budget past the one-request reserve;
                                      * answers queue 64 KiB for a slow client, not 1.25 MiB */
    PCR_OVERLOAD_REFUSE_REQUESTS,    /* new requests and HTTP/2 streams get 503 */
    PCR_OVERLOAD_STOP_ACCEPTING,     /* the public listeners stop accepting connections */
    PCR_OVERLOAD__COUNT
} pcr_overload_action_t;

#define PCR_OVERLOAD_BIT(a) (1u << (a))

/* An action ends once the account is this many thousandths of the limit below its threshold. */
#define PCR_OVERLOAD_MARGIN 50

/* The action's threshold, in thousandths of the limit: 800, 900, 950. */
unsigned pcr_overload_threshold(pcr_overload_action_t a);

/* The actions on (PCR_OVERLOAD_BIT set) for `accounted` bytes against `limit` bytes, given the
 * actions on until now (`active`). A limit of 0 turns every action off. */
unsigned pcr_overload_decide(uint64_t accounted, uint64_t limit, unsigned active);

/* "shrink_windows", "refuse_requests", "stop_accepting" (as /metrics names them). */
const char *pcr_overload_action_name(pcr_overload_action_t a);

#endif
