/* test/unit/router/upstream/test_scrape.c: tests router/upstream/scrape.c, the reading of a pod's
 * vLLM metrics: queue length, delivered prefix-cache counters as deltas (a pod restart included),
 * the v0 metric names, the KV capacity from vllm:cache_config_info reaching the index, and the KV
 * cache usage (vllm:kv_cache_usage_perc, or v0's vllm:gpu_cache_usage_perc); and
 * router/body/prom.c, the text parser under it: the format's corners and every number the pod could
 * get wrong (NaN, infinities, negatives, overflow); and a restart (counters going back, a new start
 * time or cache geometry) dropping the pod's entries. */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "pcr_test.h"
#include "prom.h"
#include "scrape.h"

static pcr_config_t cfg;
static pcr_server_t srv;
static pcr_policy_t *policy;   /* a worker's replica: the scrape reaches it through the bus */
static pcr_backend_conf_t bconf = {.name = "pod-a"};

static void setup(pcr_backend_t *be)
{
    memset(&cfg, 0, sizeof(cfg));
    memset(&srv, 0, sizeof(srv));
    memset(be, 0, sizeof(*be));
    cfg.routing.block_bytes = 256;
    srv.cfg = &cfg;
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_backend_desc_t d = {.name = "pod-a", .zone = "", .weight = 1, .capacity_blocks = 1000000};
    policy = pcr_policy_new(&o, &d, 1);
    srv.bus = pcr_bus_new(1);
    be->srv = &srv;
    be->conf = bconf;
}

static void feed(pcr_backend_t *be, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, text, strlen(text));
    pcr_scrape_parse(be, b);
    evbuffer_free(b);
}

static void test_waiting_and_running(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "# HELP vllm:num_requests_waiting x\n"
              "vllm:num_requests_waiting{model_name=\"m\"} 7.0\n"
              "vllm:num_requests_running{model_name=\"m\"} 3.0\n"
              "vllm:num_requests_waiting_other 99\n");
    PCR_CHECK_EQ_INT(be.pod_waiting, 7);
    PCR_CHECK_EQ_INT(be.pod_running, 3);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

