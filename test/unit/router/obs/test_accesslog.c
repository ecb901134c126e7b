/* test/unit/router/obs/test_accesslog.c: tests router/obs/accesslog.c, the access log's writer
 * thread: lines from several producers all arrive whole, a reopen after a rename (rotation) loses
 * none and duplicates none, lines too long are dropped and counted, and a file that cannot be
 * opened is an error at start and keeps the old file at a reopen. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accesslog.h"
#include "pcr_test.h"

#define PRODUCERS 3
#define LINES 20000

typedef struct {
    pcr_accesslog_t *al;
    unsigned q;
    int sent;            /* atomic: the main thread waits on it */
    int full_seen;
} producer_t;

static void *produce(void *arg)
{
    producer_t *p = arg;
    char line[128];
    for (int i = 0; i < LINES; i++) {
        int n = snprintf(line, sizeof(line), "producer %u line %d %s\n", p->q, i,
                         "padding-padding-padding-padding");
        /* A full queue drops: wait for room so that this test counts on every line. */
        while (pcr_accesslog_write(p->al, p->q, line, (size_t)n) == PCR_ERR_FULL) {
            p->full_seen++;
            usleep(100);
        }
        __atomic_store_n(&p->sent, i + 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Counts, per producer and line number, how often each line appears in `path`. */
static int count_lines(const char *path, unsigned char seen[PRODUCERS][LINES], int *bad)
{
    FILE *f = fopen(path, "r");
    char buf[256];
    int n = 0;
    if (f == NULL)
        return 0;
    while (fgets(buf, sizeof(buf), f) != NULL) {
        unsigned q;
        int i;
        if (sscanf(buf, "producer %u line %d ", &q, &i) != 2 || q >= PRODUCERS || i < 0 ||
            i >= LINES || buf[strlen(buf) - 1] != '\n') {
            (*bad)++;
            continue;
        }
        seen[q][i]++;
        n++;
    }
    fclose(f);
    return n;
}

static void test_rotation_loses_no_line(void)
{
    char dir[] = "/tmp/pcr-accesslog-XXXXXX";
    PCR_CHECK(mkdtemp(dir) != NULL);
    char path[256], rotated[256], err[256];
    snprintf(path, sizeof(path), "%s/access.log", dir);
    snprintf(rotated, sizeof(rotated), "%s/access.log.1", dir);
    pcr_accesslog_t *al = pcr_accesslog_new(path, PRODUCERS, 64 * 1024, err, sizeof(err));
    PCR_CHECK(al != NULL);
    if (al == NULL)
        return;
    pthread_t th[PRODUCERS];
    producer_t p[PRODUCERS];
    for (unsigned i = 0; i < PRODUCERS; i++) {
        p[i] = (producer_t){.al = al, .q = i};
        pthread_create(&th[i], NULL, produce, &p[i]);
    }
    /* Rotate while they write (each has 1000 lines out, and far more to go, which its queue
     * of 64 KiB cannot hold ahead): rename, then ask for the reopen. */
    for (unsigned i = 0; i < PRODUCERS; i++)
        for (int k = 0; k < 100000 && __atomic_load_n(&p[i].sent, __ATOMIC_RELAXED) < 1000; k++)
            usleep(100); /* polled, 10 s at most */
    PCR_CHECK(rename(path, rotated) == 0);
    pcr_accesslog_reopen(al, NULL);
    for (unsigned i = 0; i < PRODUCERS; i++)
        pthread_join(th[i], NULL);
    PCR_CHECK_EQ_INT(pcr_accesslog_reopens(al), 1);
    pcr_accesslog_free(al);

    static unsigned char seen[PRODUCERS][LINES];
    memset(seen, 0, sizeof(seen));
    int bad = 0;
    int in_old = count_lines(rotated, seen, &bad), in_new = count_lines(path, seen, &bad);
    int missing = 0, twice = 0;
    for (unsigned q = 0; q < PRODUCERS; q++)
        for (int i = 0; i < LINES; i++) {
            missing += seen[q][i] == 0;
            twice += seen[q][i] > 1;
        }
    printf("# %d lines before the reopen, %d after\n", in_old, in_new);
    PCR_CHECK_EQ_INT(bad, 0);
    PCR_CHECK_EQ_INT(missing, 0);
    PCR_CHECK_EQ_INT(twice, 0);
    PCR_CHECK(in_old > 0);
    PCR_CHECK(in_new > 0);
    unlink(path);
    unlink(rotated);
    rmdir(dir);
}

static void test_too_long_is_dropped(void)
{
    char dir[] = "/tmp/pcr-accesslog-XXXXXX", path[256], err[256];
    PCR_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/a.log", dir);
    pcr_accesslog_t *al = pcr_accesslog_new(path, 1, 0, err, sizeof(err));
    PCR_CHECK(al != NULL);
    if (al == NULL)
        return;
    size_t n = PCR_ACCESSLOG_MAX_LINE + 1;
    char *big = malloc(n);
    memset(big, 'x', n);
    big[n - 1] = '\n';
    PCR_CHECK_EQ_INT(pcr_accesslog_write(al, 0, big, n), PCR_ERR_TOO_LARGE);
    PCR_CHECK_EQ_INT(pcr_accesslog_write(al, 7, "no such queue\n", 14), PCR_ERR_INVAL);
    pcr_accesslog_drop(al);
    PCR_CHECK_EQ_INT(pcr_accesslog_dropped(al), 2);
    pcr_accesslog_write(al, 0, "kept\n", 5);
    pcr_accesslog_free(al);
    free(big);
    FILE *f = fopen(path, "r");
    char buf[64] = "";
    PCR_CHECK(f != NULL && fgets(buf, sizeof(buf), f) != NULL);
    PCR_CHECK_STR(buf, "kept\n");
    if (f != NULL)
        fclose(f);
    unlink(path);
    rmdir(dir);
}

static void test_unopenable_file(void)
{
    char err[256] = "";
    pcr_accesslog_t *al = pcr_accesslog_new("/nonexistent-dir/a.log", 1, 0, err, sizeof(err));
    PCR_CHECK(al == NULL);
    PCR_CHECK(strstr(err, "cannot open /nonexistent-dir/a.log") != NULL);

    /* At a reopen, the file in use stays. */
    char dir[] = "/tmp/pcr-accesslog-XXXXXX", path[256];
    PCR_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/a.log", dir);
    al = pcr_accesslog_new(path, 1, 0, err, sizeof(err));
    PCR_CHECK(al != NULL);
    if (al == NULL)
        return;
    pcr_accesslog_reopen(al, "/nonexistent-dir/b.log");
    for (int i = 0; i < 200 && pcr_accesslog_reopens(al) == 0; i++)
        usleep(1000);
    pcr_accesslog_write(al, 0, "still here\n", 11);
    pcr_accesslog_free(al);
    FILE *f = fopen(path, "r");
    char buf[64] = "";
    PCR_CHECK(f != NULL && fgets(buf, sizeof(buf), f) != NULL);
    PCR_CHECK_STR(buf, "still here\n");
    if (f != NULL)
        fclose(f);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    PCR_RUN(test_rotation_loses_no_line);
    PCR_RUN(test_too_long_is_dropped);
    PCR_RUN(test_unopenable_file);
    return pcr_test_done();
}
