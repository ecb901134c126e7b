/* router/net/tls.c: the TLS contexts (OpenSSL 3). Server side: certificate and key from the
 * config, TLS 1.2 or newer, and ALPN that prefers h2 and falls back to http/1.1. Client side (to
 * the pods): verification on unless turned off, an optional client certificate for mutual TLS,
 * SNI, and the last session resumed by every next connection. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/x509v3.h>

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

/* ---- the client side: TLS to the pods -------------------------------------------------- */

/* The last session a context's connections were given, resumed by every next connection: one
 * per context (a backend), guarded, since every worker connects with the same context. It
 * lives in the context's ex_data and goes with the context's last reference.
 *
 * It is a private copy, and each connection gets a copy of it: OpenSSL marks a session it
 * resumed with TLS 1.3 (or one whose connection ended badly) not resumable, and that flag is
 * on the object. Shared, the first connection to finish its handshake would stop the others
 * still building their hello from resuming. HAProxy keeps its servers' sessions serialized and
 * rebuilds one per connection, for the same reason. */
typedef struct {
    pthread_mutex_t lock;
    SSL_SESSION *last;
} client_sessions_t;

static int sessions_idx = -1;
static pthread_once_t sessions_once = PTHREAD_ONCE_INIT;

static void sessions_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                          void *argp)
{
    client_sessions_t *s = ptr;
    if (s == NULL)
        return;
    SSL_SESSION_free(s->last);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void sessions_index(void)
{
    sessions_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, sessions_free);
}

/* A new session (after the handshake with TLS 1.2, with each ticket with TLS 1.3): a copy is
 * kept as the one to resume. Returning 0 leaves OpenSSL's reference to OpenSSL. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    client_sessions_t *s = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), sessions_idx);
    if (s == NULL || !SSL_SESSION_is_resumable(sess))
        return 0;
    SSL_SESSION *copy = SSL_SESSION_dup(sess);
    if (copy == NULL)
        return 0; /* the next connection makes a full handshake */
    pthread_mutex_lock(&s->lock);
    SSL_SESSION *old = s->last;
    s->last = copy;
    pthread_mutex_unlock(&s->lock);
    SSL_SESSION_free(old);
    return 0;
}

static void set_err(char *err, size_t errlen, const char *what, const char *file)
{
    char ossl[200] = "";
    unsigned long e = ERR_get_error();
    if (e != 0)
        ERR_error_string_n(e, ossl, sizeof(ossl));
    snprintf(err, errlen, "%s%s%s%s%s", what, file ? " " : "", file ? file : "", ossl[0] ? ": " : "",
             ossl);
    ERR_clear_error();
}

SSL_CTX *pcr_tls_client_ctx_new(const pcr_tls_client_opts_t *o, char *err, size_t errlen)
{
    pthread_once(&sessions_once, sessions_index);
    client_sessions_t *sess = calloc(1, sizeof(*sess));
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL || sess == NULL || sessions_idx < 0) {
        set_err(err, errlen, "out of memory", NULL);
        free(sess);
        SSL_CTX_free(ctx);
        return NULL;
    }
    pthread_mutex_init(&sess->lock, NULL);
    SSL_CTX_set_ex_data(ctx, sessions_idx, sess); /* freed with the context from here on */
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* The pods speak HTTP/1.1 to pcrouter. */
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    if (o->verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = o->ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL)
                                    : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            set_err(err, errlen, "cannot load the CA certificates", o->ca_file);
            goto fail;
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    if (o->cert != NULL) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->cert) != 1) {
            set_err(err, errlen, "cannot use the client certificate", o->cert);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, o->key, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            set_err(err, errlen, "cannot use the client key", o->key);
            goto fail;
        }
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

SSL *pcr_tls_client_ssl_new(SSL_CTX *ctx, const char *name, int verify)
{
    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL)
        return NULL;
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    /* SNI carries host names only (RFC 6066); an address is checked against the IP SANs. */
    int ok = is_ip || SSL_set_tlsext_host_name(ssl, name) == 1;
    if (ok && verify)
        ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
                   : SSL_set1_host(ssl, name) == 1;
    client_sessions_t *s = SSL_CTX_get_ex_data(ctx, sessions_idx);
    if (ok && s != NULL) {
        pthread_mutex_lock(&s->lock);
        SSL_SESSION *copy = s->last != NULL ? SSL_SESSION_dup(s->last) : NULL;
        pthread_mutex_unlock(&s->lock);
        if (copy != NULL) {
            SSL_set_session(ssl, copy); /* takes its own reference */
            SSL_SESSION_free(copy);
        }
    }
    if (!ok) {
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

void pcr_tls_failure(SSL *ssl, unsigned long err, char *buf, size_t len)
{
    long v = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (v != X509_V_OK) {
        snprintf(buf, len, "certificate verify failed: %s", X509_verify_cert_error_string(v));
        return;
    }
    if (err != 0) {
        ERR_error_string_n(err, buf, len);
        return;
    }
    snprintf(buf, len, "the handshake failed (the peer closed it or sent no TLS)");
}
