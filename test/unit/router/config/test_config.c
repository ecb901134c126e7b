/* test/unit/router/config/test_config.c: tests router/config/config.c, the config loader: the
 * example configs load, defaults and every key are read, and every error path gives its message
 * with the right file, line, column and key path.
 *
 * Configs are written with single quotes (turned into double quotes by J()) so that the
 * columns in the expected messages can be counted by eye on the source line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "config.h"
#include "pcr_test.h"

#ifndef PCR_SOURCE_ROOT
#error "PCR_SOURCE_ROOT must name the source tree (set by test/unit/router/meson.build)"
#endif

/* A heap copy of `tmpl` with every ' turned into ". */
static char *J(const char *tmpl)
{
    char *s = strdup(tmpl);
    for (char *p = s; *p; p++)
        if (*p == '\'')
            *p = '"';
    return s;
}

static pcr_config_t *parse(const char *tmpl, char **errors)
{
    char *text = J(tmpl);
    pcr_config_t *cfg = pcr_config_parse(text, "t.json", errors);
    free(text);
    return cfg;
}

/* Parses `tmpl`, which must fail, and returns all its errors (caller frees). */
static char *errors_of(const char *tmpl)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse(tmpl, &errors);
    PCR_CHECK(cfg == NULL);
    pcr_config_free(cfg);
    return errors;
}

/* The text must fail with exactly this one error line. */
#define CHECK_ERROR(tmpl, line) do { \
    char *e_ = errors_of(tmpl); \
    PCR_CHECK_STR(e_, line "\n"); \
    free(e_); } while (0)

/* The errors must hold this line among others. */
static int has_line(const char *errors, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = errors; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; s != NULL && *s; s++)
        n += *s == '\n';
    return n;
}

/* First lines shared by most error cases; the case's own lines start at line 3, column 1. */
#define HEAD "{'listen': [{'address': '127.0.0.1:0'}],\n" \
             "'backends': [{'name': 'a', 'url': 'http://127.0.0.1:1'}],\n"
#define LISTEN_OK "{'listen': [{'address': '127.0.0.1:0'}],\n"
#define BACKENDS_OK "'backends': [{'name': 'a', 'url': 'http://127.0.0.1:1'}]"

/* ---------------------------------------------------------------------------------------- */

