/* router/config/config.c: the config loader. It owns every rule about pcrouter's JSON config file
 * (which keys exist, their types, defaults and ranges) and the text of every error about it;
 * nothing else in the router reads the file.
 *
 * It works in two passes, so that no value is ever parsed by hand-written code:
 *
 *   1. jansson parses the text (duplicate keys rejected) and a table-driven validator, here,
 *      walks the tree, filling pcr_config_t and collecting every error it meets, each with the
 *      key path it concerns ("backends[1].url") but no position: jansson keeps none for values.
 *   2. Only when there are errors, a small scanner (config_pos.c) walks the raw text, already
 *      known to be valid JSON, and records where the key and the value of every path start.
 *      Each error then takes the line and column of its path (or of its nearest located
 *      parent), and the errors are sorted by position and printed one per line (config_err.c).
 *
 * Lines and columns are 1-based; columns count UTF-8 characters, as jansson's do, so the
 * positions of parse errors (from jansson) and of validation errors (from the scanner) agree.
 * Listen addresses and backend URLs are parsed in config_addr.c.
 *
 * Over 700 lines, kept whole: the tables of keys (a row per key) and the checks across keys that
 * no row can say (listeners against each other, the redis section, discovery) share the
 * loader's context and its error paths. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "config.h"
#include "config_addr.h"
#include "config_err.h"
#include "pcr/common.h"
#include "pcr/connshare.h"
#include "pcr/hold.h"

/* A config file larger than this is a mistake (a log, a dump), not a config. */
#define CONFIG_MAX_FILE_BYTES (16u * 1024 * 1024)

/* ---------------------------------------------------------------------------------------- */
/* The schema: each JSON object is a table of fields; one reader walks any table.            */

typedef enum {
    FT_UINT,        /* integer into unsigned */
    FT_SIZE,        /* integer into size_t */
    FT_U64,         /* integer into uint64_t */
    FT_DOUBLE,      /* number (integer or real) into double */
    FT_BOOL,        /* boolean into int */
    FT_STRING,      /* string into char * (heap) */
    FT_FILE,        /* string naming a readable file */
    FT_POLICY,      /* routing policy name into pcr_policy_kind_t */
    FT_LOG_LEVEL,   /* log level name into pcr_log_level_t */
    FT_LOG_FORMAT,  /* access log format name into pcr_access_format_t */
    FT_HTTP_PATH,   /* "/..." request path into char * */
    FT_ADDRESS,     /* listen address: fills pcr_listen_conf_t's address, addr, addrlen */
    FT_TLS,         /* tls object: fills pcr_listen_conf_t's tls, cert, key */
    FT_URL,         /* backend url: fills pcr_backend_conf_t's url, host, port, tls.enabled */
    FT_UPSTREAM_TLS,/* a backend's "tls" object: pcr_upstream_tls_conf_t at `offset` */
    FT_MODELS,      /* array of model names: fills pcr_backend_conf_t's models, nmodels */
    FT_SECTION,     /* object read with `sub` into the struct at `offset` */
    FT_LISTENERS,   /* the listen array of pcr_config_t */
    FT_BACKENDS,    /* the backends array of pcr_config_t */
    FT_REDIS,       /* redis object: sets pcr_redis_conf_t's enabled, reads redis_fields */
    FT_REDIS_URL,   /* redis url: fills pcr_redis_conf_t's url, host, port, user, password, db */
    FT_KEY_PREFIX,  /* a Redis key prefix: letters, digits and "-_.:{}" */
    FT_DISCOVERY,   /* the discovery array of pcr_config_t */
    FT_HOSTNAME,    /* a DNS name to resolve, into char * (heap) */
    FT_NAMESERVERS, /* array of "IP" or "IP:PORT": fills pcr_dns_conf_t's nameservers */
    FT_ROLE,        /* "prefill", "decode" or "both" into pcr_role_t */
    FT_PD_MODE,     /* "auto", "always" or "never" into pcr_pd_mode_t */
    FT_CHOICE,      /* one of `names` into int (its index) */
    FT_ZMQ,         /* "tcp://HOST:PORT" of a ZMQ socket into char * (heap) */
    FT_OBJECT,      /* object read with `sub` into the same struct as its parent */
    FT_INT,         /* integer into int */
    FT_HEADER_NAME, /* an HTTP field name (a token), lower-cased, "" allowed, into char * */
    FT_SHA256,      /* 64 hex digits into unsigned char[32] */
    FT_AUTH,        /* auth object: sets pcr_auth_conf_t's enabled, reads auth_fields */
    FT_KEYS,        /* the keys array of pcr_auth_conf_t */
    FT_TENANTS,     /* the tenants object of pcr_config_t: name -> tenant_fields */
    FT_MEMORY,      /* "auto" (PCR_MEMORY_AUTO), 0, or bytes from `min` to `max`, into size_t */
} field_type_t;

enum { F_REQUIRED = 1, F_NONEMPTY = 2 };

typedef struct field {
    const char *key;
    field_type_t type;
    unsigned flags;
    size_t offset;                /* of the member it fills, within the table's struct */
    long long min, max;           /* integer range, inclusive; max LLONG_MAX = unbounded */
    double dmin, dmax;            /* number range, inclusive; dmax INFINITY = unbounded */
    const struct field *sub;      /* FT_SECTION, FT_OBJECT */
    size_t nsub;
    const char *const *names;     /* FT_CHOICE */
    size_t nnames;
} field_t;

#define F_INT(T, k, ty, lo, hi) { .key = #k, .type = ty, .offset = offsetof(T, k), .min = lo, .max = hi }
#define F_DBL(T, k, lo, hi) { .key = #k, .type = FT_DOUBLE, .offset = offsetof(T, k), .dmin = lo, .dmax = hi }
#define F_OF(T, k, ty, fl) { .key = #k, .type = ty, .flags = fl, .offset = offsetof(T, k) }
#define F_SECTION(k, tbl) { .key = #k, .type = FT_SECTION, .offset = offsetof(pcr_config_t, k), \
                            .sub = tbl, .nsub = PCR_ARRAY_SIZE(tbl) }

#define DAY_MS 86400000LL

static const field_t tls_fields[] = {
    F_OF(pcr_listen_conf_t, cert, FT_FILE, F_REQUIRED | F_NONEMPTY),
    F_OF(pcr_listen_conf_t, key, FT_FILE, F_REQUIRED | F_NONEMPTY),
};

static const field_t listen_fields[] = {
    F_OF(pcr_listen_conf_t, address, FT_ADDRESS, F_REQUIRED),
    F_OF(pcr_listen_conf_t, tls, FT_TLS, 0),
};

/* Precise mode: a backend's KV-event sockets, and a discovery entry's ports for them. */
static const field_t kv_events_fields[] = {
    { .key = "endpoint", .type = FT_ZMQ, .flags = F_REQUIRED,
      .offset = offsetof(pcr_backend_conf_t, kv_endpoint) },
    { .key = "replay_endpoint", .type = FT_ZMQ, .offset = offsetof(pcr_backend_conf_t, kv_replay) },
};

static const field_t kv_ports_fields[] = {
    { .key = "port", .type = FT_UINT, .flags = F_REQUIRED,
      .offset = offsetof(pcr_discovery_conf_t, tmpl.kv_port), .min = 1, .max = 65535 },
    { .key = "replay_port", .type = FT_UINT,
      .offset = offsetof(pcr_discovery_conf_t, tmpl.kv_replay_port), .min = 1, .max = 65535 },
};

#define F_OBJECT(k, tbl) { .key = #k, .type = FT_OBJECT, .sub = tbl, .nsub = PCR_ARRAY_SIZE(tbl) }

static const char *const index_names[] = {"approximate", "events"};
static const char *const tokenize_names[] = {"tokenize", "render"};
#define F_CHOICE(T, k, m, tbl) { .key = #k, .type = FT_CHOICE, .offset = offsetof(T, m), \
                                 .names = tbl, .nnames = PCR_ARRAY_SIZE(tbl) }

static const field_t backend_fields[] = {
    F_OF(pcr_backend_conf_t, name, FT_STRING, F_REQUIRED | F_NONEMPTY),
    F_OF(pcr_backend_conf_t, url, FT_URL, F_REQUIRED),
    F_OF(pcr_backend_conf_t, zone, FT_STRING, 0),
    F_OF(pcr_backend_conf_t, role, FT_ROLE, 0),
    F_INT(pcr_backend_conf_t, weight, FT_UINT, 1, 1000),
    F_INT(pcr_backend_conf_t, capacity_tokens, FT_U64, 1, LLONG_MAX),
    F_INT(pcr_backend_conf_t, max_connections, FT_UINT, 1, 65535),
    F_OF(pcr_backend_conf_t, models, FT_MODELS, 0),
    F_OF(pcr_backend_conf_t, tls, FT_UPSTREAM_TLS, 0),
    F_OBJECT(kv_events, kv_events_fields),
};

static const field_t upstream_tls_fields[] = {
    F_OF(pcr_upstream_tls_conf_t, ca_file, FT_FILE, F_NONEMPTY),
    F_OF(pcr_upstream_tls_conf_t, cert, FT_FILE, F_NONEMPTY),
    F_OF(pcr_upstream_tls_conf_t, key, FT_FILE, F_NONEMPTY),
    F_OF(pcr_upstream_tls_conf_t, verify, FT_BOOL, 0),
    F_OF(pcr_upstream_tls_conf_t, server_name, FT_HOSTNAME, F_NONEMPTY),
};

