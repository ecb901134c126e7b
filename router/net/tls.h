/* router/net/tls.h: the server side of TLS: a context for a listener's certificate and key. */
#ifndef PCR_ROUTER_TLS_H
#define PCR_ROUTER_TLS_H

#include <stddef.h>

#include <openssl/ssl.h>

/* A server SSL_CTX offering ALPN h2 and http/1.1; NULL with `err` filled when the certificate
 * or key cannot be used. */
SSL_CTX *pcr_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen);

#endif
