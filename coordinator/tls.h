/* TLS material for the coordinator: the operator's certificate and key, or
 * a self-signed certificate generated into the data directory on first
 * start (ECDSA P-256, subjectAltName localhost, 127.0.0.1, ::1 and the
 * given hosts: the listen host and the --public-url host), so agents can
 * pin it with --ca-cert. A certificate generated earlier that does not name
 * one of the hosts is replaced by a new one (logged: agents need the new
 * file). */
#ifndef COORD_TLS_H
#define COORD_TLS_H

#include <stddef.h>

/* What the HTTPS server offers unless --tls-priorities says otherwise
 * (GnuTLS priority syntax): TLS 1.2 and 1.3 only; ECDHE key exchange (forward
 * secrecy); AEAD ciphers only (no CBC, no RC4, no 3DES); the server's order.
 * Every maintained browser, curl and OpenSSL client speaks it. */
#define COORD_TLS_PRIORITIES_DEFAULT                                                              \
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA:-CIPHER-ALL:"     \
    "+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:-MAC-ALL:+AEAD:%SERVER_PRECEDENCE"

/* Loads (or creates) cert and key PEM text; caller frees both. */
int coord_tls_load(const char *cert_path, const char *key_path, const char *data_dir,
                   const char *const *hosts, size_t nhosts, char **cert_pem, char **key_pem);

#endif
