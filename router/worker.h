/* router/worker.h: the worker threads (worker.c): their start, the commands the control thread
 * sends them, and their end. What a worker is (its fields) is in server.h. */
#ifndef PCR_ROUTER_WORKER_H
#define PCR_ROUTER_WORKER_H

#include "server.h"

/* worker.c: start the workers' threads (listeners bound already), ask them to drain or stop. */
int pcr_workers_start(pcr_server_t *srv);
void pcr_workers_drain(pcr_server_t *srv);
void pcr_workers_stop(pcr_server_t *srv);
/* 'D' drain, 'S' stop, 'R' take srv->pending_switch. */
void pcr_workers_command(pcr_server_t *srv, char cmd);
void pcr_workers_join(pcr_server_t *srv);
/* One worker without its thread, for pcr_workers_start() and for harnesses that run its loop
 * themselves (the fuzz targets): init builds everything (event base, policy replica, events,
 * the listeners of srv->listen_plan), on the calling thread; dispose closes its sessions and
 * frees what init made; release closes the command pipe, once no thread can write to it. */
int pcr_worker_init(pcr_server_t *srv, pcr_worker_t *w, unsigned id);
void pcr_worker_dispose(pcr_worker_t *w);
void pcr_worker_release(pcr_worker_t *w);

#endif
