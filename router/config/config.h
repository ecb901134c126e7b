/* router/config/config.h: pcrouter's configuration as a plain C struct, and its one loader.
 *
 * All parsing of the config file lives in config.c (jansson, so every error carries the
 * file, line and column); the rest of the router only reads this struct. Every key has a
 * default, documented in conf/pcrouter.full.json. Durations are integers in milliseconds,
 * sizes integers in bytes (or tokens where the key says so). */
#ifndef PCR_ROUTER_CONFIG_H
#define PCR_ROUTER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "pcr/pd.h"
#include "pcr/policy.h"

/* The longest backend name with a "redis" section: replicas name the backends in what they
 * exchange (share_codec.h), in a byte of length. */
#define PCR_BACKEND_NAME_MAX 255

typedef struct {
    char *address;                 /* as written: "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8443" */
    struct sockaddr_storage addr;  /* resolved numerically, port included */
    socklen_t addrlen;
    int tls;                       /* 1 when a "tls" object is present */
    char *cert;                    /* PEM certificate chain file (tls only) */
    char *key;                     /* PEM private key file (tls only) */
} pcr_listen_conf_t;

/* TLS to a pod: a backend whose url is https://, or a discovery entry with a "tls" object. */
typedef struct {
    int enabled;
    int given;                     /* the "tls" object is present */
    char *ca_file;                 /* PEM CA certificates; NULL: the system's */
    char *cert;                    /* PEM client certificate chain (mutual TLS), with key */
    char *key;
    int verify;                    /* check the pod's certificate, default true */
    char *server_name;             /* SNI and the name verified; NULL: the url's host (or the
                                    * discovered address, checked against the IP SANs) */
} pcr_upstream_tls_conf_t;

typedef struct {
    char *name;                    /* unique, stable: it places the backend on the hash ring */
    char *url;                     /* "http://host:port" or "https://host:port" as written */
    char *host;                    /* host part of url, without brackets */
    uint16_t port;                 /* port of url (default 80, 443 for https) */
    pcr_upstream_tls_conf_t tls;   /* "tls" (with an https:// url) */
    char *zone;                    /* "" when absent */
    pcr_role_t role;               /* "prefill", "decode" or "both" (default) */
    unsigned weight;               /* ring weight, default 1, 1..1000 */
    uint64_t capacity_tokens;      /* KV cache capacity the index assumes; default 1048576 */
    unsigned max_connections;      /* upstream pool bound; default upstream.max_connections */
    char **models;                 /* models it serves; NULL/0 = any model (learned from /v1/models) */
    size_t nmodels;
    /* Precise mode: the pod's KV-event publisher, "tcp://HOST:PORT", and its replay socket
     * (NULL when none); a discovery entry gives ports instead (kv_port, kv_replay_port; 0 =
     * none), its backends' endpoints are made from their addresses. */
    char *kv_endpoint;
    char *kv_replay;
    unsigned kv_port, kv_replay_port;
} pcr_backend_conf_t;

/* discovery[]: one backend per address a DNS name resolves to (a Kubernetes headless Service),
 * named "ADDRESS:PORT" so that ring positions stay stable, re-resolved every interval_ms. The
 * settings every such backend gets are those of a backend (tmpl; no name or url). */
typedef struct {
    pcr_backend_conf_t tmpl;       /* first: zone, role, weight, capacity_tokens, max_connections, models */
    char *dns;                     /* the name to resolve */
    unsigned port;                 /* 1..65535 */
    unsigned interval_ms;          /* default 5000 */
} pcr_discovery_conf_t;

typedef struct {
    char **nameservers;            /* "IP" or "IP:PORT"; none: /etc/resolv.conf */
    size_t nnameservers;
    unsigned timeout_ms;           /* one query, default 2000 */
} pcr_dns_conf_t;

