/* router/config/config_pos.h: key paths of the config file ("backends[1].url") and where each one
 * starts in the raw text. Private to the config loader (config.c, config_err.c); nothing else
 * includes this.
 *
 * jansson keeps no position for values, so the loader names what an error concerns by its key
 * path, and only when there are errors asks pcr_cfg_pos_scan where each path is. */
#ifndef PCR_ROUTER_CONFIG_POS_H
#define PCR_ROUTER_CONFIG_POS_H

#include <stddef.h>

/* A key path, built by pushing and popping components on one buffer. A zeroed one is the
 * empty path (the root); free `s` when done. A failed allocation sets `nomem` and leaves the
 * path as it was. */
typedef struct {
    char *s;
    size_t len, cap;
    int nomem;
} pcr_cfg_path_t;

int pcr_cfg_path_append(pcr_cfg_path_t *pb, const char *add, size_t n);  /* raw bytes */

/* Each push returns a mark; pcr_cfg_path_pop(mark) restores the path as it was before it. */
size_t pcr_cfg_path_push_key(pcr_cfg_path_t *pb, const char *key);    /* ".key" ("key" at root) */
size_t pcr_cfg_path_push_index(pcr_cfg_path_t *pb, size_t i);         /* "[i]" */
void pcr_cfg_path_pop(pcr_cfg_path_t *pb, size_t mark);
const char *pcr_cfg_path_str(const pcr_cfg_path_t *pb);               /* never NULL */

/* Where one key path starts. Lines and columns are 1-based; columns count UTF-8 characters,
 * as jansson's do, so these positions agree with those of jansson's parse errors. */
typedef struct {
    char *path;          /* "" for the root */
    int kline, kcol;     /* where its key starts; for array elements and the root, its value */
    int vline, vcol;     /* where its value starts */
} pcr_cfg_pos_t;

/* Every path found in a text, sorted by path. Zero it before pcr_cfg_pos_scan; release it with
 * pcr_cfg_pos_dispose. */
typedef struct {
    pcr_cfg_pos_t *v;
    size_t n, cap;
    int nomem;           /* some paths could not be recorded for lack of memory */
} pcr_cfg_posmap_t;

/* Records where every key path of `text` starts. The text should be JSON jansson has accepted;
 * on anything else the scanner stops early, never reading past `len`, and keeps what it found. */
void pcr_cfg_pos_scan(pcr_cfg_posmap_t *m, const char *text, size_t len);

/* The position of `path`, or of its nearest recorded parent ("a[1].b" -> "a[1]" -> "a" -> "");
 * NULL when there is none. */
const pcr_cfg_pos_t *pcr_cfg_pos_find(const pcr_cfg_posmap_t *m, const char *path);

void pcr_cfg_pos_dispose(pcr_cfg_posmap_t *m);

#endif
