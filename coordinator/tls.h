/* TLS material for the coordinator: the operator's certificate and key, or
 * a self-signed certificate generated into the data directory on first
 * start (ECDSA P-256, subjectAltName localhost, 127.0.0.1, ::1 and the
 * listen host), so agents can pin it with --ca-cert. */
#ifndef COORD_TLS_H
#define COORD_TLS_H

/* Loads (or creates) cert and key PEM text; caller frees both. */
int coord_tls_load(const char *cert_path, const char *key_path, const char *data_dir,
                   const char *listen_host, char **cert_pem, char **key_pem);

#endif
