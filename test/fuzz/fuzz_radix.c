/* test/fuzz/fuzz_radix.c: the prefix index (hashring/radix.c) against the naive reference
 * model (test/unit/hashring/radix_ref.c), under operations the fuzzer chooses.
 *
 * Input: one byte of set-up (backends 1..4, a hash alphabet of 2..5 values so that paths
 * share prefixes and split runs, an optional memory cap, an optional failure of
 * pcr_index_new), then operations until the input ends (at most MAX_OPS):
 *
 *   op byte: bits 0-2 the operation (insert x3, match, erase, set_capacity, remove_backend,
 *            insert), bits 3-6 the backend, bit 7 "inject an allocation failure", which takes
 *            one more byte: the n-th allocation of the operation fails (and, with its top bit,
 *            every later one too);
 *   key:     a length byte (1..6 blocks), then one byte per block; erase takes a `from` byte,
 *            set_capacity a capacity byte (255 = unlimited).
 *
 * After every operation the index must pass pcr_index_check, its byte count must equal what
 * the allocator has live, and its content, read back block by block with the time of last
 * use, must equal the model's exactly. Where the model cannot predict the index (an injected
 * failure; the memory cap, which it does not model), the content must stay within what the
 * contract allows, read from include/pcr/index.h:
 *   - a failed insert holds nothing but what was there before, plus a leading part of the new
 *     blocks from *added_from on, stamped `now`; the backend loses none of the key it held
 *     (without the memory cap), and other backends are untouched;
 *   - erase and set_capacity may forget more than asked (never anything else, never another
 *     backend's blocks), and never fail;
 *   - the memory cap only takes blocks away, the oldest leaves first, and after an insert the
 *     index is within it;
 * and then the model is set to what the index holds, so the comparison goes on exactly. */
#include <string.h>

#include "fuzz.h"
#include "radix_int.h"
#include "radix_ref.h"

#define MAX_OPS 120   /* at most 6 new records each: far under RADIX_REF_MAX */
#define RL RADIX_REF_MAXLEN