typedef struct {
    pcr_policy_kind_t policy;      /* "policy": default "cache_aware" */
    char *zone;                    /* the router's own zone, "" when absent */
    size_t block_bytes;            /* default 256, 16..65536 */
    size_t max_prefix_bytes;       /* default 1048576, >= block_bytes */
    size_t index_max_bytes;        /* default 268435456 (256 MiB) */
    double load_factor;            /* bounded-load c, default 1.25, >= 1.0 */
    double load_weight;            /* default 1, >= 0 */
    double zone_penalty;           /* tokens of prefill a zone change costs, default 2048, >= 0 */
    unsigned vnodes;               /* virtual nodes per unit of weight, default 160, 1..10000 */
    unsigned unavailable_keep_ms;  /* a pod down or ejected keeps its index entries this long,
                                      default 300000; a detected restart drops them at once */
    int feedback;                  /* default true: each pod's delivered cached tokens correct
                                      the index (pcr_policy_feedback) */
    uint64_t hold_tokens;          /* a pod's prefill queue, in uncached tokens, past which
                                      streams wait at the router (pcr/hold.h); default
                                      PCR_HOLD_TOKENS_DEFAULT, 0 = off */
    /* Precise mode (docs/PRECISE.md): "index": "approximate" (0, default) or "events" (1):
     * the pods' KV events are followed and requests keyed on their tokens. */
    int index_events;
    int tokenize_render;           /* "tokenize": "tokenize" (0, POST /tokenize, default) or
                                      "render" (1, the /render endpoints) */
    unsigned tokenize_timeout_ms;  /* a tokenization's deadline, default 100; past it the
                                      request is routed on the approximate key */
    unsigned tokenize_cache_entries; /* tokenizations kept (the process's), default 4096 */
    size_t tokenize_cache_bytes;   /* their blocks' bytes, default 8 MiB */
    size_t tokenize_max_bytes;     /* the longest tokenize answer read, default 4194304 */
    int tokenize_reuse_prefix;     /* a prompt that shares its text prefix with a cached one
                                      is routed on that one's token blocks without waiting,
                                      its own asked for in the background; default 1 */
    unsigned kv_block_tokens;      /* tokens per block of the pods (vLLM's --block-size), 16 */
    char *session_header;          /* keeps a conversation on its pod; "" (default): the body's
                                      "user" only */
    char *tenant_header;           /* names the tenant when no API key does (a trusted gateway
                                      in front); "" (default): none */
    char *objective_header;        /* names a tenants entry whose priority the request takes
                                      (llm-d's x-gateway-inference-objective); "": none */
} pcr_routing_conf_t;

/* Tenants (router/http/tenancy.c): who shares the pool, in what order, within what limits.
 * tenants[0] is always "default" (configured or not): requests with no known tenant. */
#define PCR_MAX_TENANTS 64
#define PCR_TENANT_NAME_MAX 63
typedef struct {
    char *name;                    /* letters, digits, "-_.", at most 63 bytes */
    int priority;                  /* higher first; negative is sheddable; default 0 */
    double weight;                 /* its share within its priority, default 1, > 0 */
    double requests_per_s;         /* 0 (default): no limit */
    uint64_t tokens_per_min;       /* prompt (bytes / 4) plus max_tokens; 0: no limit */
    unsigned max_concurrent;       /* requests at once; 0: no limit */
    int pod_priority;              /* the body's "priority" the pods get (vLLM's priority
                                      scheduling: lower first), when has_pod_priority */
    int has_pod_priority;          /* "pod_priority" is set; absent: the field is not sent */
    unsigned slot;                 /* its state in the process (pcr_server_t.tenants), set by
                                      whoever runs the config (pcr_tenancy_assign) */
} pcr_tenant_conf_t;

typedef struct {
    unsigned char sha256[32];      /* SHA-256 of the key; the key itself is never stored */
    char *tenant;                  /* as written; "default" when absent */
    unsigned tenant_index;         /* into pcr_config_t.tenants */
} pcr_key_conf_t;

typedef struct {
    int enabled;                   /* an "auth" section is present: every request needs a key */
    pcr_key_conf_t *keys;
    size_t nkeys;
} pcr_auth_conf_t;

/* Flow control: while the pool is saturated, requests wait in pcrouter (pcr/flowq.h). */
typedef struct {
    int enabled;                   /* default false */
    size_t max_queue_requests;     /* waiting per tenant per worker, default 1000 */
    uint64_t max_queue_bytes;      /* request bodies waiting per tenant per worker, default 64 MiB */
    unsigned ttl_ms;               /* longest wait, then 429; default 30000 */
    double output_weight;          /* an output token in the fairness counters, default 2 */
    double queue_threshold;        /* a pod's waiting requests that saturate it, default 5; 0 off */
    double kv_threshold;           /* a pod's KV-cache usage that saturates it, default 0.8; 0 off */
    unsigned inflight_per_pod;     /* requests in flight that saturate a pod, default 0 (off) */
    uint64_t prefill_per_pod;      /* prefill tokens sent and not at their first token that
                                      saturate a pod, default 0 (off) */
    unsigned tick_ms;              /* a worker looks at its queue this often while something
                                      waits (TTLs, room freed by other workers), default 5 */
} pcr_flow_conf_t;

typedef struct {
    size_t max_body_bytes;         /* default 33554432 (32 MiB); larger bodies get 413 */
    size_t max_header_bytes;       /* default 16384; larger request headers get 431 */
    unsigned max_concurrent_streams; /* HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, default 256 */
    unsigned max_client_connections; /* default 10000; at the limit the longest-waiting idle one goes */
    size_t max_buffered_body_bytes; /* all request bodies held at once, default 536870912 (512 MiB) */
    size_t max_response_buffer_bytes; /* a response held for a client slower than its pod, past
                                         the write watermark, default 1048576 (1 MiB); 0: none */
    size_t max_buffered_response_bytes; /* all of those at once, default 268435456 (256 MiB) */
    size_t max_memory_bytes;       /* the memory pcrouter accounts for, against which the
                                      overload actions start (router/memguard.c); 0: off;
                                      PCR_MEMORY_AUTO (default, "auto"): a share of the cgroup's
                                      memory.max, off without one */
} pcr_limits_conf_t;