/* limits.max_memory_bytes: "auto" (the default), 0 (off), or bytes. */
static void test_max_memory_bytes(void)
{
    static const struct { const char *text; size_t want; } cases[] = {
        {HEAD "'limits': {'max_memory_bytes': 'auto'}}", PCR_MEMORY_AUTO},
        {HEAD "'limits': {'max_memory_bytes': 0}}", 0},
        {HEAD "'limits': {'max_memory_bytes': 1048576}}", 1048576},
        {HEAD "'limits': {'max_memory_bytes': 4294967296}}", (size_t)4 << 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *errors = NULL;
        pcr_config_t *cfg = parse(cases[i].text, &errors);
        PCR_CHECK(cfg != NULL);
        if (errors != NULL)
            printf("# %s", errors);
        if (cfg != NULL)
            PCR_CHECK(cfg->limits.max_memory_bytes == cases[i].want);
        pcr_config_free(cfg);
        free(errors);
    }
}

static void test_example_configs_load(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = pcr_config_load(PCR_SOURCE_ROOT "/conf/pcrouter.json", &errors);
    PCR_CHECK(cfg != NULL);
    PCR_CHECK(errors == NULL);
    if (errors != NULL)
        printf("# %s", errors);
    if (cfg != NULL) {
        PCR_CHECK_EQ_INT(cfg->nlisten, 1);
        PCR_CHECK_STR(cfg->listen[0].address, "127.0.0.1:8080");
        PCR_CHECK_EQ_INT(cfg->nbackends, 4);
        for (size_t i = 0; i < cfg->nbackends && i < 4; i++) {
            char name[16];
            snprintf(name, sizeof name, "pod-%c", (char)('a' + i));
            PCR_CHECK_STR(cfg->backends[i].name, name);
            PCR_CHECK_STR(cfg->backends[i].host, "127.0.0.1");
            PCR_CHECK_EQ_INT(cfg->backends[i].port, 8001 + i);
            PCR_CHECK(cfg->backends[i].zone[0] != '\0');
        }
        PCR_CHECK_EQ_INT(cfg->routing.policy, PCR_POLICY_CACHE_AWARE);
        PCR_CHECK_STR(cfg->path, PCR_SOURCE_ROOT "/conf/pcrouter.json");
    }
    pcr_config_free(cfg);
    free(errors);

    errors = NULL;
    cfg = pcr_config_load(PCR_SOURCE_ROOT "/conf/minimal.json", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (cfg != NULL)
        PCR_CHECK(cfg->nlisten == 1 && cfg->nbackends == 1);
    pcr_config_free(cfg);
    free(errors);
}

/* pcrouter.full.json writes every default out: it must load into exactly what minimal.json
 * (which writes none) gets by default. */
static void test_full_config_is_the_defaults(void)
{
    char *errors = NULL;
    pcr_config_t *full = pcr_config_load(PCR_SOURCE_ROOT "/conf/pcrouter.full.json", &errors);
    pcr_config_t *min = pcr_config_load(PCR_SOURCE_ROOT "/conf/minimal.json", NULL);
    PCR_CHECK(full != NULL && min != NULL);
    if (errors != NULL)
        printf("# %s", errors);
    if (full != NULL && min != NULL) {
        PCR_CHECK(memcmp(&full->limits, &min->limits, sizeof full->limits) == 0);
        PCR_CHECK(memcmp(&full->timeouts, &min->timeouts, sizeof full->timeouts) == 0);
        PCR_CHECK(memcmp(&full->upstream, &min->upstream, sizeof full->upstream) == 0);
        PCR_CHECK(memcmp(&full->flow_control, &min->flow_control, sizeof full->flow_control) == 0);
        PCR_CHECK_EQ_INT(min->flow_control.enabled, 0);
        PCR_CHECK_STR(full->routing.session_header, min->routing.session_header);
        PCR_CHECK_STR(full->routing.tenant_header, min->routing.tenant_header);
        PCR_CHECK_STR(full->routing.objective_header, min->routing.objective_header);
        PCR_CHECK_EQ_INT(min->ntenants, 1);
        PCR_CHECK_STR(min->tenants[0].name, "default");
        PCR_CHECK_EQ_INT(min->auth.enabled, 0);
        PCR_CHECK_EQ_INT(full->routing.policy, min->routing.policy);
        PCR_CHECK_STR(full->routing.zone, min->routing.zone);
        PCR_CHECK_EQ_INT(full->routing.block_bytes, min->routing.block_bytes);
        PCR_CHECK_EQ_INT(full->routing.max_prefix_bytes, min->routing.max_prefix_bytes);
        PCR_CHECK_EQ_INT(full->routing.index_max_bytes, min->routing.index_max_bytes);
        PCR_CHECK(full->routing.load_factor == min->routing.load_factor);
        PCR_CHECK(full->routing.load_weight == min->routing.load_weight);
        PCR_CHECK(full->routing.zone_penalty == min->routing.zone_penalty);
        PCR_CHECK_EQ_INT(full->routing.vnodes, min->routing.vnodes);
        PCR_CHECK_EQ_INT(full->routing.unavailable_keep_ms, min->routing.unavailable_keep_ms);
        PCR_CHECK_EQ_INT(full->routing.feedback, min->routing.feedback);
        PCR_CHECK_EQ_U64(full->routing.hold_tokens, min->routing.hold_tokens);
        PCR_CHECK_EQ_U64(min->routing.hold_tokens, 20480);
        PCR_CHECK_EQ_INT(full->workers, min->workers);
        PCR_CHECK_EQ_INT(full->io_uring, min->io_uring);
        PCR_CHECK_EQ_INT(min->io_uring, 1);
        PCR_CHECK_EQ_INT(full->batch_wait_us, min->batch_wait_us);
        PCR_CHECK_EQ_INT(min->batch_wait_us, 25);
        PCR_CHECK(full->batch_wait_busy == min->batch_wait_busy);
        PCR_CHECK_EQ_INT(full->dns.nnameservers, min->dns.nnameservers);
        PCR_CHECK_EQ_INT(full->dns.timeout_ms, min->dns.timeout_ms);
        PCR_CHECK(memcmp(&full->scrape, &min->scrape, sizeof full->scrape) == 0);
        PCR_CHECK(memcmp(&full->outlier, &min->outlier, sizeof full->outlier) == 0);
        PCR_CHECK_EQ_INT(full->health.interval_ms, min->health.interval_ms);
        PCR_CHECK_EQ_INT(full->health.timeout_ms, min->health.timeout_ms);
        PCR_CHECK_STR(full->health.path, min->health.path);
        PCR_CHECK_EQ_INT(full->health.fall, min->health.fall);
        PCR_CHECK_EQ_INT(full->health.rise, min->health.rise);
        PCR_CHECK_EQ_INT(full->log.level, min->log.level);
        PCR_CHECK_EQ_INT(full->log.access_log, min->log.access_log);
        PCR_CHECK_STR(full->log.access_log_path, min->log.access_log_path);
        PCR_CHECK_EQ_INT(full->log.access_log_format, min->log.access_log_format);
        PCR_CHECK_EQ_INT(full->backends[0].weight, min->backends[0].weight);
        PCR_CHECK_EQ_U64(full->backends[0].capacity_tokens, min->backends[0].capacity_tokens);
        PCR_CHECK_EQ_INT(full->backends[0].max_connections, min->backends[0].max_connections);
        PCR_CHECK_STR(full->backends[0].zone, min->backends[0].zone);
        PCR_CHECK_EQ_INT(full->backends[0].role, min->backends[0].role);
        PCR_CHECK_EQ_INT(min->backends[0].role, PCR_ROLE_BOTH);
        PCR_CHECK(memcmp(&full->pd, &min->pd, sizeof full->pd) == 0);
        PCR_CHECK_EQ_INT(min->pd.mode, PCR_PD_AUTO);
        PCR_CHECK_EQ_U64(min->pd.min_uncached_tokens, 512);
        PCR_CHECK_EQ_INT(full->backends[0].nmodels, min->backends[0].nmodels);
        /* Sharing is off by default (no "redis" section); the full example shows the section
         * with an example url and every other key at its default. */
        PCR_CHECK_EQ_INT(min->redis.enabled, 0);
        PCR_CHECK_EQ_INT(full->redis.enabled, 1);
        const pcr_redis_conf_t *fr = &full->redis, *mr = &min->redis;
        PCR_CHECK_STR(fr->channel, mr->channel);
        PCR_CHECK_EQ_INT(fr->port, mr->port);
        PCR_CHECK_EQ_INT(fr->db, mr->db);
        PCR_CHECK_EQ_INT(fr->flush_ms, mr->flush_ms);
        PCR_CHECK_EQ_INT(fr->batch_max_bytes, mr->batch_max_bytes);
        PCR_CHECK_EQ_INT(fr->stream_maxlen, mr->stream_maxlen);
        PCR_CHECK_EQ_INT(fr->snapshot_interval_ms, mr->snapshot_interval_ms);
        PCR_CHECK_EQ_INT(fr->snapshot_ttl_ms, mr->snapshot_ttl_ms);
        PCR_CHECK_EQ_INT(fr->snapshot_max_bytes, mr->snapshot_max_bytes);
        PCR_CHECK_EQ_INT(fr->ready_timeout_ms, mr->ready_timeout_ms);
        PCR_CHECK_EQ_INT(fr->timeout_ms, mr->timeout_ms);
        PCR_CHECK_EQ_INT(fr->reconnect_min_ms, mr->reconnect_min_ms);
        PCR_CHECK_EQ_INT(fr->reconnect_max_ms, mr->reconnect_max_ms);
        PCR_CHECK_EQ_INT(fr->max_pending_bytes, mr->max_pending_bytes);
    }
    pcr_config_free(full);
    pcr_config_free(min);
    free(errors);
}

static void test_defaults(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse("{" "'listen': [{'address': '127.0.0.1:8080'}], " BACKENDS_OK "}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (cfg == NULL)
        return;
    const pcr_listen_conf_t *l = &cfg->listen[0];
    PCR_CHECK_EQ_INT(l->tls, 0);
    PCR_CHECK(l->cert == NULL && l->key == NULL);
    const pcr_backend_conf_t *b = &cfg->backends[0];
    PCR_CHECK_STR(b->zone, "");
    PCR_CHECK_EQ_INT(b->weight, 1);
    PCR_CHECK_EQ_U64(b->capacity_tokens, 1048576);
    PCR_CHECK_EQ_INT(b->max_connections, 256);
    PCR_CHECK(b->models == NULL && b->nmodels == 0);
    PCR_CHECK_EQ_INT(cfg->routing.policy, PCR_POLICY_CACHE_AWARE);
    PCR_CHECK_STR(cfg->routing.zone, "");
    PCR_CHECK_EQ_INT(cfg->routing.block_bytes, 256);
    PCR_CHECK_EQ_INT(cfg->routing.max_prefix_bytes, 1048576);
    PCR_CHECK_EQ_INT(cfg->routing.index_max_bytes, 268435456);
    PCR_CHECK(cfg->routing.load_factor == 1.25);
    PCR_CHECK(cfg->routing.load_weight == 1.0);
    PCR_CHECK(cfg->routing.zone_penalty == 2048);
    PCR_CHECK_EQ_INT(cfg->routing.vnodes, 160);
    PCR_CHECK_EQ_INT(cfg->limits.max_body_bytes, 33554432);
    PCR_CHECK_EQ_INT(cfg->limits.max_header_bytes, 16384);
    PCR_CHECK_EQ_INT(cfg->limits.max_concurrent_streams, 256);
    PCR_CHECK_EQ_INT(cfg->limits.max_client_connections, 10000);
    PCR_CHECK_EQ_INT(cfg->limits.max_response_buffer_bytes, 1048576);
    PCR_CHECK_EQ_INT(cfg->limits.max_buffered_response_bytes, 268435456);
    PCR_CHECK(cfg->limits.max_memory_bytes == PCR_MEMORY_AUTO);
    PCR_CHECK_EQ_INT(cfg->timeouts.connect_ms, 2000);
    PCR_CHECK_EQ_INT(cfg->timeouts.response_ms, 600000);
    PCR_CHECK_EQ_INT(cfg->timeouts.stream_idle_ms, 300000);
    PCR_CHECK_EQ_INT(cfg->timeouts.upstream_keepalive_ms, 60000);
    PCR_CHECK_EQ_INT(cfg->timeouts.client_idle_ms, 120000);
    PCR_CHECK_EQ_INT(cfg->timeouts.drain_ms, 30000);
    PCR_CHECK_EQ_INT(cfg->upstream.max_connections, 256);
    PCR_CHECK_EQ_INT(cfg->upstream.retries, 1);
    PCR_CHECK_EQ_INT(cfg->health.interval_ms, 2000);
    PCR_CHECK_EQ_INT(cfg->health.timeout_ms, 1000);
    PCR_CHECK_STR(cfg->health.path, "/health");
    PCR_CHECK_EQ_INT(cfg->health.fall, 2);
    PCR_CHECK_EQ_INT(cfg->health.rise, 1);
    PCR_CHECK_EQ_INT(cfg->upstream.request_usage, 0);
    PCR_CHECK_EQ_INT(cfg->log.level, PCR_LOG_INFO);
    PCR_CHECK_EQ_INT(cfg->log.access_log, 1);
    PCR_CHECK_STR(cfg->log.access_log_path, "");
    PCR_CHECK_EQ_INT(cfg->log.access_log_format, PCR_ACCESS_TEXT);
    PCR_CHECK(cfg->admin.address == NULL && cfg->admin.addrlen == 0);
    PCR_CHECK_EQ_INT(cfg->redis.enabled, 0);
    PCR_CHECK(cfg->redis.url == NULL && cfg->redis.host == NULL);
    PCR_CHECK_STR(cfg->redis.channel, "pcrouter");
    PCR_CHECK_EQ_INT(cfg->redis.flush_ms, 1);
    PCR_CHECK_EQ_INT(cfg->redis.batch_max_bytes, 262144);
    PCR_CHECK_EQ_INT(cfg->redis.stream_maxlen, 2000);
    PCR_CHECK_EQ_INT(cfg->redis.snapshot_interval_ms, 30000);
    PCR_CHECK_EQ_INT(cfg->redis.snapshot_ttl_ms, 600000);
    PCR_CHECK_EQ_INT(cfg->redis.snapshot_max_bytes, 16777216);
    PCR_CHECK_EQ_INT(cfg->redis.ready_timeout_ms, 5000);
    PCR_CHECK_EQ_INT(cfg->redis.timeout_ms, 2000);
    PCR_CHECK_EQ_INT(cfg->redis.reconnect_min_ms, 100);
    PCR_CHECK_EQ_INT(cfg->redis.reconnect_max_ms, 5000);
    PCR_CHECK_EQ_INT(cfg->redis.max_pending_bytes, 8388608);
    PCR_CHECK_STR(cfg->path, "t.json");
    pcr_config_free(cfg);
}

/* The redis section: every key read, the URL's parts, and its defaults when only the url is
 * given. */
static void test_redis_section(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse(HEAD "'redis': {'url': 'redis://127.0.0.1'}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (cfg != NULL) {
        PCR_CHECK_EQ_INT(cfg->redis.enabled, 1);
        PCR_CHECK_STR(cfg->redis.host, "127.0.0.1");
        PCR_CHECK_EQ_INT(cfg->redis.port, 6379);
        PCR_CHECK_EQ_INT(cfg->redis.db, 0);
        PCR_CHECK(cfg->redis.user == NULL && cfg->redis.password == NULL);
        PCR_CHECK_STR(cfg->redis.channel, "pcrouter");
    }
    pcr_config_free(cfg);
    free(errors);

    errors = NULL;
    cfg = parse(HEAD "'redis': {'url': 'redis://me:p%40ss%3Aw@[::1]:7000/3', 'channel': 'prod-a:{x}',\n"
                "'flush_ms': 7, 'batch_max_bytes': 8192, 'stream_maxlen': 50, 'snapshot_interval_ms': 200,\n"
                "'snapshot_ttl_ms': 9000, 'snapshot_max_bytes': 70000, 'ready_timeout_ms': 0,\n"
                "'timeout_ms': 300, 'reconnect_min_ms': 10, 'reconnect_max_ms': 20,\n"
                "'max_pending_bytes': 100000}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (errors != NULL)
        printf("# %s", errors);
    if (cfg != NULL) {
        const pcr_redis_conf_t *r = &cfg->redis;
        PCR_CHECK_STR(r->host, "::1");
        PCR_CHECK_EQ_INT(r->port, 7000);
        PCR_CHECK_EQ_INT(r->db, 3);
        PCR_CHECK_STR(r->user, "me");
        PCR_CHECK_STR(r->password, "p@ss:w");
        PCR_CHECK_STR(r->channel, "prod-a:{x}");
        PCR_CHECK_EQ_INT(r->flush_ms, 7);
        PCR_CHECK_EQ_INT(r->batch_max_bytes, 8192);
        PCR_CHECK_EQ_INT(r->stream_maxlen, 50);
        PCR_CHECK_EQ_INT(r->snapshot_interval_ms, 200);
        PCR_CHECK_EQ_INT(r->snapshot_ttl_ms, 9000);
        PCR_CHECK_EQ_INT(r->snapshot_max_bytes, 70000);
        PCR_CHECK_EQ_INT(r->ready_timeout_ms, 0);
        PCR_CHECK_EQ_INT(r->timeout_ms, 300);
        PCR_CHECK_EQ_INT(r->reconnect_min_ms, 10);
        PCR_CHECK_EQ_INT(r->reconnect_max_ms, 20);
        PCR_CHECK_EQ_INT(r->max_pending_bytes, 100000);
    }
    pcr_config_free(cfg);
    free(errors);

    /* A password alone (the classic AUTH), and a host name. */
    errors = NULL;
    cfg = parse(HEAD "'redis': {'url': 'redis://:secret@redis.llm.svc:6380/'}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (cfg != NULL) {
        PCR_CHECK(cfg->redis.user == NULL);
        PCR_CHECK_STR(cfg->redis.password, "secret");
        PCR_CHECK_STR(cfg->redis.host, "redis.llm.svc");
        PCR_CHECK_EQ_INT(cfg->redis.port, 6380);
    }
    pcr_config_free(cfg);
    free(errors);
}

static void test_error_redis(void)
{
    CHECK_ERROR(HEAD "'redis': {}}", "t.json:3:10: redis: missing required key \"url\"");
    CHECK_ERROR(HEAD "'redis': true}", "t.json:3:10: redis: expected object, got boolean true");
    CHECK_ERROR(HEAD "'redis': {'url': 'http://r:6379'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\"");
    CHECK_ERROR(HEAD "'redis': {'url': 'rediss://r:6379'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\": TLS is not "
                "supported (hiredis 0.14 has none): reach a TLS Redis through a local tunnel such as "
                "stunnel, and point redis:// at it");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r:0'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\": the port "
                "must be a number from 1 to 65535");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r/x'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\": the "
                "database must be a number from 0 to 65535");
    /* The password never appears in a message. */
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://hunter2@r'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\": the part "
                "before \"@\" must be \"[USER]:PASSWORD\"");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://:a%4@r'}}",
                "t.json:3:18: redis.url: expected \"redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]\": the "
                "password has a broken %-escape");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r', 'channel': 'a b'}}",
                "t.json:3:42: redis.channel: expected up to 100 letters, digits or \"-_.:{}\", got \"a b\"");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r', 'reconnect_min_ms': 50, 'reconnect_max_ms': 10}}",
                "t.json:3:75: redis.reconnect_max_ms: reconnect_max_ms (10) must be >= reconnect_min_ms (50)");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r', 'snapshot_interval_ms': 700000}}",
                "t.json:3:55: redis.snapshot_interval_ms: snapshot_ttl_ms (600000) must be >= "
                "snapshot_interval_ms (700000)");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r', 'batch_max_bytes': 9000000}}",
                "t.json:3:50: redis.batch_max_bytes: max_pending_bytes (8388608) must be >= "
                "batch_max_bytes (9000000)");
    CHECK_ERROR(HEAD "'redis': {'url': 'redis://r', 'flush_ms': 0}}",
                "t.json:3:43: redis.flush_ms: must be between 1 and 10000, got 0");

    /* Replicas exchange backend names in a byte of length: a longer name is fine alone, and
     * an error with a redis section. */
    char name[300], text[600];
    memset(name, 'n', 256);
    name[256] = '\0';
    snprintf(text, sizeof text, LISTEN_OK "'backends': [{'name': '%s', 'url': 'http://a'}]}", name);
    char *errors = NULL;
    pcr_config_t *cfg = parse(text, &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    pcr_config_free(cfg);
    free(errors);
    snprintf(text, sizeof text,
             LISTEN_OK "'backends': [{'name': '%s', 'url': 'http://a'}],\n'redis': {'url': 'redis://r'}}", name);
    char *e = errors_of(text);
    PCR_CHECK_STR(e, "t.json:2:23: backends[0].name: at most 255 bytes with a \"redis\" section "
                     "(replicas exchange it), got 256\n");
    free(e);
}

