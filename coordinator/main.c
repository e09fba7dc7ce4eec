/* crowdtrain-coordinator: the backbone server. Subcommands:
 *   serve        run the HTTPS REST API (accounts, runs, allowlists, passes)
 *   migrate      apply database migrations and exit
 *   create-user  create an account (the first organizer, typically)
 *   disable-user, enable-user  lock an account out (sessions ended, passes
 *                revoked) or let it log in again
 * Options come from flags, CROWDTRAIN_* environment variables and an
 * optional config file, in that precedence (common/cm_opts.h). */
#include "coordinator/api.h"
#include "coordinator/auth.h"
#include "coordinator/backbone.h"
#include "coordinator/config.h"
#include "coordinator/db.h"
#include "coordinator/metrics.h"
#include "coordinator/migrate.h"
#include "coordinator/server.h"
#include "coordinator/tls.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_opts.h"
#include "p2p/p2p_probe.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define O(f) offsetof(struct coord_config, f)

static const struct cm_opt SERVE_OPTS[] = {
    {"database-url", CM_OPT_STR, O(database_url), NULL, "URL",
     "PostgreSQL connection URL, e.g. postgresql://user:pass@host:5432/crowdtrain", 0},
    {"listen", CM_OPT_STR, O(listen), "0.0.0.0:8443", "HOST:PORT",
     "address to serve HTTPS on; port 0 picks a free port", 0},
    {"data-dir", CM_OPT_STR, O(data_dir), "/var/lib/crowdtrain", "DIR",
     "signing key, self-signed certificate and coordinator.url live here", 0},
    {"tls-cert", CM_OPT_STR, O(tls_cert), NULL, "FILE",
     "PEM certificate (chain); without it a self-signed one is made in the data dir", 0},
    {"tls-key", CM_OPT_STR, O(tls_key), NULL, "FILE", "PEM private key for --tls-cert", 0},
    {"public-url", CM_OPT_STR, O(public_url), NULL, "URL",
     "how agents reach this coordinator, if not the listen address", 0},
    {"bootstrap", CM_OPT_STR, O(bootstrap), NULL, "HOST:PORT,...",
     "DHT bootstrap peers handed out with every pass", 0},
    {"idp-name", CM_OPT_STR, O(idp_name), NULL, "NAME",
     "name of the external identity provider volunteers log in with", 0},
    {"idp-userinfo-url", CM_OPT_STR, O(idp_userinfo_url), NULL, "URL",
     "the provider's userinfo endpoint (asked with the volunteer's bearer token)", 0},
    {"idp-ca-cert", CM_OPT_STR, O(idp_ca_cert), NULL, "FILE",
     "CA bundle to verify the provider with (default: system CAs)", 0},
    {"threads", CM_OPT_INT, O(threads), "8", "N",
     "HTTP worker threads (requests waiting for the database hold one; contribution reports "
     "do not)", 0},
    {"max-connections", CM_OPT_INT, O(max_connections), "4096", "N",
     "open client connections at most (each agent keeps one); the open-file limit is raised "
     "to fit", 0},
    {"max-connections-per-ip", CM_OPT_INT, O(max_connections_per_ip), "64", "N",
     "open connections from one client address at most (0: no limit); more are refused at "
     "once, so one address cannot fill the server", 0},
    {"header-timeout", CM_OPT_INT, O(header_timeout), "10", "SECONDS",
     "a new connection must finish its TLS handshake and send a request's headers within "
     "this, however slowly it trickles them", 0},
    {"idle-timeout", CM_OPT_INT, O(idle_timeout), "60", "SECONDS",
     "a kept-alive connection must send its next request's headers within this (and no "
     "request may stall longer while sending its body)", 0},
    {"tls-priorities", CM_OPT_STR, O(tls_priorities), COORD_TLS_PRIORITIES_DEFAULT, "STRING",
     "GnuTLS priority string: protocol versions, key exchanges and ciphers offered (default: "
     "TLS 1.2 and 1.3 only, forward-secret AEAD suites)", 0},
    {"db-pool", CM_OPT_INT, O(db_pool), "16", "N", "database connections", 0},
    {"db-timeout-ms", CM_OPT_INT, O(db_timeout_ms), "5000", "MS",
     "longest wait for a database connection and for one statement", 0},
    {"session-ttl", CM_OPT_INT, O(session_ttl), "43200", "SECONDS", "bearer session lifetime", 0},
    {"pass-ttl", CM_OPT_INT, O(pass_ttl), "14400", "SECONDS", "access pass lifetime", 0},
    {"login-max-failures", CM_OPT_INT, O(login_max_failures), "10", "N",
     "failed logins per username within the window before throttling (x10 per address)", 0},
    {"login-window", CM_OPT_INT, O(login_window), "900", "SECONDS",
     "window for counting failed logins", 0},
    {"shutdown-grace-ms", CM_OPT_INT, O(shutdown_grace_ms), "10000", "MS",
     "on SIGTERM, how long in-flight requests may take to finish", 0},
    {"log-level", CM_OPT_STR, O(log_level), "info", "LEVEL", "error, warn, info or debug", 0},
    {"checkpoint-dir", CM_OPT_STR, O(checkpoint_dir), NULL, "DIR",
     "where uploaded checkpoints are kept (default DATA-DIR/checkpoints); coordinators "
     "sharing a database must share it", 0},
    {"checkpoint-keep", CM_OPT_INT, O(checkpoint_keep), "3", "N", "newest checkpoints kept per run", 0},
    {"checkpoint-max-mb", CM_OPT_INT, O(checkpoint_max_mb), "16384", "MB",
     "largest checkpoint accepted", 0},
    {"dht-port", CM_OPT_INT, O(dht_port), "31400", "PORT",
     "first port of the per-run DHT backbone nodes (one port per open run, counting up); "
     "0 = ephemeral ports, -1 = run no backbone", 0},
    {"dht-listen-ip", CM_OPT_STR, O(dht_listen_ip), "0.0.0.0", "IP",
     "address the backbone nodes listen on", 0},
    {"dht-advertise", CM_OPT_STR, O(dht_advertise), NULL, "HOST",
     "host peers reach the backbone nodes at (default: the --public-url or --listen host, "
     "else 127.0.0.1)", 0},
    {"probe-slots", CM_OPT_INT, O(probe_slots), "4", "N",
     "agents measuring their link's rates against a backbone node at once (1-16; each may use "
     "its whole link for about 2 s at join and every 30 minutes)", 0},
    {"relay-reservations", CM_OPT_INT, O(relay_reservations), "0", "N",
     "each run's backbone node relays for up to N/2 unreachable agents (two ports each: "
     "averaging and state), so that they can aggregate when no reachable volunteer relays "
     "for them; their traffic then crosses this host's link (0-256, 0 = never)", 0},
    {"web-dir", CM_OPT_STR, O(web_dir), NULL, "DIR",
     "the built dashboard served at / (default: ../web/dist next to the binary, else "
     "../share/crowdtrain/web next to it, else /usr/share/crowdtrain/web)", 0},
};

