/* hashring/radix_int.h: the radix index's private layout, shared by radix.c (the operations)
 * and radix_check.c (the invariant checker used by tests). See radix.c for the design. */
#ifndef PCR_RADIX_INT_H
#define PCR_RADIX_INT_H

#include <stdint.h>

#include "pcr/index.h"

typedef struct rnode rnode_t;

/* One backend's holding of one node: it holds every block of the node's run. */
typedef struct {
    uint64_t time;          /* last use, as passed in by the caller */
    rnode_t *prev, *next;   /* neighbours in the backend's leaf list (only while nkids == 0) */
    uint32_t nkids;         /* children of the node this backend also holds; 0 = a leaf for it */
    uint16_t backend;
    uint16_t scratch;       /* pcr_index_check's counter; meaningless elsewhere */
} hold_t;

struct rnode {
    rnode_t *parent;        /* the root for a first-level node */
    hold_t *hold;           /* sorted by backend; never empty outside an operation */
    uint32_t depth;         /* blocks on the path above this node */
    uint32_t nblocks;       /* length of the run in hash[] */
    uint32_t cap;           /* hashes allocated (a run can shrink in place) */
    uint16_t nhold, hold_cap;
    uint64_t hash[];        /* the run: hash[0] is the child key under `parent` */
};

typedef struct {
    rnode_t *head, *tail;   /* leaf holdings, least recently used first */
    uint64_t blocks;        /* blocks held */
    uint64_t capacity;
} rbackend_t;

struct pcr_index {
    pcr_index_allocator_t a;
    size_t max_bytes;
    size_t bytes;           /* everything asked from the allocator, this struct included */
    size_t nb;
    rbackend_t *be;
    rnode_t *root;          /* an empty node: depth 0, no run, no holders */
    rnode_t **slots;        /* open addressing, linear probing, key (parent, hash[0]) */
    size_t mask;
    size_t count;           /* nodes in the table = nodes in the tree */
    uint64_t pairs;
    uint64_t evictions;     /* (block, backend) pairs dropped by capacity or the memory cap */
};

static inline size_t pcr_radix_node_size(uint32_t cap)
{
    return sizeof(rnode_t) + (size_t)cap * sizeof(uint64_t);
}

rnode_t *pcr_radix_find(const pcr_index_t *ix, const rnode_t *parent, uint64_t h);
hold_t *pcr_radix_hold(const rnode_t *x, unsigned b);

#endif