/* batch_wait_us: 0 turns the gathering off, a millisecond is the most a turn may wait. */
static void test_batch_wait_us_bounds(void)
{
    char *errors = NULL;
    pcr_config_t *off = parse(HEAD "'batch_wait_us': 0}", &errors);
    pcr_config_t *most = parse(HEAD "'batch_wait_us': 1000}", &errors);
    PCR_CHECK(off != NULL && most != NULL && errors == NULL);
    if (off != NULL && most != NULL) {
        PCR_CHECK_EQ_INT(off->batch_wait_us, 0);
        PCR_CHECK_EQ_INT(most->batch_wait_us, 1000);
    }
    pcr_config_free(off);
    pcr_config_free(most);
    CHECK_ERROR(HEAD "'batch_wait_us': 1001}",
                "t.json:3:18: batch_wait_us: must be between 0 and 1000, got 1001");
    CHECK_ERROR(HEAD "'batch_wait_us': -1}",
                "t.json:3:18: batch_wait_us: must be between 0 and 1000, got -1");
}

/* batch_wait_busy: a share of a core, half by default; 0 gathers whatever the load. */
static void test_batch_wait_busy_bounds(void)
{
    char *errors = NULL;
    pcr_config_t *dflt = parse(HEAD "'workers': 1}", &errors);
    pcr_config_t *off = parse(HEAD "'batch_wait_busy': 0}", &errors);
    pcr_config_t *most = parse(HEAD "'batch_wait_busy': 1}", &errors);
    PCR_CHECK(dflt != NULL && off != NULL && most != NULL && errors == NULL);
    if (dflt != NULL && off != NULL && most != NULL) {
        PCR_CHECK(dflt->batch_wait_busy == 0.5);
        PCR_CHECK(off->batch_wait_busy == 0.0);
        PCR_CHECK(most->batch_wait_busy == 1.0);
    }
    pcr_config_free(dflt);
    pcr_config_free(off);
    pcr_config_free(most);
    CHECK_ERROR(HEAD "'batch_wait_busy': 1.5}",
                "t.json:3:20: batch_wait_busy: must be between 0 and 1, got 1.5");
    CHECK_ERROR(HEAD "'batch_wait_busy': -0.1}",
                "t.json:3:20: batch_wait_busy: must be between 0 and 1, got -0.1");
    CHECK_ERROR(HEAD "'batch_wait_busy': '0.5'}",
                "t.json:3:20: batch_wait_busy: expected number, got string \"0.5\"");
}

