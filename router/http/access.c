/* router/http/access.c: a request's access-log line, made once its outcome is known (exchange.c's
 * record()) and handed to the access log's writer (accesslog.h), never written here.
 *
 *   text  "<time> info access <client> <protocol> <method> <path> <status> <bytes out>
 *          backend=<name> route=<reason> blocks=<matched>/<total> attempts=<n> <seconds>s"
 *   json  one object: time, client, worker, protocol, method, path, model, status, backend, route,
 *         matched_blocks, total_blocks, predicted_cached_tokens, delivered_cached_tokens,
 *         ttfb_ms, ttft_ms, held_ms, conn_wait_ms, tokenize_ms, prefill_ahead_tokens,
 *         duration_ms, bytes_in, bytes_out, unsent_bytes, retries (null where a request has
 *         none: no backend, no prefix key, no usage from the pod, no response head, not a
 *         stream or no token, never held, never waited for a pod connection, not tokenized)
 *
 * JSON goes through cJSON. Strings that come from the client (path, model) are cut at
 * ACCESS_MAX_FIELD bytes and any byte that is not valid UTF-8 becomes '?', so every line is
 * valid JSON whatever was sent. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "accesslog.h"
#include "exchange_int.h"
#include "log.h"

#define ACCESS_MAX_FIELD 2048

/* The length of the valid UTF-8 sequence at s (at most n bytes), 0 when there is none. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
                 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n || (len == 2 && s[0] < 0xC2) || (len == 4 && s[0] > 0xF4))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((len == 3 && s[0] == 0xE0 && s[1] < 0xA0) || (len == 3 && s[0] == 0xED && s[1] > 0x9F) ||
        (len == 4 && s[0] == 0xF0 && s[1] < 0x90) || (len == 4 && s[0] == 0xF4 && s[1] > 0x8F))
        return 0; /* overlong forms and surrogates */
    return len;
}

/* `s` as valid UTF-8 of at most ACCESS_MAX_FIELD bytes, into out[ACCESS_MAX_FIELD + 1]. */
static const char *clean(char *out, const char *s)
{
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n && o < ACCESS_MAX_FIELD;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k == 0) {
            out[o++] = '?';
            i++;
        } else if (o + k > ACCESS_MAX_FIELD) {
            break;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    return out;
}

static void add_str(cJSON *o, const char *key, const char *v)
{
    if (v == NULL || v[0] == '\0') {
        cJSON_AddNullToObject(o, key);
        return;
    }
    char buf[ACCESS_MAX_FIELD + 1];
    cJSON_AddStringToObject(o, key, clean(buf, v));
}