enum { OP_MATCH = 3, OP_ERASE = 4, OP_CAPACITY = 5, OP_REMOVE = 6 };

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t next(input_t *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

/* ---- an allocator that counts, and fails when told --------------------------------------- */

typedef struct {
    size_t live;       /* bytes handed out and not yet freed */
    long calls;        /* in the current operation */
    long fail_at;      /* the call that fails (1-based), 0 = none */
    int fail_rest;     /* and every later call too */
    long failed;       /* calls that failed in the current operation */
} alloc_t;

static void *alloc_malloc(size_t size, void *ud)
{
    alloc_t *a = ud;
    a->calls++;
    if (a->fail_at != 0 && (a->calls == a->fail_at || (a->fail_rest && a->calls > a->fail_at))) {
        a->failed++;
        return NULL;
    }
    void *p = malloc(size);
    if (p != NULL)
        a->live += size;
    return p;
}

static void alloc_free(void *p, size_t size, void *ud)
{
    alloc_t *a = ud;
    FUZZ_CHECKF(size <= a->live, "freeing %zu bytes, %zu live", size, a->live);
    a->live -= size;
    free(p);
}

/* ---- the index's content as model records ------------------------------------------------ */

/* Records compared through a table with a slot for every record a run can make: backend,
 * length and blocks (each under the largest alphabet, 5) give its place. Stamping one set's
 * records with a generation and looking the other's up compares them in one pass each, with
 * no sort. */
#define ALPHA_MAX 5
#define SEQS 15625            /* ALPHA_MAX ^ RL */
typedef struct {
    uint32_t mark;            /* == rec_gen: the stamped set holds this record, at `time` */
    uint32_t seen;            /* == rec_gen: the other set had it already */
    uint64_t time;
} rec_slot_t;
static rec_slot_t rec_tab[RADIX_REF_MAXB * RL * SEQS];
static uint32_t rec_gen;

static rec_slot_t *rec_slot(const radix_ref_rec_t *r)
{
    size_t id = 0;
    FUZZ_CHECKF(r->b < RADIX_REF_MAXB && r->len >= 1 && r->len <= RL, "backend %u, %zu blocks",
                r->b, r->len);
    for (size_t i = r->len; i-- > 0;) {
        FUZZ_CHECKF(r->seq[i] < ALPHA_MAX, "block hash %llu, never inserted",
                    (unsigned long long)r->seq[i]);
        id = id * ALPHA_MAX + r->seq[i];
    }
    return &rec_tab[(r->b * RL + r->len - 1) * SEQS + id];
}

/* A new generation: no slot is marked or seen. */
static void rec_new_gen(void)
{
    if (++rec_gen == 0) {
        memset(rec_tab, 0, sizeof rec_tab);
        rec_gen = 1;
    }
}

/* Marks every record of m (of backend `only`, or all when only < 0); returns how many. */
static size_t stamp(const radix_ref_t *m, int only)
{
    size_t k = 0;
    rec_new_gen();
    for (size_t i = 0; i < m->n; i++) {
        if (only >= 0 && m->r[i].b != (unsigned)only)
            continue;
        rec_slot_t *t = rec_slot(&m->r[i]);
        t->mark = rec_gen;
        t->time = m->r[i].time;
        k++;
    }
    return k;
}

/* The stamped record r, or NULL. */
static const rec_slot_t *stamped(const radix_ref_rec_t *r)
{
    const rec_slot_t *t = rec_slot(r);
    return t->mark == rec_gen ? t : NULL;
}

static void copy_model(radix_ref_t *dst, const radix_ref_t *src)
{
    dst->n = src->n;
    dst->nb = src->nb;
    dst->full = src->full;
    memcpy(dst->cap, src->cap, sizeof dst->cap);
    memcpy(dst->r, src->r, src->n * sizeof src->r[0]);
}

/* Reads every (backend, prefix, time) the index holds. Runs after pcr_index_check, so
 * the parent chains are known to end at the root. */
static void read_index(const pcr_index_t *ix, const uint64_t *caps, radix_ref_t *out)
{
    radix_ref_init(out, ix->nb);
    memcpy(out->cap, caps, sizeof out->cap);
    for (size_t i = 0; i <= ix->mask; i++) {
        const rnode_t *x = ix->slots[i];
        uint64_t path[RL];
        if (x == NULL)
            continue;
        for (const rnode_t *y = x; y != ix->root; y = y->parent) {
            FUZZ_CHECKF(y->depth + y->nblocks <= RL, "a path of %u blocks from keys of at most %d",
                        y->depth + y->nblocks, RL);
            memcpy(path + y->depth, y->hash, y->nblocks * sizeof(uint64_t));
        }
        for (size_t h = 0; h < x->nhold; h++) {
            for (size_t j = x->depth; j < x->depth + x->nblocks; j++) {
                FUZZ_CHECK(out->n < RADIX_REF_MAX);
                radix_ref_rec_t *r = &out->r[out->n++];
                r->b = x->hold[h].backend;
                r->len = j + 1;
                memcpy(r->seq, path, (j + 1) * sizeof(uint64_t));
                r->time = x->hold[h].time;
            }
        }
    }
}

static void print_rec(const char *what, const radix_ref_rec_t *r)
{
    fprintf(stderr, "%s: backend %u time %llu blocks", what, r->b, (unsigned long long)r->time);
    for (size_t i = 0; i < r->len; i++)
        fprintf(stderr, " %llu", (unsigned long long)r->seq[i]);
    fputc('\n', stderr);
}

/* Every record of `a` (of backend `only`, or all when only < 0) is in `b` with the same time,
 * and only once; with `equal`, `b` has no other (of that backend). `b`, a model, holds no
 * record twice. */
static int within(const radix_ref_t *a, const radix_ref_t *b, int only, int equal)
{
    size_t nb = stamp(b, only), matched = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (only >= 0 && a->r[i].b != (unsigned)only)
            continue;
        rec_slot_t *t = rec_slot(&a->r[i]);
        if (t->mark != rec_gen || t->time != a->r[i].time || t->seen == rec_gen) {
            print_rec(t->seen == rec_gen ? "twice in the index" : "unexpected in the index",
                      &a->r[i]);
            if (t->mark == rec_gen && t->time != a->r[i].time)
                fprintf(stderr, "expected: time %llu\n", (unsigned long long)t->time);
            return 0;
        }
        t->seen = rec_gen;
        matched++;
    }
    for (size_t j = 0; equal && matched < nb && j < b->n; j++) {
        if ((only < 0 || b->r[j].b == (unsigned)only) && rec_slot(&b->r[j])->seen != rec_gen) {
            print_rec("missing from the index", &b->r[j]);
            return 0;
        }
    }
    return 1;
}