/* The sharing keeps its own copy of its settings; a reload compares them. */
static void test_redis_conf_copy_and_equal(void)
{
    char *errors = NULL;
    pcr_config_t *a = parse(HEAD "'redis': {'url': 'redis://u:pw@r:7000/2', 'channel': 'x'}}", &errors);
    pcr_config_t *b = parse(HEAD "'redis': {'url': 'redis://u:pw@r:7000/2', 'channel': 'y'}}", &errors);
    pcr_config_t *off = parse(HEAD "'workers': 1}", &errors);
    PCR_CHECK(a != NULL && b != NULL && off != NULL && errors == NULL);
    if (a != NULL && b != NULL && off != NULL) {
        pcr_redis_conf_t c;
        PCR_CHECK_EQ_INT(pcr_redis_conf_copy(&c, &a->redis), 0);
        PCR_CHECK(c.url != a->redis.url && c.host != a->redis.host);
        PCR_CHECK_STR(c.password, "pw");
        PCR_CHECK(pcr_redis_conf_equal(&c, &a->redis));
        PCR_CHECK(!pcr_redis_conf_equal(&c, &b->redis));
        PCR_CHECK(!pcr_redis_conf_equal(&c, &off->redis));
        c.flush_ms++;
        PCR_CHECK(!pcr_redis_conf_equal(&c, &a->redis));
        pcr_redis_conf_dispose(&c);
        PCR_CHECK(c.url == NULL && c.channel == NULL);
        PCR_CHECK_EQ_INT(pcr_redis_conf_copy(&c, &off->redis), 0);
        PCR_CHECK(pcr_redis_conf_equal(&c, &off->redis) && c.url == NULL);
        pcr_redis_conf_dispose(&c);
    }
    pcr_config_free(a);
    pcr_config_free(b);
    pcr_config_free(off);
    free(errors);
}

