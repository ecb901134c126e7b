/* router/upstream/upstream_queue.c: owns the hold queue of a pool (upstream_int.h): the
 * requests waiting for a connection slot or for the pod's prefill budget, the budget's count,
 * and the one rank order over the workers.
 *
 * Holding (routing.hold_tokens, pcr/hold.h): a completion counts its uncached prefill in
 * `sent_prefill`, its pool's and its backend's (every worker's), from when it gets a connection
 * until its first event (pcr_upstream_prefill_done) or its end. One that is not streamed shows
 * no first token before its whole answer, yet its prefill is in the pod's queue all the same:
 * it counts until the time the caller estimates for its first token behind what was sent
 * before it (cbs->prefill_us, a timer: prefill_due), or its answer, whichever comes first
 * (PCR_UP_UNSTREAMED). While the backend's count is at the budget, new completions
 * join the wait queue too ("held"), and whoever waits goes first by pcr_hold_before (the
 * tenant's priority band, its fairness counter, its client's load, then pcr_hold_rank), save
 * that a held one goes before one of this worker's that counts on the blocks it brings
 * (pcr_upq_bringer). A request's budget leaves out the prefill of the pod priority classes it
 * passes (pcr_upq_open). Other requests rank as no prefill and are never held; they and small
 * completions (pcr_hold_small, unless they count on a held one) go while the budget is spent.
 * With no budget the queue stays FIFO. A queued request keeps its place until
 * timeouts.response_ms (PCR_UP_POOL_FULL, or PCR_UP_HELD for a held one), and a held one until
 * its backend leaves rotation (pcr_upstream_fail_held: PCR_UP_HELD_OUT, from the worker's tick).
 * The budget is the pod's, so a stream's first token on one worker may be what another's held
 * streams wait for, and the order is the pod's too: a release sends this worker's best held
 * stream only while no other worker's ranks higher (below, "one rank order"); when the budget is
 * still open and others hold streams, they are told (budget_freed, the owner's on_budget_open), and
 * each sends what it may (pcr_upstream_kick). */
#include <stdlib.h>

#include <event2/event.h>

#include "pcr/connshare.h"
#include "pcr/hold.h"
#include "upstream_int.h"

/* routing.hold_tokens (0: no budget), as the owner's config says now: the pod's, counted over
 * every worker. */
uint64_t pcr_upq_budget(const pcr_pool_t *pool)
{
    return (*pool->cfg)->routing.hold_tokens;
}

/* Whether a stream may go to the pod now: the prefill every worker has sent it and not seen
 * finish is under the budget. Whichever worker's stream brings that under it wakes the others
 * (pcr_upq_freed), so a worker with nothing of its own in flight there is not left waiting.
 * For `r`, the prefill of the pod priority classes it passes is left out: the pod preempts it
 * for `r`, so holding `r` behind it would spare it nothing. */
int pcr_upq_open(const pcr_pool_t *pool, const pcr_upreq_t *r)
{
    uint64_t sent = PCR_LOAD(pool->be->sent_prefill);
    for (uint64_t m = r != NULL ? r->passes : 0; m != 0 && sent > 0; m &= m - 1) {
        uint64_t p = PCR_LOAD(pool->be->sent_by_class[__builtin_ctzll(m)]);
        sent = sent > p ? sent - p : 0;
    }
    return pcr_hold_open(sent, pcr_upq_budget(pool));
}

static void prefill_due(evutil_socket_t fd, short what, void *arg);
static void on_wait_timeout(evutil_socket_t fd, short what, void *arg);

/* An unstreamed request's prefill leaves the count when its caller expects its first token:
 * behind the prefill sent before it, its own included (cbs->prefill_us). No later than the
 * response deadline, which would end it anyway. Without a timer (out of memory) it stays
 * counted until its answer, as a stream whose first token never came. */
static void prefill_arm(pcr_upreq_t *r)
{
    if (r->cbs->prefill_us == NULL)
        return;
    uint64_t us = r->cbs->prefill_us(r->ctx, r->ahead + r->prefill);
    uint64_t cap = (uint64_t)tmo(r->pool)->response_ms * 1000;
    if (us > cap)
        us = cap;
    if (r->prefill_timer == NULL)
        r->prefill_timer = evtimer_new(r->pool->base, prefill_due, r);
    if (r->prefill_timer == NULL)
        return;
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    evtimer_add(r->prefill_timer, &tv);
}

