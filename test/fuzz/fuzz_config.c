/* test/fuzz/fuzz_config.c: the config loader (router/config/config.c with jansson) on any bytes.
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour":
 *   - Exactly one of a config and an error text comes back; the same input gives the same
 *     answer twice.
 *   - A config accepted is sane (every backend has a name, a host and a port; names are
 *     unique; every range the loader promises holds) and round-trips: written back as JSON
 *     with every key set (jansson), it loads again into an equal config.
 *   - An error text is one error per line, each "fuzz.json:LINE:COL: KEY.PATH: message" with
 *     no control character, LINE and COL inside the text, sorted by position.
 * An input with a NUL byte goes through pcr_config_load (a file in memory) instead, which
 * reads every byte; pcr_config_parse takes a C string. */
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "config.h"
#include "fuzz.h"

#define NAME "fuzz.json"

static int has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F)
            return 1;
    return 0;
}

static void check_sane(const pcr_config_t *c, const char *name)
{
    FUZZ_CHECK(c->path != NULL && strcmp(c->path, name) == 0);
    FUZZ_CHECK(c->nlisten >= 1 && c->listen != NULL);
    for (size_t i = 0; i < c->nlisten; i++) {
        const pcr_listen_conf_t *l = &c->listen[i];
        FUZZ_CHECK(l->address != NULL && l->addrlen > 0);
        FUZZ_CHECK(l->addr.ss_family == AF_INET || l->addr.ss_family == AF_INET6);
        FUZZ_CHECK(!l->tls || (l->cert != NULL && l->key != NULL && l->cert[0] && l->key[0]));
    }
    FUZZ_CHECK(c->nbackends >= 1 && c->backends != NULL);
    for (size_t i = 0; i < c->nbackends; i++) {
        const pcr_backend_conf_t *b = &c->backends[i];
        FUZZ_CHECK(b->name != NULL && b->name[0] != '\0' && !has_control(b->name));
        FUZZ_CHECK(b->url != NULL && b->host != NULL && b->host[0] != '\0' && b->port >= 1);
        FUZZ_CHECK(b->zone != NULL && !has_control(b->zone));
        FUZZ_CHECK(b->weight >= 1 && b->weight <= 1000);
        FUZZ_CHECK(b->capacity_tokens >= 1);
        FUZZ_CHECK(b->max_connections >= 1 && b->max_connections <= 65535);
        FUZZ_CHECK((b->nmodels == 0) == (b->models == NULL));
        for (size_t m = 0; m < b->nmodels; m++)
            FUZZ_CHECK(b->models[m] != NULL && b->models[m][0] && !has_control(b->models[m]));
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECKF(strcmp(c->backends[j].name, b->name) != 0, "two backends named %s",
                        b->name);
    }
    const pcr_routing_conf_t *r = &c->routing;
    FUZZ_CHECK(strcmp(pcr_policy_kind_name(r->policy), "unknown") != 0);
    FUZZ_CHECK(r->zone != NULL);
    FUZZ_CHECK(r->block_bytes >= 16 && r->block_bytes <= 65536);
    FUZZ_CHECK(r->max_prefix_bytes >= r->block_bytes);
    FUZZ_CHECK(isfinite(r->load_factor) && r->load_factor >= 1.0);
    FUZZ_CHECK(isfinite(r->load_weight) && r->load_weight >= 0);
    FUZZ_CHECK(isfinite(r->zone_penalty) && r->zone_penalty >= 0);
    FUZZ_CHECK(r->vnodes >= 1 && r->vnodes <= 10000);
    FUZZ_CHECK(c->limits.max_body_bytes >= 1024 && c->limits.max_header_bytes >= 1024);
    FUZZ_CHECK(c->limits.max_concurrent_streams >= 1 && c->limits.max_client_connections >= 1);
    const pcr_timeouts_conf_t *t = &c->timeouts;
    FUZZ_CHECK(t->connect_ms && t->response_ms && t->stream_idle_ms && t->upstream_keepalive_ms &&
               t->client_idle_ms);
    FUZZ_CHECK(c->upstream.max_connections >= 1 && c->upstream.retries <= 16);
    FUZZ_CHECK(c->health.path != NULL && c->health.path[0] == '/');
    FUZZ_CHECK(c->health.timeout_ms >= 1 && c->health.fall >= 1 && c->health.rise >= 1);
    FUZZ_CHECK(c->log.level <= PCR_LOG_DEBUG && (c->log.access_log == 0 || c->log.access_log == 1));
}

/* ---- the round trip ---------------------------------------------------------------------- */

static const char *level_name(pcr_log_level_t l)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    return names[l];
}

