/* router/config/config_err.h: the errors of one config load: collecting them, describing values in
 * them, placing them at a line and column, and printing them. Private to the config loader
 * (config.c); nothing else includes this. */
#ifndef PCR_ROUTER_CONFIG_ERR_H
#define PCR_ROUTER_CONFIG_ERR_H

#include <stddef.h>

#include <jansson.h>

#include "config_pos.h"

/* Longest value quoted in full in a message; longer ones are cut, so one error stays one line. */
#define PCR_CFG_QUOTE_MAX 80
/* Room for any value pcr_cfg_quote writes. */
#define PCR_CFG_QBUF (PCR_CFG_QUOTE_MAX * 6 + 16)

typedef struct {
    char *path;          /* "" for the root */
    char *msg;
    int at_key;          /* point at the key (an unknown key) rather than at the value */
    int located;         /* line/col already known (parse and file errors) */
    int line, col;
    size_t seq;          /* order of discovery: breaks ties so the sort is stable */
} pcr_cfg_err_t;

/* One load. Initialise with { .name = ... }; end with pcr_cfg_ctx_finish, or with
 * pcr_cfg_ctx_dispose when its errors are to be dropped. */
typedef struct {
    const char *name;    /* file name used in messages */
    pcr_cfg_path_t path; /* where the validator is: each error concerns this path */
    pcr_cfg_err_t *errs;
    size_t nerrs, caperrs;
    int nomem;           /* set by anyone whose allocation failed: the load fails */
} pcr_cfg_ctx_t;

/* An error about the value at the current path. */
void pcr_cfg_err(pcr_cfg_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An error about the key at the current path (an unknown key points at the key itself). */
void pcr_cfg_err_key(pcr_cfg_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An error whose position is already known (jansson's parse errors, unreadable files). */
void pcr_cfg_err_at(pcr_cfg_ctx_t *c, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "expected EXPECTED, got string \"10\"" (or integer 3, null, object...) about the value. */
void pcr_cfg_err_type(pcr_cfg_ctx_t *c, const char *expected, const json_t *v);

/* `s` between double quotes, escaped as JSON would, cut after PCR_CFG_QUOTE_MAX bytes, in
 * `buf` (of PCR_CFG_QBUF bytes), which it returns. */
const char *pcr_cfg_quote(char *buf, size_t n, const char *s);

/* Optimal string alignment distance (edits: insert, delete, substitute, swap two neighbours),
 * used only to suggest a known key for a mistyped one; longer keys are never close enough
 * (INT_MAX). */
int pcr_cfg_edit_distance(const char *a, const char *b);

/* Locates the errors of `c` in `text` (NULL when there is no text to scan) and prints them
 * into *errors (when asked; the caller frees), then frees them. Returns 1 when there was any
 * error: the load has failed. */
int pcr_cfg_ctx_finish(pcr_cfg_ctx_t *c, const char *text, size_t len, char **errors);

void pcr_cfg_ctx_dispose(pcr_cfg_ctx_t *c);  /* frees the errors unprinted */

#endif
