/* router/core/memcount.c: per-thread byte counts (memcount.h). */
#include <stddef.h>

#include "atomic.h"
#include "memcount.h"

#define NSLOTS 64
typedef struct {
    _Alignas(64) int64_t v[PCR_MEMCOUNT__COUNT];
} slot_t;
static slot_t slots[NSLOTS];
static unsigned nslots;                      /* atomic: slots claimed */
static __thread slot_t *my_slot;

void pcr_memcount_add(pcr_memcount_kind_t kind, int64_t d)
{
    if (my_slot == NULL) {
        unsigned i = __atomic_fetch_add(&nslots, 1, __ATOMIC_RELAXED);
        my_slot = &slots[i < NSLOTS - 1 ? i : NSLOTS - 1];
    }
    if (my_slot == &slots[NSLOTS - 1])
        PCR_ADD(my_slot->v[kind], d);
    else
        PCR_BUMP(my_slot->v[kind], d); /* its own thread's slot: no read-modify-write needed */
}

uint64_t pcr_memcount_sum(pcr_memcount_kind_t kind)
{
    int64_t sum = 0;
    unsigned n = PCR_LOAD(nslots);
    for (unsigned i = 0; i < n && i < NSLOTS; i++) /* slots are claimed in order */
        sum += PCR_LOAD(slots[i].v[kind]);
    return sum > 0 ? (uint64_t)sum : 0;
}