static int is_key_prefix(const radix_ref_rec_t *r, const uint64_t *k, size_t n)
{
    return r->len <= n && memcmp(r->seq, k, r->len * sizeof(uint64_t)) == 0;
}

/* ---- the run ----------------------------------------------------------------------------- */

typedef struct {
    pcr_index_t *ix;
    alloc_t al;
    size_t nb;
    size_t max_bytes;                    /* a memory cap the model does not follow, or 0 */
    int capped;
    radix_ref_t *want, *succ, *got, *before;
} run_t;

static radix_ref_t models[4];

/* What holds after every operation, whatever happened. */
static void check_index(run_t *r)
{
    char err[256] = "";
    int rc = pcr_index_check(r->ix, err, sizeof err);
    FUZZ_CHECKF(rc == 0, "pcr_index_check: %s", err);
    FUZZ_CHECKF(pcr_index_bytes(r->ix) == r->al.live, "the index counts %zu bytes, %zu live",
                pcr_index_bytes(r->ix), r->al.live);
    read_index(r->ix, r->want->cap, r->got);
    FUZZ_CHECK(pcr_index_pairs(r->ix) == r->got->n);
    for (unsigned b = 0; b < r->nb; b++) {
        FUZZ_CHECK(pcr_index_backend_blocks(r->ix, b) == radix_ref_count(r->got, b));
        FUZZ_CHECK(radix_ref_count(r->got, b) <= r->want->cap[b]);
    }
}

/* Under the memory cap, an insert then evicts whole leaf holdings, oldest first, so whatever
 * it took (in the model's `succ`, not in the index's `got`) is no newer than any leaf left. */
static void check_cap_order(const radix_ref_t *got, const radix_ref_t *succ)
{
    uint64_t newest_gone = 0;
    int gone = 0;
    stamp(got, -1);
    for (size_t i = 0; i < succ->n; i++) {
        const radix_ref_rec_t *e = &succ->r[i];
        if (stamped(e) == NULL) {
            newest_gone = gone && newest_gone > e->time ? newest_gone : e->time;
            gone = 1;
        }
    }
    for (size_t i = 0; i < got->n && gone; i++) {
        const radix_ref_rec_t *e = &got->r[i];
        radix_ref_rec_t child = *e;
        int leaf = 1;
        child.len = e->len + 1;
        for (uint64_t h = 0; h < ALPHA_MAX && leaf && e->len < RL; h++) {
            child.seq[e->len] = h;
            leaf = stamped(&child) == NULL;
        }
        if (leaf && e->time < newest_gone)
            print_rec("kept, older than an evicted block", e);
        FUZZ_CHECKF(!leaf || e->time >= newest_gone, "the memory cap evicted a block of time %llu",
                    (unsigned long long)newest_gone);
    }
}

/* The model could not follow this operation: check what the contract allows, then adopt the
 * index's content. `b` is the backend operated on; r->succ is the model's idea. */
static void adopt(run_t *r, unsigned b)
{
    for (unsigned o = 0; o < r->nb && !r->capped; o++)
        if (o != b)
            FUZZ_CHECKF(within(r->got, r->succ, (int)o, 1), "backend %u changed", o);
    memcpy(r->got->cap, r->succ->cap, sizeof r->got->cap);
    radix_ref_t *t = r->want;
    r->want = r->got;
    r->got = t;
}