/* Every key, set to a value other than its default, lands in its field. */
static void test_every_key_is_read(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse(
        "{'listen': [{'address': '127.0.0.1:8080'}],\n"
        " 'backends': [{'name': 'p', 'url': 'http://pod.local:9000/', 'zone': 'z1', 'weight': 3,\n"
        "               'capacity_tokens': 5000000000, 'max_connections': 7, 'models': ['m1', 'm2']},\n"
        "              {'name': 'q', 'url': 'http://[::1]', 'models': []}],\n"
        " 'routing': {'policy': 'least_loaded', 'zone': 'z1', 'block_bytes': 64, 'max_prefix_bytes': 64,\n"
        "             'index_max_bytes': 1048576, 'load_factor': 2, 'load_weight': 0.5,\n"
        "             'zone_penalty': 0, 'vnodes': 10},\n"
        " 'limits': {'max_body_bytes': 2048, 'max_header_bytes': 4096, 'max_concurrent_streams': 9,\n"
        "            'max_client_connections': 11},\n"
        " 'timeouts': {'connect_ms': 1, 'response_ms': 2, 'stream_idle_ms': 3,\n"
        "              'upstream_keepalive_ms': 4, 'client_idle_ms': 5, 'drain_ms': 0},\n"
        " 'upstream': {'max_connections': 12, 'retries': 0, 'request_usage': true},\n"
        " 'health': {'interval_ms': 0, 'timeout_ms': 13, 'path': '/ready?x=1', 'fall': 4, 'rise': 5},\n"
        " 'log': {'level': 'debug', 'access_log': false, 'access_log_path': '/tmp/a.log',\n"
        "         'access_log_format': 'json'},\n"
        " 'admin': {'address': '127.0.0.1:9090'}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (errors != NULL)
        printf("# %s", errors);
    free(errors);
    if (cfg == NULL)
        return;
    const pcr_backend_conf_t *p = &cfg->backends[0], *q = &cfg->backends[1];
    PCR_CHECK_STR(p->url, "http://pod.local:9000/");
    PCR_CHECK_STR(p->host, "pod.local");
    PCR_CHECK_EQ_INT(p->port, 9000);
    PCR_CHECK_STR(p->zone, "z1");
    PCR_CHECK_EQ_INT(p->weight, 3);
    PCR_CHECK_EQ_U64(p->capacity_tokens, 5000000000ull);
    PCR_CHECK_EQ_INT(p->max_connections, 7);
    PCR_CHECK_EQ_INT(p->nmodels, 2);
    if (p->nmodels == 2) {
        PCR_CHECK_STR(p->models[0], "m1");
        PCR_CHECK_STR(p->models[1], "m2");
    }
    PCR_CHECK_STR(q->host, "::1");
    PCR_CHECK_EQ_INT(q->port, 80);
    PCR_CHECK_EQ_INT(q->nmodels, 0);
    PCR_CHECK_EQ_INT(q->max_connections, 12);  /* from upstream.max_connections */
    PCR_CHECK_EQ_INT(cfg->routing.policy, PCR_POLICY_LEAST_LOADED);
    PCR_CHECK_STR(cfg->routing.zone, "z1");
    PCR_CHECK_EQ_INT(cfg->routing.block_bytes, 64);
    PCR_CHECK_EQ_INT(cfg->routing.max_prefix_bytes, 64);
    PCR_CHECK_EQ_INT(cfg->routing.index_max_bytes, 1048576);
    PCR_CHECK(cfg->routing.load_factor == 2.0);
    PCR_CHECK(cfg->routing.load_weight == 0.5);
    PCR_CHECK(cfg->routing.zone_penalty == 0.0);
    PCR_CHECK_EQ_INT(cfg->routing.vnodes, 10);
    PCR_CHECK_EQ_INT(cfg->limits.max_body_bytes, 2048);
    PCR_CHECK_EQ_INT(cfg->limits.max_header_bytes, 4096);
    PCR_CHECK_EQ_INT(cfg->limits.max_concurrent_streams, 9);
    PCR_CHECK_EQ_INT(cfg->limits.max_client_connections, 11);
    PCR_CHECK_EQ_INT(cfg->timeouts.connect_ms, 1);
    PCR_CHECK_EQ_INT(cfg->timeouts.response_ms, 2);
    PCR_CHECK_EQ_INT(cfg->timeouts.stream_idle_ms, 3);
    PCR_CHECK_EQ_INT(cfg->timeouts.upstream_keepalive_ms, 4);
    PCR_CHECK_EQ_INT(cfg->timeouts.client_idle_ms, 5);
    PCR_CHECK_EQ_INT(cfg->timeouts.drain_ms, 0);
    PCR_CHECK_EQ_INT(cfg->upstream.max_connections, 12);
    PCR_CHECK_EQ_INT(cfg->upstream.retries, 0);
    PCR_CHECK_EQ_INT(cfg->health.interval_ms, 0);
    PCR_CHECK_EQ_INT(cfg->health.timeout_ms, 13);
    PCR_CHECK_STR(cfg->health.path, "/ready?x=1");
    PCR_CHECK_EQ_INT(cfg->health.fall, 4);
    PCR_CHECK_EQ_INT(cfg->health.rise, 5);
    PCR_CHECK_EQ_INT(cfg->upstream.request_usage, 1);
    PCR_CHECK_EQ_INT(cfg->log.level, PCR_LOG_DEBUG);
    PCR_CHECK_EQ_INT(cfg->log.access_log, 0);
    PCR_CHECK_STR(cfg->log.access_log_path, "/tmp/a.log");
    PCR_CHECK_EQ_INT(cfg->log.access_log_format, PCR_ACCESS_JSON);
    PCR_CHECK_STR(cfg->admin.address, "127.0.0.1:9090");
    PCR_CHECK_EQ_INT(cfg->admin.addrlen, sizeof(struct sockaddr_in));
    PCR_CHECK_EQ_INT(ntohs(((const struct sockaddr_in *)&cfg->admin.addr)->sin_port), 9090);
    pcr_config_free(cfg);
}

static void test_listen_ipv6_and_port_0(void)
{
    pcr_config_t *cfg = parse("{'listen': [{'address': '[::1]:8443'}, {'address': '0.0.0.0:0'},\n"
                              "            {'address': '127.0.0.1:0'}, {'address': '127.0.0.1:0'}],\n"
                              BACKENDS_OK "}", NULL);
    PCR_CHECK(cfg != NULL);
    if (cfg == NULL)
        return;
    PCR_CHECK_EQ_INT(cfg->nlisten, 4);
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&cfg->listen[0].addr;
    PCR_CHECK_EQ_INT(a6->sin6_family, AF_INET6);
    PCR_CHECK_EQ_INT(ntohs(a6->sin6_port), 8443);
    PCR_CHECK(IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr));
    PCR_CHECK_EQ_INT(cfg->listen[0].addrlen, sizeof(struct sockaddr_in6));
    PCR_CHECK_STR(cfg->listen[0].address, "[::1]:8443");
    const struct sockaddr_in *a4 = (const struct sockaddr_in *)&cfg->listen[1].addr;
    PCR_CHECK_EQ_INT(a4->sin_family, AF_INET);
    PCR_CHECK_EQ_INT(a4->sin_port, 0);
    PCR_CHECK_EQ_INT(a4->sin_addr.s_addr, htonl(INADDR_ANY));
    PCR_CHECK_EQ_INT(cfg->listen[1].addrlen, sizeof(struct sockaddr_in));
    a4 = (const struct sockaddr_in *)&cfg->listen[2].addr;
    PCR_CHECK_EQ_INT(a4->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    pcr_config_free(cfg);
}

/* Makes a readable file for tls.cert / tls.key; returns its path (static storage). */
static const char *temp_file(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/pcr-test-config-XXXXXX");
    int fd = mkstemp(buf);
    PCR_CHECK(fd >= 0);
    if (fd >= 0) {
        PCR_CHECK(write(fd, "x\n", 2) == 2);
        close(fd);
    }
    return buf;
}

static void test_tls_listener(void)
{
    char cert[64], key[64], tmpl[512];
    temp_file(cert, sizeof cert);
    temp_file(key, sizeof key);
    snprintf(tmpl, sizeof tmpl, "{'listen': [{'address': '0.0.0.0:0', 'tls': {'cert': '%s', 'key': '%s'}}],\n"
             BACKENDS_OK "}", cert, key);
    char *errors = NULL;
    pcr_config_t *cfg = parse(tmpl, &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (cfg != NULL) {
        PCR_CHECK_EQ_INT(cfg->listen[0].tls, 1);
        PCR_CHECK_STR(cfg->listen[0].cert, cert);
        PCR_CHECK_STR(cfg->listen[0].key, key);
    }
    pcr_config_free(cfg);
    free(errors);

    /* The key file missing: the error names it, at the key's value. */
    unlink(key);
    snprintf(tmpl, sizeof tmpl, "{'listen': [{'address': '0.0.0.0:0', 'tls': {'cert': '%s',\n"
             "'key': '%s'}}],\n" BACKENDS_OK "}", cert, key);
    char *e = errors_of(tmpl);
    char want[256];
    snprintf(want, sizeof want, "t.json:2:8: listen[0].tls.key: cannot read \"%s\": No such file or directory", key);
    PCR_CHECK(has_line(e, want));
    PCR_CHECK_EQ_INT(count_lines(e), 1);
    free(e);
    unlink(cert);
}

static void test_free_null_and_no_errors_pointer(void)
{
    pcr_config_free(NULL);
    PCR_CHECK(pcr_config_parse("{", "x", NULL) == NULL);
    PCR_CHECK(pcr_config_load("/nonexistent/pcrouter.json", NULL) == NULL);
    char *e = (char *)1;
    PCR_CHECK(pcr_config_parse(NULL, NULL, &e) == NULL);
    PCR_CHECK(e != NULL && strstr(e, ": $: ") != NULL);
    free(e);
}

/* ---------------------------------------------------------------------------------------- */
/* The file itself.                                                                          */

static void test_error_file_missing_or_unreadable(void)
{
    char *e = NULL;
    PCR_CHECK(pcr_config_load("/nonexistent/x.json", &e) == NULL);
    PCR_CHECK_STR(e, "/nonexistent/x.json:0:0: $: cannot read: No such file or directory\n");
    free(e);
    e = NULL;
    PCR_CHECK(pcr_config_load("/tmp", &e) == NULL);
    PCR_CHECK_STR(e, "/tmp:0:0: $: cannot read: Is a directory\n");
    free(e);
}

static void test_error_not_json(void)
{
    /* jansson's own position and text. */
    CHECK_ERROR("{'listen': [],,\n}", "t.json:1:15: $: string or '}' expected near ','");
    CHECK_ERROR("", "t.json:1:0: $: '[' or '{' expected near end of file");
    CHECK_ERROR("{'a': 1} x", "t.json:1:10: $: end of file expected near 'x'");
    /* A file on disk gives the same, under its own name. */
    char path[64];
    temp_file(path, sizeof path);
    char *e = NULL;
    PCR_CHECK(pcr_config_load(path, &e) == NULL);
    char want[128];
    snprintf(want, sizeof want, "%s:1:1: $: '[' or '{' expected near 'x'\n", path);
    PCR_CHECK_STR(e, want);
    free(e);
    unlink(path);
}

static void test_error_duplicate_key(void)
{
    CHECK_ERROR(HEAD "'listen': []}", "t.json:3:8: $: duplicate object key near '\"listen\"'");
}

static void test_error_top_level_not_object(void)
{
    CHECK_ERROR("\n  [1, 2]", "t.json:2:3: $: expected object, got array");
}

/* ---------------------------------------------------------------------------------------- */
/* Keys and types.                                                                           */

static void test_error_unknown_keys(void)
{
    CHECK_ERROR(LISTEN_OK "'backend': []}",
                "t.json:1:1: $: missing required key \"backends\" (or \"discovery\"): at least one "
                "backend or discovery entry is needed\n"
                "t.json:2:1: backend: unknown key \"backend\"; did you mean \"backends\"? "
                "(allowed: listen, backends, discovery, dns, workers, io_uring, batch_wait_us, batch_wait_busy, routing, limits, timeouts, upstream, health, scrape, outlier, log, admin, redis, pd, auth, tenants, flow_control)");
    CHECK_ERROR(HEAD "'routing': {'polcy': 'round_robin', 'foo': 1}}",
                "t.json:3:13: routing.polcy: unknown key \"polcy\"; did you mean \"policy\"? "
                "(allowed: policy, zone, block_bytes, max_prefix_bytes, index_max_bytes, "
                "load_factor, load_weight, zone_penalty, vnodes, unavailable_keep_ms, feedback, hold_tokens, index, " "tokenize, tokenize_timeout_ms, tokenize_cache_entries, tokenize_cache_bytes, tokenize_max_bytes, tokenize_reuse_prefix, kv_block_tokens, session_header, tenant_header, objective_header)\n"
                "t.json:3:37: routing.foo: unknown key \"foo\" (allowed: policy, zone, block_bytes, "
                "max_prefix_bytes, index_max_bytes, load_factor, load_weight, zone_penalty, vnodes, unavailable_keep_ms, feedback, hold_tokens, index, " "tokenize, tokenize_timeout_ms, tokenize_cache_entries, tokenize_cache_bytes, tokenize_max_bytes, tokenize_reuse_prefix, kv_block_tokens, session_header, tenant_header, objective_header)");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a'},\n"
                "{'name': 'b', 'url': 'http://b', 'wieght': 2}]}",
                "t.json:3:34: backends[1].wieght: unknown key \"wieght\"; did you mean \"weight\"? "
                "(allowed: name, url, zone, role, weight, capacity_tokens, max_connections, models, tls, kv_events)");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0', 'tls': {'cert': '/', 'key': '/', 'ca': 'x'}}],\n"
                BACKENDS_OK "}",
                "t.json:1:73: listen[0].tls.ca: unknown key \"ca\" (allowed: cert, key)");
    CHECK_ERROR(HEAD "'log': {'Level': 'info'}}",
                "t.json:3:9: log.Level: unknown key \"Level\"; did you mean \"level\"? (allowed: level, access_log, access_log_path, access_log_format)");
}

