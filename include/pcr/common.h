/* pcr/common.h: error codes and small helpers shared by every part of pcrouter.
 *
 * Functions return 0 on success or a negative PCR_ERR_* code; this header is
 * self-contained and names no libevent, nghttp2 or router type. */
#ifndef PCR_COMMON_H
#define PCR_COMMON_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum {
    PCR_OK            = 0,
    PCR_ERR_NOMEM     = -1,  /* an allocation failed; the structure is left valid */
    PCR_ERR_INVAL     = -2,  /* an argument or input is not acceptable */
    PCR_ERR_NOTFOUND  = -3,
    PCR_ERR_FULL      = -4,  /* a bounded resource is exhausted */
    PCR_ERR_IO        = -5,
    PCR_ERR_PARSE     = -6,  /* malformed input (JSON, HTTP, config) */
    PCR_ERR_TOO_LARGE = -7,  /* input over a configured limit */
    PCR_ERR_TIMEOUT   = -8,
    PCR_ERR_UNAVAIL   = -9,  /* no backend can take the request */
};

/* A short English description of a PCR_ERR_* code ("out of memory"). */
static inline const char *pcr_strerror(int err)
{
    switch (err) {
    case PCR_OK:            return "ok";
    case PCR_ERR_NOMEM:     return "out of memory";
    case PCR_ERR_INVAL:     return "invalid argument";
    case PCR_ERR_NOTFOUND:  return "not found";
    case PCR_ERR_FULL:      return "resource exhausted";
    case PCR_ERR_IO:        return "i/o error";
    case PCR_ERR_PARSE:     return "parse error";
    case PCR_ERR_TOO_LARGE: return "too large";
    case PCR_ERR_TIMEOUT:   return "timed out";
    case PCR_ERR_UNAVAIL:   return "unavailable";
    default:                return "unknown error";
    }
}

#define PCR_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* A growable array's one way to grow, with a hard cap: makes the array `*bufp` (a pointer to
 * any pointer to `elem`-byte elements, e.g. `&b->p`) hold at least `need` elements, its
 * capacity `*cap` (in elements) doubling from `first` but never past `max`. `re` is the
 * allocator's realloc (NULL: realloc). Returns 0; PCR_ERR_TOO_LARGE when `need` is over `max`,
 * PCR_ERR_NOMEM when the allocation fails: then the array and `*cap` are unchanged. */
static inline int pcr_grow_elems(void *bufp, size_t *cap, size_t need, size_t elem, size_t first,
                                 size_t max, void *(*re)(void *, size_t))
{
    if (need <= *cap)
        return PCR_OK;
    if (elem == 0 || max > (size_t)-1 / elem)
        max = elem ? (size_t)-1 / elem : 0;
    if (need > max)
        return PCR_ERR_TOO_LARGE;
    size_t ncap = *cap ? *cap : (first ? first : 1);
    while (ncap < need)
        ncap = ncap > max / 2 ? max : ncap * 2;
    if (ncap > max)
        ncap = max;
    void *old, *nb;
    memcpy(&old, bufp, sizeof(old));
    nb = (re != NULL ? re : realloc)(old, ncap * elem);
    if (nb == NULL)
        return PCR_ERR_NOMEM;
    memcpy(bufp, &nb, sizeof(nb));
    *cap = ncap;
    return PCR_OK;
}

/* pcr_grow_elems() for a buffer of bytes. */
static inline int pcr_grow(void *bufp, size_t *cap, size_t need, size_t first, size_t max,
                           void *(*re)(void *, size_t))
{
    return pcr_grow_elems(bufp, cap, need, 1, first, max, re);
}

/* A token as pcrouter counts one before a pod says: 4 bytes of canonical prompt. Capacities in
 * tokens become blocks with it, and predicted cached tokens come from matched blocks with it. */
#define PCR_BYTES_PER_TOKEN 4

#endif