/* The key differs from the member: the backend settings of a discovery entry. */
#define F_TMPL(k, ty, lo, hi) { .key = #k, .type = ty, .offset = offsetof(pcr_discovery_conf_t, tmpl.k), \
                                .min = lo, .max = hi }

static const field_t discovery_fields[] = {
    F_OF(pcr_discovery_conf_t, dns, FT_HOSTNAME, F_REQUIRED | F_NONEMPTY),
    F_INT(pcr_discovery_conf_t, port, FT_UINT, 1, 65535),
    F_INT(pcr_discovery_conf_t, interval_ms, FT_UINT, 100, DAY_MS),
    F_TMPL(zone, FT_STRING, 0, 0),
    F_TMPL(role, FT_ROLE, 0, 0),
    F_TMPL(weight, FT_UINT, 1, 1000),
    F_TMPL(capacity_tokens, FT_U64, 1, LLONG_MAX),
    F_TMPL(max_connections, FT_UINT, 1, 65535),
    F_TMPL(models, FT_MODELS, 0, 0),
    F_TMPL(tls, FT_UPSTREAM_TLS, 0, 0),
    F_OBJECT(kv_events, kv_ports_fields),
};

static const field_t dns_fields[] = {
    F_OF(pcr_dns_conf_t, nameservers, FT_NAMESERVERS, 0),
    F_INT(pcr_dns_conf_t, timeout_ms, FT_UINT, 1, DAY_MS),
};

static const field_t routing_fields[] = {
    F_OF(pcr_routing_conf_t, policy, FT_POLICY, 0),
    F_OF(pcr_routing_conf_t, zone, FT_STRING, 0),
    F_INT(pcr_routing_conf_t, block_bytes, FT_SIZE, 16, 65536),
    F_INT(pcr_routing_conf_t, max_prefix_bytes, FT_SIZE, 16, 16777216),
    F_INT(pcr_routing_conf_t, index_max_bytes, FT_SIZE, 65536, 1LL << 40),
    F_DBL(pcr_routing_conf_t, load_factor, 1.0, INFINITY),
    F_DBL(pcr_routing_conf_t, load_weight, 0.0, INFINITY),
    F_DBL(pcr_routing_conf_t, zone_penalty, 0.0, INFINITY),
    F_INT(pcr_routing_conf_t, vnodes, FT_UINT, 1, 10000),
    F_INT(pcr_routing_conf_t, unavailable_keep_ms, FT_UINT, 0, DAY_MS),
    F_OF(pcr_routing_conf_t, feedback, FT_BOOL, 0),
    F_INT(pcr_routing_conf_t, hold_tokens, FT_U64, 0, 1LL << 40),
    F_CHOICE(pcr_routing_conf_t, index, index_events, index_names),
    F_CHOICE(pcr_routing_conf_t, tokenize, tokenize_render, tokenize_names),
    F_INT(pcr_routing_conf_t, tokenize_timeout_ms, FT_UINT, 1, 60000),
    F_INT(pcr_routing_conf_t, tokenize_cache_entries, FT_UINT, 0, 1000000),
    F_INT(pcr_routing_conf_t, tokenize_cache_bytes, FT_SIZE, 0, 1LL << 34),
    F_INT(pcr_routing_conf_t, tokenize_max_bytes, FT_SIZE, 1024, 1LL << 30),
    F_OF(pcr_routing_conf_t, tokenize_reuse_prefix, FT_BOOL, 0),
    F_INT(pcr_routing_conf_t, kv_block_tokens, FT_UINT, 1, 65536),
    F_OF(pcr_routing_conf_t, session_header, FT_HEADER_NAME, 0),
    F_OF(pcr_routing_conf_t, tenant_header, FT_HEADER_NAME, 0),
    F_OF(pcr_routing_conf_t, objective_header, FT_HEADER_NAME, 0),
};

static const field_t pd_fields[] = {
    F_OF(pcr_pd_opts_t, mode, FT_PD_MODE, 0),
    F_INT(pcr_pd_opts_t, min_uncached_tokens, FT_U64, 0, 1LL << 40),
    F_DBL(pcr_pd_opts_t, max_ttft_ratio, 0.0, INFINITY),
    F_DBL(pcr_pd_opts_t, transfer_us_per_token, 0.0, 1e9),
    F_DBL(pcr_pd_opts_t, itl_weight, 0.0, 1e6),
};

static const field_t tenant_fields[] = {
    F_INT(pcr_tenant_conf_t, priority, FT_INT, -1000, 1000),
    F_DBL(pcr_tenant_conf_t, weight, 1e-6, 1e6),
    F_DBL(pcr_tenant_conf_t, requests_per_s, 0.0, 1e9),
    F_INT(pcr_tenant_conf_t, tokens_per_min, FT_U64, 0, 1LL << 50),
    F_INT(pcr_tenant_conf_t, max_concurrent, FT_UINT, 0, 1000000),
    F_INT(pcr_tenant_conf_t, pod_priority, FT_INT, -1000000000, 1000000000),
};

static const field_t key_fields[] = {
    F_OF(pcr_key_conf_t, sha256, FT_SHA256, F_REQUIRED),
    F_OF(pcr_key_conf_t, tenant, FT_STRING, F_NONEMPTY),
};

static const field_t auth_fields[] = {
    F_OF(pcr_auth_conf_t, keys, FT_KEYS, F_REQUIRED),
};

static const field_t flow_fields[] = {
    F_OF(pcr_flow_conf_t, enabled, FT_BOOL, 0),
    F_INT(pcr_flow_conf_t, max_queue_requests, FT_SIZE, 0, 10000000),
    F_INT(pcr_flow_conf_t, max_queue_bytes, FT_U64, 0, 1LL << 40),
    F_INT(pcr_flow_conf_t, ttl_ms, FT_UINT, 1, DAY_MS),
    F_DBL(pcr_flow_conf_t, output_weight, 0.0, 1000.0),
    F_DBL(pcr_flow_conf_t, queue_threshold, 0.0, 1e6),
    F_DBL(pcr_flow_conf_t, kv_threshold, 0.0, 1.0),
    F_INT(pcr_flow_conf_t, inflight_per_pod, FT_UINT, 0, 1000000),
    F_INT(pcr_flow_conf_t, prefill_per_pod, FT_U64, 0, 1LL << 40),
    F_INT(pcr_flow_conf_t, tick_ms, FT_UINT, 1, 60000),
};

static const field_t limits_fields[] = {
    F_INT(pcr_limits_conf_t, max_body_bytes, FT_SIZE, 1024, 1LL << 32),
    F_INT(pcr_limits_conf_t, max_header_bytes, FT_SIZE, 1024, 1048576),
    F_INT(pcr_limits_conf_t, max_concurrent_streams, FT_UINT, 1, 100000),
    F_INT(pcr_limits_conf_t, max_client_connections, FT_UINT, 1, 1000000),
    F_INT(pcr_limits_conf_t, max_buffered_body_bytes, FT_SIZE, 1024, 1LL << 40),
    F_INT(pcr_limits_conf_t, max_response_buffer_bytes, FT_SIZE, 0, 1LL << 32),
    F_INT(pcr_limits_conf_t, max_buffered_response_bytes, FT_SIZE, 0, 1LL << 40),
    F_INT(pcr_limits_conf_t, max_memory_bytes, FT_MEMORY, PCR_MEMORY_MIN, 1LL << 50),
};

/* Every network wait has a timeout (house rule 7): no timeout accepts 0 but drain_ms, where 0
 * means "close at once". A day bounds them all and keeps them inside an unsigned. */
static const field_t timeouts_fields[] = {
    F_INT(pcr_timeouts_conf_t, connect_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, response_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, stream_idle_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, upstream_keepalive_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, client_idle_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, request_header_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, client_write_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, drain_ms, FT_UINT, 0, DAY_MS),
};

static const field_t upstream_fields[] = {
    F_INT(pcr_upstream_conf_t, max_connections, FT_UINT, 1, 65535),
    F_INT(pcr_upstream_conf_t, retries, FT_UINT, 0, 16),
    F_OF(pcr_upstream_conf_t, request_usage, FT_BOOL, 0),
    F_INT(pcr_upstream_conf_t, light_reserve_pct, FT_UINT, 0, PCR_LIGHT_RESERVE_PCT_MAX),
};

static const field_t health_fields[] = {
    F_INT(pcr_health_conf_t, interval_ms, FT_UINT, 0, DAY_MS),
    F_INT(pcr_health_conf_t, timeout_ms, FT_UINT, 1, DAY_MS),
    F_OF(pcr_health_conf_t, path, FT_HTTP_PATH, 0),
    F_INT(pcr_health_conf_t, fall, FT_UINT, 1, 100),
    F_INT(pcr_health_conf_t, rise, FT_UINT, 1, 100),
};

static const field_t scrape_fields[] = {
    F_INT(pcr_scrape_conf_t, interval_ms, FT_UINT, 0, DAY_MS),
    F_INT(pcr_scrape_conf_t, timeout_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_scrape_conf_t, models_interval_ms, FT_UINT, 0, DAY_MS),
    F_INT(pcr_scrape_conf_t, models_timeout_ms, FT_UINT, 1, DAY_MS),
};