void pcr_upq_charge(pcr_upreq_t *r)
{
    if (pcr_upreq_budgeted(r) && !r->charged) {
        r->ahead = PCR_LOAD(r->pool->be->sent_prefill);
        r->t_sent = pcr_now_us();
        r->pool->sent_prefill += r->prefill;
        PCR_ADD(r->pool->be->sent_prefill, r->prefill);
        if (r->pclass)
            PCR_ADD(r->pool->be->sent_by_class[r->pclass - 1], r->prefill);
        r->charged = 1;
        if (pcr_upreq_estimated(r))
            prefill_arm(r);
    }
}

void pcr_upq_uncharge(pcr_upreq_t *r)
{
    if (r->charged) {
        r->pool->sent_prefill -= r->prefill;
        PCR_SUB(r->pool->be->sent_prefill, r->prefill);
        if (r->pclass)
            PCR_SUB(r->pool->be->sent_by_class[r->pclass - 1], r->prefill);
        r->charged = 0;
        if (r->prefill_timer != NULL)
            evtimer_del(r->prefill_timer);
    }
}

/* pcr_hold_rank at `now` of a request queued at `t_queued` with `prefill` tokens to do. */
static double rank_at(uint64_t now, uint64_t t_queued, uint64_t prefill)
{
    return pcr_hold_rank(now > t_queued ? now - t_queued : 0, prefill);
}

/* Fair share between clients: how many requests the waiter's client (its connection) has on
 * pod connections now, or more while it left answers unread lately (pcr_light_count). A
 * waiter whose client has fewer goes first, so that a client with many streams in flight (or
 * stuck behind a window it never opens) cannot keep the pod's connections from everyone else:
 * a connection that frees goes to whoever holds fewest. The clock is read only for a client
 * that was slow once. */
static unsigned owner_busy(const pcr_upreq_t *r)
{
    if (r->owner == NULL)
        return 0;
    return pcr_light_count(r->owner, r->owner->slow_us != 0 ? pcr_now_us() : 0);
}

/* The pool's connections carrying a request: the open ones but the idle ones and the one being
 * handed to the next waiter. */
static unsigned pool_busy(const pcr_pool_t *pool)
{
    unsigned busy = pool->nconns - pool->nidle;
    return busy > pool->handing ? busy - pool->handing : 0;
}

/* The light clients' reserve of this pool (pcr/connshare.h), as the owner's config says now. */
static unsigned light_reserve(const pcr_pool_t *pool)
{
    return pcr_light_reserve(pool->max_connections, (*pool->cfg)->upstream.light_reserve_pct);
}

/* Whether the pool keeps its reserve for light clients at `now`: one needed a reserve lately,
 * this pool's or any other's. The first light client that finds a pool taken whole waits for
 * one of its answers to end; kept everywhere from then, the next light clients find a free
 * connection on every pod and worker, not only on the one that first ran out. */
static int light_kept(const pcr_pool_t *pool, uint64_t now)
{
    uint64_t needed = PCR_LOAD(pool->be->srv->light_needed_us);
    /* Another worker may have noted a time a little after `now` was read. */
    return light_reserve(pool) > 0 && needed != 0 &&
           (now < needed || now - needed < (uint64_t)PCR_LIGHT_KEEP_MS * 1000);
}

/* Whether `r` may take a connection now (pcr/connshare.h): one is free and, when only the
 * light clients' reserve is and that reserve is `kept`, its client is light. A re-sent request
 * had a connection: the reserve is not kept from it. */
static int may_take(const pcr_pool_t *pool, const pcr_upreq_t *r, int kept)
{
    unsigned reserve = r->resent ? 0 : light_reserve(pool);
    unsigned busy = owner_busy(r);
    if (busy >= PCR_LIGHT_BLIND && !pcr_blind_may_take(pool->nblind, reserve))
        return 0;
    return pcr_light_may_take(busy, pool_busy(pool), pool->max_connections, reserve,
                              kept && reserve > 0);
}

int pcr_upq_may_take(const pcr_pool_t *pool, const pcr_upreq_t *r)
{
    return may_take(pool, r, light_kept(pool, pcr_now_us()));
}

int pcr_upq_fresh(const pcr_pool_t *pool, const pcr_upreq_t *r)
{
    return pcr_light_fresh(owner_busy(r), pool->nidle, pool->nconns, pool->max_connections,
                           light_reserve(pool));
}

void pcr_upq_note_light(pcr_pool_t *pool, const pcr_upreq_t *r)
{
    if (!r->resent &&
        pcr_light_needed(owner_busy(r), pool_busy(pool), pool->max_connections,
                         light_reserve(pool)))
        PCR_STORE(pool->be->srv->light_needed_us, pcr_now_us());
}

