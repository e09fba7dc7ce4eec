/* Configuration of `crowdtrain-coordinator serve` (flags, CROWDTRAIN_*
 * environment, config file; see main.c for the option table). */
#ifndef COORD_CONFIG_H
#define COORD_CONFIG_H

struct coord_config {
    char *database_url;
    char *listen;
    char *data_dir;
    char *tls_cert;
    char *tls_key;
    char *public_url;
    char *bootstrap;
    char *idp_name;
    char *idp_userinfo_url;
    char *idp_ca_cert;
    long threads;
    long max_connections;
    long max_connections_per_ip;
    long header_timeout;
    long idle_timeout;
    char *tls_priorities;
    long db_pool;
    long db_timeout_ms;
    long session_ttl;
    long pass_ttl;
    long max_body;
    long login_max_failures;
    long login_window;
    long shutdown_grace_ms;
    char *log_level;
    char *checkpoint_dir;
    long checkpoint_keep;
    long checkpoint_max_mb;
    long dht_port;
    char *dht_listen_ip;
    char *dht_advertise;
    long probe_slots;
    long relay_reservations; /* backbone nodes lend this many relay ports (0: none) */
    char *web_dir;
};

#endif