static void test_error_wrong_types(void)
{
    CHECK_ERROR(HEAD "'routing': {'vnodes': '10'}}",
                "t.json:3:23: routing.vnodes: expected integer, got string \"10\"");
    CHECK_ERROR(HEAD "'routing': {'vnodes': 1.5}}",
                "t.json:3:23: routing.vnodes: expected integer, got number 1.5");
    CHECK_ERROR(HEAD "'routing': {'load_factor': true}}",
                "t.json:3:28: routing.load_factor: expected number, got boolean true");
    CHECK_ERROR(HEAD "'routing': {'zone': 5}}",
                "t.json:3:21: routing.zone: expected string, got integer 5");
    CHECK_ERROR(HEAD "'log': {'access_log': 'yes'}}",
                "t.json:3:23: log.access_log: expected boolean, got string \"yes\"");
    CHECK_ERROR(HEAD "'routing': []}", "t.json:3:12: routing: expected object, got array");
    CHECK_ERROR(HEAD "'health': null}", "t.json:3:11: health: expected object, got null");
    CHECK_ERROR("{'listen': {'address': '127.0.0.1:0'},\n" BACKENDS_OK "}",
                "t.json:1:12: listen: expected array, got object");
    CHECK_ERROR(LISTEN_OK "'backends': ['http://a']}",
                "t.json:2:14: backends[0]: expected object, got string \"http://a\"");
    CHECK_ERROR("{'listen': [{'address': 8080}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected string, got integer 8080");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'models': 'm1'}]}",
                "t.json:2:57: backends[0].models: expected array of strings, got string \"m1\"");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'models': ['m1', 2, '']}]}",
                "t.json:2:64: backends[0].models[1]: expected string, got integer 2\n"
                "t.json:2:67: backends[0].models[2]: must not be empty");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0', 'tls': true}],\n" BACKENDS_OK "}",
                "t.json:1:47: listen[0].tls: expected object, got boolean true");
}

static void test_error_required_and_empty(void)
{
    CHECK_ERROR("{}", "t.json:1:1: $: missing required key \"listen\"\n"
                      "t.json:1:1: $: missing required key \"backends\" (or \"discovery\"): at least one backend or discovery entry is needed");
    CHECK_ERROR("{'listen': [],\n'backends': []}",
                "t.json:1:12: listen: must not be empty: at least one listener is needed\n"
                "t.json:2:13: backends: must not be empty: at least one backend is needed");
    CHECK_ERROR(LISTEN_OK "'backends': [\n  {'url': 'http://a'}, {'name': 'b'}]}",
                "t.json:3:3: backends[0]: missing required key \"name\"\n"
                "t.json:3:24: backends[1]: missing required key \"url\"");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': '', 'url': 'http://a'}]}",
                "t.json:2:23: backends[0].name: must not be empty");
    CHECK_ERROR("{'listen': [{'tls': {'cert': '/'}}],\n" BACKENDS_OK "}",
                "t.json:1:13: listen[0]: missing required key \"address\"\n"
                "t.json:1:21: listen[0].tls: missing required key \"key\"");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0', 'tls': {'key': '/'}}],\n" BACKENDS_OK "}",
                "t.json:1:47: listen[0].tls: missing required key \"cert\"");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0', 'tls': {'cert': '/nonexistent.crt', 'key': '/'}}],\n"
                BACKENDS_OK "}",
                "t.json:1:56: listen[0].tls.cert: cannot read \"/nonexistent.crt\": No such file or directory");
}

/* ---------------------------------------------------------------------------------------- */
/* Values.                                                                                   */

static void test_error_listen_address(void)
{
    CHECK_ERROR("{'listen': [{'address': 'localhost:80'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"localhost:80\": not a numeric IPv4 address (host names are not resolved)");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"127.0.0.1\": missing \":PORT\"");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:65536'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"127.0.0.1:65536\": the port must be a number from 0 to 65535");
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:-1'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"127.0.0.1:-1\": the port must be a number from 0 to 65535");
    CHECK_ERROR("{'listen': [{'address': '::1:80'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"::1:80\": an IPv6 address must be in brackets, as in \"[::1]:8080\"");
    CHECK_ERROR("{'listen': [{'address': '[::g]:80'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"[::g]:80\": not a numeric IPv6 address");
    CHECK_ERROR("{'listen': [{'address': '[::1]80'}],\n" BACKENDS_OK "}",
                "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"[::1]80\": missing \":PORT\" after \"]\"");
}

static void test_error_duplicate_listen_address(void)
{
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:8080'},\n"
                "{'address': '127.0.0.1:8080'}],\n" BACKENDS_OK "}",
                "t.json:2:13: listen[1].address: duplicate listen address \"127.0.0.1:8080\" "
                "(also listen[0].address)");
    /* The same socket written two ways is still the same socket. */
    CHECK_ERROR("{'listen': [{'address': '[::1]:80'}, {'address': '[0:0::1]:80'}],\n" BACKENDS_OK "}",
                "t.json:1:50: listen[1].address: duplicate listen address \"[0:0::1]:80\" "
                "(also listen[0].address)");
    /* The admin listener needs an address of its own, and a valid one. */
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:8080'}],\n" BACKENDS_OK ",\n"
                "'admin': {'address': '127.0.0.1:8080'}}",
                "t.json:3:22: admin.address: admin address \"127.0.0.1:8080\" is also "
                "listen[0].address: the admin listener needs an address of its own");
    CHECK_ERROR(HEAD "'admin': {}}", "t.json:3:10: admin: missing required key \"address\"");
    CHECK_ERROR(HEAD "'admin': {'address': 'localhost:9090'}}",
                "t.json:3:22: admin.address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got "
                "\"localhost:9090\": not a numeric IPv4 address (host names are not resolved)");
}

static void test_error_backend_url(void)
{
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'ftp://a'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"ftp://a\"");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'https://a/v1'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"https://a/v1\": "
                "a path or query is not allowed");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://a:8000/v1'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://a:8000/v1\": "
                "a path or query is not allowed");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://a/?x'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://a/?x\": "
                "a path or query is not allowed");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://a:0'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://a:0\": "
                "the port must be a number from 1 to 65535");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://a:'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://a:\": "
                "the port must be a number from 1 to 65535");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://:80'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://:80\": "
                "the host is missing");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://u@a'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://u@a\": "
                "the host may hold only letters, digits, \"-\", \".\" and \"_\"");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a',\n'url': 'http://[::x]:80'}]}",
                "t.json:3:8: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"http://[::x]:80\": "
                "not a valid bracketed IPv6 address");
}

/* An https:// url turns TLS on (port 443 by default); "tls" says how; a discovery entry's
 * "tls" turns it on for every pod found. */
static void test_backend_tls(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse(LISTEN_OK "'backends': [{'name': 'a', 'url': 'https://pod.test'},\n"
                              "{'name': 'b', 'url': 'https://[::1]:8443/', 'tls': {'verify': false, "
                              "'server_name': 'pod.test', 'ca_file': '/etc/hostname'}},\n"
                              "{'name': 'c', 'url': 'http://127.0.0.1:1'}],\n"
                              "'discovery': [{'dns': 'pods.test', 'tls': {}}, {'dns': 'plain.test'}]}",
                              &errors);
    PCR_CHECK(cfg != NULL);
    if (cfg == NULL) {
        printf("# %s", errors);
        free(errors);
        return;
    }
    PCR_CHECK_EQ_INT(cfg->backends[0].port, 443);
    PCR_CHECK(cfg->backends[0].tls.enabled && cfg->backends[0].tls.verify);
    PCR_CHECK(cfg->backends[0].tls.ca_file == NULL && cfg->backends[0].tls.server_name == NULL);
    PCR_CHECK_EQ_INT(cfg->backends[1].port, 8443);
    PCR_CHECK(cfg->backends[1].tls.enabled && !cfg->backends[1].tls.verify);
    PCR_CHECK_STR(cfg->backends[1].tls.server_name, "pod.test");
    PCR_CHECK(!cfg->backends[2].tls.enabled);
    PCR_CHECK(cfg->discovery[0].tmpl.tls.enabled && cfg->discovery[0].tmpl.tls.verify);
    PCR_CHECK(!cfg->discovery[1].tmpl.tls.enabled);
    pcr_backend_conf_t copy;
    PCR_CHECK(pcr_backend_conf_copy(&copy, &cfg->backends[1]) == 0);
    PCR_CHECK_STR(copy.tls.ca_file, "/etc/hostname");
    PCR_CHECK(copy.tls.ca_file != cfg->backends[1].tls.ca_file);
    pcr_backend_conf_dispose(&copy);
    pcr_config_free(cfg);
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a',\n'tls': {}}]}",
                "t.json:3:8: backends[0].tls: a \"tls\" object needs an https:// url (the url is http://a)");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'https://a',\n'tls': {'key': '/etc/hostname'}}]}",
                "t.json:3:8: backends[0].tls: \"cert\" and \"key\" go together: a client certificate needs its key");
}

