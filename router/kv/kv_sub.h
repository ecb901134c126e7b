/* router/kv/kv_sub.h: the subscriber to vLLM's KV-cache events (precise mode), on a thread of
 * its own, so that no worker's loop ever waits on a pod's publisher.
 *
 * One ZMQ SUB socket per pod, connected to its publisher (`kv_events.endpoint`), and, where
 * the pod has one, a DEALER socket to its replay endpoint (a ZMQ ROUTER). Messages are three
 * frames [topic, sequence, payload]; the sequence is 8 bytes big-endian, from 0 for each life
 * of the publisher. The subscriber keeps each pod's last sequence and:
 *   - delivers a batch that follows it (decoded and checked whole, kv_decode.h);
 *   - on a gap, asks the replay endpoint for what was missed (start sequence, 8 bytes; the pod
 *     sends [seq, payload] or [topic, seq, payload] per buffered batch, then seq -1), holding
 *     the live batches that arrive meanwhile (bounded), and delivers all in order. A pod
 *     without replay, a replay that cannot fill the gap (its buffer no longer has it, a hole,
 *     its deadline), and a batch that does not decode all clear the pod's entries
 *     (`on_clear`): they are rebuilt from what follows;
 *   - at its first message from a pod, asks for the pod's whole replay buffer, so that a
 *     router that starts late learns what the pod stored recently;
 *   - takes a sequence that goes back (to 0 or anywhere) for a restarted pod: its entries are
 *     cleared, and its new life is followed from there.
 * Every bound is explicit: a message's size (ZMQ_MAXMSGSIZE), ZMQ's queue per socket, the live
 * batches held during a replay, the replay's deadline. A pod that sends garbage costs its own
 * entries and a counter, nothing else. */
#ifndef PCR_KV_SUB_H
#define PCR_KV_SUB_H

#include <stddef.h>
#include <stdint.h>

#include "kv_decode.h"

typedef struct pcr_kv_sub pcr_kv_sub_t;

typedef struct {
    unsigned backend;          /* the router's slot */
    const char *name;          /* for the log */
    const char *endpoint;      /* "tcp://HOST:PORT" */
    const char *replay;        /* "tcp://HOST:PORT", or NULL */
} pcr_kv_pod_t;

typedef enum {
    PCR_KV_CLEAR_GAP,          /* events missed and not replayed */
    PCR_KV_CLEAR_RESTART,      /* the pod's sequence went back */
    PCR_KV_CLEAR_DECODE,       /* a batch that does not decode */
    PCR_KV_CLEAR_LEFT,         /* the pod left the subscription */
} pcr_kv_clear_t;

/* Called on the subscriber's thread, never with a lock of the subscriber's held. */
typedef struct {
    void (*on_batch)(void *arg, unsigned backend, const pcr_kv_decoder_t *d,
                     const pcr_kv_batch_t *b);
    void (*on_clear)(void *arg, unsigned backend, pcr_kv_clear_t why);
    void *arg;
} pcr_kv_sub_cbs_t;

typedef struct {
    size_t max_msg_bytes;      /* one frame; larger ones are refused by ZMQ (the peer is cut) */
    unsigned replay_timeout_ms;
    unsigned max_held;         /* live batches held while a replay runs */
} pcr_kv_sub_opts_t;

/* Totals since start, read with relaxed loads from any thread. */
typedef struct {
    uint64_t batches, events, unknown_events, gaps, replays, replays_failed, restarts,
        decode_errors, bad_messages, cleared;
} pcr_kv_sub_stats_t;

/* Starts the thread. NULL with `err` set when ZMQ or the thread cannot start. */
pcr_kv_sub_t *pcr_kv_sub_new(const pcr_kv_sub_opts_t *opts, const pcr_kv_sub_cbs_t *cbs,
                             char *err, size_t errlen);
/* The pods to follow from now on (copied); the thread applies it at its next turn: a pod
 * whose endpoints changed, or that is gone, is unsubscribed and its entries cleared
 * (PCR_KV_CLEAR_LEFT). 0 or PCR_ERR_NOMEM. Any thread. */
int pcr_kv_sub_set_pods(pcr_kv_sub_t *s, const pcr_kv_pod_t *pods, size_t n);
void pcr_kv_sub_stats(const pcr_kv_sub_t *s, pcr_kv_sub_stats_t *out);
/* Stops the thread and frees everything. NULL is a no-op. */
void pcr_kv_sub_free(pcr_kv_sub_t *s);

#endif
