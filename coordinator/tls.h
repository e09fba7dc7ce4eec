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

/* Loads (or creates) cert and key PEM text; caller frees both. */
int coord_tls_load(const char *cert_path, const char *key_path, const char *data_dir,
                   const char *const *hosts, size_t nhosts, char **cert_pem, char **key_pem);

#endif