static const field_t outlier_fields[] = {
    F_INT(pcr_outlier_conf_t, consecutive_errors, FT_UINT, 0, 1000),
    F_INT(pcr_outlier_conf_t, consecutive_connect_errors, FT_UINT, 0, 1000),
    F_INT(pcr_outlier_conf_t, ejection_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_outlier_conf_t, max_ejection_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_outlier_conf_t, probe_ms, FT_UINT, 10, DAY_MS),
};

static const field_t log_fields[] = {
    F_OF(pcr_log_conf_t, level, FT_LOG_LEVEL, 0),
    F_OF(pcr_log_conf_t, access_log, FT_BOOL, 0),
    F_OF(pcr_log_conf_t, access_log_path, FT_STRING, 0),
    F_OF(pcr_log_conf_t, access_log_format, FT_LOG_FORMAT, 0),
};

static const field_t admin_fields[] = {
    F_OF(pcr_listen_conf_t, address, FT_ADDRESS, F_REQUIRED),
};

/* Redis sizes stay under 512 MiB, the largest string Redis stores. */
static const field_t redis_fields[] = {
    F_OF(pcr_redis_conf_t, url, FT_REDIS_URL, F_REQUIRED),
    F_OF(pcr_redis_conf_t, channel, FT_KEY_PREFIX, 0),
    F_INT(pcr_redis_conf_t, flush_ms, FT_UINT, 1, 10000),
    F_INT(pcr_redis_conf_t, batch_max_bytes, FT_SIZE, 4096, 1LL << 26),
    F_INT(pcr_redis_conf_t, stream_maxlen, FT_UINT, 10, 10000000),
    F_INT(pcr_redis_conf_t, snapshot_interval_ms, FT_UINT, 100, DAY_MS),
    F_INT(pcr_redis_conf_t, snapshot_ttl_ms, FT_UINT, 1000, 7 * DAY_MS),
    F_INT(pcr_redis_conf_t, snapshot_max_bytes, FT_SIZE, 65536, 1LL << 29),
    F_INT(pcr_redis_conf_t, ready_timeout_ms, FT_UINT, 0, DAY_MS),
    F_INT(pcr_redis_conf_t, timeout_ms, FT_UINT, 10, DAY_MS),
    F_INT(pcr_redis_conf_t, reconnect_min_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_redis_conf_t, reconnect_max_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_redis_conf_t, max_pending_bytes, FT_SIZE, 65536, 1LL << 32),
};

static const field_t root_fields[] = {
    F_OF(pcr_config_t, listen, FT_LISTENERS, F_REQUIRED),
    F_OF(pcr_config_t, backends, FT_BACKENDS, 0),
    F_OF(pcr_config_t, discovery, FT_DISCOVERY, 0),
    F_SECTION(dns, dns_fields),
    F_INT(pcr_config_t, workers, FT_UINT, 0, 256),
    F_OF(pcr_config_t, io_uring, FT_BOOL, 0),
    F_INT(pcr_config_t, batch_wait_us, FT_UINT, 0, 1000),
    F_DBL(pcr_config_t, batch_wait_busy, 0.0, 1.0),
    F_SECTION(routing, routing_fields),
    F_SECTION(limits, limits_fields),
    F_SECTION(timeouts, timeouts_fields),
    F_SECTION(upstream, upstream_fields),
    F_SECTION(health, health_fields),
    F_SECTION(scrape, scrape_fields),
    F_SECTION(outlier, outlier_fields),
    F_SECTION(log, log_fields),
    F_SECTION(admin, admin_fields),
    F_OF(pcr_config_t, redis, FT_REDIS, 0),
    F_SECTION(pd, pd_fields),
    F_OF(pcr_config_t, auth, FT_AUTH, 0),
    F_OF(pcr_config_t, tenants, FT_TENANTS, 0),
    F_SECTION(flow_control, flow_fields),
};

static const char *const log_level_names[] = {
    [PCR_LOG_ERROR] = "error", [PCR_LOG_WARN] = "warn", [PCR_LOG_INFO] = "info",
    [PCR_LOG_DEBUG] = "debug",
};

static const char *const access_format_names[] = {
    [PCR_ACCESS_TEXT] = "text", [PCR_ACCESS_JSON] = "json",
};

static const char *const role_names[] = {
    [PCR_ROLE_BOTH] = "both", [PCR_ROLE_PREFILL] = "prefill", [PCR_ROLE_DECODE] = "decode",
};

static const char *const pd_mode_names[] = {
    [PCR_PD_AUTO] = "auto", [PCR_PD_ALWAYS] = "always", [PCR_PD_NEVER] = "never",
};

/* Reports every key of `obj` the table does not know, listing the allowed ones and the
 * closest of them when it is a likely typo (edit distance at most 2). A known key costs one
 * pass of string compares: the distances and the list are only worked out for an unknown one
 * (every config load and reload reads every key through here). */
static void check_keys(pcr_cfg_ctx_t *c, const json_t *obj, const field_t *fields, size_t n)
{
    const char *key;
    const json_t *v;
    char allowed[512] = "";
    json_object_foreach((json_t *)obj, key, v) {
        size_t i = 0;
        while (i < n && strcmp(key, fields[i].key) != 0)
            i++;
        if (i < n)
            continue;
        if (allowed[0] == '\0') {
            size_t o = 0;
            for (i = 0; i < n; i++)
                o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s%s", i ? ", " : "",
                                      fields[i].key);
        }
        const char *best = NULL;
        int best_d = 3;
        size_t lk = strlen(key);
        for (i = 0; i < n; i++) {
            /* The distance is at least the difference in length: past 2, no suggestion. */
            size_t lf = strlen(fields[i].key);
            if (lk > lf + 2 || lf > lk + 2)
                continue;
            int d = pcr_cfg_edit_distance(key, fields[i].key);
            if (d < best_d && (size_t)d < lk) {
                best_d = d;
                best = fields[i].key;
            }
        }
        char q[PCR_CFG_QBUF];
        size_t mark = pcr_cfg_path_push_key(&c->path, key);
        if (best != NULL)
            pcr_cfg_err_key(c, "unknown key %s; did you mean \"%s\"? (allowed: %s)",
                            pcr_cfg_quote(q, sizeof q, key), best, allowed);
        else
            pcr_cfg_err_key(c, "unknown key %s (allowed: %s)", pcr_cfg_quote(q, sizeof q, key),
                            allowed);
        pcr_cfg_path_pop(&c->path, mark);
    }
}

static int has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F)
            return 1;
    return 0;
}

/* Replaces the heap string at *slot; 0, or PCR_ERR_NOMEM with *slot unchanged. */
static int set_string(pcr_cfg_ctx_t *c, char **slot, const char *s)
{
    char *copy = strdup(s);
    if (copy == NULL) {
        c->nomem = 1;
        return PCR_ERR_NOMEM;
    }
    free(*slot);
    *slot = copy;
    return 0;
}

/* A string value that may go into a log line, a header or a metrics label. */
static const char *get_text(pcr_cfg_ctx_t *c, const json_t *v, unsigned flags)
{
    if (!json_is_string(v)) {
        pcr_cfg_err_type(c, "string", v);
        return NULL;
    }
    const char *s = json_string_value(v);
    if ((flags & F_NONEMPTY) && s[0] == '\0') {
        pcr_cfg_err(c, "must not be empty");
        return NULL;
    }
    if (has_control(s)) {
        char q[PCR_CFG_QBUF];
        pcr_cfg_err(c, "must not contain control characters, got %s",
                    pcr_cfg_quote(q, sizeof q, s));
        return NULL;
    }
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* The reader.                                                                               */

static void read_fields(pcr_cfg_ctx_t *c, const json_t *obj, void *base, const field_t *f, size_t n);

static void read_integer(pcr_cfg_ctx_t *c, void *slot, const field_t *f, const json_t *v)
{
    if (!json_is_integer(v)) {
        pcr_cfg_err_type(c, "integer", v);
        return;
    }
    long long x = json_integer_value(v);
    if (x < f->min || x > f->max) {
        if (f->max == LLONG_MAX)
            pcr_cfg_err(c, "must be >= %lld, got %lld", f->min, x);
        else
            pcr_cfg_err(c, "must be between %lld and %lld, got %lld", f->min, f->max, x);
        return;
    }
    if (f->type == FT_INT)
        *(int *)slot = (int)x;
    else if (f->type == FT_UINT)
        *(unsigned *)slot = (unsigned)x;
    else if (f->type == FT_SIZE)
        *(size_t *)slot = (size_t)x;
    else
        *(uint64_t *)slot = (uint64_t)x;
}

/* "auto", 0 (off), or a number of bytes in the field's range. */
static void read_memory(pcr_cfg_ctx_t *c, void *slot, const field_t *f, const json_t *v)
{
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        *(size_t *)slot = PCR_MEMORY_AUTO;
        return;
    }
    if (!json_is_integer(v)) {
        pcr_cfg_err_type(c, "\"auto\" or an integer (bytes; 0: off)", v);
        return;
    }
    long long x = json_integer_value(v);
    if (x != 0 && (x < f->min || x > f->max)) {
        pcr_cfg_err(c, "must be 0 (off), \"auto\", or between %lld and %lld bytes, got %lld",
                    f->min, f->max, x);
        return;
    }
    *(size_t *)slot = (size_t)x;
}

