/* router/core/counters.c: owns the histograms' buckets and the updates of a worker's counters
 * (counters.h). Buckets are fixed, suited to LLM latencies (5 ms .. 10 min). */
#include "atomic.h"
#include "counters.h"

const char *const pcr_reject_names[PCR_REJECT__COUNT] = {
    [PCR_REJECT_AUTH] = "unauthorized", [PCR_REJECT_RATE] = "rate-limit",
    [PCR_REJECT_TOKENS] = "token-limit", [PCR_REJECT_CONCURRENCY] = "concurrency",
    [PCR_REJECT_SHED] = "shed", [PCR_REJECT_QUEUE_FULL] = "queue-full",
    [PCR_REJECT_TTL] = "rejected-ttl-expired",
};

const pcr_hist_spec_t pcr_hist_latency_us = {
    {5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
     30000000, 60000000, 120000000, 300000000, 600000000},
    16, 1e6};

/* A decision takes about 4 us for a 1k-token prompt and 130 us for a 32k one (bench_hashring):
 * microseconds to a tenth of a second, in seconds. */
const pcr_hist_spec_t pcr_hist_decision_ns = {
    {1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,
     10000000, 25000000, 50000000, 100000000},
    16, 1e9};

/* Predicted minus delivered cached tokens, per request: symmetric around 0, each bucket four
 * times the last. 16 tokens is one vLLM block; 65536 a long prompt wholly mispredicted. A
 * positive error is a prefix the index believed the pod held and it did not. */
const pcr_hist_spec_t pcr_hist_tokens_error = {
    {-65536, -16384, -4096, -1024, -256, -64, -16, 0, 16, 64, 256, 1024, 4096, 16384, 65536},
    15, 1};

void pcr_hist_observe(pcr_hist_t *h, const pcr_hist_spec_t *spec, int64_t v)
{
    size_t i = 0;
    while (i < spec->n && v > spec->le[i])
        i++;
    PCR_INC(h->counts[i]);
    PCR_STORE(h->sum, PCR_LOAD(h->sum) + v);
    PCR_INC(h->total);
}

void pcr_metrics_count_status(uint64_t by_code[600], int status)
{
    PCR_INC(by_code[status >= 100 && status < 600 ? status : 0]);
}

void pcr_metrics_count_status_shared(uint64_t by_code[600], int status)
{
    PCR_ADD(by_code[status >= 100 && status < 600 ? status : 0], 1);
}
