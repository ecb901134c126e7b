/* bench/sim/sim_kvev.h: a pod's KV-cache events, published as vLLM publishes them
 * (vllm_sim --kv-events PORT).
 *
 * Each pod has a ZMQ PUB socket and a ZMQ ROUTER socket for replay. The pod's cache observer
 * (kvcache.h) turns each block an admission names anew into BlockStored (the sim's block names
 * as u64 hashes, the parent's name or nil, the block's 16 token ids from the toy tokenizer,
 * block size 16, lora_id nil, medium "GPU") and each eviction into BlockRemoved, in the cache's
 * order. Events gathered during one turn of the event loop go out as one batch: three frames,
 * topic "kv@NAME", an 8-byte big-endian sequence number from 0 for each life of the pod, and a
 * msgpack payload [ts, events, nil] (msgpack-c's packer). Events are positional arrays (vLLM
 * <= 0.23) or, with map encoding, maps keyed by "type" (vLLM 0.26 on). A third encoding,
 * map-batch, follows vllm/distributed/kv_events.py as read at commit 0181ea31, where neither
 * the batch nor its events are msgspec array_like: the payload is the map {"ts", "events",
 * "data_parallel_rank": 0}, each BlockStored also carries "lora_name", and replay answers
 * carry no topic frame.
 *
 * The last SIM_KVEV_RING batches (fewer if they pass SIM_KVEV_RING_BYTES) stay in a replay
 * buffer. A request [id, "", start (8 bytes
 * big-endian)] on the ROUTER gets [id, "", seq, payload] for each buffered batch from start on
 * ([id, "", topic, seq, payload] with map encoding, as vLLM 0.26), then [id, "", -1, ""].
 * --kv-events-drop F leaves that fraction of batches unpublished but buffered, so a subscriber
 * sees gaps that the replay fills. A restart (sim_kvev_restart) empties the buffer and starts
 * a new life at sequence 0 with AllBlocksCleared.
 *
 * ZMQ runs on the pod's libevent loop through ZMQ_FD, which signals edges: the replay callback
 * reads while ZMQ_EVENTS says POLLIN (so the check after its own sends is part of the loop),
 * a bounded number of requests per turn; the PUB socket's ZMQ_FD makes ZMQ take in new
 * subscriptions as they come. */
#ifndef PCR_BENCH_SIM_KVEV_H
#define PCR_BENCH_SIM_KVEV_H

#include <stdint.h>

enum { SIM_KVEV_ARRAY, SIM_KVEV_MAP, SIM_KVEV_MAP_BATCH };   /* --kv-events-encoding */

#define SIM_KVEV_RING 1024
#define SIM_KVEV_RING_BYTES ((size_t)64 << 20)   /* and at most this many payload bytes */

typedef struct sim_pod sim_pod_t;
typedef struct sim_kvev sim_kvev_t;

/* Binds the pod's two sockets on `host` (port 0: one the OS picks), prints
 * "vllm-sim: pod NAME kv-events tcp://HOST:PORT replay tcp://HOST:PORT" and observes the
 * pod's cache. NULL (and a message on stderr) on failure. */
sim_kvev_t *sim_kvev_new(sim_pod_t *pod, void *zctx, const char *host, int pub_port,
                         int replay_port, int encoding, double drop, uint64_t seed);
/* Stops observing, closes the sockets, frees the buffer. NULL is a no-op. */
void sim_kvev_free(sim_kvev_t *k);
/* A new life: what was pending and buffered is forgotten, AllBlocksCleared goes out as 0. */
void sim_kvev_restart(sim_kvev_t *k);

typedef struct {
    uint64_t batches, dropped, replays, events, unknown_owner;
} sim_kvev_stats_t;
void sim_kvev_stats(const sim_kvev_t *k, sim_kvev_stats_t *out);

#endif