static void read_models(pcr_cfg_ctx_t *c, pcr_backend_conf_t *b, const json_t *v)
{
    if (!json_is_array(v)) {
        pcr_cfg_err_type(c, "array of strings", v);
        return;
    }
    size_t n = json_array_size(v);
    if (n == 0)
        return;  /* like no "models" at all: any model, learned from the pod's /v1/models */
    b->models = calloc(n, sizeof *b->models);
    if (b->models == NULL) {
        c->nomem = 1;
        return;
    }
    b->nmodels = n;
    for (size_t i = 0; i < n; i++) {
        size_t mark = pcr_cfg_path_push_index(&c->path, i);
        const char *s = get_text(c, json_array_get(v, i), F_NONEMPTY);
        if (s != NULL)
            set_string(c, &b->models[i], s);
        pcr_cfg_path_pop(&c->path, mark);
    }
}

/* Reads a non-empty array of objects, each read with `fields` into a new array of `size`-byte
 * elements whose defaults `init` sets first. *n is set as soon as the array exists, so that
 * pcr_config_free sees every element whatever the errors. */
static void *read_object_array(pcr_cfg_ctx_t *c, const json_t *v, const char *what, size_t size,
                               const field_t *fields, size_t nfields,
                               void (*init)(pcr_cfg_ctx_t *, void *), size_t *n)
{
    if (!json_is_array(v)) {
        pcr_cfg_err_type(c, "array", v);
        return NULL;
    }
    if (json_array_size(v) == 0) {
        pcr_cfg_err(c, "must not be empty: at least one %s is needed", what);
        return NULL;
    }
    char *arr = calloc(json_array_size(v), size);
    if (arr == NULL) {
        c->nomem = 1;
        return NULL;
    }
    *n = json_array_size(v);
    for (size_t i = 0; i < *n; i++) {
        const json_t *el = json_array_get(v, i);
        size_t mark = pcr_cfg_path_push_index(&c->path, i);
        if (init != NULL)
            init(c, arr + i * size);
        if (!json_is_object(el))
            pcr_cfg_err_type(c, "object", el);
        else
            read_fields(c, el, arr + i * size, fields, nfields);
        pcr_cfg_path_pop(&c->path, mark);
    }
    return arr;
}

static int listen_port_is_0(const pcr_listen_conf_t *l)
{
    if (l->addr.ss_family == AF_INET6)
        return ((const struct sockaddr_in6 *)&l->addr)->sin6_port == 0;
    return ((const struct sockaddr_in *)&l->addr)->sin_port == 0;
}

static void read_listeners(pcr_cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    cfg->listen = read_object_array(c, v, "listener", sizeof *cfg->listen, listen_fields,
                                    PCR_ARRAY_SIZE(listen_fields), NULL, &cfg->nlisten);
    /* Compared as sockets, so "[::1]:80" and "[0:0::1]:80" clash; two listeners on port 0
     * do not: the OS gives each its own port. */
    for (size_t i = 1; i < cfg->nlisten; i++) {
        const pcr_listen_conf_t *l = &cfg->listen[i];
        for (size_t j = 0; j < i && l->addrlen != 0 && !listen_port_is_0(l); j++) {
            const pcr_listen_conf_t *o = &cfg->listen[j];
            if (o->addrlen == l->addrlen && memcmp(&o->addr, &l->addr, l->addrlen) == 0) {
                char q[PCR_CFG_QBUF];
                size_t mark = pcr_cfg_path_push_index(&c->path, i);
                pcr_cfg_path_push_key(&c->path, "address");
                pcr_cfg_err(c, "duplicate listen address %s (also listen[%zu].address)",
                    pcr_cfg_quote(q, sizeof q, l->address), j);
                pcr_cfg_path_pop(&c->path, mark);
                break;
            }
        }
    }
}

static void backend_init(pcr_cfg_ctx_t *c, void *el)
{
    pcr_backend_conf_t *b = el;
    b->weight = 1;
    b->capacity_tokens = 1048576;
    b->max_connections = 0;  /* filled from upstream.max_connections once that is read */
    b->tls.verify = 1;
    set_string(c, &b->zone, "");
}

static void discovery_init(pcr_cfg_ctx_t *c, void *el)
{
    pcr_discovery_conf_t *d = el;
    backend_init(c, &d->tmpl);
    d->port = 8000;
    d->interval_ms = 5000;
}

static void read_discovery(pcr_cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    cfg->discovery = read_object_array(c, v, "discovery entry", sizeof *cfg->discovery,
                                       discovery_fields, PCR_ARRAY_SIZE(discovery_fields),
                                       discovery_init, &cfg->ndiscovery);
    /* Discovered pods have no url: the "tls" object is what turns TLS on. */
    for (size_t i = 0; i < cfg->ndiscovery; i++)
        cfg->discovery[i].tmpl.tls.enabled = cfg->discovery[i].tmpl.tls.given;
}

/* A DNS name: letters, digits, '-', '.', '_' (as in SRV-style labels), at most 253 bytes. */
static const char *hostname_problem(const char *s)
{
    size_t n = strlen(s);
    if (n > 253)
        return "longer than 253 bytes";
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '.' || s[i] == '_'))
            return "only letters, digits, '-', '_' and '.' may appear in a DNS name";
    return NULL;
}

static void read_nameservers(pcr_cfg_ctx_t *c, pcr_dns_conf_t *d, const json_t *v)
{
    if (!json_is_array(v)) {
        pcr_cfg_err_type(c, "array", v);
        return;
    }
    size_t n = json_array_size(v);
    d->nameservers = calloc(n ? n : 1, sizeof(char *));
    if (d->nameservers == NULL) {
        c->nomem = 1;
        return;
    }
    d->nnameservers = n;
    for (size_t i = 0; i < n; i++) {
        size_t mark = pcr_cfg_path_push_index(&c->path, i);
        const char *s = get_text(c, json_array_get(v, i), F_NONEMPTY);
        if (s != NULL) {
            struct sockaddr_storage ss;
            socklen_t len;
            struct in6_addr a6;
            struct in_addr a4;
            char q[PCR_CFG_QBUF];
            /* "IP" alone means port 53; otherwise the listen-address form. */
            if (inet_pton(AF_INET, s, &a4) != 1 && inet_pton(AF_INET6, s, &a6) != 1 &&
                pcr_cfg_parse_listen_address(s, &ss, &len) != NULL)
                pcr_cfg_err(c, "expected \"IP\" or \"IP:PORT\" of a DNS server, got %s",
                            pcr_cfg_quote(q, sizeof q, s));
            else
                set_string(c, &d->nameservers[i], s);
        }
        pcr_cfg_path_pop(&c->path, mark);
    }
}

static void read_backends(pcr_cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    cfg->backends = read_object_array(c, v, "backend", sizeof *cfg->backends, backend_fields,
                                      PCR_ARRAY_SIZE(backend_fields), backend_init, &cfg->nbackends);
    /* The name places the backend on the ring: two with one name would share a place. */
    for (size_t i = 1; i < cfg->nbackends; i++) {
        const char *name = cfg->backends[i].name;
        for (size_t j = 0; j < i && name != NULL; j++) {
            if (cfg->backends[j].name != NULL && strcmp(cfg->backends[j].name, name) == 0) {
                char q[PCR_CFG_QBUF];
                size_t mark = pcr_cfg_path_push_index(&c->path, i);
                pcr_cfg_path_push_key(&c->path, "name");
                pcr_cfg_err(c, "duplicate backend name %s (also backends[%zu].name)",
                    pcr_cfg_quote(q, sizeof q, name), j);
                pcr_cfg_path_pop(&c->path, mark);
                break;
            }
        }
    }
    /* A "tls" object says how to speak TLS; the url's scheme says whether to. */
    for (size_t i = 0; i < cfg->nbackends; i++) {
        const pcr_backend_conf_t *b = &cfg->backends[i];
        if (b->tls.given && !b->tls.enabled && b->url != NULL) {
            size_t mark = pcr_cfg_path_push_index(&c->path, i);
            pcr_cfg_path_push_key(&c->path, "tls");
            pcr_cfg_err(c, "a \"tls\" object needs an https:// url (the url is %s)", b->url);
            pcr_cfg_path_pop(&c->path, mark);
        }
    }
}

/* An API key's SHA-256, as 64 hex digits (either case): the config never holds a key. */
static void read_sha256(pcr_cfg_ctx_t *c, unsigned char *out, const json_t *v)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s == NULL) {
        pcr_cfg_err_type(c, "string", v);
        return;
    }
    if (strlen(s) != 64 || strspn(s, "0123456789abcdefABCDEF") != 64) {
        pcr_cfg_err(c, "expected the key's SHA-256 as 64 hex digits (sha256sum's output), got "
                       "%zu characters", strlen(s));
        return;
    }
    for (size_t i = 0; i < 32; i++) {
        unsigned hi = (unsigned)(isdigit((unsigned char)s[2 * i]) ? s[2 * i] - '0'
                                                                : (tolower((unsigned char)s[2 * i]) - 'a' + 10));
        unsigned lo = (unsigned)(isdigit((unsigned char)s[2 * i + 1]) ? s[2 * i + 1] - '0'
                                                                    : (tolower((unsigned char)s[2 * i + 1]) - 'a' + 10));
        out[i] = (unsigned char)(hi << 4 | lo);
    }
}