/* Every key, written out: nothing is left to a default on the way back. */
static json_t *to_json(const pcr_config_t *c)
{
    json_t *listen = json_array(), *backends = json_array();
    for (size_t i = 0; i < c->nlisten; i++) {
        const pcr_listen_conf_t *l = &c->listen[i];
        json_t *o = json_pack("{s:s}", "address", l->address);
        if (l->tls)
            json_object_set_new(o, "tls", json_pack("{s:s, s:s}", "cert", l->cert, "key", l->key));
        json_array_append_new(listen, o);
    }
    for (size_t i = 0; i < c->nbackends; i++) {
        const pcr_backend_conf_t *b = &c->backends[i];
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I}", "name", b->name, "url", b->url,
                              "zone", b->zone, "weight", (json_int_t)b->weight,
                              "capacity_tokens", (json_int_t)b->capacity_tokens,
                              "max_connections", (json_int_t)b->max_connections);
        if (b->nmodels > 0) {
            json_t *models = json_array();
            for (size_t m = 0; m < b->nmodels; m++)
                json_array_append_new(models, json_string(b->models[m]));
            json_object_set_new(o, "models", models);
        }
        json_array_append_new(backends, o);
    }
    const pcr_routing_conf_t *r = &c->routing;
    const pcr_timeouts_conf_t *t = &c->timeouts;
    return json_pack(
        "{s:o, s:o,"
        " s:{s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:I},"
        " s:{s:I, s:I, s:I, s:I},"
        " s:{s:I, s:I, s:I, s:I, s:I, s:I},"
        " s:{s:I, s:I},"
        " s:{s:I, s:I, s:s, s:I, s:I},"
        " s:{s:s, s:b}}",
        "listen", listen, "backends", backends,
        "routing", "policy", pcr_policy_kind_name(r->policy), "zone", r->zone,
        "block_bytes", (json_int_t)r->block_bytes, "max_prefix_bytes", (json_int_t)r->max_prefix_bytes,
        "index_max_bytes", (json_int_t)r->index_max_bytes, "load_factor", r->load_factor,
        "load_weight", r->load_weight, "zone_penalty", r->zone_penalty,
        "vnodes", (json_int_t)r->vnodes,
        "limits", "max_body_bytes", (json_int_t)c->limits.max_body_bytes,
        "max_header_bytes", (json_int_t)c->limits.max_header_bytes,
        "max_concurrent_streams", (json_int_t)c->limits.max_concurrent_streams,
        "max_client_connections", (json_int_t)c->limits.max_client_connections,
        "timeouts", "connect_ms", (json_int_t)t->connect_ms, "response_ms", (json_int_t)t->response_ms,
        "stream_idle_ms", (json_int_t)t->stream_idle_ms,
        "upstream_keepalive_ms", (json_int_t)t->upstream_keepalive_ms,
        "client_idle_ms", (json_int_t)t->client_idle_ms, "drain_ms", (json_int_t)t->drain_ms,
        "upstream", "max_connections", (json_int_t)c->upstream.max_connections,
        "retries", (json_int_t)c->upstream.retries,
        "health", "interval_ms", (json_int_t)c->health.interval_ms,
        "timeout_ms", (json_int_t)c->health.timeout_ms, "path", c->health.path,
        "fall", (json_int_t)c->health.fall, "rise", (json_int_t)c->health.rise,
        "log", "level", level_name(c->log.level), "access_log", c->log.access_log);
}

#define SAME_STR(f) FUZZ_CHECKF(strcmp(a->f, b->f) == 0, #f ": \"%s\" then \"%s\"", a->f, b->f)
#define SAME(f) FUZZ_CHECKF(a->f == b->f, #f " changed on the way back")

static void check_equal(const pcr_config_t *a, const pcr_config_t *b)
{
    SAME(nlisten);
    for (size_t i = 0; i < a->nlisten; i++) {
        SAME_STR(listen[i].address);
        SAME(listen[i].addrlen);
        FUZZ_CHECK(memcmp(&a->listen[i].addr, &b->listen[i].addr, a->listen[i].addrlen) == 0);
        SAME(listen[i].tls);
        if (a->listen[i].tls) {
            SAME_STR(listen[i].cert);
            SAME_STR(listen[i].key);
        }
    }
    SAME(nbackends);
    for (size_t i = 0; i < a->nbackends; i++) {
        SAME_STR(backends[i].name);
        SAME_STR(backends[i].url);
        SAME_STR(backends[i].host);
        SAME(backends[i].port);
        SAME_STR(backends[i].zone);
        SAME(backends[i].weight);
        SAME(backends[i].capacity_tokens);
        SAME(backends[i].max_connections);
        SAME(backends[i].nmodels);
        for (size_t m = 0; m < a->backends[i].nmodels; m++)
            SAME_STR(backends[i].models[m]);
    }
    SAME(routing.policy);
    SAME_STR(routing.zone);
    SAME(routing.block_bytes);
    SAME(routing.max_prefix_bytes);
    SAME(routing.index_max_bytes);
    SAME(routing.load_factor);
    SAME(routing.load_weight);
    SAME(routing.zone_penalty);
    SAME(routing.vnodes);
    FUZZ_CHECK(memcmp(&a->limits, &b->limits, sizeof a->limits) == 0);
    FUZZ_CHECK(memcmp(&a->timeouts, &b->timeouts, sizeof a->timeouts) == 0);
    FUZZ_CHECK(memcmp(&a->upstream, &b->upstream, sizeof a->upstream) == 0);
    SAME(health.interval_ms);
    SAME(health.timeout_ms);
    SAME_STR(health.path);
    SAME(health.fall);
    SAME(health.rise);
    SAME(log.level);
    SAME(log.access_log);
}