static void test_error_duplicate_backend_name(void)
{
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'pod-a', 'url': 'http://a'},\n"
                "{'name': 'pod-b', 'url': 'http://b'},\n"
                "{'name': 'pod-a', 'url': 'http://c'}]}",
                "t.json:4:10: backends[2].name: duplicate backend name \"pod-a\" (also backends[0].name)");
}

static void test_error_unknown_policy_and_level(void)
{
    CHECK_ERROR(HEAD "'routing': {'policy': 'fastest'}}",
                "t.json:3:23: routing.policy: unknown policy \"fastest\"; expected one of "
                "round_robin, least_loaded, consistent_hash, cache_aware, random");
    CHECK_ERROR(HEAD "'log': {'level': 'trace'}}",
                "t.json:3:18: log.level: unknown log level \"trace\"; expected one of error, warn, info, debug");
    CHECK_ERROR(HEAD "'log': {'access_log_format': 'xml'}}",
                "t.json:3:30: log.access_log_format: unknown access log format \"xml\"; expected one of text, json");
    CHECK_ERROR(HEAD "'health': {'path': 'health'}}",
                "t.json:3:20: health.path: expected a request path such as \"/health\", got \"health\"");
}

/* Roles and the disaggregation section: read, and the mistakes named. */
static void test_roles_and_pd(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse(
        "{'listen': [{'address': '127.0.0.1:8080'}],\n"
        " 'backends': [{'name': 'p', 'url': 'http://127.0.0.1:1', 'role': 'prefill'},\n"
        "              {'name': 'd', 'url': 'http://127.0.0.1:2', 'role': 'decode'},\n"
        "              {'name': 'b', 'url': 'http://127.0.0.1:3'}],\n"
        " 'discovery': [{'dns': 'pods.local', 'role': 'prefill'}],\n"
        " 'pd': {'mode': 'always', 'min_uncached_tokens': 7, 'max_ttft_ratio': 2.5,\n"
        "        'transfer_us_per_token': 0.5, 'itl_weight': 0.25}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    free(errors);
    if (cfg != NULL) {
        PCR_CHECK_EQ_INT(cfg->backends[0].role, PCR_ROLE_PREFILL);
        PCR_CHECK_EQ_INT(cfg->backends[1].role, PCR_ROLE_DECODE);
        PCR_CHECK_EQ_INT(cfg->backends[2].role, PCR_ROLE_BOTH);
        PCR_CHECK_EQ_INT(cfg->discovery[0].tmpl.role, PCR_ROLE_PREFILL);
        PCR_CHECK_EQ_INT(cfg->pd.mode, PCR_PD_ALWAYS);
        PCR_CHECK_EQ_U64(cfg->pd.min_uncached_tokens, 7);
        PCR_CHECK(cfg->pd.max_ttft_ratio == 2.5);
        PCR_CHECK(cfg->pd.transfer_us_per_token == 0.5);
        PCR_CHECK(cfg->pd.itl_weight == 0.25);
    }
    pcr_config_free(cfg);
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'role': 'prefil'}]}",
                "t.json:2:55: backends[0].role: unknown role \"prefil\"; expected one of "
                "prefill, decode, both");
    CHECK_ERROR(HEAD "'pd': {'mode': 'sometimes'}}",
                "t.json:3:16: pd.mode: unknown mode \"sometimes\"; expected one of auto, always, never");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'role': 'prefill'}]}",
                "t.json:2:55: backends[0].role: prefill pods need a pod that decodes: give at "
                "least one backend or discovery entry the role \"decode\" or \"both\"");
}

static void test_error_out_of_range(void)
{
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'weight': 0}]}",
                "t.json:2:57: backends[0].weight: must be between 1 and 1000, got 0");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'capacity_tokens': -5}]}",
                "t.json:2:66: backends[0].capacity_tokens: must be >= 1, got -5");
    CHECK_ERROR(HEAD "'routing': {'vnodes': 10001}}",
                "t.json:3:23: routing.vnodes: must be between 1 and 10000, got 10001");
    CHECK_ERROR(HEAD "'routing': {'block_bytes': 8}}",
                "t.json:3:28: routing.block_bytes: must be between 16 and 65536, got 8");
    CHECK_ERROR(HEAD "'routing': {'load_factor': 0.5}}",
                "t.json:3:28: routing.load_factor: must be >= 1, got 0.5");
    CHECK_ERROR(HEAD "'routing': {'zone_penalty': -1}}",
                "t.json:3:29: routing.zone_penalty: must be >= 0, got -1");
    CHECK_ERROR(HEAD "'routing': {'hold_tokens': -1}}",
                "t.json:3:28: routing.hold_tokens: must be between 0 and 1099511627776, got -1");
    CHECK_ERROR(HEAD "'routing': {'block_bytes': 1024, 'max_prefix_bytes': 512}}",
                "t.json:3:54: routing.max_prefix_bytes: must be >= routing.block_bytes (1024), got 512");
    CHECK_ERROR(HEAD "'timeouts': {'connect_ms': 0}}",
                "t.json:3:28: timeouts.connect_ms: must be between 1 and 86400000, got 0");
    CHECK_ERROR(HEAD "'limits': {'max_header_bytes': 100}}",
                "t.json:3:32: limits.max_header_bytes: must be between 1024 and 1048576, got 100");
    CHECK_ERROR(HEAD "'limits': {'max_response_buffer_bytes': 2048, 'max_buffered_response_bytes': 1024}}",
                "t.json:3:41: limits.max_response_buffer_bytes: must be <= "
                "limits.max_buffered_response_bytes (1024), got 2048 (0 turns response buffering off)");
    CHECK_ERROR(HEAD "'limits': {'max_buffered_response_bytes': 1024}}",
                "t.json:3:43: limits.max_buffered_response_bytes: must be >= "
                "limits.max_response_buffer_bytes (1048576), got 1024 (set that to 0 to turn "
                "response buffering off)");
    CHECK_ERROR(HEAD "'limits': {'max_memory_bytes': 1000}}",
                "t.json:3:32: limits.max_memory_bytes: must be 0 (off), \"auto\", or between "
                "1048576 and 1125899906842624 bytes, got 1000");
    CHECK_ERROR(HEAD "'limits': {'max_memory_bytes': -1}}",
                "t.json:3:32: limits.max_memory_bytes: must be 0 (off), \"auto\", or between "
                "1048576 and 1125899906842624 bytes, got -1");
    CHECK_ERROR(HEAD "'limits': {'max_memory_bytes': 'lots'}}",
                "t.json:3:32: limits.max_memory_bytes: expected \"auto\" or an integer (bytes; "
                "0: off), got string \"lots\"");
    CHECK_ERROR(HEAD "'limits': {'max_memory_bytes': 1.5e9}}",
                "t.json:3:32: limits.max_memory_bytes: expected \"auto\" or an integer (bytes; "
                "0: off), got number 1.5e+09");
    CHECK_ERROR(HEAD "'upstream': {'retries': 17}}",
                "t.json:3:25: upstream.retries: must be between 0 and 16, got 17");
    CHECK_ERROR(HEAD "'health': {'fall': 0}}",
                "t.json:3:20: health.fall: must be between 1 and 100, got 0");
}

/* ---------------------------------------------------------------------------------------- */
/* All errors, in order; and the position finder on awkward text.                            */

static void test_multiple_errors_all_reported_in_order(void)
{
    char *e = errors_of("{'listen': [{'address': 'nope'}],\n"
                        "'backends': [{'name': 'a', 'url': 'ftp://a'},\n"
                        "             {'name': 'a', 'url': 'http://b', 'weight': 0}],\n"
                        "'routing': {'policy': 'x', 'vnodes': 'y'},\n"
                        "'extra': 1}");
    PCR_CHECK_EQ_INT(count_lines(e), 7);
    const char *want =
        "t.json:1:25: listen[0].address: expected \"IP:PORT\" or \"[IPv6]:PORT\", got \"nope\": missing \":PORT\"\n"
        "t.json:2:35: backends[0].url: expected \"http://host:port\" or \"https://host:port\", got \"ftp://a\"\n"
        "t.json:3:23: backends[1].name: duplicate backend name \"a\" (also backends[0].name)\n"
        "t.json:3:57: backends[1].weight: must be between 1 and 1000, got 0\n"
        "t.json:4:23: routing.policy: unknown policy \"x\"; expected one of round_robin, least_loaded, "
        "consistent_hash, cache_aware, random\n"
        "t.json:4:38: routing.vnodes: expected integer, got string \"y\"\n"
        "t.json:5:1: extra: unknown key \"extra\" (allowed: listen, backends, discovery, dns, workers, io_uring, batch_wait_us, batch_wait_busy, routing, limits, timeouts, "
        "upstream, health, scrape, outlier, log, admin, redis, pd, auth, tenants, flow_control)\n";
    PCR_CHECK_STR(e, want);
    free(e);
}

