/* router/net/tls.h: TLS contexts: a listener's (its certificate and key) and a backend's (the
 * client side, to a pod). */
#ifndef PCR_ROUTER_TLS_H
#define PCR_ROUTER_TLS_H

#include <stddef.h>

#include <openssl/ssl.h>

/* A server SSL_CTX offering ALPN h2 and http/1.1; NULL with `err` filled when the certificate
 * or key cannot be used. */
SSL_CTX *pcr_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen);

/* The client side, one context per backend (or discovery entry). */
typedef struct {
    const char *ca_file;   /* PEM CA certificates; NULL: the system's */
    const char *cert;      /* PEM client certificate chain for mutual TLS, or NULL */
    const char *key;       /* its PEM private key (with cert) */
    int verify;            /* check the pod's chain and its name or address */
} pcr_tls_client_opts_t;

/* A client SSL_CTX (TLS 1.2 or newer, ALPN http/1.1, the last session kept for resumption);
 * NULL with `err` filled (the file and OpenSSL's reason) when a file cannot be used. */
SSL_CTX *pcr_tls_client_ctx_new(const pcr_tls_client_opts_t *o, char *err, size_t errlen);
/* A connection's SSL for the pod called `name` (a host name: sent as SNI and verified; an IP
 * address: verified against the certificate's IP addresses), resuming the context's last
 * session. Any thread. NULL when out of memory. */
SSL *pcr_tls_client_ssl_new(SSL_CTX *ctx, const char *name, int verify);
/* Why a handshake failed, in words: the verification's reason, else OpenSSL's `err`. */
void pcr_tls_failure(SSL *ssl, unsigned long err, char *buf, size_t len);

#endif
