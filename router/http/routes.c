/* router/http/routes.c: the paths pcrouter answers, in one table: the router's own endpoints
 * (endpoints.c), the two prompts it routes by their prefix, and every other POST under /v1/,
 * balanced by load (proxy.c). The exchange walks the table (pcr_exchange_run) and names no path itself,
 * so a new endpoint is a row here and a function in endpoints.c. */
#include "exchange_int.h"

static const pcr_route_t routes[] = {
    {"/v1/completions", "POST", PCR_ROUTE_PROMPT, 0, PCR_API_COMPLETIONS, pcr_proxy_routed, NULL},
    {"/v1/chat/completions", "POST", PCR_ROUTE_PROMPT, 0, PCR_API_CHAT, pcr_proxy_routed, NULL},
    {"/v1/models", "GET", PCR_ROUTE_FANOUT, 0, -1, pcr_endpoint_models, pcr_endpoint_models_cancel},
    {"/health", "GET", PCR_ROUTE_ANSWER, 1, -1, pcr_endpoint_health, NULL},
    {"/metrics", "GET", PCR_ROUTE_ANSWER, 1, -1, pcr_endpoint_metrics, NULL},
    /* embeddings, tokenize, ...: balanced by load, no prefix key */
    {"/v1/", "POST", PCR_ROUTE_PROXY, 0, -1, pcr_proxy_plain, NULL},
};

const pcr_route_table_t pcr_routes = {routes, sizeof(routes) / sizeof(routes[0])};