static const struct cm_cmd_spec SERVE = {
    "crowdtrain-coordinator serve --database-url URL [options]",
    "Serves the Crowdtrain REST API over HTTPS: accounts and sessions, runs and\n"
    "allowlists, signed access passes and their revocation list, health and\n"
    "metrics. Applies pending database migrations first. SIGTERM or SIGINT stops\n"
    "it gracefully: in-flight requests finish, then it exits.",
    SERVE_OPTS, sizeof SERVE_OPTS / sizeof SERVE_OPTS[0], 1};

static int validate(const struct coord_config *c)
{
    if (!c->database_url) {
        fprintf(stderr, "error: --database-url is required (or CROWDTRAIN_DATABASE_URL)\n");
        return 0;
    }
    struct {
        const char *name;
        long v, lo, hi;
    } ranges[] = {{"threads", c->threads, 1, 256},
                  {"max-connections", c->max_connections, 16, 1000000},
                  {"max-connections-per-ip", c->max_connections_per_ip, 0, 1000000},
                  {"header-timeout", c->header_timeout, 1, 3600},
                  {"idle-timeout", c->idle_timeout, 1, 86400},
                  {"db-pool", c->db_pool, 1, 1000},
                  {"db-timeout-ms", c->db_timeout_ms, 100, 600000},
                  {"session-ttl", c->session_ttl, 60, 90L * 24 * 3600},
                  {"pass-ttl", c->pass_ttl, 30, 30L * 24 * 3600},
                  {"login-max-failures", c->login_max_failures, 1, 100000},
                  {"login-window", c->login_window, 1, 86400},
                  {"shutdown-grace-ms", c->shutdown_grace_ms, 0, 600000},
                  {"checkpoint-keep", c->checkpoint_keep, 1, 1000},
                  {"checkpoint-max-mb", c->checkpoint_max_mb, 1, 1L << 24},
                  {"dht-port", c->dht_port, -1, 65535},
                  {"probe-slots", c->probe_slots, 1, P2P_PROBE_MAX_SLOTS},
                  {"relay-reservations", c->relay_reservations, 0, 256}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (ranges[i].v < ranges[i].lo || ranges[i].v > ranges[i].hi) {
            fprintf(stderr, "error: --%s must be %ld..%ld\n", ranges[i].name, ranges[i].lo,
                    ranges[i].hi);
            return 0;
        }
    }
    if ((c->idp_name == NULL) != (c->idp_userinfo_url == NULL)) {
        fprintf(stderr, "error: --idp-name and --idp-userinfo-url go together\n");
        return 0;
    }
    if (c->idp_name && !cm_name_valid(c->idp_name)) {
        fprintf(stderr, "error: --idp-name: 1-64 characters of A-Z a-z 0-9 _ . -\n");
        return 0;
    }
    enum cm_log_level lv;
    if (cm_log_parse_level(c->log_level, &lv) != CM_OK) {
        fprintf(stderr, "error: --log-level: error, warn, info or debug\n");
        return 0;
    }
    cm_log_set_level(lv);
    return 1;
}