static void add_num(cJSON *o, const char *key, int known, double v)
{
    if (known)
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

/* The path as logged. With auth, a query string may carry a key a client put in the URL (which
 * pcrouter refuses): the log keeps the path and shows only that a query was there. */
static const char *logged_path(const pcr_exchange_t *ex, char *buf, size_t cap)
{
    const char *p = ex->path;
    const char *q = p != NULL ? strchr(p, '?') : NULL;
    if (q == NULL || !ex->w->cfg->auth.enabled)
        return p;
    snprintf(buf, cap, "%.*s?...", (int)(q - p), p);
    return buf;
}

static size_t json_line(const pcr_exchange_t *ex, int status, uint64_t now, char *line, size_t cap)
{
    char t[40];
    pcr_log_time(t, sizeof(t));
    int routed = ex->be != NULL;
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return 0;
    cJSON_AddStringToObject(o, "time", t);
    add_str(o, "client", ex->peer);
    cJSON_AddNumberToObject(o, "worker", ex->w->id);
    add_str(o, "protocol", ex->proto);
    add_str(o, "method", ex->method);
    char pbuf[2048];
    add_str(o, "path", logged_path(ex, pbuf, sizeof pbuf));
    add_str(o, "model", ex->req.model);
    cJSON_AddNumberToObject(o, "status", status);
    add_str(o, "backend", routed ? ex->be->conf.name : NULL);
    add_str(o, "route", routed ? pcr_reason_name(ex->decision.reason) : NULL);
    add_num(o, "matched_blocks", routed && ex->has_key, ex->decision.matched_blocks);
    add_num(o, "total_blocks", routed && ex->has_key, ex->decision.total_blocks);
    add_num(o, "predicted_cached_tokens", routed && ex->has_key, (double)ex->predicted);
    add_num(o, "delivered_cached_tokens", ex->delivered >= 0, (double)ex->delivered);
    add_num(o, "ttfb_ms", ex->t_head != 0, (double)(ex->t_head - ex->t_start) / 1e3);
    add_num(o, "ttft_ms", ex->t_first != 0, (double)(ex->t_first - ex->t_start) / 1e3);
    add_num(o, "held_ms", ex->held, (double)ex->held_us / 1e3);
    add_num(o, "conn_wait_ms", ex->conn_wait_us > 0, (double)ex->conn_wait_us / 1e3);
    add_num(o, "tokenize_ms", ex->tokenized, (double)ex->ns_tokenize / 1e6);
    add_num(o, "prefill_ahead_tokens", ex->has_prefill_ahead, (double)ex->prefill_ahead);
    /* Disaggregation: where the prompt was decided to be prefilled, the prefill pod the decode
     * pod pulled from, and when that pod's answer came (the prefill leg, held time included). */
    int pd = ex->pd_state != PD_NONE;
    add_str(o, "pd", pd ? pcr_pd_outcome_name(ex->pd_outcome) : NULL);
    pcr_backend_t *pf = ex->pd_state == PD_DECODE
                            ? pcr_backend_at(ex->w->srv, (size_t)ex->pd_prefill_slot) : NULL;
    add_str(o, "prefill_backend", pf != NULL ? pf->conf.name : NULL);
    add_num(o, "prefill_leg_ms", ex->pd_t_answer != 0,
            (double)(ex->pd_t_answer - ex->t_start) / 1e3);
    cJSON_AddNumberToObject(o, "duration_ms", (double)(now - ex->t_start) / 1e3);
    cJSON_AddNumberToObject(o, "bytes_in", (double)ex->body_counted);
    cJSON_AddNumberToObject(o, "bytes_out", (double)ex->resp_bytes);
    cJSON_AddNumberToObject(o, "unsent_bytes", (double)ex->unsent_at_end);
    cJSON_AddNumberToObject(o, "retries", ex->attempts > 1 ? ex->attempts - 1 : 0);
    /* Room for the newline: a line that does not fit is not written (and counted). */
    int ok = cJSON_PrintPreallocated(o, line, (int)cap - 1, 0);
    cJSON_Delete(o);
    if (!ok)
        return 0;
    size_t n = strlen(line);
    line[n++] = '\n';
    return n;
}

static size_t text_line(const pcr_exchange_t *ex, int status, uint64_t now, char *line, size_t cap)
{
    size_t t = pcr_log_time(line, cap);
    char pbuf[2048];
    const char *path = logged_path(ex, pbuf, sizeof pbuf);
    int n = snprintf(line + t, cap - t,
                     " info access %s %s %s %.2048s %d %llu backend=%s route=%s blocks=%u/%u "
                     "attempts=%u %.3fs\n",
                     ex->peer[0] ? ex->peer : "-", ex->proto, ex->method, path ? path : "-",
                     status, (unsigned long long)ex->resp_bytes, ex->be ? ex->be->conf.name : "-",
                     ex->be ? pcr_reason_name(ex->decision.reason) : "-", ex->decision.matched_blocks,
                     ex->decision.total_blocks, ex->attempts, (double)(now - ex->t_start) / 1e6);
    return n < 0 || (size_t)n >= cap - t ? 0 : t + (size_t)n;
}

void pcr_access_record(const pcr_exchange_t *ex, int status, uint64_t now)
{
    const pcr_log_conf_t *lc = &ex->w->cfg->log;
    if (!lc->access_log)
        return;
    char line[PCR_ACCESSLOG_MAX_LINE];
    size_t n = lc->access_log_format == PCR_ACCESS_JSON ? json_line(ex, status, now, line, sizeof(line))
                                                        : text_line(ex, status, now, line, sizeof(line));
    pcr_accesslog_t *al = ex->w->srv->access_log;
    if (n == 0)
        pcr_accesslog_drop(al); /* too long even with its fields cut: counted, not written */
    else
        pcr_accesslog_write(al, ex->w->id, line, n);
}
