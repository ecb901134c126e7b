/* router/core/spare.h: a thread's freed objects of one kind, kept for its next allocation of that
 * kind. Exchanges and body readers are made and freed once per request and are too large for
 * malloc's per-thread caches; reused, they skip its slow path (and a calloc's zeroing).
 *
 * A kind embeds a pcr_spare_link_t and its file keeps one `static __thread pcr_spare_t`.
 * pcr_spare_put() keeps a freed object unless `max` are kept already (the caller frees it
 * then); pcr_spare_take() gives back the last one kept, or NULL; the caller resets it. A
 * thread empties its lists before it ends (the kinds' *_cache_clear functions). */
#ifndef PCR_ROUTER_SPARE_H
#define PCR_ROUTER_SPARE_H

#include <stddef.h>

typedef struct pcr_spare_link {
    struct pcr_spare_link *next;
} pcr_spare_link_t;

typedef struct {
    pcr_spare_link_t *head;
    unsigned n;
} pcr_spare_t;

static inline int pcr_spare_put(pcr_spare_t *l, pcr_spare_link_t *link, unsigned max)
{
    if (l->n >= max)
        return 0;
    link->next = l->head;
    l->head = link;
    l->n++;
    return 1;
}

static inline pcr_spare_link_t *pcr_spare_take(pcr_spare_t *l)
{
    pcr_spare_link_t *link = l->head;
    if (link != NULL) {
        l->head = link->next;
        l->n--;
    }
    return link;
}

/* The object `link` is the `member` of. */
#define PCR_SPARE_OBJ(link, type, member) \
    ((type *)(void *)((char *)(link) - offsetof(type, member)))

#endif
