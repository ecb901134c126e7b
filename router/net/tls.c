/* router/net/tls.c: the server-side TLS context (OpenSSL 3): certificate and key from the config,
 * TLS 1.2 or newer, and ALPN that prefers h2 and falls back to http/1.1. */
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "tls.h"

static int on_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char prefs[] = "\x02h2\x08http/1.1";
    unsigned char *sel = NULL;
    /* Server preference order: h2 first when the client offers it. */
    if (SSL_select_next_proto(&sel, outlen, prefs, sizeof(prefs) - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no overlap: continue without ALPN (HTTP/1.1) */
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

SSL_CTX *pcr_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        goto fail;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        goto fail;
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        goto fail;
    if (SSL_CTX_check_private_key(ctx) != 1)
        goto fail;
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn_select, NULL);
    return ctx;
fail:
    ERR_error_string_n(ERR_get_error(), err, errlen);
    SSL_CTX_free(ctx);
    return NULL;
}