/* `w`'s place in the order at `now` (pcr_hold_before). */
static pcr_hold_key_t key_of(const pcr_upreq_t *w, uint64_t now)
{
    return (pcr_hold_key_t){
        .priority = w->priority,
        .fair = w->cbs->fair != NULL ? w->cbs->fair(w->ctx) : 0,
        .busy = owner_busy(w),
        .rank = rank_at(now, w->t_queued, w->prefill),
    };
}

/* The first by pcr_hold_before now (the highest band, then its tenant with the lowest
 * fairness counter, then whose client has fewest requests on pod connections, then the highest
 * rank; ties: the older) among the HOLD_SCAN first waiters, which are the highest bands' (the
 * queue is kept in band order): of the held completions only (`held_only`), or of all,
 * completions only while the budget lets them go (`budget`: pcr_upq_open for each). Small
 * completions (pcr_hold_small) that only wait for a connection slot may go whatever the budget;
 * one held because it counts on a held one's blocks waits for the budget as before, so that it
 * reaches the pod after that one's prefill, not beside it on another connection. Requests that
 * are not completions rank as no prefill. */
static pcr_upreq_t *highest_rank(pcr_pool_t *pool, int held_only, int budget)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters), *best = NULL;
    uint64_t now = pcr_now_us();
    int kept = light_kept(pool, now); /* once for the scan, not per waiter */
    pcr_hold_key_t bk = {0};
    unsigned seen = 0;
    for (; w != NULL && seen < HOLD_SCAN; w = TAILQ_NEXT(w, wait_link), seen++) {
        int held = w->state == UPR_HELD;
        if (best != NULL && w->priority < bk.priority)
            break; /* a lower band: the best is found */
        if ((held_only && !held) ||
            (budget && pcr_upreq_budgeted(w) && !pcr_upq_open(pool, w) &&
             (held || !pcr_hold_small(w->prefill))) ||
            !may_take(pool, w, kept))
            continue;
        pcr_hold_key_t k = key_of(w, now);
        if (best == NULL || pcr_hold_before(&k, &bk)) {
            best = w;
            bk = k;
        }
    }
    return best;
}

/* The oldest of the highest band's HOLD_SCAN first waiters whose client has fewest requests
 * on pod connections. */
static pcr_upreq_t *oldest_fewest(pcr_pool_t *pool)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters), *best = w;
    unsigned seen = 0, fewest = w != NULL ? owner_busy(w) : 0;
    for (; w != NULL && fewest > 0 && seen < HOLD_SCAN && w->priority == best->priority;
         w = TAILQ_NEXT(w, wait_link), seen++) {
        if (owner_busy(w) < fewest) {
            best = w;
            fewest = owner_busy(w);
        }
    }
    return best;
}

/* ---- one rank order over the workers -------------------------------------------------
 *
 * Each worker publishes, in its slot on the backend (pcr_pending_t), its held stream that goes
 * next: the highest rank when it last looked (at each kick, and when that one leaves). A
 * release on a budget opening sends this worker's best only if no other worker's published one
 * ranks higher now; else it stops, and pcr_upq_freed wakes the others. A published stream may
 * have been overtaken by another of its worker's since, so what is compared is a lower bound of
 * that worker's best, never more: two workers cannot each defer to the other. A worker without a
 * connection slot to give publishes none. The one deferred to is woken and sends, as it sees the
 * same budget; should a wake-up cross a hold, the ticks kick too. */

static pcr_pending_t *own_slot(const pcr_pool_t *pool)
{
    if (pool->owner_slot < 0 || (unsigned)pool->owner_slot >= pool->be->npending)
        return NULL;
    return &pool->be->pending[pool->owner_slot];
}

static int slot_free(const pcr_pool_t *pool)
{
    return pool->nidle > 0 || pool->nconns < pool->max_connections;
}

/* `r` (or none) is this worker's next held stream, as the others see it. The three words are
 * read apart: a reader between two publications may pair one stream's time with the other's
 * prefill or priority, and misorder one release; nothing waits on it. */
static void publish(pcr_pool_t *pool, pcr_upreq_t *r)
{
    pcr_pending_t *slot = own_slot(pool);
    int same = r != NULL && r == pool->best_held;
    pool->best_held = r;
    if (slot == NULL || same)
        return;
    if (r != NULL) {
        PCR_STORE(slot->held_prefill, r->prefill);
        PCR_STORE(slot->held_prio, (int64_t)r->priority);
    }
    PCR_STORE(slot->held_at, r != NULL ? (r->t_queued ? r->t_queued : 1) : 0);
}

