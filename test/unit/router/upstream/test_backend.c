/* test/unit/router/upstream/test_backend.c: tests router/upstream/backend.c, the backends'
 * registry, on its own: it sends nothing to a pod, so its checks are hooks this test records.
 * Backends take the lowest free slot and tell the hooks in order (prepare before the backend is
 * published, join after); one whose prepare fails is refused whole; a removed one leaves its slot
 * at once but is freed only once nothing holds it and no check runs; health results move it down
 * after `fall` and up after `rise`; failed connects eject it until a probe or the end of its
 * ejection; a model list decides what it serves. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bus.h"
#include "pcr_test.h"

#define MAX_EVENTS 64

/* What the hooks saw, in order: "p:a" prepare of a, "j:a" join, "l:a" leave, "d:a" dispose. */
static char events[MAX_EVENTS][40];
static int nevents;
static int fail_prepare;     /* the next prepare fails */
static int busy;             /* every backend has a check running */

static void note(char kind, const pcr_backend_t *be)
{
    if (nevents < MAX_EVENTS)
        snprintf(events[nevents++], sizeof(events[0]), "%c:%s", kind, be->conf.name);
}

static int on_prepare(pcr_backend_t *be)
{
    note('p', be);
    if (fail_prepare) {
        fail_prepare = 0;
        return PCR_ERR_NOMEM;
    }
    return 0;
}

static void on_join(pcr_backend_t *be)
{
    /* Published before join: any thread may find it in its slot now. */
    PCR_CHECK(pcr_backend_at(be->srv, (size_t)be->id) == be);
    note('j', be);
}

static void on_leave(pcr_backend_t *be) { note('l', be); }
static int on_busy(const pcr_backend_t *be) { return busy; }
static void on_dispose(pcr_backend_t *be) { note('d', be); }

static const pcr_backend_hooks_t hooks = {on_prepare, on_join, on_leave, on_busy, on_dispose};

static const char config_text[] =
    "{\"listen\": [{\"address\": \"127.0.0.1:0\"}],\n"
    " \"backends\": [\n"
    "   {\"name\": \"pod-a\", \"url\": \"http://127.0.0.1:9001\", \"models\": [\"m1\"],\n"
    "    \"capacity_tokens\": 64000},\n"
    "   {\"name\": \"pod-b\", \"url\": \"http://127.0.0.1:9002\"}],\n"
    " \"health\": {\"fall\": 2, \"rise\": 1},\n"
    " \"outlier\": {\"consecutive_errors\": 3, \"consecutive_connect_errors\": 2,\n"
    "             \"ejection_ms\": 1000, \"max_ejection_ms\": 8000}}\n";

static pcr_server_t srv;

static void open_registry(void)
{
    memset(&srv, 0, sizeof(srv));
    nevents = 0;
    fail_prepare = busy = 0;
    char *errors = NULL;
    srv.cfg = pcr_config_parse(config_text, "test.json", &errors);
    PCR_CHECK(srv.cfg != NULL);
    if (srv.cfg == NULL) {
        printf("# %s\n", errors ? errors : "");
        free(errors);
        exit(1);
    }
    srv.bus = pcr_bus_new(1);
    PCR_CHECK_EQ_INT(pcr_backends_open(&srv, &hooks), 0);
}

static void close_registry(void)
{
    pcr_backends_close(&srv);
    pcr_bus_free(srv.bus);
    pcr_config_free(srv.cfg);
}

static int seen(const char *ev)
{
    for (int i = 0; i < nevents; i++)
        if (strcmp(events[i], ev) == 0)
            return i;
    return -1;
}

