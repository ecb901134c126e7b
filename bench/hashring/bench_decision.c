/* bench_decision.c: the routing decision, timed from the request body's last byte: the last
 * chunk fed to the reader (router/body/body.h), its finish, and pcr_policy_decide() against the
 * pre-filled index. The target: within 10 us for any prompt up to 512 KiB.
 *
 * Prompts of 1k, 8k, 32k and 128k tokens (4 bytes a token, so up to 512 KiB), as completions
 * (one string) and as chat (a system prompt and turns, the model and tools after the
 * messages), fed in 16 KiB chunks as HTTP/1.1 reads and HTTP/2 DATA frames come. Two splits:
 * chunks from the body's start (the last one is what is left over), and the worst case, a
 * last chunk of a full 16 KiB. Also the reader's whole cost per request (every chunk, finish)
 * per body byte, next to cJSON parsing the whole body at once, since throughput counts too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench_hashring.h"
#include "body.h"

#define CHUNK 16384

/* `text` bytes of prose with a JSON escape now and then, as real prompts have. */
static size_t put_text(char *s, size_t text)
{
    size_t n = 0;
    for (size_t i = 0; i < text; i++) {
        if (i % 97 == 96 && i + 1 < text) {
            s[n++] = '\\';
            s[n++] = 'n';
            i++;
        } else {
            s[n++] = i % 6 == 5 ? ' ' : (char)('a' + (i * 7 + i / 13) % 26);
        }
    }
    return n;
}

static char *completions_body(size_t tokens, size_t *len)
{
    size_t text = tokens * 4;
    char *s = malloc(text + 256);
    size_t n = (size_t)sprintf(s, "{\"model\":\"llama-3-8b\",\"prompt\":\"");
    n += put_text(s + n, text);
    n += (size_t)sprintf(s + n, "\",\"max_tokens\":128,\"stream\":true}");
    *len = n;
    return s;
}

/* A 2 KiB system prompt, then user and assistant turns (about 8 of them at any size), the
 * model and a tool list after the messages, as SDKs write them. */
static char *chat_body(size_t tokens, size_t *len)
{
    size_t text = tokens * 4, sys = text < 4096 ? text / 2 : 2048;
    size_t turn = (text - sys) / 8 > 256 ? (text - sys) / 8 : text - sys;
    char *s = malloc(text + 1024);
    size_t n = (size_t)sprintf(s, "{\"messages\":[{\"role\":\"system\",\"content\":\"");
    n += put_text(s + n, sys);
    for (size_t done = sys, m = 0; done < text; m++) {
        size_t take = text - done < turn ? text - done : turn;
        n += (size_t)sprintf(s + n, "\"},{\"role\":\"%s\",\"content\":\"",
                             m % 2 ? "assistant" : "user");
        n += put_text(s + n, take);
        done += take;
    }
    n += (size_t)sprintf(s + n, "\"}],\"model\":\"llama-3-8b\",\"stream\":true,\"tools\":[{\"type\":"
                                "\"function\",\"function\":{\"name\":\"search\",\"parameters\":"
                                "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}}}]}");
    *len = n;
    return s;
}

typedef struct {
    pcr_policy_t *p;
    const pcr_backend_load_t *loads;
    uint64_t now;
    pcr_body_opts_t o;
} ctx_t;

/* One request: every chunk but the last untimed, then the last chunk, finish and decide
 * timed. `last` is the last chunk's length. Returns ns, and the backend in *backend. */
static uint64_t decide_once(const ctx_t *c, pcr_api_t api, const char *body, size_t len,
                            size_t last, int *backend)
{
    pcr_body_reader_t *r = pcr_body_reader_new(api, &c->o);
    size_t head = len - last;
    for (size_t off = 0; off < head; off += CHUNK)
        pcr_body_reader_feed(r, body + off, head - off < CHUNK ? head - off : CHUNK);
    pcr_body_t b;
    pcr_decision_t d;
    uint64_t t0 = now_ns();
    int rc = pcr_body_reader_feed(r, body + head, last);
    if (rc == 0)
        rc = pcr_body_reader_finish(r, &b);
    if (rc != 0) {
        fprintf(stderr, "bench body refused: %s\n", pcr_body_reader_error(r));
        exit(1);
    }
    pcr_key_t k = pcr_body_key(&b);
    pcr_policy_decide(c->p, &k, c->loads, c->now, &d);
    uint64_t t = now_ns() - t0;
    *backend = d.backend;
    pcr_body_dispose(&b);
    pcr_body_reader_free(r);
    return t;
}

/* The reader's whole cost for one body: create, every chunk, finish, free. */
static uint64_t read_whole(const ctx_t *c, pcr_api_t api, const char *body, size_t len)
{
    uint64_t t0 = now_ns();
    pcr_body_reader_t *r = pcr_body_reader_new(api, &c->o);
    for (size_t off = 0; off < len; off += CHUNK)
        pcr_body_reader_feed(r, body + off, len - off < CHUNK ? len - off : CHUNK);
    pcr_body_t b;
    pcr_body_reader_finish(r, &b);
    pcr_body_dispose(&b);
    pcr_body_reader_free(r);
    return now_ns() - t0;
}

static uint64_t cjson_whole(const char *body, size_t len)
{
    uint64_t t0 = now_ns();
    cJSON *j = cJSON_ParseWithLength(body, len);
    cJSON_Delete(j);
    return now_ns() - t0;
}