/* Publishes the held stream that goes first now (of the HOLD_SCAN first), or none. */
static void publish_best(pcr_pool_t *pool)
{
    if (pool->nheld > 0 && slot_free(pool))
        publish(pool, highest_rank(pool, 1, 0));
    else if (pool->best_held != NULL)
        publish(pool, NULL);
}

/* Whether another worker's published held stream for this backend goes before `r` now: of a
 * higher band, or of the same band and a higher rank (the tenants' fairness counters are each
 * worker's own, so they order a worker's streams only). */
static int other_goes_first(const pcr_pool_t *pool, const pcr_upreq_t *r)
{
    const pcr_pending_t *own = own_slot(pool);
    if (own == NULL)
        return 0;
    uint64_t now = pcr_now_us();
    pcr_hold_key_t mine = {.priority = r->priority,
                           .rank = rank_at(now, r->t_queued, r->prefill)};
    for (unsigned i = 0; i < pool->be->npending; i++) {
        const pcr_pending_t *o = &pool->be->pending[i];
        uint64_t at = o == own ? 0 : PCR_LOAD(o->held_at);
        if (at == 0)
            continue;
        pcr_hold_key_t k = {.priority = (int)PCR_LOAD(o->held_prio),
                            .rank = rank_at(now, at, PCR_LOAD(o->held_prefill))};
        if (pcr_hold_before(&k, &mine))
            return 1;
    }
    return 0;
}

void pcr_upq_add(pcr_upreq_t *r, int hold)
{
    pcr_pool_t *pool = r->pool;
    /* Waiting is bounded by the response timeout. */
    if (r->wait_timer == NULL)
        r->wait_timer = evtimer_new(pool->base, on_wait_timeout, r);
    if (r->wait_timer != NULL) {
        struct timeval wt = pcr_ms_to_tv(tmo(pool)->response_ms);
        evtimer_add(r->wait_timer, &wt);
    }
    /* In band order, so that the HOLD_SCAN first are the highest bands': behind the last
     * waiter of its priority or a higher one. Walked from the tail, past the lower bands only. */
    pcr_upreq_t *after = TAILQ_LAST(&pool->waiters, pcr_upreq_wait);
    while (after != NULL && after->priority < r->priority)
        after = TAILQ_PREV(after, pcr_upreq_wait, wait_link);
    if (after != NULL)
        TAILQ_INSERT_AFTER(&pool->waiters, after, r, wait_link);
    else
        TAILQ_INSERT_HEAD(&pool->waiters, r, wait_link);
    r->t_queued = pcr_upq_budget(pool) ? pcr_now_us() : 0;
    pcr_upreq_to(r, hold ? UPR_HELD : UPR_WAITING);
    if (hold) {
        if (pool->best_held == NULL && slot_free(pool))
            publish(pool, r); /* it ranks 0 now: an older one, if any, stays the next */
    }
}

/* Off the queue to be sent now, its prefill counted first. While it was this worker's
 * published next, the other workers deferred to it; were its rank withdrawn before its prefill
 * counted, another worker could see the budget open with nobody ahead, and send too. */
void pcr_upq_take_to_send(pcr_upreq_t *r)
{
    pcr_upq_charge(r);
    pcr_upq_take(r);
}

/* pcr_upq_take_to_send, then the transport's dispatch. Should it find no connection after all
 * (out of memory), `r` waits again, and its prefill is not counted while it waits. */
void pcr_upq_send(pcr_upreq_t *r)
{
    pcr_upq_take_to_send(r);
    r->pool->transport->dispatch(r);
    if (pcr_upreq_queued(r))
        pcr_upq_uncharge(r);
}

/* Off the queue, its deadline disarmed (the connection's own deadlines take over). */
void pcr_upq_take(pcr_upreq_t *r)
{
    TAILQ_REMOVE(&r->pool->waiters, r, wait_link);
    if (r->wait_timer)
        evtimer_del(r->wait_timer);
    int was_held = r->state == UPR_HELD;
    pcr_upreq_to(r, UPR_READY);
    if (was_held && r == r->pool->best_held)
        publish_best(r->pool);
}

/* Who waits and may go next, or NULL: with no budget, of the highest band's waiters whose
 * client has fewest requests on pod connections, the oldest; else the first by
 * pcr_hold_before among those the budget lets go (of the HOLD_SCAN first). Either way one whose
 * client may take a connection now (pcr_upq_may_take): when only the light clients' reserve is
 * free, a heavy client's request waits for a connection past it. */