static void test_open_adds_in_order_with_hooks(void)
{
    open_registry();
    PCR_CHECK_EQ_INT(pcr_backends_count(&srv), 2);
    PCR_CHECK_EQ_INT(pcr_backend_slots(&srv), 2);
    PCR_CHECK_STR(pcr_backend_at(&srv, 0)->conf.name, "pod-a");
    PCR_CHECK_STR(pcr_backend_at(&srv, 1)->conf.name, "pod-b");
    PCR_CHECK(pcr_backend_find(&srv, "pod-b") == pcr_backend_at(&srv, 1));
    PCR_CHECK(pcr_backend_find(&srv, "pod-c") == NULL);
    PCR_CHECK(pcr_backend_at(&srv, 2) == NULL);
    PCR_CHECK(pcr_backend_at(&srv, PCR_MAX_BACKENDS) == NULL);
    PCR_CHECK_EQ_INT(nevents, 4);
    PCR_CHECK_STR(events[0], "p:pod-a");
    PCR_CHECK_STR(events[1], "j:pod-a");
    PCR_CHECK_STR(events[2], "p:pod-b");
    PCR_CHECK_STR(events[3], "j:pod-b");
    PCR_CHECK_STR(pcr_backend_at(&srv, 0)->host_header, "127.0.0.1:9001");
    close_registry();
    PCR_CHECK(seen("d:pod-a") >= 0 && seen("d:pod-b") >= 0);
}

static void test_failed_prepare_refuses_the_backend(void)
{
    open_registry();
    pcr_backend_conf_t bc = srv.cfg->backends[1];
    bc.name = "pod-c";
    pcr_backend_t *b = pcr_backend_at(&srv, 1);
    fail_prepare = 1;
    nevents = 0;
    PCR_CHECK(pcr_backend_add(&srv, &bc, (const struct sockaddr *)&b->addr, b->addrlen) == NULL);
    PCR_CHECK_EQ_INT(pcr_backends_count(&srv), 2);
    PCR_CHECK(pcr_backend_find(&srv, "pod-c") == NULL);
    /* Told to prepare, never to join, and disposed of. */
    PCR_CHECK(seen("p:pod-c") == 0 && seen("j:pod-c") < 0 && seen("d:pod-c") > 0);
    /* The slot it would have had is still free. */
    pcr_backend_t *c = pcr_backend_add(&srv, &bc, (const struct sockaddr *)&b->addr, b->addrlen);
    PCR_CHECK(c != NULL && c->id == 2);
    close_registry();
}

static void test_removed_backend_drains_before_it_is_freed(void)
{
    open_registry();
    pcr_backend_t *a = pcr_backend_at(&srv, 0);
    pcr_backend_ref(a); /* an exchange still sent to it */
    nevents = 0;
    pcr_backend_remove(a);
    PCR_CHECK(pcr_backend_at(&srv, 0) == NULL);
    PCR_CHECK_EQ_INT(pcr_backends_count(&srv), 1);
    PCR_CHECK_STR(events[0], "l:pod-a");
    pcr_backends_collect(&srv);
    PCR_CHECK(seen("d:pod-a") < 0); /* held */
    pcr_backend_unref(a);
    busy = 1;
    pcr_backends_collect(&srv);
    PCR_CHECK(seen("d:pod-a") < 0); /* a check still runs */
    busy = 0;
    pcr_backends_collect(&srv);
    PCR_CHECK(seen("d:pod-a") > 0);
    /* Its slot is free again, and the lowest. */
    const pcr_backend_conf_t *bc = &srv.cfg->backends[0];
    pcr_backend_t *b = pcr_backend_at(&srv, 1);
    pcr_backend_t *again = pcr_backend_add(&srv, bc, (const struct sockaddr *)&b->addr, b->addrlen);
    PCR_CHECK(again != NULL && again->id == 0);
    close_registry();
}

static void test_health_results_move_up_and_down(void)
{
    open_registry();
    pcr_backend_t *a = pcr_backend_at(&srv, 0);
    PCR_CHECK_EQ_INT(a->up, 1); /* optimistic until a check says otherwise */
    pcr_backend_check_result(a, 0);
    PCR_CHECK_EQ_INT(a->up, 1); /* fall is 2 */
    pcr_backend_check_result(a, 0);
    PCR_CHECK_EQ_INT(a->up, 0);
    PCR_CHECK_EQ_INT(pcr_backends_up(&srv), 1);
    pcr_backend_check_result(a, 1); /* rise is 1 */
    PCR_CHECK_EQ_INT(a->up, 1);
    PCR_CHECK_EQ_INT(pcr_backends_up(&srv), 2);
    close_registry();
}

