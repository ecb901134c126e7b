/* test/unit/router/upstream/test_upstream.c: tests router/upstream/upstream.c and
 * upstream_queue.c, the pool's one send and its hold queue, on their own: with the pod's prefill
 * budget (routing.hold_tokens) spent, completions are held in the pool without a connection, so
 * nothing is sent anywhere. Held completions count in the pool's and the backend's gauges, their
 * client's count of requests on pod connections stays untouched, a cancelled one leaves without
 * a callback, and the rest fail oldest first when the backend leaves rotation, or with
 * PCR_UP_HELD at timeouts.response_ms; a request that is not a completion is never held. The
 * HTTP/1.1 client behind the pool is the fuzz target test/fuzz/fuzz_h1_response.c's, whose corpus
 * every build replays. */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "backend.h"
#include "bus.h"
#include "pcr_test.h"
#include "upstream.h"

static const char config_text[] =
    "{\"listen\": [{\"address\": \"127.0.0.1:0\"}],\n"
    " \"backends\": [{\"name\": \"pod-a\", \"url\": \"http://127.0.0.1:9\"}],\n"
    " \"routing\": {\"hold_tokens\": 1000},\n"
    " \"timeouts\": {\"response_ms\": 50}}\n";

static int on_prepare(pcr_backend_t *be) { return 0; }
static void on_be(pcr_backend_t *be) {}
static int on_busy(const pcr_backend_t *be) { return 0; }
static const pcr_backend_hooks_t hooks = {on_prepare, on_be, on_be, on_busy, on_be};

static pcr_server_t srv;
static struct event_base *base;
static pcr_backend_t *be;
static pcr_pool_t pool;
static const int not_draining = 0;

/* What the callbacks saw: the order of errors by request number, and any other call. */
typedef struct {
    int id;
    pcr_light_client_t *owner;
} req_ctx_t;
static int errors[8], nerrors;
static pcr_up_error_t last_err;
static int other_calls;

static void on_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    other_calls++;
}
static void on_body(void *ctx, const char *data, size_t len) { other_calls++; }
static void on_done(void *ctx) { other_calls++; }
static void on_error(void *ctx, pcr_up_error_t err, int got_head)
{
    req_ctx_t *c = ctx;
    if (nerrors < 8)
        errors[nerrors++] = c->id;
    last_err = err;
    PCR_CHECK(!got_head);
}
static pcr_light_client_t *owner_of(void *ctx) { return ((req_ctx_t *)ctx)->owner; }

static const pcr_upstream_cbs_t cbs = {on_head, on_body, on_done, on_error, owner_of, NULL, NULL, NULL};

static void open_pool(void)
{
    memset(&srv, 0, sizeof(srv));
    char *errs = NULL;
    srv.cfg = pcr_config_parse(config_text, "test.json", &errs);
    PCR_CHECK(srv.cfg != NULL);
    if (srv.cfg == NULL) {
        printf("# %s\n", errs ? errs : "");
        free(errs);
        exit(1);
    }
    base = event_base_new();
    srv.base = base;
    srv.bus = pcr_bus_new(1);
    PCR_CHECK_EQ_INT(pcr_backends_open(&srv, &hooks), 0);
    be = pcr_backend_find(&srv, "pod-a");
    PCR_CHECK(be != NULL);
    pcr_pool_init(&pool, be, base, 1, &not_draining, (const pcr_config_t *const *)&srv.cfg);
    nerrors = other_calls = 0;
    last_err = 0;
}

static void close_pool(void)
{
    pcr_pool_dispose(&pool);
    pcr_backends_close(&srv);
    pcr_bus_free(srv.bus);
    pcr_config_free(srv.cfg);
    event_base_free(base);
}

static pcr_upreq_t *send_kind(req_ctx_t *c, pcr_up_kind_t kind, uint64_t prefill)
{
    struct evbuffer *head = evbuffer_new();
    evbuffer_add_printf(head, "POST /v1/completions HTTP/1.1\r\nHost: pod-a\r\n\r\n");
    pcr_up_send_t req = {.head = head, .kind = kind, .prefill = prefill};
    return pcr_upstream_send(&pool, &req, &cbs, c);
}

