/* test/fuzz/fuzz_pod.h: the pod the fuzz targets that drive the router put behind it
 * (fuzz_h1_request.c, fuzz_h2_request.c): loopback connections the router opens to the
 * backend's listener, each request on them read with http-parser and checked for what every
 * request to a pod must be (one Host, the backend's; no hop-by-hop field, no pseudo-header;
 * the Content-Length and Transfer-Encoding counted for the target), then answered.
 *
 * A target gives two functions: `check`, its own invariants for a whole request (the pod's
 * fields, url and body are in the fuzz_pod_t), and `answer`, which queues the answer in outq
 * and sets close_when_sent (the pod closes once it is out) or silent (it reads and ignores
 * the rest). */
#ifndef PCR_FUZZ_POD_H
#define PCR_FUZZ_POD_H

#include <http_parser.h>

#include "fuzz_net.h"

#define FUZZ_MAX_PODS 32         /* pod connections open at once */

typedef struct fuzz_pod fuzz_pod_t;

typedef struct {
    void (*check)(fuzz_pod_t *c);
    void (*answer)(fuzz_pod_t *c);
} fuzz_pod_ops_t;

struct fuzz_pod {
    void *owner;            /* the target's state, for its check and answer */
    const fuzz_pod_ops_t *ops;
    const char *host;       /* the Host every request must carry */
    int fd;
    int eof;
    int silent;             /* answered with a silent kind: read and ignore the rest */
    fuzz_buf_t outq;        /* the answer, as the socket takes it */
    int close_when_sent;
    http_parser p;
    fuzz_buf_t in;          /* not parsed yet */
    fuzz_buf_t name, value, url, body;
    int in_value;
    unsigned n_host, n_cl, n_te;
    fuzz_buf_t hnames;      /* the field names, each followed by '\0' */
    char cl[32];            /* the Content-Length's value */
};

typedef struct {
    fuzz_pod_t pods[FUZZ_MAX_PODS];
    size_t n;               /* slots used; a closed connection's slot is taken again */
} fuzz_pods_t;

/* The pod's loopback listener, made on the first call and kept until exit (the kept servers'
 * configs name its port, fuzz_router.h): its descriptor, and its port in *port. */
int fuzz_pods_listener(uint16_t *port);
/* Takes every connection waiting on `lfd`: 1 when there was one. */
int fuzz_pods_accept(fuzz_pods_t *ps, int lfd, const fuzz_pod_ops_t *ops, void *owner,
                     const char *host);
/* The harness's own I/O for one turn of the loop (fuzz_run): reads what the client's end
 * `client_fd` holds into `out` (*client_eof set once the router closed it; -1: the client is
 * gone), takes the connections waiting on `lfd`, and reads, checks and answers on every pod
 * connection. One poll() first says which of them have anything, so that a quiet turn, the
 * most common, costs one system call rather than a read on each and an accept (which, on
 * Linux, makes and frees a socket even when none is waiting). 1 when anything moved. */
int fuzz_pods_turn(fuzz_pods_t *ps, int lfd, const fuzz_pod_ops_t *ops, void *owner,
                   const char *host, int client_fd, fuzz_buf_t *out, int *client_eof);
/* The pod closes its connections (with a FIN). */
void fuzz_pods_close(fuzz_pods_t *ps);
/* Closes what is left with a reset and frees the buffers. */
void fuzz_pods_free(fuzz_pods_t *ps);

#endif