static void do_insert(run_t *r, unsigned b, const uint64_t *k, size_t n, uint64_t now)
{
    int exact = r->al.fail_at == 0 && !r->capped;
    size_t from = 0;
    uint32_t held_before[RADIX_REF_MAXB], held_after[RADIX_REF_MAXB];

    if (exact) {
        size_t want_from = radix_ref_insert(r->want, b, k, n, now);
        FUZZ_CHECK(pcr_index_insert(r->ix, b, k, n, now, &from) == 0);
        FUZZ_CHECKF(from == want_from, "added from %zu, model %zu", from, want_from);
        check_index(r);
        FUZZ_CHECK(within(r->got, r->want, -1, 1));
        return;
    }
    copy_model(r->before, r->want);
    copy_model(r->succ, r->want);
    size_t want_from = radix_ref_insert(r->succ, b, k, n, now);
    pcr_index_match(r->ix, k, n, held_before);
    int rc = pcr_index_insert(r->ix, b, k, n, now, &from);
    check_index(r);
    if (r->al.failed == 0) {
        /* Only the memory cap differs from the model: it can only have taken blocks away. */
        FUZZ_CHECK(rc == 0);
        FUZZ_CHECKF(from == want_from, "added from %zu, model %zu", from, want_from);
        FUZZ_CHECK(within(r->got, r->succ, -1, 0));
        check_cap_order(r->got, r->succ);
    } else {
        FUZZ_CHECKF(rc == 0 || rc == PCR_ERR_NOMEM, "insert returned %d", rc);
        FUZZ_CHECK(from <= n);
        stamp(r->before, -1);
        for (size_t i = 0; i < r->got->n; i++) {
            const radix_ref_rec_t *g = &r->got->r[i];
            const rec_slot_t *old = stamped(g);
            if (g->b == b && is_key_prefix(g, k, n) && g->time == now) {
                /* New or refreshed: a new one lies past *added_from. */
                FUZZ_CHECKF(old != NULL || g->len > from, "new block %zu before added_from %zu",
                            g->len - 1, from);
            } else {
                FUZZ_CHECK(old != NULL && old->time == g->time);
            }
        }
        if (!r->capped) {
            pcr_index_match(r->ix, k, n, held_after);
            FUZZ_CHECKF(held_after[b] >= held_before[b], "held %u blocks of the key, now %u",
                        held_before[b], held_after[b]);
            /* Without an eviction to make (the one step that may fail silently, forgetting
             * more), a failed allocation was the insert's own: it must say so. */
            int evicts = radix_ref_count(r->before, b) + (n - held_before[b]) > r->before->cap[b];
            FUZZ_CHECKF(evicts || rc == PCR_ERR_NOMEM, "an allocation failed, insert returned %d",
                        rc);
        }
    }
    if (r->capped)
        FUZZ_CHECKF(pcr_index_bytes(r->ix) <= r->max_bytes || pcr_index_pairs(r->ix) == 0,
                    "%zu bytes over the cap of %zu", pcr_index_bytes(r->ix), r->max_bytes);
    adopt(r, b);
}

/* erase and set_capacity: exact unless an allocation failed, and then they may only have
 * forgotten more of backend b. Neither touches the memory cap. */
static void do_erase_or_cap(run_t *r, int erase, unsigned b, const uint64_t *k, size_t n,
                            size_t from, uint64_t cap)
{
    copy_model(r->succ, r->want);
    if (erase) {
        radix_ref_erase(r->succ, b, k, n, from);
        pcr_index_erase(r->ix, b, k, n, from);
    } else {
        radix_ref_set_capacity(r->succ, b, cap);
        FUZZ_CHECK(pcr_index_set_capacity(r->ix, b, cap) == 0);
    }
    memcpy(r->want->cap, r->succ->cap, sizeof r->want->cap);
    check_index(r);
    FUZZ_CHECK(within(r->got, r->succ, -1, r->al.failed == 0));
    adopt(r, b);
}

