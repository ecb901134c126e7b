/* test_ring.c: hashring/ring.c, consistent hashing with bounded loads. */
#include <stdlib.h>
#include <xxhash.h>

#include "pcr/ring.h"
#include "pcr_test.h"

#define NKEYS 20000

static const char *names[] = {"pod-a", "pod-b", "pod-c", "pod-d", "pod-e", "pod-f", "pod-g",
                              "pod-h", "pod-i"};

static uint64_t key_of(int i)
{
    return XXH3_64bits(&i, sizeof(i));
}

static void test_deterministic_and_total(void)
{
    pcr_ring_t *r1 = pcr_ring_new(names, NULL, 8, 160);
    pcr_ring_t *r2 = pcr_ring_new(names, NULL, 8, 160);
    int same = 1, counts[8] = {0};
    PCR_CHECK_EQ_INT(pcr_ring_points(r1), 8 * 160);
    for (int i = 0; i < NKEYS; i++) {
        int a = pcr_ring_lookup(r1, key_of(i), NULL, NULL, 0);
        same &= a == pcr_ring_lookup(r2, key_of(i), NULL, NULL, 0);
        if (a >= 0 && a < 8)
            counts[a]++;
    }
    PCR_CHECK(same);
    for (int b = 0; b < 8; b++)  /* 160 points each: within 25% of the mean */
        PCR_CHECK(counts[b] > NKEYS / 8 * 3 / 4 && counts[b] < NKEYS / 8 * 5 / 4);
    /* The last point wraps around to the first. */
    PCR_CHECK(pcr_ring_lookup(r1, UINT64_MAX, NULL, NULL, 0) >= 0);
    pcr_ring_free(r1);
    pcr_ring_free(r2);
}

static void test_adding_one_moves_one_nth(void)
{
    pcr_ring_t *r8 = pcr_ring_new(names, NULL, 8, 160);
    pcr_ring_t *r9 = pcr_ring_new(names, NULL, 9, 160);
    int moved = 0, moved_elsewhere = 0;
    for (int i = 0; i < NKEYS; i++) {
        int a = pcr_ring_lookup(r8, key_of(i), NULL, NULL, 0);
        int b = pcr_ring_lookup(r9, key_of(i), NULL, NULL, 0);
        moved += a != b;
        moved_elsewhere += a != b && b != 8;  /* a key only ever moves to the new backend */
    }
    /* Ideal is 1/9 of the keys (2222). */
    PCR_CHECK(moved > NKEYS / 9 * 7 / 10 && moved < NKEYS / 9 * 13 / 10);
    PCR_CHECK_EQ_INT(moved_elsewhere, 0);
    /* Removing one (marking it unusable) moves only its own keys. */
    unsigned char usable[9] = {1, 1, 1, 0, 1, 1, 1, 1, 1};
    moved = 0;
    int wrong = 0;
    for (int i = 0; i < NKEYS; i++) {
        int a = pcr_ring_lookup(r9, key_of(i), NULL, NULL, 0);
        int b = pcr_ring_lookup(r9, key_of(i), NULL, usable, 0);
        moved += a != b;
        wrong += a != b && a != 3;
        wrong += b == 3;
    }
    PCR_CHECK(moved > NKEYS / 9 * 7 / 10 && moved < NKEYS / 9 * 13 / 10);
    PCR_CHECK_EQ_INT(wrong, 0);
    pcr_ring_free(r8);
    pcr_ring_free(r9);
}

static void test_weights_honoured(void)
{
    const uint32_t w[4] = {1, 1, 2, 4};
    pcr_ring_t *r = pcr_ring_new(names, w, 4, 160);
    int counts[4] = {0};
    for (int i = 0; i < 80000; i++)
        counts[pcr_ring_lookup(r, key_of(i), NULL, NULL, 0)]++;
    /* Shares 1/8, 1/8, 2/8, 4/8, each within 20%. */
    PCR_CHECK(counts[0] > 8000 && counts[0] < 12000);
    PCR_CHECK(counts[1] > 8000 && counts[1] < 12000);
    PCR_CHECK(counts[2] > 16000 && counts[2] < 24000);
    PCR_CHECK(counts[3] > 32000 && counts[3] < 48000);
    pcr_ring_free(r);
}

static void test_bound_respected(void)
{
    const double c = 1.25;
    pcr_ring_t *r = pcr_ring_new(names, NULL, 8, 160);
    uint64_t load[8] = {0}, total = 0;
    int violations = 0;
    /* Every request the same key: the worst case for a plain ring. */
    for (int i = 0; i < 1000; i++) {
        int b = pcr_ring_lookup(r, 12345, load, NULL, c);
        uint64_t bound = pcr_ring_bound(total, 1, 8, c);
        violations += b < 0 || load[b] + 1 > bound;
        load[b]++;
        total++;
    }
    PCR_CHECK_EQ_INT(violations, 0);
    for (int b = 0; b < 8; b++)   /* ceil(1.25 * 1000 / 8) = 157 */
        PCR_CHECK(load[b] <= 157);
    /* Load leaves as it came: random departures, arrivals keep the bound. */
    uint64_t s = 7;
    for (int i = 0; i < 20000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int b = (int)((s >> 33) % 8);
        if (load[b] > 0 && (s >> 20) % 2) {
            load[b]--;
            total--;
        }
        int c2 = pcr_ring_lookup(r, key_of(i % 50), load, NULL, c);
        violations += load[c2] + 1 > pcr_ring_bound(total, 1, 8, c);
        load[c2]++;
        total++;
    }
    PCR_CHECK_EQ_INT(violations, 0);
    pcr_ring_free(r);
}

static void test_bad_arguments(void)
{
    const char *bad[] = {"a", NULL};
    const uint32_t zero[1] = {0};
    unsigned char none[2] = {0, 0};
    PCR_CHECK(pcr_ring_new(bad, NULL, 2, 10) == NULL);
    PCR_CHECK(pcr_ring_new(names, zero, 1, 10) == NULL);
    PCR_CHECK(pcr_ring_new(names, NULL, 0, 10) == NULL);
    PCR_CHECK(pcr_ring_new(names, NULL, 2, 0) == NULL);
    PCR_CHECK(pcr_ring_new(names, NULL, 2, PCR_RING_MAX_POINTS) == NULL);
    pcr_ring_t *r = pcr_ring_new(names, NULL, 2, 10);
    PCR_CHECK_EQ_INT(pcr_ring_lookup(r, 1, NULL, none, 1.25), -1);
    PCR_CHECK_EQ_INT(pcr_ring_lookup(NULL, 1, NULL, NULL, 1.25), -1);
    pcr_ring_free(r);
    pcr_ring_free(NULL);
}

int main(void)
{
    PCR_RUN(test_deterministic_and_total);
    PCR_RUN(test_adding_one_moves_one_nth);
    PCR_RUN(test_weights_honoured);
    PCR_RUN(test_bound_respected);
    PCR_RUN(test_bad_arguments);
    return pcr_test_done();
}