static void check_round_trip(const pcr_config_t *cfg)
{
    json_t *j = to_json(cfg);
    FUZZ_CHECK(j != NULL);
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    json_decref(j);
    FUZZ_CHECK(text != NULL);
    char *errors = NULL;
    pcr_config_t *again = pcr_config_parse(text, NAME, &errors);
    FUZZ_CHECKF(again != NULL, "written back, the config fails:\n%s\n%s", text,
                errors ? errors : "");
    check_equal(cfg, again);
    pcr_config_free(again);
    free(text);
}

/* ---- the error text ---------------------------------------------------------------------- */

/* Length in bytes of 1-based line `n` of text[0..len), or -1 past the last line. */
static long line_length(const char *text, size_t len, long n)
{
    const char *end = text + len, *nl;
    for (long i = 1; i < n; i++) {
        if ((nl = memchr(text, '\n', (size_t)(end - text))) == NULL)
            return -1;
        text = nl + 1;
    }
    nl = memchr(text, '\n', (size_t)(end - text));
    return (long)((nl != NULL ? nl : end) - text);
}

static void check_errors(const char *errors, const char *name, const char *text, size_t tlen)
{
    size_t nlen = strlen(name);
    FUZZ_CHECK(errors != NULL && errors[0] != '\0');
    size_t len = strlen(errors);
    FUZZ_CHECKF(errors[len - 1] == '\n', "no final newline: %s", errors);
    long last_line = 0, last_col = 0;
    for (const char *p = errors; *p; ) {
        const char *eol = strchr(p, '\n');
        char line[4096];
        size_t n = (size_t)(eol - p);
        FUZZ_CHECKF(n < sizeof line, "an error line of %zu bytes", n);
        memcpy(line, p, n);
        line[n] = '\0';
        p = eol + 1;
        FUZZ_CHECKF(!has_control(line), "control character in: %s", line);
        FUZZ_CHECKF(strncmp(line, name, nlen) == 0 && line[nlen] == ':', "no file name: %s", line);
        char *s = line + nlen + 1, *end;
        long ln = strtol(s, &end, 10);
        FUZZ_CHECKF(end > s && *end == ':' && ln >= 0, "no line number: %s", line);
        s = end + 1;
        long col = strtol(s, &end, 10);
        FUZZ_CHECKF(end > s && end[0] == ':' && end[1] == ' ' && col >= 0, "no column: %s", line);
        s = end + 2;
        /* The key path is not always first-class: an unknown key is shown as written, and a
         * key may hold ": " itself. What must be there is a separator and a message. */
        char *sep = strstr(s, ": ");
        FUZZ_CHECKF(sep != NULL && sep[2] != '\0', "no key path or message: %s", line);
        /* Inside the text: a line that exists, a column at most one past its end. */
        if (ln > 0) {
            long ll = line_length(text, tlen, ln);
            FUZZ_CHECKF(ll >= 0, "line %ld is past the text: %s", ln, line);
            FUZZ_CHECKF(col <= ll + 1, "column %ld past line %ld of %ld bytes: %s", col, ln, ll,
                        line);
        }
        FUZZ_CHECKF(ln > last_line || (ln == last_line && col >= last_col),
                    "errors out of order at: %s", line);
        last_line = ln;
        last_col = col;
    }
}

/* With a NUL inside, the text is no C string: pcr_config_load, which hands the loader every
 * byte read, is the way in, through a file in memory. */
static void check_file(const uint8_t *data, size_t size)
{
    char path[64], *errors = NULL;
    int fd = memfd_create("fuzz.json", 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(write(fd, data, size) == (ssize_t)size);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    pcr_config_t *cfg = pcr_config_load(path, &errors);
    close(fd);
    FUZZ_CHECK((cfg == NULL) != (errors == NULL));
    if (cfg != NULL)
        check_sane(cfg, path);
    else
        check_errors(errors, path, (const char *)data, size);
    pcr_config_free(cfg);
    free(errors);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memchr(data, '\0', size) != NULL) {
        check_file(data, size);
        return 0;
    }
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';

    char *errors = NULL, *errors2 = NULL;
    pcr_config_t *cfg = pcr_config_parse(text, NAME, &errors);
    pcr_config_t *cfg2 = pcr_config_parse(text, NAME, &errors2);
    FUZZ_CHECK((cfg == NULL) != (errors == NULL));
    FUZZ_CHECK((cfg == NULL) == (cfg2 == NULL));
    if (cfg != NULL) {
        check_sane(cfg, NAME);
        check_equal(cfg, cfg2);
        check_round_trip(cfg);
    } else {
        FUZZ_CHECK(errors2 != NULL && strcmp(errors, errors2) == 0);
        check_errors(errors, NAME, text, size);
    }
    pcr_config_free(cfg);
    pcr_config_free(cfg2);
    free(errors);
    free(errors2);
    free(text);
    return 0;
}