static void test_spent_budget_holds_completions_until_the_backend_leaves(void)
{
    open_pool();
    pcr_light_client_t load = {0};
    req_ctx_t c[3] = {{0, &load}, {1, &load}, {2, &load}};
    PCR_STORE(be->sent_prefill, 2000); /* other workers' prefill: the budget is spent */
    pcr_upreq_t *r[3];
    r[0] = send_kind(&c[0], PCR_UP_STREAM, 5000);
    r[1] = send_kind(&c[1], PCR_UP_UNSTREAMED, 5000);
    r[2] = send_kind(&c[2], PCR_UP_STREAM, 5000);
    for (int i = 0; i < 3; i++)
        PCR_CHECK(r[i] != NULL);
    /* Held, not sent: no connection, the gauges count them, the client has none on a pod. */
    PCR_CHECK_EQ_INT(pool.nconns, 0);
    PCR_CHECK_EQ_INT(pool.nheld, 3);
    PCR_CHECK_EQ_INT(PCR_LOAD(be->held), 3);
    PCR_CHECK_EQ_U64(PCR_LOAD(be->held_total), 3);
    PCR_CHECK_EQ_INT(load.busy, 0);
    PCR_CHECK_EQ_U64(pcr_upstream_sent_us(r[0]), 0);
    /* A cancelled one leaves the queue and the gauges, with no callback. */
    pcr_upstream_cancel(r[1]);
    PCR_CHECK_EQ_INT(pool.nheld, 2);
    PCR_CHECK_EQ_INT(PCR_LOAD(be->held), 2);
    /* The backend leaves rotation: the rest fail, oldest first, nothing was sent. */
    pcr_upstream_fail_held(&pool);
    PCR_CHECK_EQ_INT(nerrors, 2);
    PCR_CHECK_EQ_INT(errors[0], 0);
    PCR_CHECK_EQ_INT(errors[1], 2);
    PCR_CHECK_EQ_INT(last_err, PCR_UP_HELD_OUT);
    PCR_CHECK_EQ_INT(pool.nheld, 0);
    PCR_CHECK_EQ_INT(PCR_LOAD(be->held), 0);
    PCR_CHECK_EQ_INT(other_calls, 0);
    PCR_CHECK_EQ_INT(load.busy, 0);
    PCR_CHECK_EQ_U64(PCR_LOAD(be->sent_prefill), 2000); /* held ones were never charged */
    close_pool();
}

static void test_held_completion_fails_at_the_response_deadline(void)
{
    open_pool();
    req_ctx_t c = {7, NULL};
    PCR_STORE(be->sent_prefill, 2000);
    PCR_CHECK(send_kind(&c, PCR_UP_STREAM, 5000) != NULL);
    PCR_CHECK_EQ_INT(pool.nheld, 1);
    /* timeouts.response_ms is 50: the loop ends once the wait timer has fired. */
    event_base_dispatch(base);
    PCR_CHECK_EQ_INT(nerrors, 1);
    PCR_CHECK_EQ_INT(errors[0], 7);
    PCR_CHECK_EQ_INT(last_err, PCR_UP_HELD);
    PCR_CHECK_EQ_INT(pool.nheld, 0);
    PCR_CHECK_EQ_INT(PCR_LOAD(be->held), 0);
    close_pool();
}

static void test_small_and_plain_requests_are_not_held(void)
{
    open_pool();
    PCR_STORE(be->sent_prefill, 2000);
    /* A completion too small to matter, and a request that is not one, go whatever the budget
     * says: they take the pool's one connection slot (its connect is cancelled here, before the
     * loop runs) and the next waits for the slot, not for the budget. */
    req_ctx_t c[2] = {{0, NULL}, {1, NULL}};
    pcr_upreq_t *small = send_kind(&c[0], PCR_UP_STREAM, 10);
    pcr_upreq_t *plain = send_kind(&c[1], PCR_UP_PLAIN, 5000);
    PCR_CHECK(small != NULL && plain != NULL);
    PCR_CHECK_EQ_INT(pool.nheld, 0);
    PCR_CHECK_EQ_INT(PCR_LOAD(be->held), 0);
    PCR_CHECK_EQ_INT(pool.nconns, 1);
    PCR_CHECK_EQ_U64(PCR_LOAD(be->sent_prefill), 2010); /* the small one went: charged */
    PCR_CHECK(pcr_upstream_sent_us(small) != 0);
    PCR_CHECK_EQ_INT(pcr_upstream_prefill_done(small), 0); /* never held */
    PCR_CHECK_EQ_U64(PCR_LOAD(be->sent_prefill), 2000);
    pcr_upstream_cancel(plain);
    pcr_upstream_cancel(small);
    PCR_CHECK_EQ_INT(pool.nconns, 0);
    PCR_CHECK_EQ_INT(nerrors + other_calls, 0);
    close_pool();
}

int main(void)
{
    PCR_RUN(test_spent_budget_holds_completions_until_the_backend_leaves);
    PCR_RUN(test_held_completion_fails_at_the_response_deadline);
    PCR_RUN(test_small_and_plain_requests_are_not_held);
    return pcr_test_done();
}