/* Connects, retrying for a while: in compose setups the database may start
 * after the coordinator. */
static int connect_retry(const char *url, int statement_timeout_ms, PGconn **pg)
{
    int rc = CM_ECONN;
    for (int attempt = 0; attempt < 30; attempt++) {
        rc = coord_db_connect(url, statement_timeout_ms, pg);
        if (rc == CM_OK)
            return rc;
        if (attempt == 0)
            CM_LOGW("main", "database not reachable yet; retrying for 30 s");
        sleep(1);
    }
    return rc;
}

/* Each client connection is a descriptor; so are database connections,
 * checkpoint files and the backbone's sockets. Raise the soft limit to fit
 * --max-connections (up to the hard limit; say so when it does not fit). */
static void raise_nofile(long max_connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)max_connections + 1024;
    if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max)
        want = rl.rlim_max;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        CM_LOGW("main", "could not raise the open-file limit to %llu: %s", (unsigned long long)want,
                strerror(errno));
    if ((long)want < max_connections + 1024)
        CM_LOGW("main", "open-file limit %llu is below --max-connections %ld + 1024: new "
                "connections will be refused before that many are open",
                (unsigned long long)want, max_connections);
}

static int run_migrations(PGconn *pg)
{
    int applied = 0, version = 0;
    int rc = coord_migrate(pg, &applied, &version);
    if (rc == CM_OK)
        CM_LOGI("main", "database schema at version %d (%d migration%s applied now)", version,
                applied, applied == 1 ? "" : "s");
    return rc;
}

static int register_key(PGconn *pg, const struct cm_ed25519 *k, const char *kid)
{
    const char *params[] = {kid, (const char *)k->pub};
    const int lens[] = {0, CM_ED25519_PUB_LEN};
    const int fmts[] = {0, 1};
    PGresult *r = PQexecParams(pg,
                               "INSERT INTO signing_keys (kid, public_key) VALUES ($1, $2) "
                               "ON CONFLICT (kid) DO NOTHING",
                               2, NULL, params, lens, fmts, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        CM_LOGE("main", "registering the signing key: %s", PQerrorMessage(pg));
    PQclear(r);
    return ok ? CM_OK : CM_EDB;
}

static int write_url_file(const char *dir, const char *url)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/coordinator.url", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return CM_EIO;
    fprintf(f, "%s\n", url);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return CM_EIO;
    return CM_OK;
}

/* "[::1]" -> "::1" in place. */
static void strip_brackets(char *h)
{
    size_t n = strlen(h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        memmove(h, h + 1, n - 2);
        h[n - 2] = '\0';
    }
}

/* The host of a URL ("https://[::1]:8443/x" -> "::1"); "" when there is
 * none. */