/* limits.max_memory_bytes "auto": PCR_MEMORY_AUTO_SHARE of the cgroup v2 memory.max the process
 * runs under, read at start and at each reload; off (0) where none is set. */
#define PCR_MEMORY_AUTO SIZE_MAX
#define PCR_MEMORY_AUTO_SHARE 0.9
/* The smallest limit other than 0: below it the idle process alone would pass the thresholds. */
#define PCR_MEMORY_MIN ((size_t)1 << 20)

typedef struct {
    unsigned connect_ms;           /* upstream connect, default 2000 */
    unsigned response_ms;          /* upstream: request sent -> response headers, default 600000 */
    unsigned stream_idle_ms;       /* upstream: longest silence inside a response, default 300000 */
    unsigned upstream_keepalive_ms;/* idle pooled connection closed after, default 60000 */
    unsigned client_idle_ms;       /* idle client connection closed after, default 120000; a
                                      request body that stalls this long gets 408 */
    unsigned request_header_ms;    /* a request head (and a connection's handshake) must be complete
                                      within this, else 408 and close; default 10000 */
    unsigned client_write_ms;      /* a client that accepts no response bytes this long loses the
                                      stream (HTTP/2) or the connection (HTTP/1.1); default 30000 */
    unsigned drain_ms;             /* SIGTERM: longest wait for in-flight requests, default 30000 */
} pcr_timeouts_conf_t;

typedef struct {
    unsigned max_connections;      /* per backend default, default 256 */
    unsigned retries;              /* other backends tried before answering 502, default 1 */
    int request_usage;             /* ask pods for usage on streams whose clients did not (and
                                      drop that usage event before the client sees it); default
                                      false */
    unsigned light_reserve_pct;    /* of each pool's connections, kept for clients holding few
                                      (pcr/connshare.h); default 10, 0: none */
} pcr_upstream_conf_t;

typedef struct {
    unsigned interval_ms;          /* active health check period, default 2000; 0 disables */
    unsigned timeout_ms;           /* default 1000 */
    char *path;                    /* default "/health" */
    unsigned fall;                 /* consecutive failures that mark a backend down, default 2 */
    unsigned rise;                 /* consecutive successes that mark it up again, default 1 */
} pcr_health_conf_t;

typedef struct {
    unsigned interval_ms;          /* the pods' /metrics, default 200; 0 disables */
    unsigned timeout_ms;           /* default 1000 */
    unsigned models_interval_ms;   /* GET /v1/models again, default 10000; 0: never */
    unsigned models_timeout_ms;    /* a client's GET /v1/models: the pods' answers, default 5000 */
} pcr_scrape_conf_t;

typedef struct {
    unsigned consecutive_errors;   /* 5xx, resets, timeouts in a row that eject, default 5; 0 off */
    unsigned consecutive_connect_errors; /* failed connects in a row that eject, default 2; 0 off */
    unsigned ejection_ms;          /* first ejection, default 1000; doubles at each in a row */
    unsigned max_ejection_ms;      /* default 30000 */
    unsigned probe_ms;             /* an ejected backend is probed this often, default 100 */
} pcr_outlier_conf_t;

typedef enum { PCR_LOG_ERROR = 0, PCR_LOG_WARN, PCR_LOG_INFO, PCR_LOG_DEBUG } pcr_log_level_t;

typedef enum { PCR_ACCESS_TEXT = 0, PCR_ACCESS_JSON } pcr_access_format_t;

typedef struct {
    pcr_log_level_t level;         /* "error" | "warn" | "info" (default) | "debug" */
    int access_log;                /* one line per request, default true */
    char *access_log_path;         /* the file it goes to; "" (default): stderr */
    pcr_access_format_t access_log_format; /* "text" (default) | "json" */
} pcr_log_conf_t;

/* Sharing the prefix index between replicas through Redis (router/share/share.c, docs/SHARING.md).
 * Off unless a "redis" section is present. */
