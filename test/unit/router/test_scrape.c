/* test/unit/router/test_scrape.c: tests router/scrape.c, the reading of a pod's vLLM metrics:
 * queue length, delivered prefix-cache counters as deltas (a pod restart included), the v0
 * metric names, the KV capacity from vllm:cache_config_info reaching the index, and a restart
 * (counters going back, a new start time or cache geometry) dropping the pod's entries. */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "pcr_test.h"
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

/* The same page whole and in pieces cut anywhere (lines split across reads), with a line far
 * longer than any we read and a last line without its newline: the same figures. */
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
        PCR_CHECK_EQ_INT(be.pod_waiting, 9); /* 5 + 4, the last one without a newline */
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

int main(void)
{
    PCR_RUN(test_waiting_and_running);
    PCR_RUN(test_counters_are_deltas);
    PCR_RUN(test_v0_names_and_label_sum);
    PCR_RUN(test_cache_config_sets_capacity);
    PCR_RUN(test_restart_drops_the_pods_entries);
    PCR_RUN(test_page_in_pieces);
    return pcr_test_done();
}