/* Strings holding quotes, brackets, braces, colons and commas, escaped keys, nested arrays and
 * multi-byte characters all come before the error; its position must still be exact. */
static void test_positions_survive_awkward_text(void)
{
    /* Key "\u0072outing" is "routing"; the zone value holds "\"]}:," and the models array is
     * nested in backends; 'é' and '€' count one column each, '😀' (4 bytes, an escaped surrogate
     * pair in the key) too. */
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0'}],\n"
                "'backends': [{'name': 'a', 'url': 'http://a', 'zone': '\\'[{]}:,\\\\', 'models': [['x']]}],\n"
                "'\\u0072outing': {'zone': 'é€', 'vnodes': 0}}",
                "t.json:2:80: backends[0].models[0]: expected string, got array\n"
                "t.json:3:42: routing.vnodes: must be between 1 and 10000, got 0");
    CHECK_ERROR(HEAD "'routing': {'zone': '\\ud83d\\ude00 😀', '\\ud83d\\ude00': 1}}",
                "t.json:3:39: routing.\xf0\x9f\x98\x80: unknown key \"\xf0\x9f\x98\x80\" (allowed: policy, zone, "
                "block_bytes, max_prefix_bytes, index_max_bytes, load_factor, load_weight, zone_penalty, vnodes, unavailable_keep_ms, feedback, hold_tokens, index, " "tokenize, tokenize_timeout_ms, tokenize_cache_entries, tokenize_cache_bytes, tokenize_max_bytes, tokenize_reuse_prefix, kv_block_tokens, session_header, tenant_header, objective_header)");
    /* Tabs and CRLF line ends: a tab is one column, a CR is not a line end. */
    CHECK_ERROR("{'listen': [{'address': '127.0.0.1:0'}],\r\n" BACKENDS_OK ",\r\n\t'log': {'level': 1}}",
                "t.json:3:19: log.level: expected string, got integer 1");
    /* Deeply nested arrays are skipped correctly. */
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a', 'url': 'http://a', 'models': [[[[]], []], 'm']}],\n"
                "'x': 1}",
                "t.json:2:58: backends[0].models[0]: expected string, got array\n"
                "t.json:3:1: x: unknown key \"x\" (allowed: listen, backends, discovery, dns, workers, io_uring, batch_wait_us, batch_wait_busy, routing, limits, timeouts, "
                "upstream, health, scrape, outlier, log, admin, redis, pd, auth, tenants, flow_control)");
}

/* A key holding a newline or a control character still makes one error line. */
static void test_error_lines_stay_one_line(void)
{
    CHECK_ERROR(HEAD "'a\\nb': 1}",
                "t.json:3:1: a\\x0ab: unknown key \"a\\u000ab\" (allowed: listen, backends, discovery, dns, workers, io_uring, batch_wait_us, batch_wait_busy, routing, "
                "limits, timeouts, upstream, health, scrape, outlier, log, admin, redis, pd, auth, tenants, flow_control)");
    CHECK_ERROR(LISTEN_OK "'backends': [{'name': 'a\\tb', 'url': 'http://a'}]}",
                "t.json:2:23: backends[0].name: must not contain control characters, got \"a\\u0009b\"");
}

/* auth and tenants: digests only, "default" first, keys resolved to tenants. */
static void test_auth_and_tenants(void)
{
    char *errors = NULL;
    pcr_config_t *cfg = parse("{'listen': [{'address': '127.0.0.1:8080'}], " BACKENDS_OK ", "
        "'routing': {'session_header': 'X-Session-ID'}, "
        "'auth': {'keys': [{'sha256': '00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff', "
        "'tenant': 'batch'}, {'sha256': '" "ff00000000000000000000000000000000000000000000000000000000000000'}]}, "
        "'tenants': {'chat': {'priority': 5, 'weight': 2, 'max_concurrent': 3}, "
        "'batch': {'priority': -1, 'requests_per_s': 0.5, 'tokens_per_min': 1000}, "
        "'default': {'weight': 0.5}}}", &errors);
    PCR_CHECK(cfg != NULL && errors == NULL);
    if (errors != NULL)
        printf("# %s", errors);
    if (cfg != NULL) {
        PCR_CHECK_EQ_INT(cfg->ntenants, 3);
        PCR_CHECK_STR(cfg->tenants[0].name, "default");
        PCR_CHECK(cfg->tenants[0].weight == 0.5);
        PCR_CHECK_STR(cfg->tenants[1].name, "chat");
        PCR_CHECK_EQ_INT(cfg->tenants[1].priority, 5);
        PCR_CHECK_EQ_INT(cfg->tenants[1].max_concurrent, 3);
        PCR_CHECK_EQ_INT(cfg->tenants[2].priority, -1);
        PCR_CHECK_EQ_U64(cfg->tenants[2].tokens_per_min, 1000);
        PCR_CHECK_EQ_INT(cfg->auth.enabled, 1);
        PCR_CHECK_EQ_INT(cfg->auth.nkeys, 2);
        PCR_CHECK_EQ_INT(cfg->auth.keys[0].tenant_index, 2);
        PCR_CHECK_EQ_INT(cfg->auth.keys[0].sha256[0], 0x00);
        PCR_CHECK_EQ_INT(cfg->auth.keys[0].sha256[10], 0xaa);
        PCR_CHECK_EQ_INT(cfg->auth.keys[0].sha256[31], 0xff);
        PCR_CHECK_EQ_INT(cfg->auth.keys[1].tenant_index, 0);
        PCR_CHECK_STR(cfg->routing.session_header, "x-session-id");
    }
    pcr_config_free(cfg);
    free(errors);
    char *e = errors_of("{'listen': [{'address': '127.0.0.1:8080'}], " BACKENDS_OK ", "
        "'auth': {'keys': [{'sha256': 'abc'}]}, 'tenants': {'a b': {}, 'x': {'weight': 0}}, "
        "'routing': {'tenant_header': 'bad header'}}");
    PCR_CHECK(strstr(e, "auth.keys[0].sha256: expected the key's SHA-256 as 64 hex digits") != NULL);
    PCR_CHECK(strstr(e, "tenants.a b") != NULL);
    PCR_CHECK(strstr(e, "tenants.x.weight: must be between") != NULL);
    PCR_CHECK(strstr(e, "routing.tenant_header: expected an HTTP header name") != NULL);
    free(e);
}

int main(void)
{
    PCR_RUN(test_example_configs_load);
    PCR_RUN(test_max_memory_bytes);
    PCR_RUN(test_full_config_is_the_defaults);
    PCR_RUN(test_defaults);
    PCR_RUN(test_redis_section);
    PCR_RUN(test_error_redis);
    PCR_RUN(test_redis_conf_copy_and_equal);
    PCR_RUN(test_every_key_is_read);
    PCR_RUN(test_listen_ipv6_and_port_0);
    PCR_RUN(test_tls_listener);
    PCR_RUN(test_free_null_and_no_errors_pointer);
    PCR_RUN(test_error_file_missing_or_unreadable);
    PCR_RUN(test_error_not_json);
    PCR_RUN(test_error_duplicate_key);
    PCR_RUN(test_error_top_level_not_object);
    PCR_RUN(test_error_unknown_keys);
    PCR_RUN(test_error_wrong_types);
    PCR_RUN(test_error_required_and_empty);
    PCR_RUN(test_error_listen_address);
    PCR_RUN(test_error_duplicate_listen_address);
    PCR_RUN(test_error_backend_url);
    PCR_RUN(test_backend_tls);
    PCR_RUN(test_error_duplicate_backend_name);
    PCR_RUN(test_error_unknown_policy_and_level);
    PCR_RUN(test_roles_and_pd);
    PCR_RUN(test_error_out_of_range);
    PCR_RUN(test_batch_wait_us_bounds);
    PCR_RUN(test_batch_wait_busy_bounds);
    PCR_RUN(test_multiple_errors_all_reported_in_order);
    PCR_RUN(test_positions_survive_awkward_text);
    PCR_RUN(test_error_lines_stay_one_line);
    PCR_RUN(test_auth_and_tenants);
    return pcr_test_done();
}