typedef struct {
    int enabled;                   /* a "redis" section is present */
    char *url;                     /* "redis://[[user]:password@]host[:port][/db]" as written */
    char *host;                    /* host part of url, without brackets */
    uint16_t port;                 /* default 6379 */
    char *user;                    /* NULL when the url names none (AUTH password only) */
    char *password;                /* NULL when none; percent-decoded */
    unsigned db;                   /* SELECTed database, default 0 */
    char *channel;                 /* prefix of every key pcrouter uses, default "pcrouter" */
    unsigned flush_ms;             /* batches of updates sent at least this often, default 1 */
    size_t batch_max_bytes;        /* a batch is sent once this large, default 262144 */
    unsigned stream_maxlen;        /* entries the stream keeps (XADD MAXLEN ~), default 2000 */
    unsigned snapshot_interval_ms; /* own snapshot written this often, default 30000 */
    unsigned snapshot_ttl_ms;      /* a snapshot (and the stream) expires after, default 600000 */
    size_t snapshot_max_bytes;     /* bound on the snapshot, default 16777216 (16 MiB) */
    unsigned ready_timeout_ms;     /* /health says "loading" this long at most, default 5000 */
    unsigned timeout_ms;           /* connect and reply timeout, default 2000 */
    unsigned reconnect_min_ms;     /* first back-off after a failure, default 100 */
    unsigned reconnect_max_ms;     /* longest back-off, default 5000 */
    size_t max_pending_bytes;      /* updates sent and not acknowledged, default 8388608 */
} pcr_redis_conf_t;

typedef struct {
    char *path;                    /* the file it was read from */
    pcr_listen_conf_t *listen;     /* at least one */
    size_t nlisten;
    pcr_backend_conf_t *backends;  /* with discovery, at least one of the two */
    size_t nbackends;
    pcr_discovery_conf_t *discovery;
    size_t ndiscovery;
    pcr_dns_conf_t dns;
    unsigned workers;              /* event-loop threads; 0 (default) = one per core */
    int io_uring;                  /* batch each worker's socket calls through io_uring, default 1 */
    unsigned batch_wait_us;        /* a busy worker lets events gather this long, default 25 */
    double batch_wait_busy;        /* ... busy: this share of a core or more, default 0.5 */
    pcr_routing_conf_t routing;
    pcr_limits_conf_t limits;
    pcr_timeouts_conf_t timeouts;
    pcr_upstream_conf_t upstream;
    pcr_health_conf_t health;
    pcr_scrape_conf_t scrape;
    pcr_outlier_conf_t outlier;
    pcr_log_conf_t log;
    /* admin.address: /metrics and /health are served there, and no longer on the listeners
     * of `listen` (they answer 404). addrlen 0 when there is no admin listener. */
    pcr_listen_conf_t admin;
    pcr_redis_conf_t redis;
    /* pd: prefill/decode disaggregation (pcr/pd.h): used when some backend has a role of
     * prefill or decode; defaults are the library's. */
    pcr_pd_opts_t pd;
    pcr_auth_conf_t auth;
    pcr_tenant_conf_t *tenants;    /* [0] is "default" */
    size_t ntenants;
    int pod_priorities;            /* some tenant has pod_priority: pcrouter owns the body's
                                      "priority" (a client's own is never forwarded) */
    pcr_flow_conf_t flow_control;
} pcr_config_t;

/* Reads and validates `path`. On success returns a config (free with pcr_config_free).
 * On failure returns NULL and, when `errors` is not NULL, sets *errors to a heap string
 * (caller frees) holding every error found, one per line, each in the form
 *   FILE:LINE:COLUMN: KEY.PATH: message
 * e.g. "conf/x.json:7:15: backends[1].url: expected http://host:port, got \"ftp://a\"".
 * Errors of the file itself (missing, not JSON) use the same form with the key path "$". */
pcr_config_t *pcr_config_load(const char *path, char **errors);

/* Same, from a string; `name` stands for the file name in messages. */
pcr_config_t *pcr_config_parse(const char *text, const char *name, char **errors);

void pcr_config_free(pcr_config_t *cfg);  /* NULL is a no-op */

/* The policy options a config gives a process of `nworkers` workers: the workers' first
 * replicas and every reload's tune (config_policy.c). */
void pcr_config_policy_opts(const pcr_config_t *cfg, unsigned nworkers, pcr_policy_opts_t *o);

/* A deep copy of one backend's settings (a running backend outlives the config it came from),
 * and its release. 0 or PCR_ERR_NOMEM (then `dst` holds nothing). */
int pcr_backend_conf_copy(pcr_backend_conf_t *dst, const pcr_backend_conf_t *src);
void pcr_backend_conf_dispose(pcr_backend_conf_t *b);

/* The sharing keeps a deep copy of its settings, since a reload frees the config they came in:
 * 0 or PCR_ERR_NOMEM (dst then empty). Equal: 1 when a and b set up the same sharing. */
int pcr_redis_conf_copy(pcr_redis_conf_t *dst, const pcr_redis_conf_t *src);
void pcr_redis_conf_dispose(pcr_redis_conf_t *r);
int pcr_redis_conf_equal(const pcr_redis_conf_t *a, const pcr_redis_conf_t *b);

#endif