static void tenant_default(pcr_cfg_ctx_t *c, pcr_tenant_conf_t *t, const char *name)
{
    *t = (pcr_tenant_conf_t){ .weight = 1 };
    set_string(c, &t->name, name);
}

/* "tenants": {"NAME": {...}}. tenants[0] is "default", configured or not. */
static void read_tenants(pcr_cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    if (!json_is_object(v)) {
        pcr_cfg_err_type(c, "object", v);
        return;
    }
    size_t n = json_object_size(v);
    if (n + 1 > PCR_MAX_TENANTS) {
        pcr_cfg_err(c, "at most %d tenants, got %zu", PCR_MAX_TENANTS - 1, n);
        return;
    }
    pcr_tenant_conf_t *t = calloc(n + 1, sizeof *t);
    if (t == NULL) {
        c->nomem = 1;
        return;
    }
    for (size_t i = 0; i < cfg->ntenants; i++)
        free(cfg->tenants[i].name);
    free(cfg->tenants);
    cfg->tenants = t;
    cfg->ntenants = 1;
    cfg->pod_priorities = 0;
    tenant_default(c, &t[0], "default");
    const char *name;
    json_t *el;
    json_object_foreach((json_t *)v, name, el) {
        size_t mark = pcr_cfg_path_push_key(&c->path, name);
        size_t len = strlen(name);
        pcr_tenant_conf_t *dst = strcmp(name, "default") == 0 ? &t[0] : &t[cfg->ntenants++];
        if (dst != &t[0])
            tenant_default(c, dst, name);
        if (len == 0 || len > PCR_TENANT_NAME_MAX ||
            strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != len)
            pcr_cfg_err_key(c, "a tenant's name is 1 to %d letters, digits or \"-_.\" (it is a "
                               "metrics label)", PCR_TENANT_NAME_MAX);
        if (!json_is_object(el))
            pcr_cfg_err_type(c, "object", el);
        else
            read_fields(c, el, dst, tenant_fields, PCR_ARRAY_SIZE(tenant_fields));
        /* Absent and 0 differ: a pod without priority scheduling refuses any priority but 0,
         * and one that has it is sent nothing for a tenant that sets none. */
        dst->has_pod_priority = json_is_object(el) && json_object_get(el, "pod_priority");
        if (dst->has_pod_priority)
            cfg->pod_priorities = 1;
        pcr_cfg_path_pop(&c->path, mark);
    }
}