static void test_counters_are_deltas(void)
{
    pcr_backend_t be;
    setup(&be);
    /* The first scrape is the baseline: what the pod served before the router came is not ours. */
    feed(&be, "vllm:prefix_cache_hits_total{model_name=\"m\"} 1000\nvllm:prefix_cache_queries_total{model_name=\"m\"} 4000\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 0);
    PCR_CHECK_EQ_INT(be.pod_queries, 0);
    feed(&be, "vllm:prefix_cache_hits_total{model_name=\"m\"} 1600\nvllm:prefix_cache_queries_total{model_name=\"m\"} 5000\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 600);
    PCR_CHECK_EQ_INT(be.pod_queries, 1000);
    /* Restart: counters start again from 0; the new values count in full, never negative. */
    feed(&be, "vllm:prefix_cache_hits_total{model_name=\"m\"} 50\nvllm:prefix_cache_queries_total{model_name=\"m\"} 200\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 650);
    PCR_CHECK_EQ_INT(be.pod_queries, 1200);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

static void test_v0_names_and_label_sum(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "vllm:gpu_prefix_cache_hits_total{model_name=\"a\"} 10\n"
              "vllm:gpu_prefix_cache_hits_total{model_name=\"b\"} 20\n"
              "vllm:gpu_prefix_cache_queries_total{model_name=\"a\"} 100\n");
    feed(&be, "vllm:gpu_prefix_cache_hits_total{model_name=\"a\"} 15\n"
              "vllm:gpu_prefix_cache_hits_total{model_name=\"b\"} 25\n"
              "vllm:gpu_prefix_cache_queries_total{model_name=\"a\"} 150\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 10);
    PCR_CHECK_EQ_INT(be.pod_queries, 50);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

static void test_cache_config_sets_capacity(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "vllm:cache_config_info{block_size=\"16\",model_name=\"m\",num_gpu_blocks=\"2048\"} 1.0\n");
    PCR_CHECK_EQ_INT(be.pod_cache_tokens, 16 * 2048);
    PCR_CHECK_EQ_INT(pcr_bus_drain(srv.bus, 0, &policy), 1);
    /* The index now holds at most 32768 tokens * 4 bytes / 256-byte blocks = 512 blocks. */
    uint64_t blocks[600];
    pcr_key_t key = {.blocks = blocks};
    char prompt[600 * 256];
    memset(prompt, 'x', sizeof(prompt));
    pcr_policy_key(policy, "m", 1, prompt, sizeof(prompt), &key);
    uint32_t from;
    pcr_policy_commit(policy, 0, &key, 1, &from);
    PCR_CHECK(pcr_policy_backend_blocks(policy, 0) <= 512);
    PCR_CHECK(pcr_policy_backend_blocks(policy, 0) > 0);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

/* ---- prom.c ------------------------------------------------------------------------------ */

static pcr_pod_sample_t parse(const char *text)
{
    pcr_pod_sample_t s;
    memset(&s, 0xAB, sizeof s);   /* pcr_prom_parse must clear it */
    PCR_CHECK_EQ_INT(pcr_prom_parse(text, strlen(text), &s), 0);
    return s;
}

static void test_prom_every_value(void)
{
    pcr_pod_sample_t s = parse(
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n"
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 3.0\n"
        "vllm:num_requests_running{model_name=\"m\"} 4\n"
        "vllm:prefix_cache_hits_total{model_name=\"m\"} 1.5e3\n"
        "vllm:prefix_cache_queries_total{model_name=\"m\"} 4000\n"
        "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n"
        "vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
        "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"2048\"} 1.0\n"
        "process_start_time_seconds 1.7e9\n"
        "\n"
        "python_gc_objects_collected_total{generation=\"0\"} -3 1700000000000\n");
    PCR_CHECK_EQ_INT(s.seen, PCR_PROM_WAITING | PCR_PROM_RUNNING | PCR_PROM_HITS |
                     PCR_PROM_QUERIES | PCR_PROM_KV_USAGE | PCR_PROM_CACHE_CONFIG |
                     PCR_PROM_START_TIME);
    PCR_CHECK(s.num_requests_waiting == 5.0);
    PCR_CHECK(s.num_requests_running == 4.0);
    PCR_CHECK(s.prefix_cache_hits == 1500.0);
    PCR_CHECK(s.prefix_cache_queries == 4000.0);
    PCR_CHECK(s.kv_cache_usage == 0.75);    /* the fullest engine, not a sum */
    PCR_CHECK_EQ_INT(s.block_size, 16);
    PCR_CHECK_EQ_INT(s.num_gpu_blocks, 2048);
    PCR_CHECK(s.process_start_time == 1.7e9);
    PCR_CHECK_EQ_INT(s.samples, 9);
    PCR_CHECK_EQ_INT(s.other_lines, 1);     /* a metric not ours: dismissed, not checked */
    PCR_CHECK_EQ_INT(s.bad_lines, 0);
}

static void test_prom_older_names(void)
{
    pcr_pod_sample_t s = parse("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n"
                               "vllm:gpu_prefix_cache_hits_total{model_name=\"m\"} 7\n"
                               "vllm:gpu_prefix_cache_queries_total{model_name=\"m\"} 9\n");
    PCR_CHECK_EQ_INT(s.seen, PCR_PROM_KV_USAGE | PCR_PROM_HITS | PCR_PROM_QUERIES);
    PCR_CHECK(s.kv_cache_usage == 0.5);
    PCR_CHECK(s.prefix_cache_hits == 7.0 && s.prefix_cache_queries == 9.0);
}

/* Each of these lines is skipped whole and counted; none reaches the sample. */
static void test_prom_bad_numbers(void)
{
    static const char *const bad[] = {
        "vllm:num_requests_waiting NaN\n",
        "vllm:num_requests_waiting +Inf\n",
        "vllm:num_requests_waiting -Inf\n",
        "vllm:num_requests_waiting -1\n",
        "vllm:num_requests_waiting 1e999\n",          /* overflows to an infinity */
        "vllm:num_requests_waiting 12abc\n",
        "vllm:num_requests_waiting \n",
        "vllm:num_requests_waiting\n",
        "vllm:num_requests_waiting 1 2 3\n",          /* a timestamp, then garbage */
        "vllm:num_requests_waiting 1 12.5\n",         /* a timestamp is an integer */
        "vllm:num_requests_waiting 0x\n",
        "vllm:num_requests_waiting 1111111111111111111111111111111111111111111111111111111111111111111\n",
        "vllm:kv_cache_usage_perc 1.5\n",
        "vllm:kv_cache_usage_perc -0.1\n",
        "process_start_time_seconds 0\n",
        "process_start_time_seconds -5\n",
    };
    for (size_t i = 0; i < PCR_ARRAY_SIZE(bad); i++) {
        pcr_pod_sample_t s = parse(bad[i]);
        if (s.seen != 0 || s.bad_lines != 1 || s.samples != 0)
            printf("# accepted: %s", bad[i]);
        PCR_CHECK_EQ_INT(s.seen, 0);
        PCR_CHECK_EQ_INT(s.bad_lines, 1);
        PCR_CHECK(s.num_requests_waiting == 0 && s.kv_cache_usage == 0);
    }
    /* A sum that would leave the doubles is refused at the line that would overflow it. */
    pcr_pod_sample_t s = parse("vllm:num_requests_waiting{a=\"1\"} 1.7e308\n"
                               "vllm:num_requests_waiting{a=\"2\"} 1.7e308\n");
    PCR_CHECK(s.num_requests_waiting == 1.7e308);
    PCR_CHECK_EQ_INT(s.bad_lines, 1);
}

static void test_prom_labels(void)
{
    /* Escaped quotes, commas and braces inside values; blanks; a trailing comma; a timestamp. */
    pcr_pod_sample_t s = parse(
        "vllm:num_requests_waiting{model_name=\"a \\\"b\\\", {c}\" , x = \"\\\\\",} 3 -1700\n"
        "vllm:num_requests_waiting {} 4\n"
        "vllm:num_requests_waiting\t5\r\n");
    PCR_CHECK(s.num_requests_waiting == 12.0);
    PCR_CHECK_EQ_INT(s.bad_lines, 0);
    static const char *const bad[] = {
        "vllm:num_requests_waiting{model_name=\"m\" 3\n",        /* no '}' */
        "vllm:num_requests_waiting{model_name=\"m} 3\n",         /* value never closed */
        "vllm:num_requests_waiting{model_name=m} 3\n",           /* value not quoted */
        "vllm:num_requests_waiting{=\"m\"} 3\n",                  /* no label name */
        "vllm:num_requests_waiting{a=\"1\" b=\"2\"} 3\n",         /* no comma */
        "vllm:num_requests_waiting{a=\"1\"}3\n",                  /* value not set apart */
        "vllm:num_requests_waiting{a=\"\\\n",                    /* escape at the end */
        "{a=\"1\"} 3\n",
        "vllm:cache_config_info{block_size=\"16\",block_size=\"32\",num_gpu_blocks=\"8\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\"} 1\n",
        "vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"8\"} 1\n",
        "vllm:cache_config_info{block_size=\"+16\",num_gpu_blocks=\"8\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"99999999999999999999999\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4294967297\"} 1\n",
        "vllm:cache_config_info{block_size=\"1048577\",num_gpu_blocks=\"8\"} 1\n",
    };
    for (size_t i = 0; i < PCR_ARRAY_SIZE(bad); i++) {
        pcr_pod_sample_t t;
        /* strlen would stop at the NUL of one case: give the length up to the '\n'. */
        size_t n = (size_t)((const char *)memchr(bad[i], '\n', 200) - bad[i]) + 1;
        PCR_CHECK_EQ_INT(pcr_prom_parse(bad[i], n, &t), 0);
        if (t.seen != 0 || t.bad_lines != 1)
            printf("# accepted: %s", bad[i]);
        PCR_CHECK_EQ_INT(t.seen, 0);
        PCR_CHECK_EQ_INT(t.bad_lines, 1);
    }
    /* Not one of the names read, whole: dismissed, unread (a name character, then not a name
     * the router reads), never a sample. */
    static const char *const other[] = {
        "vllm:num_requests_waiting-x 3\n",
        "vllm:num_requests_waiting\0 3\n",
        "vllm:num_requests_waitingx 3\n",
    };
    for (size_t i = 0; i < PCR_ARRAY_SIZE(other); i++) {
        pcr_pod_sample_t t;
        size_t n = (size_t)((const char *)memchr(other[i], '\n', 200) - other[i]) + 1;
        PCR_CHECK_EQ_INT(pcr_prom_parse(other[i], n, &t), 0);
        PCR_CHECK_EQ_INT(t.seen, 0);
        PCR_CHECK_EQ_INT(t.samples + t.bad_lines, 0);
        PCR_CHECK_EQ_INT(t.other_lines, 1);
    }
}

static void test_prom_bounds(void)
{
    /* Too many labels. */
    char line[PCR_PROM_MAX_LINE + 64];
    size_t o = (size_t)snprintf(line, sizeof line, "vllm:num_requests_waiting{");
    for (int i = 0; i <= PCR_PROM_MAX_LABELS; i++)
        o += (size_t)snprintf(line + o, sizeof line - o, "l%d=\"v\",", i);
    snprintf(line + o, sizeof line - o, "} 1\n");
    pcr_pod_sample_t s = parse(line);
    PCR_CHECK_EQ_INT(s.seen, 0);
    PCR_CHECK_EQ_INT(s.bad_lines, 1);
    /* A line over the bound, then a good one: the good one still counts. */
    memset(line, 'x', sizeof line);
    memcpy(line, "vllm:num_requests_waiting{a=\"", 29);
    memcpy(line + PCR_PROM_MAX_LINE - 3, "\"} 1\n", 6);   /* one byte over */
    char *text = malloc(sizeof line + 64);
    size_t n = (size_t)snprintf(text, sizeof line + 64, "%svllm:num_requests_waiting 2\n", line);
    PCR_CHECK_EQ_INT(pcr_prom_parse(text, n, &s), 0);
    PCR_CHECK_EQ_INT(s.bad_lines, 1);
    PCR_CHECK(s.num_requests_waiting == 2.0);
    free(text);
    /* The last line, cut before its '\n', is not read; nor is anything in an empty text. */
    s = parse("vllm:num_requests_waiting 2\nvllm:num_requests_waiting 3");
    PCR_CHECK(s.num_requests_waiting == 2.0);
    PCR_CHECK_EQ_INT(pcr_prom_parse(NULL, 0, &s), 0);
    PCR_CHECK_EQ_INT(s.seen, 0);
    PCR_CHECK_EQ_INT(pcr_prom_parse(NULL, 1, &s), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_prom_parse("x", 1, NULL), PCR_ERR_INVAL);
}

/* What the pod says outside any sensible range reaches the backend saturated, never wrapped. */
static void test_huge_values_saturate(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "vllm:num_requests_waiting 1e300\nvllm:num_requests_running 5e9\n"
              "vllm:prefix_cache_hits_total 1e30\nvllm:prefix_cache_queries_total 1e30\n");
    PCR_CHECK_EQ_INT(be.pod_waiting, UINT32_MAX);
    PCR_CHECK_EQ_INT(be.pod_running, UINT32_MAX);
    feed(&be, "vllm:num_requests_waiting 1\n"
              "vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_queries_total 5\n");
    feed(&be, "vllm:num_requests_waiting 1\n"
              "vllm:prefix_cache_hits_total 1e30\nvllm:prefix_cache_queries_total 1e30\n");
    PCR_CHECK_EQ_U64(be.pod_hits, UINT64_MAX);  /* 5 (restart) + UINT64_MAX - 5, no wrap */
    PCR_CHECK_EQ_INT(be.pod_waiting, 1);
    /* The largest capacity prom.c lets through does not overflow the capacity in blocks. */
    feed(&be, "vllm:cache_config_info{block_size=\"1048576\",num_gpu_blocks=\"4294967296\"} 1\n");
    PCR_CHECK_EQ_U64(be.pod_cache_tokens, 1ull << 52);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

static void test_kv_cache_usage(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "vllm:num_requests_waiting 0\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_known, 0);  /* not reported: unknown, not 0 */
    feed(&be, "# TYPE vllm:kv_cache_usage_perc gauge\n"
              "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_known, 1);
    PCR_CHECK_EQ_INT(be.pod_kv_usage_ppm, 250000);
    /* vLLM v0's name; two engines in one pod: the fuller one (prom.c). */
    feed(&be, "vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.5\n"
              "vllm:gpu_cache_usage_perc{model_name=\"b\"} 1.0\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_ppm, 1000000);
    feed(&be, "vllm:kv_cache_usage_perc 0.4\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_ppm, 400000);
    /* A value out of range is refused (prom.c): the last good one stays. */
    feed(&be, "vllm:kv_cache_usage_perc 7\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_ppm, 400000);
    feed(&be, "vllm:kv_cache_usage_perc -1\n");
    PCR_CHECK_EQ_INT(be.pod_kv_usage_ppm, 400000);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

/* The same page whole and in pieces cut anywhere (lines split across reads), with a line far
 * longer than any we read and a last line without its newline (not read: the text format ends
 * every line with one): the same figures. */
static void test_page_in_pieces(void)
{
    static char page[20000];
    size_t n = 0;
    n += (size_t)snprintf(page + n, sizeof(page) - n,
                          "# HELP vllm:num_requests_waiting x\n"
                          "vllm:num_requests_waiting{model_name=\"m\"} 5\n"
                          "vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",model_name=\"m\",x=\"");
    memset(page + n, 'z', 9000); /* a 9 KB line: skipped, and the next one still read */
    n += 9000;
    n += (size_t)snprintf(page + n, sizeof(page) - n,
                          "\"} 3\n"
                          "vllm:num_requests_running{model_name=\"m\"} 2\n"
                          "vllm:prefix_cache_hits_total{model_name=\"m\"} 10\n"
                          "vllm:prefix_cache_queries_total{model_name=\"m\"} 40\n"
                          "vllm:num_requests_waiting{model_name=\"other\"} 4");
    for (size_t piece = 1; piece <= 4099; piece += piece < 8 ? 1 : 997) {
        pcr_backend_t be;
        setup(&be);
        struct evbuffer *b = evbuffer_new();
        for (size_t off = 0; off < n; off += piece)
            evbuffer_add_reference(b, page + off, off + piece <= n ? piece : n - off, NULL, NULL);
        pcr_scrape_parse(&be, b);
        PCR_CHECK_EQ_INT(evbuffer_get_length(b), 0);
        evbuffer_free(b);
        PCR_CHECK_EQ_INT(be.pod_waiting, 5); /* not + 4: that last line has no newline */
        PCR_CHECK_EQ_INT(be.pod_running, 2);
        PCR_CHECK_EQ_INT(be.pod_have_hits, 1);
        PCR_CHECK_EQ_INT(be.pod_hits_last, 10);
        PCR_CHECK_EQ_INT(be.pod_queries_last, 40);
        pcr_policy_free(policy);
        pcr_bus_free(srv.bus);
    }
}

/* Indexes a prompt for the pod in the worker's replica; returns its blocks there. */
static uint64_t index_some(pcr_policy_t *pol)
{
    uint64_t blocks[64];
    pcr_key_t key = {.blocks = blocks};
    char prompt[16 * 256];
    memset(prompt, 'y', sizeof(prompt));
    pcr_policy_key(pol, "m", 1, prompt, sizeof(prompt), &key);
    uint32_t from;
    pcr_policy_commit(pol, 0, &key, 1, &from);
    return pcr_policy_backend_blocks(pol, 0);
}

static void test_restart_drops_the_pods_entries(void)
{
    pcr_backend_t be;
    setup(&be);
    PCR_CHECK(index_some(policy) > 0);
    /* The first scrape is a baseline, never a restart. */
    feed(&be, "process_start_time_seconds 1700000000.25\n"
              "vllm:prefix_cache_hits_total{model_name=\"m\"} 100\n"
              "vllm:prefix_cache_queries_total{model_name=\"m\"} 400\n");
    feed(&be, "process_start_time_seconds 1700000000.25\n"
              "vllm:prefix_cache_hits_total{model_name=\"m\"} 150\n"
              "vllm:prefix_cache_queries_total{model_name=\"m\"} 500\n");
    PCR_CHECK_EQ_INT(be.restarts, 0);
    pcr_bus_drain(srv.bus, 0, &policy);
    PCR_CHECK(pcr_policy_backend_blocks(policy, 0) > 0);
    /* Counters went back: a new engine, an empty cache. */
    feed(&be, "process_start_time_seconds 1700000000.25\n"
              "vllm:prefix_cache_hits_total{model_name=\"m\"} 0\n"
              "vllm:prefix_cache_queries_total{model_name=\"m\"} 10\n");
    PCR_CHECK_EQ_INT(be.restarts, 1);
    PCR_CHECK_EQ_INT(pcr_bus_drain(srv.bus, 0, &policy), 1);
    PCR_CHECK_EQ_INT(pcr_policy_backend_blocks(policy, 0), 0);
    /* A new start time alone says so too (a pod that served nothing has no counter to drop). */
    PCR_CHECK(index_some(policy) > 0);
    feed(&be, "process_start_time_seconds 1700000099.5\n"
              "vllm:prefix_cache_hits_total{model_name=\"m\"} 0\n"
              "vllm:prefix_cache_queries_total{model_name=\"m\"} 10\n");
    PCR_CHECK_EQ_INT(be.restarts, 2);
    pcr_bus_drain(srv.bus, 0, &policy);
    PCR_CHECK_EQ_INT(pcr_policy_backend_blocks(policy, 0), 0);
    /* And a new cache geometry. */
    feed(&be, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4096\"} 1\n");
    PCR_CHECK_EQ_INT(be.restarts, 2);
    feed(&be, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8192\"} 1\n");
    PCR_CHECK_EQ_INT(be.restarts, 3);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

/* Hits never outgrow queries; counters that go back twice within a minute flap and stop
 * counting (they used to add their whole value at every fall, driving the hit rate to 1). */
static void test_flapping_counters_stop_counting(void)
{
    pcr_backend_t be;
    setup(&be);
    feed(&be, "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n");
    feed(&be, "vllm:prefix_cache_hits_total 500\nvllm:prefix_cache_queries_total 100\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 100);
    PCR_CHECK_EQ_INT(be.pod_queries, 100);
    feed(&be, "vllm:prefix_cache_hits_total 500\nvllm:prefix_cache_queries_total 1000\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 100);
    PCR_CHECK_EQ_INT(be.pod_queries, 1000);
    /* One reset: a restart, its new values count in full. */
    feed(&be, "vllm:prefix_cache_hits_total 10\nvllm:prefix_cache_queries_total 10\n");
    PCR_CHECK_EQ_INT(be.pod_hits, 110);
    PCR_CHECK_EQ_INT(be.pod_queries, 1010);
    PCR_CHECK_EQ_INT(be.pod_counters_flap, 0);
    feed(&be, "vllm:prefix_cache_hits_total 1000000\nvllm:prefix_cache_queries_total 1000000\n");
    /* A second one at once: flapping; nothing more is added. */
    feed(&be, "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n");
    PCR_CHECK_EQ_INT(be.pod_counters_flap, 1);
    uint64_t h = be.pod_hits, q = be.pod_queries;
    for (int i = 0; i < 4; i++) {
        feed(&be, "vllm:prefix_cache_hits_total 1000000\nvllm:prefix_cache_queries_total 1000000\n");
        feed(&be, "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n");
    }
    PCR_CHECK_EQ_U64(be.pod_hits, h);
    PCR_CHECK_EQ_U64(be.pod_queries, q);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

/* One scrape of `be`: `ours` more answers from it, then its page; the pool's verdict after it
 * and the messages the bus carried to the policy. */
static void sharing_step(pcr_backend_t *be, uint64_t ours, const char *page, int verdict,
                         size_t told)
{
    be->requests_by_code[200] += ours;
    feed(be, page);
    PCR_CHECK_EQ_INT(srv.pods_shared, verdict);
    PCR_CHECK_EQ_INT(pcr_bus_drain(srv.bus, 0, &policy), told);
}

/* Whether the pods serve others too: their own count of finished requests against this
 * router's answers from them, summed over the pool, judged once a window holds 32 requests,
 * told to each pod's entry once. */
static void test_sharing_is_judged_from_the_pods_count(void)
{
    pcr_backend_t be;
    setup(&be);
    pcr_backend_t *slots[1] = {&be};
    srv.backends = slots;
    srv.nslots = 1;
    sharing_step(&be, 0, "vllm:request_success_total{finished_reason=\"stop\"} 100\n", 0, 0);
    /* 40 answered here (one an error), 40 finished there (over two label sets): this router
     * alone. */
    be.requests_by_code[503] += 1;
    sharing_step(&be, 39, "vllm:request_success_total{finished_reason=\"stop\"} 120\n"
                          "vllm:request_success_total{finished_reason=\"length\"} 20\n", 1, 1);
    /* Not a window's worth yet: nothing judged. */
    sharing_step(&be, 10, "vllm:request_success_total 150\n", 1, 0);
    /* 80 more finished there, 30 of them answered here (with the 10 before): others too. */
    sharing_step(&be, 20, "vllm:request_success_total 220\n", 2, 1);
    /* Still so: not told again. */
    sharing_step(&be, 10, "vllm:request_success_total 300\n", 2, 0);
    /* A restart: its counter starts again, and that scrape adds nothing (its new count is no
     * one's); the next ones do. */
    sharing_step(&be, 60, "vllm:request_success_total 70\n", 2, 0);
    sharing_step(&be, 40, "vllm:request_success_total 110\n", 1, 1);
    /* A pod that joins is told the verdict at the next window; the one told already is not
     * told again. */
    pcr_backend_t other = be;
    other.id = 1;
    other.shared_told = 0;
    pcr_backend_t *two[2] = {&be, &other};
    srv.backends = two;
    srv.nslots = 2;
    sharing_step(&be, 40, "vllm:request_success_total 150\n", 1, 1);
    PCR_CHECK_EQ_INT(other.shared_told, 1);
    pcr_policy_free(policy);
    pcr_bus_free(srv.bus);
}

int main(void)
{
    PCR_RUN(test_sharing_is_judged_from_the_pods_count);
    PCR_RUN(test_waiting_and_running);
    PCR_RUN(test_counters_are_deltas);
    PCR_RUN(test_v0_names_and_label_sum);
    PCR_RUN(test_cache_config_sets_capacity);
    PCR_RUN(test_prom_every_value);
    PCR_RUN(test_prom_older_names);
    PCR_RUN(test_prom_bad_numbers);
    PCR_RUN(test_prom_labels);
    PCR_RUN(test_prom_bounds);
    PCR_RUN(test_huge_values_saturate);
    PCR_RUN(test_kv_cache_usage);
    PCR_RUN(test_restart_drops_the_pods_entries);
    PCR_RUN(test_flapping_counters_stop_counting);
    PCR_RUN(test_page_in_pieces);
    return pcr_test_done();
}