static pcr_upreq_t *waiter_next(pcr_pool_t *pool)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters);
    if (w == NULL || pcr_upq_budget(pool) == 0) {
        w = oldest_fewest(pool);
        return w != NULL && pcr_upq_may_take(pool, w) ? w : NULL;
    }
    return highest_rank(pool, 0, 1);
}

/* A stream held in this pool (of the HOLD_SCAN oldest) that brings blocks `r` counts as cached
 * (pcr_hold_depends), or NULL. Sent first, `r` would prefill them itself and the other would
 * find them: the hit the routing chose both for would be lost. Only this worker's: another
 * worker's held streams are seen as one published rank, not as keys. */
pcr_upreq_t *pcr_upq_bringer(pcr_pool_t *pool, const pcr_upreq_t *r)
{
    if (pool->nheld == 0 || r->prefix.blocks == NULL || r->prefix.matched == 0)
        return NULL;
    unsigned seen = 0;
    for (pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters); w != NULL && seen < HOLD_SCAN;
         w = TAILQ_NEXT(w, wait_link), seen++) {
        if (w != r && w->state == UPR_HELD && w->prefix.blocks != NULL &&
            pcr_hold_depends(r->prefix.blocks, r->prefix.nblocks, r->prefix.matched,
                             w->prefix.blocks, w->prefix.nblocks, w->prefix.added_from))
            return w;
    }
    return NULL;
}

/* waiter_next(), but NULL when its choice is a held stream that another worker's published
 * one ranks above: that one goes first (pcr_upq_freed wakes its worker). A held stream's turn
 * goes to the held stream whose blocks it counts on, if any (that one's, in turn, to its own):
 * the chosen one's rank stands for both. */
pcr_upreq_t *pcr_upq_next(pcr_pool_t *pool)
{
    pcr_upreq_t *w = waiter_next(pool);
    if (w == NULL || w->state != UPR_HELD)
        return w;
    if (other_goes_first(pool, w))
        return NULL;
    pcr_upreq_t *b;
    for (int depth = 0; depth < 8 && (b = pcr_upq_bringer(pool, w)) != NULL; depth++)
        w = b;
    return w;
}

/* The budget or a slot opened: sends whoever may go, in order, while a connection is there to
 * take (an idle one, or room for a new one). Then publishes this worker's next. */
static void pool_kick(pcr_pool_t *pool)
{
    pcr_upreq_t *w;
    while (slot_free(pool) && (w = pcr_upq_next(pool)) != NULL) {
        pcr_upq_send(w);
        if (pcr_upreq_queued(w))
            break; /* no connection after all (out of memory): it waits again */
    }
    publish_best(pool);
}

void pcr_upstream_kick(pcr_pool_t *pool)
{
    pool_kick(pool);
}

/* A stream's prefill left the budget (or may have): this worker's waiters go first, then the
 * other workers hear of it if the pod still has room and they hold streams for it. Never from
 * pcr_upstream_kick, so two workers that cannot send (no connection slot) do not wake each
 * other in turn. */
void pcr_upq_freed(pcr_pool_t *pool)
{
    pool_kick(pool);
    if (pool->on_budget_open != NULL && PCR_LOAD(pool->be->held) > pool->nheld &&
        pcr_upq_open(pool, NULL))
        pool->on_budget_open(pool->owner);
}

/* An unstreamed request's estimated first token: its prefill leaves the count. Its owner
 * hears first (its own count of the pod's queue), then held streams may go. */
static void prefill_due(evutil_socket_t fd, short what, void *arg)
{
    pcr_upreq_t *r = arg;
    pcr_pool_t *pool = r->pool;
    pcr_upq_uncharge(r);
    if (r->cbs->on_prefill_due != NULL)
        r->cbs->on_prefill_due(r->ctx);
    pcr_upq_freed(pool);
}

static void on_wait_timeout(evutil_socket_t fd, short what, void *arg)
{
    pcr_upreq_t *r = arg;
    pcr_upreq_fail(r, r->state == UPR_HELD ? PCR_UP_HELD : PCR_UP_POOL_FULL, 0);
}

void pcr_upstream_fail_held(pcr_pool_t *pool)
{
    /* One at a time from the head: an owner's callback may end other requests of this pool,
     * so no pointer is kept across one. */
    while (pool->nheld > 0) {
        pcr_upreq_t *r = TAILQ_FIRST(&pool->waiters);
        while (r != NULL && r->state != UPR_HELD)
            r = TAILQ_NEXT(r, wait_link);
        if (r == NULL)
            break;
        pcr_upreq_fail(r, PCR_UP_HELD_OUT, 0);
    }
}