static void do_match(run_t *r, const uint64_t *k, size_t n)
{
    uint32_t got[RADIX_REF_MAXB], want[RADIX_REF_MAXB];
    size_t best = 0;
    radix_ref_match(r->want, k, n, want);
    size_t longest = pcr_index_match(r->ix, k, n, got);
    for (unsigned b = 0; b < r->nb; b++) {
        FUZZ_CHECKF(got[b] == want[b], "backend %u matches %u blocks, model %u", b, got[b], want[b]);
        best = want[b] > best ? want[b] : best;
    }
    FUZZ_CHECKF(longest == best, "match returned %zu, the longest held is %zu", longest, best);
}

static size_t read_key(input_t *in, unsigned alphabet, uint64_t *k)
{
    size_t n = 1 + next(in) % RL;
    for (size_t i = 0; i < n; i++)
        k[i] = next(in) % alphabet;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int trace = -1;    /* FUZZ_TRACE=1: print every operation (to read a crash) */
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    input_t in = {data, size};
    run_t r = {.want = &models[0], .succ = &models[1], .got = &models[2], .before = &models[3]};
    uint8_t setup = next(&in);
    unsigned alphabet = 2 + (setup >> 2) % 4;
    r.nb = 1 + setup % 4;
    r.capped = (setup >> 4) & 1;
    r.max_bytes = r.capped ? 1024 + 64 * (size_t)next(&in) : 0;
    if (setup & 0x20)
        r.al.fail_at = 1 + next(&in) % 4;

    pcr_index_allocator_t a = {alloc_malloc, alloc_free, &r.al};
    pcr_index_opts_t o = {.nbackends = r.nb, .max_bytes = r.max_bytes, .alloc = &a};
    r.ix = pcr_index_new(&o);
    if (r.al.failed) {
        FUZZ_CHECK(r.ix == NULL && r.al.live == 0);
        return 0;
    }
    FUZZ_CHECK(r.ix != NULL);
    radix_ref_init(r.want, r.nb);

    for (uint64_t now = 1; now <= MAX_OPS && in.n > 0; now++) {
        uint8_t op = next(&in);
        unsigned b = (op >> 3) % r.nb;
        uint64_t k[RL];
        size_t n = read_key(&in, alphabet, k);
        r.al.calls = r.al.failed = r.al.fail_at = r.al.fail_rest = 0;
        if (op & 0x80) {
            uint8_t f = next(&in);
            r.al.fail_at = 1 + (f & 7);
            r.al.fail_rest = f >> 7;
        }
        if (trace) {
            fprintf(stderr, "op %u backend %u fail %ld%s key", op & 7, b, r.al.fail_at,
                    r.al.fail_rest ? "+" : "");
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %llu", (unsigned long long)k[i]);
            fputc('\n', stderr);
        }
        switch (op & 7) {
        case OP_MATCH:
            do_match(&r, k, n);
            break;
        case OP_ERASE:
            do_erase_or_cap(&r, 1, b, k, n, next(&in) % (n + 1), 0);
            break;
        case OP_CAPACITY: {
            uint8_t c = next(&in);
            do_erase_or_cap(&r, 0, b, k, n, 0, c == 255 ? PCR_INDEX_UNLIMITED : c % 40);
            break;
        }
        case OP_REMOVE:
            radix_ref_remove(r.want, b);
            pcr_index_remove_backend(r.ix, b);
            check_index(&r);
            FUZZ_CHECK(within(r.got, r.want, -1, 1));
            break;
        default:
            do_insert(&r, b, k, n, now);
            break;
        }
        FUZZ_CHECK(!r.want->full);
    }
    r.al.fail_at = 0;
    pcr_index_free(r.ix);
    FUZZ_CHECKF(r.al.live == 0, "%zu bytes leaked", r.al.live);
    return 0;
}