static void test_failed_connects_eject_until_a_probe_or_the_end(void)
{
    open_registry();
    pcr_backend_t *a = pcr_backend_at(&srv, 0);
    const pcr_outlier_conf_t *o = &srv.cfg->outlier;
    uint64_t now = 1000000000;
    pcr_backend_report(a, o, PCR_OUTCOME_CONNECT, now);
    PCR_CHECK(!pcr_backend_ejected(a, now));
    pcr_backend_report(a, o, PCR_OUTCOME_CONNECT, now);
    PCR_CHECK(pcr_backend_ejected(a, now));
    PCR_CHECK(!pcr_backend_ejected(a, now + 1000 * 1000)); /* ejection_ms */
    pcr_backend_uneject(a); /* a probe answered */
    PCR_CHECK(!pcr_backend_ejected(a, now));
    /* Errors: three in a row, and a 4xx (OK) between resets the count. */
    pcr_backend_report(a, o, PCR_OUTCOME_5XX, now);
    pcr_backend_report(a, o, PCR_OUTCOME_5XX, now);
    pcr_backend_report(a, o, PCR_OUTCOME_OK, now);
    pcr_backend_report(a, o, PCR_OUTCOME_5XX, now);
    PCR_CHECK(!pcr_backend_ejected(a, now));
    pcr_backend_report(a, o, PCR_OUTCOME_ERROR, now);
    pcr_backend_report(a, o, PCR_OUTCOME_5XX, now);
    PCR_CHECK(pcr_backend_ejected(a, now));
    /* The second ejection in a row lasts twice as long. */
    PCR_CHECK(pcr_backend_ejected(a, now + 1500 * 1000));
    uint64_t until = a->ejected_until_us;
    pcr_backend_ejection_served(a, until);
    PCR_CHECK(!pcr_backend_ejected(a, now));
    PCR_CHECK_EQ_INT(a->ejections_total, 2);
    close_registry();
}

static void test_models_and_capacity(void)
{
    open_registry();
    pcr_backend_t *a = pcr_backend_at(&srv, 0), *b = pcr_backend_at(&srv, 1);
    uint64_t m1 = pcr_model_hash("m1", 2), m2 = pcr_model_hash("m2", 2);
    PCR_CHECK(pcr_backend_serves(a, "m1", m1));
    PCR_CHECK(!pcr_backend_serves(a, "m2", m2)); /* its config lists m1 only */
    PCR_CHECK(pcr_backend_serves(a, "", 0));     /* a request naming no model */
    PCR_CHECK(pcr_backend_serves(b, "m2", m2));  /* nothing known yet: any */
    pcr_modelset_store(&b->pod_models, &m1, 1);  /* its pod says m1 */
    PCR_CHECK(!pcr_backend_serves(b, "m2", m2));
    PCR_CHECK(pcr_backend_serves(b, "m1", m1));
    /* Capacity in tokens, as blocks of the index: PCR_BYTES_PER_TOKEN bytes a token. */
    pcr_backend_desc_t d;
    pcr_backend_desc(a, &d);
    PCR_CHECK_EQ_INT(d.capacity_blocks,
                     64000 * PCR_BYTES_PER_TOKEN / srv.cfg->routing.block_bytes);
    close_registry();
}

int main(void)
{
    PCR_RUN(test_open_adds_in_order_with_hooks);
    PCR_RUN(test_failed_prepare_refuses_the_backend);
    PCR_RUN(test_removed_backend_drains_before_it_is_freed);
    PCR_RUN(test_health_results_move_up_and_down);
    PCR_RUN(test_failed_connects_eject_until_a_probe_or_the_end);
    PCR_RUN(test_models_and_capacity);
    return pcr_test_done();
}
