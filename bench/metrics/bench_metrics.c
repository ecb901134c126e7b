/* bench/metrics/bench_metrics.c: the time to render GET /metrics (`make bench-metrics`).
 *
 * A server is laid out in memory as the router has it (backends in their slots, workers with
 * their counters, a policy replica for the per-backend block counts), every counter non-zero
 * and every status code a pod could answer counted, so each render writes every series it
 * would in production. Renders are timed one by one; each size is measured in several rounds
 * and the median of the rounds' medians is reported, with the ratio to one backend (the fixed
 * part) measured in the same run. The target: under 1 ms with 100 backends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "metrics.h"
#include "server.h"

#define WORKERS 4
#define ROUNDS 7
#define RENDERS 200

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fill_hist(pcr_hist_t *h, uint64_t seed)
{
    for (size_t i = 0; i <= PCR_HIST_BUCKETS; i++)
        h->counts[i] = seed + i;
    h->sum = (int64_t)seed * 1000;
    h->total = seed * 17;
}

typedef struct {
    pcr_config_t cfg;
    pcr_server_t srv;
    pcr_backend_t *be;
    pcr_backend_t **slots;
    pcr_backend_desc_t *desc;
    char (*names)[40];
} fake_t;

static void fake_init(fake_t *f, size_t nb)
{
    memset(f, 0, sizeof(*f));
    f->cfg.routing.policy = PCR_POLICY_CACHE_AWARE;
    f->srv.cfg = &f->cfg;
    f->be = calloc(nb, sizeof(*f->be));
    f->slots = calloc(PCR_MAX_BACKENDS, sizeof(*f->slots));
    f->desc = calloc(nb, sizeof(*f->desc));
    f->names = calloc(nb, sizeof(*f->names));
    for (size_t i = 0; i < nb; i++) {
        pcr_backend_t *be = &f->be[i];
        snprintf(f->names[i], sizeof(f->names[i]), "vllm-pod-%03zu.zone-a", i);
        be->srv = &f->srv;
        be->id = (int)i;
        be->conf.name = f->names[i];
        be->up = 1;
        be->inflight = 3;
        be->pod_kv_usage_known = 1;
        be->pod_kv_usage_ppm = 412345;
        be->cached_predicted = 123456789;
        be->cached_delivered = 98765432;
        be->prompt_tokens = 555555555;
        /* The codes a busy pod answers: ok, the client's mistakes, overload, failures. */
        static const int codes[] = {200, 400, 404, 413, 429, 499, 500, 502, 503, 504};
        for (size_t c = 0; c < sizeof(codes) / sizeof(codes[0]); c++)
            be->requests_by_code[codes[c]] = (uint64_t)codes[c] * 3;
        f->slots[i] = be;
        f->desc[i] = (pcr_backend_desc_t){.name = f->names[i], .zone = "", .weight = 1};
    }
    f->srv.backends = f->slots;
    f->srv.nslots = nb;
    f->srv.nworkers = WORKERS;
    f->srv.bus = pcr_bus_new(WORKERS);
    f->srv.workers = calloc(WORKERS, sizeof(pcr_worker_t));
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    for (unsigned k = 0; k < WORKERS; k++) {
        pcr_worker_t *w = &f->srv.workers[k];
        w->srv = &f->srv;
        w->cfg = &f->cfg;
        w->id = k;
        w->policy = k == 0 ? pcr_policy_new(&o, f->desc, nb) : NULL;
        pcr_metrics_t *m = &w->metrics;
        for (int c = 200; c < 600; c += 50)
            m->requests_by_code[c] = 1000 + k;
        for (int r = 0; r < PCR_REASON__COUNT; r++)
            m->decisions[r] = 10 + (uint64_t)r;
        m->prefix_blocks = 1000000;
        m->prefix_blocks_matched = 600000;
        fill_hist(&m->duration, 5 + k);
        fill_hist(&m->ttfb, 7 + k);
        fill_hist(&m->cached_error, 11 + k);
        for (int p = 0; p < PCR_PHASE__COUNT; p++)
            fill_hist(&m->decision[p], 13 + k + (uint64_t)p);
    }
}

static void fake_dispose(fake_t *f)
{
    pcr_policy_free(f->srv.workers[0].policy);
    free(f->srv.workers);
    pcr_bus_free(f->srv.bus);
    free(f->be);
    free(f->slots);
    free(f->desc);
    free(f->names);
}

/* Median render time in ns over ROUNDS rounds of RENDERS renders; *bytes: one render's size. */
static uint64_t measure(size_t nb, size_t *bytes, uint64_t *p99)
{
    fake_t f;
    fake_init(&f, nb);
    uint64_t medians[ROUNDS], all[ROUNDS * RENDERS];
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t t[RENDERS];
        for (int i = 0; i < RENDERS; i++) {
            struct evbuffer *out = evbuffer_new();
            uint64_t t0 = now_ns();
            pcr_metrics_render(&f.srv.workers[0], out);
            /* What the endpoint does next: one contiguous body. */
            (void)evbuffer_pullup(out, -1);
            t[i] = now_ns() - t0;
            all[r * RENDERS + i] = t[i];
            *bytes = evbuffer_get_length(out);
            evbuffer_free(out);
        }
        qsort(t, RENDERS, sizeof(t[0]), cmp_u64);
        medians[r] = t[RENDERS / 2];
    }
    qsort(medians, ROUNDS, sizeof(medians[0]), cmp_u64);
    qsort(all, ROUNDS * RENDERS, sizeof(all[0]), cmp_u64);
    *p99 = all[ROUNDS * RENDERS * 99 / 100];
    fake_dispose(&f);
    return medians[ROUNDS / 2];
}

int main(void)
{
    static const size_t sizes[] = {1, 10, 100, 1000};
    uint64_t base = 0, at100 = 0;
    printf("GET /metrics render time, %d workers' counters summed, median of %d rounds x %d renders\n",
           WORKERS, ROUNDS, RENDERS);
    printf("%-10s %12s %12s %12s %10s\n", "backends", "median us", "p99 us", "bytes", "x 1 pod");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t bytes = 0;
        uint64_t p99 = 0, med = measure(sizes[i], &bytes, &p99);
        if (i == 0)
            base = med;
        if (sizes[i] == 100)
            at100 = med;
        printf("%-10zu %12.1f %12.1f %12zu %10.1f\n", sizes[i], med / 1e3, p99 / 1e3, bytes,
               base ? (double)med / (double)base : 0.0);
    }
    printf("target: 100 backends under 1000 us: %s (%.1f us)\n", at100 < 1000000 ? "met" : "MISSED",
           at100 / 1e3);
    return 0;
}