static void url_host(const char *url, char *out, size_t cap)
{
    out[0] = '\0';
    const char *p = url ? strstr(url, "://") : NULL;
    if (!p)
        return;
    p += 3;
    size_t n = *p == '[' ? strcspn(p, "]") + 1 : strcspn(p, ":/");
    if (n > 0 && n < cap) {
        snprintf(out, cap, "%.*s", (int)n, p);
        strip_brackets(out);
    }
}

/* SIGTERM and SIGINT are taken by sigwait in the main thread; every thread
 * we start inherits them blocked. Threads that a library starts before
 * main() do not: OpenBLAS's pool comes from its constructor (the kernels
 * are linked into every binary) with nothing blocked. The kernel may hand
 * a process-directed SIGTERM to such a thread when the main thread is not
 * in sigwait at that instant (seen: a coordinator stopped and continued
 * around the signal, as test_agent_login does), and the default action
 * then killed the process instead of stopping it gracefully. This handler
 * only ever runs on such threads (everywhere else the signals are blocked)
 * and hands the signal to the main thread, where sigwait takes it. */
static pid_t g_main_tid;
static void forward_to_main(int sig)
{
    int saved = errno;
    syscall(SYS_tgkill, getpid(), g_main_tid, sig);
    errno = saved;
}

static void catch_stop_signals(sigset_t *set)
{
    g_main_tid = (pid_t)syscall(SYS_gettid);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_to_main;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

static int cmd_serve(int argc, char **argv)
{
    struct coord_config cfg = {0};
    int rc = cm_opts_parse(&SERVE, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&SERVE, &cfg);
        return rc == 1 ? 0 : 2;
    }
    if (!validate(&cfg)) {
        cm_opts_free(&SERVE, &cfg);
        return 2;
    }
    int status = 1;
    struct coord_server srv = {0};
    struct coord_backbone *backbone = NULL;
    srv.cfg = &cfg;
    srv.routes = coord_routes;
    srv.nroutes = coord_nroutes;
    PGconn *pg = NULL;

    /* Signals are handled by sigwait in this thread only; workers inherit the mask. */
    sigset_t set;
    catch_stop_signals(&set);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    raise_nofile(cfg.max_connections);

    if (!cfg.web_dir)
        cfg.web_dir = coord_web_default_dir();
    if (cfg.web_dir)
        CM_LOGI("main", "dashboard files from %s", cfg.web_dir);
    else
        CM_LOGW("main", "no dashboard files found (build them with `make web`; --web-dir DIR)");
    if (mkdir(cfg.data_dir, 0700) != 0 && errno != EEXIST) {
        CM_LOGE("main", "creating data dir %s: %s", cfg.data_dir, strerror(errno));
        goto out;
    }
    if (!cfg.checkpoint_dir) {
        char d[4096];
        snprintf(d, sizeof d, "%s/checkpoints", cfg.data_dir);
        cfg.checkpoint_dir = strdup(d);
    }
    if (!cfg.checkpoint_dir || (mkdir(cfg.checkpoint_dir, 0700) != 0 && errno != EEXIST)) {
        CM_LOGE("main", "creating checkpoint dir %s: %s", cfg.checkpoint_dir ? cfg.checkpoint_dir : "",
                strerror(errno));
        goto out;
    }
    char keypath[4096];
    snprintf(keypath, sizeof keypath, "%s/coordinator-ed25519.pem", cfg.data_dir);
    int created = 0;
    if ((rc = cm_ed25519_load_or_create(&srv.signing_key, keypath, &created)) != CM_OK) {
        CM_LOGE("main", "signing key %s: %s", keypath, cm_strerror(rc));
        goto out;
    }
    cm_key_id(srv.signing_key.pub, srv.kid);
    CM_LOGI("main", "%s signing key %s (kid %s)", created ? "created" : "loaded", keypath, srv.kid);

    char host[64] = "", pub_host[256] = "";
    const char *colon = strrchr(cfg.listen, ':');
    if (colon && (size_t)(colon - cfg.listen) < sizeof host)
        snprintf(host, sizeof host, "%.*s", (int)(colon - cfg.listen), cfg.listen);
    strip_brackets(host);
    url_host(cfg.public_url, pub_host, sizeof pub_host);
    const char *tls_hosts[] = {host, pub_host};
    if ((rc = coord_tls_load(cfg.tls_cert, cfg.tls_key, cfg.data_dir, tls_hosts, 2, &srv.tls_cert_pem,
                             &srv.tls_key_pem)) != CM_OK)
        goto out;

    if (connect_retry(cfg.database_url, (int)cfg.db_timeout_ms * 6, &pg) != CM_OK ||
        run_migrations(pg) != CM_OK || register_key(pg, &srv.signing_key, srv.kid) != CM_OK)
        goto out;
    /* what interrupted uploads and crashes left on disk (docs/checkpoints.md) */
    coord_checkpoints_sweep(pg, cfg.checkpoint_dir);
    coord_expert_ckpt_sweep(pg, cfg.checkpoint_dir);
    PQfinish(pg);
    pg = NULL;

    if (!cfg.dht_advertise)
        cfg.dht_advertise = strdup(pub_host[0] ? pub_host
                                   : host[0] && strcmp(host, "0.0.0.0") && strcmp(host, "::") ? host
                                   : "127.0.0.1");
    if ((rc = coord_db_pool_new(cfg.database_url, (int)cfg.db_pool, (int)cfg.db_timeout_ms,
                                (int)cfg.db_timeout_ms, &srv.db)) != CM_OK ||
        (rc = coord_metrics_new(srv.nroutes, &srv.metrics)) != CM_OK ||
        (rc = coord_backbone_start(&srv, &backbone)) != CM_OK ||
        (rc = coord_http_start(&srv)) != CM_OK)
        goto out;

    char url[512];
    snprintf(url, sizeof url, "https://%s:%u",
             (!host[0] || !strcmp(host, "0.0.0.0")) ? "127.0.0.1" : host, srv.port);
    write_url_file(cfg.data_dir, url);
    CM_LOGI("main", "serving %s (%ld threads, %ld database connections)", url, cfg.threads,
            cfg.db_pool);

    int sig = 0;
    sigwait(&set, &sig);
    CM_LOGI("main", "%s received: finishing in-flight requests", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    coord_http_stop(&srv, (int)cfg.shutdown_grace_ms);
    coord_backbone_stop(backbone);
    backbone = NULL;
    CM_LOGI("main", "stopped");
    status = 0;
out:
    if (pg)
        PQfinish(pg);
    if (srv.daemon)
        coord_http_stop(&srv, 0);
    coord_backbone_stop(backbone);
    coord_db_pool_free(srv.db);
    coord_metrics_free(srv.metrics);
    cm_ed25519_cleanup(&srv.signing_key);
    free(srv.tls_cert_pem);
    free(srv.tls_key_pem);
    curl_global_cleanup();
    cm_opts_free(&SERVE, &cfg);
    return status;
}

struct migrate_cfg {
    char *database_url;
};
static const struct cm_opt MIGRATE_OPTS[] = {
    {"database-url", CM_OPT_STR, offsetof(struct migrate_cfg, database_url), NULL, "URL",
     "PostgreSQL connection URL", 0},
};
static const struct cm_cmd_spec MIGRATE = {
    "crowdtrain-coordinator migrate --database-url URL",
    "Applies the database migrations compiled into this binary, each in its own\n"
    "transaction, and exits. Refuses a database migrated by a newer version.",
    MIGRATE_OPTS, 1, 1};

static int cmd_migrate(int argc, char **argv)
{
    struct migrate_cfg cfg = {0};
    int rc = cm_opts_parse(&MIGRATE, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&MIGRATE, &cfg);
        return rc == 1 ? 0 : 2;
    }
    if (!cfg.database_url) {
        fprintf(stderr, "error: --database-url is required\n");
        cm_opts_free(&MIGRATE, &cfg);
        return 2;
    }
    PGconn *pg = NULL;
    int status = 1;
    if (coord_db_connect(cfg.database_url, 600000, &pg) == CM_OK && run_migrations(pg) == CM_OK)
        status = 0;
    if (pg)
        PQfinish(pg);
    cm_opts_free(&MIGRATE, &cfg);
    return status;
}