static double pct(uint64_t *v, size_t n, double q)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return (double)v[i] / 1000.0;
}

/* Makes the prompt warm: one backend holds all of it, another its first half. */
static void warm(ctx_t *c, pcr_api_t api, const char *body, size_t len)
{
    pcr_body_t b;
    char err[256];
    if (pcr_body_parse_opts(api, &c->o, body, len, &b, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench body refused: %s\n", err);
        exit(1);
    }
    pcr_key_t k = pcr_body_key(&b);
    uint32_t from;
    pcr_policy_commit(c->p, 3, &k, c->now++, &from);
    k.nblocks /= 2;
    pcr_policy_commit(c->p, 7, &k, c->now++, &from);
    pcr_body_dispose(&b);
}

void bench_decisions(void)
{
    static const size_t tokens[] = {1024, 8192, 32768, 131072};
    pcr_backend_desc_t be[NB];
    char names[NB][16];
    for (int b = 0; b < NB; b++) {
        snprintf(names[b], sizeof(names[b]), "pod-%02d", b);
        be[b] = (pcr_backend_desc_t){names[b], "", 1, 0};
    }
    pcr_policy_opts_t po;
    pcr_policy_opts_default(&po);
    ctx_t c;
    c.p = pcr_policy_new(&po, be, NB);
    c.now = prefill(ins_policy, c.p, pairs_policy, PREFILL_PAIRS);
    pcr_body_opts_default(&c.o);
    pcr_backend_load_t loads[NB];
    memset(loads, 0, sizeof(loads));
    for (int b = 0; b < NB; b++) {
        loads[b].usable = 1;
        loads[b].inflight = (uint32_t)(b % 5);
        loads[b].queued_prefill = (uint64_t)(b % 3) * 2000;
    }
    c.loads = loads;
    printf("decision from the body's last byte = last chunk fed + finish + decide; bodies in %d KiB "
           "chunks; index of %llu pairs over %d backends; us, median (p99):\n", CHUNK / 1024,
           (unsigned long long)pairs_policy(c.p), NB);
    printf("  %-5s %-11s %8s | %-25s | %-20s | %-18s | %s\n", "tok", "api", "body", "last chunk as left over",
           "last chunk 16 KiB", "whole body, reader", "whole body, cJSON");
    int nat_ok = 1, worst_ok = 1;
    double per_byte = 0;  /* the most a byte of the last chunk added, over the rows */
    for (size_t s = 0; s < PCR_ARRAY_SIZE(tokens); s++) {
        for (int a = 0; a < 2; a++) {
            pcr_api_t api = a ? PCR_API_CHAT : PCR_API_COMPLETIONS;
            size_t len;
            char *body = a ? chat_body(tokens[s], &len) : completions_body(tokens[s], &len);
            size_t runs = len < 40000 ? 3000 : len < 200000 ? 1000 : 400;
            uint64_t *nat = malloc(runs * sizeof(uint64_t)), *worst = malloc(runs * sizeof(uint64_t));
            uint64_t *whole = malloc(runs * sizeof(uint64_t)), *cj = malloc(runs * sizeof(uint64_t));
            size_t left = len % CHUNK ? len % CHUNK : CHUNK, full = len < CHUNK ? len : CHUNK;
            uint64_t sink = 0;
            int backend;
            warm(&c, api, body, len);
            for (size_t i = 0; i < runs; i++) {
                nat[i] = decide_once(&c, api, body, len, left, &backend);
                sink += (uint64_t)backend;
                worst[i] = decide_once(&c, api, body, len, full, &backend);
                whole[i] = read_whole(&c, api, body, len);
                cj[i] = cjson_whole(body, len);
            }
            double nmed = pct(nat, runs, 0.5), np99 = pct(nat, runs, 0.99);
            double wmed = pct(worst, runs, 0.5), wp99 = pct(worst, runs, 0.99);
            double rd = pct(whole, runs, 0.5), cd = pct(cj, runs, 0.5);
            nat_ok &= nmed <= 10;
            worst_ok &= wmed <= 10;
            if (full > left && (wmed - nmed) * 1000 / (double)(full - left) > per_byte)
                per_byte = (wmed - nmed) * 1000 / (double)(full - left);
            printf("  %4zuk %-11s %4zu KiB | %5zu B %6.2f (%6.2f) %s | %6.2f (%6.2f) %s | %7.1f, %4.2f ns/B "
                   "| %7.1f, %4.2f ns/B%s\n", tokens[s] / 1024, a ? "chat" : "completions",
                   len / 1024, left, nmed, np99, verdict(nmed <= 10), wmed, wp99,
                   verdict(wmed <= 10), rd, rd * 1000 / (double)len, cd, cd * 1000 / (double)len,
                   sink == 1 ? " " : "");
            free(nat);
            free(worst);
            free(whole);
            free(cj);
            free(body);
        }
    }
    printf("  target, median <= 10 us after the last byte for any prompt up to 512 KiB: %s with the "
           "last chunk as left over, %s with a full 16 KiB last chunk (a byte of it adds up to "
           "%.2f ns)\n", verdict(nat_ok), verdict(worst_ok), per_byte);
    pcr_policy_free(c.p);
}