/* The index of tenant `name` in cfg->tenants, or -1. */
static int tenant_index(const pcr_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->ntenants; i++)
        if (strcmp(cfg->tenants[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* Reads one value `v` of field `f` into the struct at `base`; the path names `v`. */
static void read_field(pcr_cfg_ctx_t *c, void *base, const field_t *f, const json_t *v)
{
    void *slot = (char *)base + f->offset;
    const char *s;
    char q[PCR_CFG_QBUF];

    switch (f->type) {
    case FT_UINT:
    case FT_SIZE:
    case FT_U64:
    case FT_INT:
        read_integer(c, slot, f, v);
        break;
    case FT_MEMORY:
        read_memory(c, slot, f, v);
        break;
    case FT_HEADER_NAME:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        if (s[0] != '\0' && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789!#$%&'*+-.^_`|~") != strlen(s)) {
            pcr_cfg_err(c, "expected an HTTP header name, got %s", pcr_cfg_quote(q, sizeof q, s));
        } else if (set_string(c, (char **)slot, s) == 0) {
            for (char *p = *(char **)slot; *p; p++)
                *p = (char)tolower((unsigned char)*p);
        }
        break;
    case FT_SHA256:
        read_sha256(c, slot, v);
        break;
    case FT_AUTH:
        if (!json_is_object(v)) {
            pcr_cfg_err_type(c, "object", v);
            break;
        }
        ((pcr_auth_conf_t *)slot)->enabled = 1;
        read_fields(c, v, slot, auth_fields, PCR_ARRAY_SIZE(auth_fields));
        break;
    case FT_KEYS: {
        pcr_auth_conf_t *a = base;
        a->keys = read_object_array(c, v, "key", sizeof *a->keys, key_fields,
                                    PCR_ARRAY_SIZE(key_fields), NULL, &a->nkeys);
        break;
    }
    case FT_TENANTS:
        read_tenants(c, base, v);
        break;
    case FT_DOUBLE:
        if (!json_is_number(v)) {
            pcr_cfg_err_type(c, "number", v);
        } else if (json_number_value(v) < f->dmin || json_number_value(v) > f->dmax) {
            if (isinf(f->dmax))
                pcr_cfg_err(c, "must be >= %g, got %g", f->dmin, json_number_value(v));
            else
                pcr_cfg_err(c, "must be between %g and %g, got %g", f->dmin, f->dmax,
                            json_number_value(v));
        } else {
            *(double *)slot = json_number_value(v);
        }
        break;
    case FT_BOOL:
        if (!json_is_boolean(v))
            pcr_cfg_err_type(c, "boolean", v);
        else
            *(int *)slot = json_is_true(v);
        break;
    case FT_STRING:
        if ((s = get_text(c, v, f->flags)) != NULL)
            set_string(c, slot, s);
        break;
    case FT_FILE:
        if ((s = get_text(c, v, f->flags)) == NULL)
            break;
        /* Checked now so a bad path stops the start with a clear error, not a TLS failure
         * later; relative paths are relative to the working directory, as the process opens them. */
        if (access(s, R_OK) != 0)
            pcr_cfg_err(c, "cannot read %s: %s", pcr_cfg_quote(q, sizeof q, s), strerror(errno));
        set_string(c, slot, s);
        break;
    case FT_POLICY:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        if (pcr_policy_kind_parse(s, slot) != 0) {
            char names[256];
            size_t o = 0;
            for (int k = 0; k < 16 && strcmp(pcr_policy_kind_name(k), "unknown") != 0; k++)
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", k ? ", " : "",
                                      pcr_policy_kind_name(k));
            pcr_cfg_err(c, "unknown policy %s; expected one of %s", pcr_cfg_quote(q, sizeof q, s),
                        names);
        }
        break;
    case FT_LOG_LEVEL:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        for (size_t k = 0; k < PCR_ARRAY_SIZE(log_level_names); k++) {
            if (strcmp(s, log_level_names[k]) == 0) {
                *(pcr_log_level_t *)slot = (pcr_log_level_t)k;
                return;
            }
        }
        pcr_cfg_err(c, "unknown log level %s; expected one of error, warn, info, debug",
                    pcr_cfg_quote(q, sizeof q, s));
        break;
    case FT_ROLE:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        for (size_t k = 0; k < PCR_ARRAY_SIZE(role_names); k++) {
            if (strcmp(s, role_names[k]) == 0) {
                *(pcr_role_t *)slot = (pcr_role_t)k;
                return;
            }
        }
        pcr_cfg_err(c, "unknown role %s; expected one of prefill, decode, both",
                    pcr_cfg_quote(q, sizeof q, s));
        break;
    case FT_PD_MODE:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        for (size_t k = 0; k < PCR_ARRAY_SIZE(pd_mode_names); k++) {
            if (strcmp(s, pd_mode_names[k]) == 0) {
                *(pcr_pd_mode_t *)slot = (pcr_pd_mode_t)k;
                return;
            }
        }
        pcr_cfg_err(c, "unknown mode %s; expected one of auto, always, never",
                    pcr_cfg_quote(q, sizeof q, s));
        break;
    case FT_LOG_FORMAT:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        for (size_t k = 0; k < PCR_ARRAY_SIZE(access_format_names); k++) {
            if (strcmp(s, access_format_names[k]) == 0) {
                *(pcr_access_format_t *)slot = (pcr_access_format_t)k;
                return;
            }
        }
        pcr_cfg_err(c, "unknown access log format %s; expected one of text, json",
                    pcr_cfg_quote(q, sizeof q, s));
        break;
    case FT_HTTP_PATH:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        /* It goes into a request line as is: no space, no control character, nothing to encode. */
        if (s[0] != '/' || strpbrk(s, " #") != NULL)
            pcr_cfg_err(c, "expected a request path such as \"/health\", got %s",
                        pcr_cfg_quote(q, sizeof q, s));
        else
            set_string(c, slot, s);
        break;
    case FT_ADDRESS: {
        pcr_listen_conf_t *l = base;
        const char *why;
        if (!json_is_string(v)) {
            pcr_cfg_err_type(c, "string", v);
            break;
        }
        s = json_string_value(v);
        if ((why = pcr_cfg_parse_listen_address(s, &l->addr, &l->addrlen)) != NULL) {
            l->addrlen = 0;
            pcr_cfg_err(c, "expected \"IP:PORT\" or \"[IPv6]:PORT\", got %s: %s",
                        pcr_cfg_quote(q, sizeof q, s), why);
        }
        set_string(c, &l->address, s);
        break;
    }
    case FT_TLS:
        if (!json_is_object(v)) {
            pcr_cfg_err_type(c, "object", v);
            break;
        }
        ((pcr_listen_conf_t *)base)->tls = 1;
        read_fields(c, v, base, tls_fields, PCR_ARRAY_SIZE(tls_fields));
        break;
    case FT_URL: {
        pcr_backend_conf_t *b = base;
        const char *why;
        if (!json_is_string(v)) {
            pcr_cfg_err_type(c, "string", v);
            break;
        }
        s = json_string_value(v);
        free(b->host);
        b->host = NULL;
        why = pcr_cfg_parse_url(s, &b->host, &b->port, &b->tls.enabled);
        if (why != NULL)
            pcr_cfg_err(c, "expected \"http://host:port\" or \"https://host:port\", got %s%s%s",
                        pcr_cfg_quote(q, sizeof q, s), why[0] ? ": " : "", why);
        set_string(c, &b->url, s);
        break;
    }
    case FT_MODELS:
        read_models(c, base, v);
        break;
    case FT_REDIS:
        if (!json_is_object(v)) {
            pcr_cfg_err_type(c, "object", v);
            break;
        }
        ((pcr_redis_conf_t *)slot)->enabled = 1;
        read_fields(c, v, slot, redis_fields, PCR_ARRAY_SIZE(redis_fields));
        break;
    case FT_REDIS_URL: {
        pcr_redis_conf_t *r = base;
        const char *why;
        if ((s = get_text(c, v, F_NONEMPTY)) == NULL)
            break;
        free(r->host);
        free(r->user);
        free(r->password);
        why = pcr_cfg_parse_redis_url(s, &r->host, &r->port, &r->user, &r->password, &r->db);
        /* The password is left out of the message: it may be right but for one character. */
        if (why != NULL)
            pcr_cfg_err(c, "expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\"%s%s",
                        why[0] ? ": " : "", why);
        set_string(c, &r->url, s);
        break;
    }
    case FT_KEY_PREFIX:
        if ((s = get_text(c, v, F_NONEMPTY)) == NULL)
            break;
        if (strlen(s) > 100 || strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_.:{}") != strlen(s))
            pcr_cfg_err(c, "expected up to 100 letters, digits or \"-_.:{}\", got %s",
                        pcr_cfg_quote(q, sizeof q, s));
        else
            set_string(c, slot, s);
        break;
    case FT_HOSTNAME: {
        const char *why;
        if ((s = get_text(c, v, f->flags)) == NULL)
            break;
        if ((why = hostname_problem(s)) != NULL)
            pcr_cfg_err(c, "expected a DNS name, got %s: %s", pcr_cfg_quote(q, sizeof q, s), why);
        else
            set_string(c, (char **)slot, s);
        break;
    }
    case FT_NAMESERVERS:
        read_nameservers(c, base, v);
        break;
    case FT_CHOICE: {
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        char names[256];
        size_t o = 0;
        for (size_t k = 0; k < f->nnames; k++) {
            if (strcmp(s, f->names[k]) == 0) {
                *(int *)slot = (int)k;
                return;
            }
            o += (size_t)snprintf(names + o, sizeof names - o, "%s\"%s\"", k ? ", " : "",
                                  f->names[k]);
        }
        pcr_cfg_err(c, "unknown value %s; expected one of %s", pcr_cfg_quote(q, sizeof q, s),
                    names);
        break;
    }
    case FT_ZMQ: {
        if ((s = get_text(c, v, F_NONEMPTY)) == NULL)
            break;
        /* "tcp://HOST:PORT": the host and port read as a backend URL's, the port required. */
        char url[300], *host = NULL;
        uint16_t port = 0;
        int tls = 0;
        const char *why = strncmp(s, "tcp://", 6) != 0 ? "it must start with tcp://" : NULL;
        if (why == NULL && (strlen(s) > 256 || strrchr(s, ':') == s + 3 ||
                            strrchr(s, ']') > strrchr(s, ':')))
            why = "the port is missing";
        if (why == NULL) {
            snprintf(url, sizeof url, "http://%s", s + 6);
            why = pcr_cfg_parse_url(url, &host, &port, &tls);
            free(host);
            if (why != NULL && why[0] == '\0')
                why = "not HOST:PORT";
        }
        if (why != NULL)
            pcr_cfg_err(c, "expected \"tcp://HOST:PORT\", got %s: %s",
                        pcr_cfg_quote(q, sizeof q, s), why);
        else
            set_string(c, (char **)slot, s);
        break;
    }
    case FT_OBJECT:
        if (!json_is_object(v))
            pcr_cfg_err_type(c, "object", v);
        else
            read_fields(c, v, base, f->sub, f->nsub);
        break;
    case FT_DISCOVERY:
        read_discovery(c, base, v);
        break;
    case FT_UPSTREAM_TLS: {
        pcr_upstream_tls_conf_t *t = slot;
        if (!json_is_object(v)) {
            pcr_cfg_err_type(c, "object", v);
            break;
        }
        t->given = 1;
        read_fields(c, v, t, upstream_tls_fields, PCR_ARRAY_SIZE(upstream_tls_fields));
        if ((t->cert == NULL) != (t->key == NULL))
            pcr_cfg_err(c, "\"cert\" and \"key\" go together: a client certificate needs its key");
        break;
    }
    case FT_SECTION:
        if (!json_is_object(v))
            pcr_cfg_err_type(c, "object", v);
        else
            read_fields(c, v, slot, f->sub, f->nsub);
        break;
    case FT_LISTENERS:
        read_listeners(c, base, v);
        break;
    case FT_BACKENDS:
        read_backends(c, base, v);
        break;
    }
}

static void read_fields(pcr_cfg_ctx_t *c, const json_t *obj, void *base, const field_t *f, size_t n)
{
    check_keys(c, obj, f, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_object_get(obj, f[i].key);
        if (v == NULL) {
            if (f[i].flags & F_REQUIRED)
                pcr_cfg_err(c, "missing required key \"%s\"", f[i].key);
            continue;
        }
        size_t mark = pcr_cfg_path_push_key(&c->path, f[i].key);
        read_field(c, base, &f[i], v);
        pcr_cfg_path_pop(&c->path, mark);
    }
}

static pcr_config_t *config_new(pcr_cfg_ctx_t *c, const char *name)
{
    pcr_config_t *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        c->nomem = 1;
        return NULL;
    }
    /* The routing defaults are the library's own, so the two can never drift apart. */
    pcr_policy_opts_t po;
    pcr_policy_opts_default(&po);
    cfg->io_uring = 1;
    cfg->batch_wait_us = 25;
    cfg->batch_wait_busy = 0.5;
    cfg->routing = (pcr_routing_conf_t){
        .policy = po.kind, .block_bytes = po.block_bytes, .max_prefix_bytes = po.max_prefix_bytes,
        .index_max_bytes = po.index_max_bytes, .load_factor = po.load_factor,
        .load_weight = po.load_weight, .zone_penalty = po.zone_penalty, .vnodes = po.vnodes,
        .unavailable_keep_ms = (unsigned)(po.unavailable_keep / 1000), .feedback = 1,
        .hold_tokens = PCR_HOLD_TOKENS_DEFAULT, .index_events = po.index_events,
        .tokenize_timeout_ms = 100, .tokenize_cache_entries = 4096, .tokenize_reuse_prefix = 1,
        .tokenize_cache_bytes = 8u << 20,
        .tokenize_max_bytes = (size_t)4 << 20, .kv_block_tokens = po.kv_block_tokens,
    };
    cfg->limits = (pcr_limits_conf_t){
        .max_body_bytes = 33554432, .max_header_bytes = 16384, .max_concurrent_streams = 256,
        .max_client_connections = 10000, .max_buffered_body_bytes = (size_t)512 << 20,
        .max_response_buffer_bytes = (size_t)1 << 20,
        .max_buffered_response_bytes = (size_t)256 << 20, .max_memory_bytes = PCR_MEMORY_AUTO,
    };
    cfg->timeouts = (pcr_timeouts_conf_t){
        .connect_ms = 2000, .response_ms = 600000, .stream_idle_ms = 300000,
        .upstream_keepalive_ms = 60000, .client_idle_ms = 120000, .drain_ms = 30000,
        .request_header_ms = 10000, .client_write_ms = 30000,
    };
    cfg->upstream = (pcr_upstream_conf_t){ .max_connections = 256, .retries = 1,
                                         .light_reserve_pct = PCR_LIGHT_RESERVE_PCT_DEFAULT };
    cfg->health = (pcr_health_conf_t){ .interval_ms = 2000, .timeout_ms = 1000, .fall = 2, .rise = 1 };
    cfg->scrape = (pcr_scrape_conf_t){ .interval_ms = 200, .timeout_ms = 1000,
                                       .models_interval_ms = 10000, .models_timeout_ms = 5000 };
    cfg->dns = (pcr_dns_conf_t){ .timeout_ms = 2000 };
    cfg->outlier = (pcr_outlier_conf_t){ .consecutive_errors = 5, .consecutive_connect_errors = 2,
                                         .ejection_ms = 1000, .max_ejection_ms = 30000,
                                         .probe_ms = 100 };
    cfg->log = (pcr_log_conf_t){ .level = PCR_LOG_INFO, .access_log = 1 };
    cfg->redis = (pcr_redis_conf_t){
        .port = 6379, .flush_ms = 1, .batch_max_bytes = 262144, .stream_maxlen = 2000,
        .snapshot_interval_ms = 30000, .snapshot_ttl_ms = 600000,
        .snapshot_max_bytes = (size_t)16 << 20, .ready_timeout_ms = 5000, .timeout_ms = 2000,
        .reconnect_min_ms = 100, .reconnect_max_ms = 5000, .max_pending_bytes = (size_t)8 << 20,
    };
    pcr_pd_opts_default(&cfg->pd);
    cfg->flow_control = (pcr_flow_conf_t){
        .max_queue_requests = 1000, .max_queue_bytes = (uint64_t)64 << 20, .ttl_ms = 30000,
        .output_weight = 2, .queue_threshold = 5, .kv_threshold = 0.8, .tick_ms = 5,
    };
    cfg->tenants = calloc(1, sizeof *cfg->tenants);
    if (cfg->tenants == NULL)
        c->nomem = 1;
    else {
        cfg->ntenants = 1;
        tenant_default(c, &cfg->tenants[0], "default");
    }
    set_string(c, &cfg->routing.session_header, "");
    set_string(c, &cfg->routing.tenant_header, "");
    set_string(c, &cfg->routing.objective_header, "");
    set_string(c, &cfg->redis.channel, "pcrouter");
    set_string(c, &cfg->path, name);
    set_string(c, &cfg->routing.zone, "");
    set_string(c, &cfg->health.path, "/health");
    set_string(c, &cfg->log.access_log_path, "");
    return cfg;
}

/* A prefill pod hands its KV blocks to a pod that decodes: prefill pods with no pod that
 * decodes (role "decode" or "both", backends and discovery entries alike) could answer no
 * request, a mistake to name at load rather than a 503 on every request. */
static void check_roles(pcr_cfg_ctx_t *c, const pcr_config_t *cfg)
{
    size_t first_prefill = SIZE_MAX, decoders = 0;
    int in_discovery = 0;
    for (size_t i = 0; i < cfg->nbackends; i++) {
        if (cfg->backends[i].role == PCR_ROLE_PREFILL && first_prefill == SIZE_MAX)
            first_prefill = i;
        decoders += cfg->backends[i].role != PCR_ROLE_PREFILL;
    }
    for (size_t i = 0; i < cfg->ndiscovery; i++) {
        if (cfg->discovery[i].tmpl.role == PCR_ROLE_PREFILL && first_prefill == SIZE_MAX) {
            first_prefill = i;
            in_discovery = 1;
        }
        decoders += cfg->discovery[i].tmpl.role != PCR_ROLE_PREFILL;
    }
    if (first_prefill == SIZE_MAX || decoders > 0)
        return;
    size_t mark = pcr_cfg_path_push_key(&c->path, in_discovery ? "discovery" : "backends");
    pcr_cfg_path_push_index(&c->path, first_prefill);
    pcr_cfg_path_push_key(&c->path, "role");
    pcr_cfg_err(c, "prefill pods need a pod that decodes: give at least one backend or "
                   "discovery entry the role \"decode\" or \"both\"");
    pcr_cfg_path_pop(&c->path, mark);
}

static void read_root(pcr_cfg_ctx_t *c, pcr_config_t *cfg, const json_t *root)
{
    if (!json_is_object(root)) {
        pcr_cfg_err_type(c, "object", root);
        return;
    }
    read_fields(c, root, cfg, root_fields, PCR_ARRAY_SIZE(root_fields));

    /* Checks across keys, once each key is known valid on its own. */
    const json_t *routing = json_object_get(root, "routing");
    if (json_is_object(routing) && json_object_get(routing, "max_prefix_bytes") != NULL &&
        cfg->routing.max_prefix_bytes < cfg->routing.block_bytes) {
        size_t mark = pcr_cfg_path_push_key(&c->path, "routing");
        pcr_cfg_path_push_key(&c->path, "max_prefix_bytes");
        pcr_cfg_err(c, "must be >= routing.block_bytes (%zu), got %zu", cfg->routing.block_bytes,
            cfg->routing.max_prefix_bytes);
        pcr_cfg_path_pop(&c->path, mark);
    }
    if (json_is_object(routing) && cfg->routing.index_events &&
        cfg->routing.policy != PCR_POLICY_CACHE_AWARE) {
        size_t mark = pcr_cfg_path_push_key(&c->path, "routing");
        pcr_cfg_path_push_key(&c->path, "index");
        pcr_cfg_err(c, "\"events\" needs routing.policy \"cache_aware\" (got \"%s\"): only it "
                       "keeps an index", pcr_policy_kind_name(cfg->routing.policy));
        pcr_cfg_path_pop(&c->path, mark);
    }
    /* One response's buffer larger than all of them together could never fill. */
    const json_t *limits = json_object_get(root, "limits");
    const pcr_limits_conf_t *lim = &cfg->limits;
    if (json_is_object(limits) && lim->max_response_buffer_bytes > lim->max_buffered_response_bytes) {
        size_t mark = pcr_cfg_path_push_key(&c->path, "limits");
        if (json_object_get(limits, "max_response_buffer_bytes") != NULL) {
            pcr_cfg_path_push_key(&c->path, "max_response_buffer_bytes");
            pcr_cfg_err(c, "must be <= limits.max_buffered_response_bytes (%zu), got %zu "
                           "(0 turns response buffering off)",
                        lim->max_buffered_response_bytes, lim->max_response_buffer_bytes);
        } else {
            pcr_cfg_path_push_key(&c->path, "max_buffered_response_bytes");
            pcr_cfg_err(c, "must be >= limits.max_response_buffer_bytes (%zu), got %zu "
                           "(set that to 0 to turn response buffering off)",
                        lim->max_response_buffer_bytes, lim->max_buffered_response_bytes);
        }
        pcr_cfg_path_pop(&c->path, mark);
    }
    const json_t *redis = json_object_get(root, "redis");
    if (cfg->redis.enabled && json_is_object(redis)) {
        const pcr_redis_conf_t *r = &cfg->redis;
        size_t mark = pcr_cfg_path_push_key(&c->path, "redis");
        const char *key = NULL;
        char msg[160] = "";
        if (r->reconnect_max_ms < r->reconnect_min_ms) {
            key = json_object_get(redis, "reconnect_max_ms") ? "reconnect_max_ms" : "reconnect_min_ms";
            snprintf(msg, sizeof msg, "reconnect_max_ms (%u) must be >= reconnect_min_ms (%u)",
                     r->reconnect_max_ms, r->reconnect_min_ms);
        } else if (r->snapshot_ttl_ms < r->snapshot_interval_ms) {
            key = json_object_get(redis, "snapshot_ttl_ms") ? "snapshot_ttl_ms" : "snapshot_interval_ms";
            snprintf(msg, sizeof msg, "snapshot_ttl_ms (%u) must be >= snapshot_interval_ms (%u)",
                     r->snapshot_ttl_ms, r->snapshot_interval_ms);
        } else if (r->max_pending_bytes < r->batch_max_bytes) {
            key = json_object_get(redis, "max_pending_bytes") ? "max_pending_bytes" : "batch_max_bytes";
            snprintf(msg, sizeof msg, "max_pending_bytes (%zu) must be >= batch_max_bytes (%zu)",
                     r->max_pending_bytes, r->batch_max_bytes);
        }
        if (key != NULL) {
            pcr_cfg_path_push_key(&c->path, key);
            pcr_cfg_err(c, "%s", msg);
        }
        pcr_cfg_path_pop(&c->path, mark);
        /* Replicas name the backends in what they exchange, in a byte of length. */
        for (size_t i = 0; i < cfg->nbackends; i++) {
            size_t len = cfg->backends[i].name != NULL ? strlen(cfg->backends[i].name) : 0;
            if (len <= PCR_BACKEND_NAME_MAX)
                continue;
            mark = pcr_cfg_path_push_key(&c->path, "backends");
            pcr_cfg_path_push_index(&c->path, i);
            pcr_cfg_path_push_key(&c->path, "name");
            pcr_cfg_err(c, "at most %d bytes with a \"redis\" section (replicas exchange it), "
                           "got %zu", PCR_BACKEND_NAME_MAX, len);
            pcr_cfg_path_pop(&c->path, mark);
        }
    }
    /* The admin listener is a listener too: it may not take a public one's address. */
    for (size_t j = 0; cfg->admin.addrlen != 0 && !listen_port_is_0(&cfg->admin) &&
                       j < cfg->nlisten; j++) {
        const pcr_listen_conf_t *o = &cfg->listen[j];
        if (o->addrlen == cfg->admin.addrlen &&
            memcmp(&o->addr, &cfg->admin.addr, o->addrlen) == 0) {
            char q[PCR_CFG_QBUF];
            size_t mark = pcr_cfg_path_push_key(&c->path, "admin");
            pcr_cfg_path_push_key(&c->path, "address");
            pcr_cfg_err(c, "admin address %s is also listen[%zu].address: the admin listener "
                           "needs an address of its own", pcr_cfg_quote(q, sizeof q, cfg->admin.address), j);
            pcr_cfg_path_pop(&c->path, mark);
            break;
        }
    }
    /* Each key names a tenant of "tenants" (or "default"). */
    for (size_t i = 0; i < cfg->auth.nkeys; i++) {
        pcr_key_conf_t *k = &cfg->auth.keys[i];
        int t = tenant_index(cfg, k->tenant != NULL ? k->tenant : "default");
        if (t >= 0) {
            k->tenant_index = (unsigned)t;
            continue;
        }
        char q[PCR_CFG_QBUF];
        size_t mark = pcr_cfg_path_push_key(&c->path, "auth");
        pcr_cfg_path_push_key(&c->path, "keys");
        pcr_cfg_path_push_index(&c->path, i);
        pcr_cfg_path_push_key(&c->path, "tenant");
        pcr_cfg_err(c, "no tenant %s in \"tenants\"", pcr_cfg_quote(q, sizeof q, k->tenant));
        pcr_cfg_path_pop(&c->path, mark);
    }
    for (size_t i = 0; i < cfg->nbackends; i++)
        if (cfg->backends[i].max_connections == 0)
            cfg->backends[i].max_connections = cfg->upstream.max_connections;
    for (size_t i = 0; i < cfg->ndiscovery; i++)
        if (cfg->discovery[i].tmpl.max_connections == 0)
            cfg->discovery[i].tmpl.max_connections = cfg->upstream.max_connections;
    if (json_object_get(root, "backends") == NULL && json_object_get(root, "discovery") == NULL)
        pcr_cfg_err(c, "missing required key \"backends\" (or \"discovery\"): at least one "
                       "backend or discovery entry is needed");
    check_roles(c, cfg);
}

static pcr_config_t *config_from_text(const char *text, size_t len, const char *name, char **errors)
{
    pcr_cfg_ctx_t c = { .name = name };
    json_error_t jerr;
    pcr_config_t *cfg = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);

    if (root == NULL) {
        pcr_cfg_err_at(&c, jerr.line, jerr.column, "%s", jerr.text);
        goto cleanup;
    }
    cfg = config_new(&c, name);
    if (cfg != NULL)
        read_root(&c, cfg, root);

cleanup:
    json_decref(root);
    if (pcr_cfg_ctx_finish(&c, text, len, errors)) {
        pcr_config_free(cfg);
        cfg = NULL;
    }
    return cfg;
}

pcr_config_t *pcr_config_parse(const char *text, const char *name, char **errors)
{
    if (errors != NULL)
        *errors = NULL;
    if (name == NULL)
        name = "(config)";
    if (text == NULL) {
        pcr_cfg_ctx_t c = { .name = name };
        pcr_cfg_err_at(&c, 0, 0, "no config text");
        pcr_cfg_ctx_finish(&c, NULL, 0, errors);
        return NULL;
    }
    return config_from_text(text, strlen(text), name, errors);
}

pcr_config_t *pcr_config_load(const char *path, char **errors)
{
    pcr_cfg_ctx_t c = { .name = path != NULL ? path : "(null)" };
    pcr_config_t *cfg = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    FILE *f = NULL;

    if (errors != NULL)
        *errors = NULL;
    if (path == NULL || (f = fopen(path, "rb")) == NULL) {
        pcr_cfg_err_at(&c, 0, 0, "cannot read: %s", strerror(path == NULL ? EINVAL : errno));
        goto cleanup;
    }
    for (;;) {
        if (len == cap) {
            int rc = pcr_grow(&buf, &cap, len + 1, 16384, CONFIG_MAX_FILE_BYTES + 1, NULL);
            if (rc != 0) {
                pcr_cfg_err_at(&c, 0, 0, "cannot read: %s", rc == PCR_ERR_TOO_LARGE
                               ? "larger than 16 MiB, surely not a config file" : strerror(ENOMEM));
                goto cleanup;
            }
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        pcr_cfg_err_at(&c, 0, 0, "cannot read: %s", strerror(errno));
        goto cleanup;
    }
    cfg = config_from_text(buf, len, path, errors);

cleanup:
    if (f != NULL)
        fclose(f);
    free(buf);
    if (cfg == NULL && c.nerrs + c.nomem > 0)
        pcr_cfg_ctx_finish(&c, NULL, 0, errors);
    else
        pcr_cfg_ctx_dispose(&c);
    return cfg;
}

void pcr_backend_conf_dispose(pcr_backend_conf_t *b)
{
    free(b->name);
    free(b->url);
    free(b->host);
    free(b->zone);
    free(b->tls.ca_file);
    free(b->tls.cert);
    free(b->tls.key);
    free(b->tls.server_name);
    free(b->kv_endpoint);
    free(b->kv_replay);
    for (size_t j = 0; j < b->nmodels; j++)
        free(b->models[j]);
    free(b->models);
    memset(b, 0, sizeof(*b));
}

static int copy_str(char **dst, const char *src)
{
    *dst = NULL;
    if (src == NULL)
        return 0;
    *dst = strdup(src);
    return *dst != NULL ? 0 : PCR_ERR_NOMEM;
}

int pcr_backend_conf_copy(pcr_backend_conf_t *dst, const pcr_backend_conf_t *src)
{
    *dst = *src;
    dst->name = dst->url = dst->host = dst->zone = dst->kv_endpoint = dst->kv_replay = NULL;
    dst->tls.ca_file = dst->tls.cert = dst->tls.key = dst->tls.server_name = NULL;
    dst->models = NULL;
    dst->nmodels = 0;
    int rc = copy_str(&dst->name, src->name) | copy_str(&dst->url, src->url) |
             copy_str(&dst->host, src->host) | copy_str(&dst->zone, src->zone) |
             copy_str(&dst->tls.ca_file, src->tls.ca_file) | copy_str(&dst->tls.cert, src->tls.cert) |
             copy_str(&dst->tls.key, src->tls.key) |
             copy_str(&dst->tls.server_name, src->tls.server_name) |
             copy_str(&dst->kv_endpoint, src->kv_endpoint) |
             copy_str(&dst->kv_replay, src->kv_replay);
    if (rc == 0 && src->nmodels > 0) {
        dst->models = calloc(src->nmodels, sizeof(char *));
        rc = dst->models != NULL ? 0 : PCR_ERR_NOMEM;
        for (size_t j = 0; rc == 0 && j < src->nmodels; j++, dst->nmodels++)
            rc = copy_str(&dst->models[j], src->models[j]);
    }
    if (rc != 0) {
        pcr_backend_conf_dispose(dst);
        return PCR_ERR_NOMEM;
    }
    return 0;
}

void pcr_redis_conf_dispose(pcr_redis_conf_t *r)
{
    free(r->url);
    free(r->host);
    free(r->user);
    free(r->password);
    free(r->channel);
    memset(r, 0, sizeof(*r));
}

int pcr_redis_conf_copy(pcr_redis_conf_t *dst, const pcr_redis_conf_t *src)
{
    *dst = *src;
    int rc = copy_str(&dst->url, src->url) | copy_str(&dst->host, src->host) |
             copy_str(&dst->user, src->user) | copy_str(&dst->password, src->password) |
             copy_str(&dst->channel, src->channel);
    if (rc != 0) {
        pcr_redis_conf_dispose(dst);
        return PCR_ERR_NOMEM;
    }
    return 0;
}

static int same_str(const char *a, const char *b)
{
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

int pcr_redis_conf_equal(const pcr_redis_conf_t *a, const pcr_redis_conf_t *b)
{
    /* url holds host, port, user, password and db: the parsed parts need no check of their own. */
    return a->enabled == b->enabled && same_str(a->url, b->url) &&
           same_str(a->channel, b->channel) && a->flush_ms == b->flush_ms &&
           a->batch_max_bytes == b->batch_max_bytes && a->stream_maxlen == b->stream_maxlen &&
           a->snapshot_interval_ms == b->snapshot_interval_ms &&
           a->snapshot_ttl_ms == b->snapshot_ttl_ms &&
           a->snapshot_max_bytes == b->snapshot_max_bytes &&
           a->ready_timeout_ms == b->ready_timeout_ms && a->timeout_ms == b->timeout_ms &&
           a->reconnect_min_ms == b->reconnect_min_ms && a->reconnect_max_ms == b->reconnect_max_ms &&
           a->max_pending_bytes == b->max_pending_bytes;
}

void pcr_config_free(pcr_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->nlisten; i++) {
        free(cfg->listen[i].address);
        free(cfg->listen[i].cert);
        free(cfg->listen[i].key);
    }
    free(cfg->listen);
    for (size_t i = 0; i < cfg->nbackends; i++)
        pcr_backend_conf_dispose(&cfg->backends[i]);
    free(cfg->backends);
    for (size_t i = 0; i < cfg->ndiscovery; i++) {
        pcr_backend_conf_dispose(&cfg->discovery[i].tmpl);
        free(cfg->discovery[i].dns);
    }
    free(cfg->discovery);
    for (size_t i = 0; i < cfg->dns.nnameservers; i++)
        free(cfg->dns.nameservers[i]);
    free(cfg->dns.nameservers);
    free(cfg->routing.zone);
    free(cfg->health.path);
    free(cfg->log.access_log_path);
    free(cfg->admin.address);
    pcr_redis_conf_dispose(&cfg->redis);
    for (size_t i = 0; i < cfg->auth.nkeys; i++)
        free(cfg->auth.keys[i].tenant);
    free(cfg->auth.keys);
    for (size_t i = 0; i < cfg->ntenants; i++)
        free(cfg->tenants[i].name);
    free(cfg->tenants);
    free(cfg->routing.session_header);
    free(cfg->routing.tenant_header);
    free(cfg->routing.objective_header);
    free(cfg->path);
    free(cfg);
}