struct user_cfg {
    char *database_url, *username, *role;
    int password_stdin;
};
static const struct cm_opt USER_OPTS[] = {
    {"database-url", CM_OPT_STR, offsetof(struct user_cfg, database_url), NULL, "URL",
     "PostgreSQL connection URL", 0},
    {"username", CM_OPT_STR, offsetof(struct user_cfg, username), NULL, "NAME",
     "1-64 characters of A-Z a-z 0-9 _ . -", 1},
    {"role", CM_OPT_STR, offsetof(struct user_cfg, role), NULL, "ROLE",
     "organizer, auditor or volunteer", 1},
    {"password-stdin", CM_OPT_BOOL, offsetof(struct user_cfg, password_stdin), NULL, NULL,
     "read the password (first line, at least 8 characters) from standard input", 1},
};
static const struct cm_cmd_spec CREATE_USER = {
    "crowdtrain-coordinator create-user --database-url URL --username U --role ROLE "
    "--password-stdin",
    "Creates an account directly in the database (typically the first organizer;\n"
    "organizers create further accounts through POST /api/v1/users). Applies\n"
    "pending migrations first. The password is hashed with argon2id.",
    USER_OPTS, sizeof USER_OPTS / sizeof USER_OPTS[0], 1};

static int cmd_create_user(int argc, char **argv)
{
    struct user_cfg cfg = {0};
    int rc = cm_opts_parse(&CREATE_USER, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&CREATE_USER, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status = 2;
    unsigned role = coord_role_parse(cfg.role);
    char pw[COORD_PASSWORD_MAX + 2];
    PGconn *pg = NULL;
    if (!cfg.database_url || !cfg.username || !cfg.role || !cfg.password_stdin) {
        fprintf(stderr, "error: --database-url, --username, --role and --password-stdin are required\n");
        goto out;
    }
    if (!cm_name_valid(cfg.username)) {
        fprintf(stderr, "error: --username: 1-64 characters of A-Z a-z 0-9 _ . -\n");
        goto out;
    }
    if (!role) {
        fprintf(stderr, "error: --role: organizer, auditor or volunteer\n");
        goto out;
    }
    if (!fgets(pw, sizeof pw, stdin)) {
        fprintf(stderr, "error: no password on standard input\n");
        goto out;
    }
    pw[strcspn(pw, "\r\n")] = '\0';
    if (strlen(pw) < COORD_PASSWORD_MIN || strlen(pw) > COORD_PASSWORD_MAX) {
        fprintf(stderr, "error: the password must be %d..%d characters\n", COORD_PASSWORD_MIN,
                COORD_PASSWORD_MAX);
        goto out;
    }
    status = 1;
    if (coord_db_connect(cfg.database_url, 60000, &pg) != CM_OK || run_migrations(pg) != CM_OK)
        goto out;
    {
        struct coord_db_conn c = {.pg = pg};
        int64_t id = 0;
        rc = coord_user_create(&c, cfg.username, role, pw, &id);
        if (rc == CM_EEXISTS) {
            fprintf(stderr, "error: the username '%s' is taken (unique ignoring case)\n", cfg.username);
            goto out;
        }
        if (rc != CM_OK) {
            fprintf(stderr, "error: creating the account failed: %s\n", cm_strerror(rc));
            goto out;
        }
        PGresult *r = PQexecParams(pg,
                                   "INSERT INTO audit_log (actor, action, target, details) "
                                   "VALUES ('cli', 'user.create', $1, jsonb_build_object('role', $2::text))",
                                   2, NULL, (const char *const[]){cfg.username, cfg.role}, NULL, NULL, 0);
        PQclear(r);
        printf("created %s '%s' (id %lld)\n", cfg.role, cfg.username, (long long)id);
        status = 0;
    }
out:
    memset(pw, 0, sizeof pw);
    if (pg)
        PQfinish(pg);
    cm_opts_free(&CREATE_USER, &cfg);
    return status;
}

struct disable_cfg {
    char *database_url, *username;
};
static const struct cm_opt DISABLE_OPTS[] = {
    {"database-url", CM_OPT_STR, offsetof(struct disable_cfg, database_url), NULL, "URL",
     "PostgreSQL connection URL", 0},
    {"username", CM_OPT_STR, offsetof(struct disable_cfg, username), NULL, "NAME",
     "the account", 1},
};
static const struct cm_cmd_spec DISABLE_USER = {
    "crowdtrain-coordinator disable-user --database-url URL --username U",
    "Disables an account directly in the database (also when no organizer can log\n"
    "in; organizers use PATCH /api/v1/users/{username}): its sessions end and its\n"
    "live passes are revoked at once, listed on every run's revocation list.\n"
    "Read requests on a running coordinator may still take a cached session for\n"
    "up to 5 seconds. Applies pending migrations first.",
    DISABLE_OPTS, sizeof DISABLE_OPTS / sizeof DISABLE_OPTS[0], 1};
static const struct cm_cmd_spec ENABLE_USER = {
    "crowdtrain-coordinator enable-user --database-url URL --username U",
    "Lets a disabled account log in again. Its revoked passes stay revoked; its\n"
    "agents ask for new ones. Applies pending migrations first.",
    DISABLE_OPTS, sizeof DISABLE_OPTS / sizeof DISABLE_OPTS[0], 1};

static int cmd_disable_user(int argc, char **argv, int disable)
{
    const struct cm_cmd_spec *spec = disable ? &DISABLE_USER : &ENABLE_USER;
    struct disable_cfg cfg = {0};
    int rc = cm_opts_parse(spec, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(spec, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status = 2;
    PGconn *pg = NULL;
    if (!cfg.database_url || !cfg.username) {
        fprintf(stderr, "error: --database-url and --username are required\n");
        goto out;
    }
    status = 1;
    if (coord_db_connect(cfg.database_url, 60000, &pg) != CM_OK || run_migrations(pg) != CM_OK)
        goto out;
    {
        struct coord_db_conn c = {.pg = pg};
        struct coord_user_change ch;
        const char *action = disable ? "user.disable" : "user.enable";
        if (coord_db_cmd(&c, "BEGIN") != CM_OK)
            goto out;
        rc = coord_user_set_disabled(&c, cfg.username, disable, 0, &ch);
        if (rc == CM_ENOTFOUND) {
            fprintf(stderr, "error: no user '%s'\n", cfg.username);
            goto out;
        }
        char sess[24], passes[24];
        snprintf(sess, sizeof sess, "%ld", ch.sessions_ended);
        snprintf(passes, sizeof passes, "%ld", ch.passes_revoked);
        PGresult *r = rc != CM_OK || !ch.changed ? NULL
                      : PQexecParams(pg,
                                     "INSERT INTO audit_log (actor, action, target, details) "
                                     "VALUES ('cli', $1, $2, jsonb_build_object('sessions_ended', "
                                     "$3::bigint, 'passes_revoked', $4::bigint))",
                                     4, NULL, (const char *const[]){action, cfg.username, sess, passes},
                                     NULL, NULL, 0);
        int ok = rc == CM_OK && (!ch.changed || PQresultStatus(r) == PGRES_COMMAND_OK) &&
                 coord_db_cmd(&c, "COMMIT") == CM_OK;
        PQclear(r);
        if (!ok) {
            fprintf(stderr, "error: changing the account failed: %s\n", PQerrorMessage(pg));
            goto out;
        }
        if (!ch.changed)
            printf("'%s' was already %s\n", cfg.username, disable ? "disabled" : "enabled");
        else if (disable)
            printf("disabled '%s': %ld sessions ended, %ld passes revoked\n", cfg.username,
                   ch.sessions_ended, ch.passes_revoked);
        else
            printf("enabled '%s'\n", cfg.username);
        status = 0;
    }
out:
    if (pg)
        PQfinish(pg);
    cm_opts_free(spec, &cfg);
    return status;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: crowdtrain-coordinator <command> [options]\n\n"
               "The Crowdtrain backbone: accounts, allowlists, signed access passes.\n\n"
               "commands:\n"
               "  serve        serve the HTTPS REST API\n"
               "  migrate      apply database migrations and exit\n"
               "  create-user  create an account (e.g. the first organizer)\n"
               "  disable-user end an account's sessions and passes and lock it out\n"
               "  enable-user  let a disabled account log in again\n\n"
               "Run 'crowdtrain-coordinator <command> --help' for its options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "serve"))
        return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "migrate"))
        return cmd_migrate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "create-user"))
        return cmd_create_user(argc - 1, argv + 1);
    if (!strcmp(argv[1], "disable-user"))
        return cmd_disable_user(argc - 1, argv + 1, 1);
    if (!strcmp(argv[1], "enable-user"))
        return cmd_disable_user(argc - 1, argv + 1, 0);
    fprintf(stderr, "crowdtrain-coordinator: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
