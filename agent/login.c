/* crowdtrain-agent login and pass: the volunteer's first contact with a
 * coordinator (seed 000_02cc6b5d62a616fc.txt, Appendix H.4).
 *
 * login  asks for the password (or reads it from stdin, or takes an
 *        identity-provider token), opens a session, creates the peer's
 *        Ed25519 key pair on first use (peer-ed25519.pem, 0600) and, with
 *        --run, obtains an access pass.
 * pass   obtains or renews the pass for a run with the saved session, or
 *        --show prints the stored one. Every pass printed is first verified
 *        against the coordinator's published keys. */
#include "agent/client.h"
#include "agent/commands.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_opts.h"
#include "cm_token.h"

#include <curl/curl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

struct login_cfg {
    char *coordinator, *username, *run, *ca_cert, *config_dir, *provider;
    int password_stdin, token_stdin;
};

#define L(f) offsetof(struct login_cfg, f)
static const struct cm_opt LOGIN_OPTS[] = {
    {"coordinator", CM_OPT_STR, L(coordinator), NULL, "URL", "the coordinator, e.g. https://coord.example.org:8443", 0},
    {"username", CM_OPT_STR, L(username), NULL, "NAME", "your account (not with --provider)", 0},
    {"run", CM_OPT_STR, L(run), NULL, "RUN", "also get an access pass for this run", 0},
    {"ca-cert", CM_OPT_STR, L(ca_cert), NULL, "FILE",
     "the coordinator's certificate, when it is self-signed (its data dir's tls-cert.pem)", 0},
    {"config-dir", CM_OPT_STR, L(config_dir), NULL, "DIR",
     "where the key, session and passes are kept (default ~/.config/crowdtrain)", 0},
    {"provider", CM_OPT_STR, L(provider), NULL, "NAME",
     "log in with a token from this identity provider instead of a password", 0},
    {"password-stdin", CM_OPT_BOOL, L(password_stdin), NULL, NULL,
     "read the password from standard input instead of prompting", 1},
    {"token-stdin", CM_OPT_BOOL, L(token_stdin), NULL, NULL,
     "with --provider: read the provider's token from standard input", 1},
};
static const struct cm_cmd_spec LOGIN = {
    "crowdtrain-agent login --coordinator URL (--username U | --provider NAME) [--run RUN]",
    "Logs in to a coordinator and keeps the session in the state directory. On\n"
    "first use it creates this peer's Ed25519 key pair there. With --run it also\n"
    "obtains an access pass for that run and prints it. The password is asked for\n"
    "on the terminal (not echoed) unless --password-stdin is given.",
    LOGIN_OPTS, sizeof LOGIN_OPTS / sizeof LOGIN_OPTS[0], 1};

static int read_secret(const char *prompt, int from_stdin, char *out, size_t cap)
{
    FILE *in = stdin;
    struct termios old, quiet;
    int tty = 0;
    if (!from_stdin && isatty(STDIN_FILENO)) {
        fprintf(stderr, "%s", prompt);
        if (tcgetattr(STDIN_FILENO, &old) == 0) {
            quiet = old;
            quiet.c_lflag &= ~(tcflag_t)ECHO;
            tty = tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet) == 0;
        }
    }
    char *got = fgets(out, (int)cap, in);
    if (tty) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
        fprintf(stderr, "\n");
    }
    if (!got)
        return CM_EINVAL;
    out[strcspn(out, "\r\n")] = '\0';
    return out[0] ? CM_OK : CM_EINVAL;
}

static void fmt_time(int64_t t, char *out, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(out, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

static int load_peer_key(const char *dir, struct cm_ed25519 *k, int *created)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/peer-ed25519.pem", dir);
    int rc = cm_ed25519_load_or_create(k, path, created);
    if (rc != CM_OK)
        fprintf(stderr, "error: peer key %s: %s\n", path, cm_strerror(rc));
    return rc;
}

/* Verifies `tok` against the keys the coordinator publishes at /api/v1/keys. */
static int verify_pass(const struct agent_client *c, const char *tok, struct cm_pass_claims *claims)
{
    struct agent_client anon = {c->url, c->ca_cert, NULL};
    struct agent_reply r;
    if (agent_request(&anon, "GET", "/api/v1/keys", NULL, &r) != CM_OK)
        return CM_ECONN;
    uint8_t keys[16][CM_ED25519_PUB_LEN];
    size_t n = 0, i;
    json_t *k;
    json_array_foreach(json_object_get(r.json, "keys"), i, k) {
        const char *s = json_string_value(json_object_get(k, "public_key"));
        size_t got = 0;
        if (s && n < 16 && cm_b64url_decode(s, strlen(s), keys[n], CM_ED25519_PUB_LEN, &got) == CM_OK &&
            got == CM_ED25519_PUB_LEN)
            n++;
    }
    agent_reply_free(&r);
    return cm_token_verify(tok, strlen(tok), (const uint8_t(*)[CM_ED25519_PUB_LEN])keys, n,
                           (int64_t)time(NULL), 60, claims);
}

static void print_pass(const struct cm_pass_claims *c, json_t *pass, const char *path, int verified)
{
    char iss[64], exp[64];
    fmt_time(c->issued_at, iss, sizeof iss);
    fmt_time(c->expires_at, exp, sizeof exp);
    long left = (long)(c->expires_at - time(NULL));
    char pk[64];
    cm_b64url_encode(c->peer_public_key, CM_ED25519_PUB_LEN, pk);
    printf("Access pass for run '%s':\n", c->run);
    printf("  pass id      %s\n", c->pass_id);
    printf("  user         %s\n", c->username);
    printf("  run          %s\n", c->run);
    printf("  peer key     %s\n", pk);
    printf("  issued       %s\n", iss);
    printf("  expires      %s (in %ldh %02ldm)\n", exp, left / 3600, (left % 3600) / 60);
    printf("  signed by    coordinator key %s\n", c->kid);
    printf("  signature    %s\n", verified ? "valid (checked against the coordinator's published keys)"
                                           : "NOT VERIFIED");
    json_t *boot = json_object_get(pass, "bootstrap");
    printf("  bootstrap    ");
    if (json_array_size(boot) == 0)
        printf("(none announced yet)");
    size_t i;
    json_t *b;
    json_array_foreach(boot, i, b) printf("%s%s", i ? ", " : "", json_string_value(b));
    printf("\n  saved to     %s\n", path);
}

/* Obtains a pass for `run` and stores/prints it; the request is signed by
 * the peer key, as `username` (the session's user). */
static int obtain_pass(const struct agent_client *c, const char *dir, const char *run, const char *username)
{
    struct cm_ed25519 key;
    int created = 0;
    if (load_peer_key(dir, &key, &created) != CM_OK)
        return 1;
    char pk[64];
    cm_b64url_encode(key.pub, CM_ED25519_PUB_LEN, pk);
    if (created)
        printf("Created this peer's key pair: %s/peer-ed25519.pem (public key %s)\n", dir, pk);
    uint8_t pub[CM_ED25519_PUB_LEN];
    memcpy(pub, key.pub, sizeof pub);
    struct agent_reply r;
    int rc = agent_request_pass(c, run, username, &key, (int64_t)time(NULL), &r);
    cm_ed25519_cleanup(&key);
    if (rc != CM_OK)
        return 1;
    if (r.status != 201) {
        if (r.status == 401)
            fprintf(stderr, "error: the session has expired; run 'crowdtrain-agent login' again\n");
        else
            agent_reply_report("getting a pass", &r);
        agent_reply_free(&r);
        return 1;
    }
    const char *tok = json_string_value(json_object_get(r.json, "access_token"));
    struct cm_pass_claims claims;
    rc = tok ? verify_pass(c, tok, &claims) : CM_EPARSE;
    if (rc != CM_OK || strcmp(claims.run, run) != 0 || memcmp(claims.peer_public_key, pub, sizeof pub) != 0) {
        fprintf(stderr, "error: the coordinator's pass does not verify (%s); not saving it\n",
                cm_strerror(rc != CM_OK ? rc : CM_EINVAL));
        agent_reply_free(&r);
        return 1;
    }
    json_object_set_new(r.json, "coordinator", json_string(c->url));
    char name[128], full[4300];
    snprintf(name, sizeof name, "pass-%s.json", run);
    snprintf(full, sizeof full, "%s/%s", dir, name);
    if (agent_state_write(dir, name, r.json) != CM_OK) {
        agent_reply_free(&r);
        return 1;
    }
    print_pass(&claims, r.json, full, 1);
    agent_reply_free(&r);
    return 0;
}

int agent_cmd_login(int argc, char **argv)
{
    struct login_cfg cfg = {0};
    int rc = cm_opts_parse(&LOGIN, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&LOGIN, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status = 2;
    char dir[4096], secret[1100];
    json_t *body = NULL;
    struct agent_reply r = {0};
    struct agent_client c = {0};
    if (!cfg.coordinator || (!cfg.username == !cfg.provider)) {
        fprintf(stderr, "error: --coordinator and one of --username or --provider are required (see --help)\n");
        goto out;
    }
    if ((cfg.username && !cm_name_valid(cfg.username)) || (cfg.run && !cm_name_valid(cfg.run))) {
        fprintf(stderr, "error: names are 1-64 characters of A-Z a-z 0-9 _ . -\n");
        goto out;
    }
    if (strncmp(cfg.coordinator, "https://", 8) != 0 && strncmp(cfg.coordinator, "http://", 7) != 0) {
        fprintf(stderr, "error: --coordinator must be an https:// URL\n");
        goto out;
    }
    status = 1;
    if (agent_state_dir(cfg.config_dir, dir, sizeof dir) != CM_OK)
        goto out;
    char prompt[512];
    if (cfg.username) {
        snprintf(prompt, sizeof prompt, "Password for %s at %s: ", cfg.username, cfg.coordinator);
        if (read_secret(prompt, cfg.password_stdin, secret, sizeof secret) != CM_OK) {
            fprintf(stderr, "error: no password given\n");
            goto out;
        }
        body = json_pack("{s:s, s:s}", "username", cfg.username, "password", secret);
    } else {
        snprintf(prompt, sizeof prompt, "Token from %s: ", cfg.provider);
        if (read_secret(prompt, cfg.token_stdin, secret, sizeof secret) != CM_OK) {
            fprintf(stderr, "error: no token given\n");
            goto out;
        }
        body = json_pack("{s:s, s:s}", "provider", cfg.provider, "token", secret);
    }
    memset(secret, 0, sizeof secret);
    size_t ul = strlen(cfg.coordinator);
    while (ul && cfg.coordinator[ul - 1] == '/')
        cfg.coordinator[--ul] = '\0';
    char ca_abs[PATH_MAX];
    c.url = cfg.coordinator;
    c.ca_cert = cfg.ca_cert ? (realpath(cfg.ca_cert, ca_abs) ? ca_abs : cfg.ca_cert) : NULL;
    if (agent_request(&c, "POST", "/api/v1/session", body, &r) != CM_OK)
        goto out;
    if (r.status != 201) {
        agent_reply_report("login", &r);
        goto out;
    }
    const char *token = json_string_value(json_object_get(r.json, "token"));
    const char *user = json_string_value(json_object_get(r.json, "username"));
    const char *role = json_string_value(json_object_get(r.json, "role"));
    json_int_t exp = json_integer_value(json_object_get(r.json, "expires_at"));
    if (!token || !user || !role) {
        fprintf(stderr, "error: login: the coordinator's answer lacks a token\n");
        goto out;
    }
    json_t *session = json_pack("{s:s, s:s, s:s, s:s, s:I}", "coordinator", c.url, "username", user,
                                "role", role, "token", token, "expires_at", exp);
    if (c.ca_cert)
        json_object_set_new(session, "ca_cert", json_string(c.ca_cert));
    rc = agent_state_write(dir, "session.json", session);
    json_decref(session);
    if (rc != CM_OK)
        goto out;
    char when[64];
    fmt_time(exp, when, sizeof when);
    printf("Logged in to %s as %s (%s); session valid until %s.\n", c.url, user, role, when);
    struct cm_ed25519 key;
    int created = 0;
    if (load_peer_key(dir, &key, &created) != CM_OK)
        goto out;
    char pk[64];
    cm_b64url_encode(key.pub, CM_ED25519_PUB_LEN, pk);
    cm_ed25519_cleanup(&key);
    printf("Peer key: %s (%s %s/peer-ed25519.pem)\n", pk, created ? "created" : "from", dir);
    status = 0;
    if (cfg.run) {
        c.token = (char *)token;
        status = obtain_pass(&c, dir, cfg.run, user);
    }
out:
    agent_reply_free(&r);
    json_decref(body);
    cm_opts_free(&LOGIN, &cfg);
    return status;
}

struct pass_cfg {
    char *run, *config_dir;
    int show;
};
static const struct cm_opt PASS_OPTS[] = {
    {"run", CM_OPT_STR, offsetof(struct pass_cfg, run), NULL, "RUN", "the run", 0},
    {"config-dir", CM_OPT_STR, offsetof(struct pass_cfg, config_dir), NULL, "DIR",
     "state directory (default ~/.config/crowdtrain)", 0},
    {"show", CM_OPT_BOOL, offsetof(struct pass_cfg, show), NULL, NULL,
     "print the stored pass instead of getting a new one", 0},
};
static const struct cm_cmd_spec PASS = {
    "crowdtrain-agent pass --run RUN [--show]",
    "Gets (or renews) this peer's access pass for a run, using the session saved\n"
    "by 'crowdtrain-agent login'. With --show, prints the stored pass and checks\n"
    "it is still valid.",
    PASS_OPTS, sizeof PASS_OPTS / sizeof PASS_OPTS[0], 1};

int agent_cmd_pass(int argc, char **argv)
{
    struct pass_cfg cfg = {0};
    int rc = cm_opts_parse(&PASS, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&PASS, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status = 2;
    char dir[4096];
    json_t *session = NULL, *pass = NULL;
    if (!cfg.run || !cm_name_valid(cfg.run)) {
        fprintf(stderr, "error: --run RUN is required (see --help)\n");
        goto out;
    }
    status = 1;
    if (agent_state_dir(cfg.config_dir, dir, sizeof dir) != CM_OK)
        goto out;
    session = agent_state_read(dir, "session.json");
    if (!session) {
        fprintf(stderr, "error: not logged in; run 'crowdtrain-agent login' first\n");
        goto out;
    }
    struct agent_client c = {
        (char *)json_string_value(json_object_get(session, "coordinator")),
        (char *)json_string_value(json_object_get(session, "ca_cert")),
        (char *)json_string_value(json_object_get(session, "token")),
    };
    const char *user = json_string_value(json_object_get(session, "username"));
    if (!c.url || !c.token || !user) {
        fprintf(stderr, "error: %s/session.json is incomplete; log in again\n", dir);
        goto out;
    }
    if (!cfg.show) {
        status = obtain_pass(&c, dir, cfg.run, user);
        goto out;
    }
    char name[128], full[4300];
    snprintf(name, sizeof name, "pass-%s.json", cfg.run);
    snprintf(full, sizeof full, "%s/%s", dir, name);
    pass = agent_state_read(dir, name);
    const char *tok = json_string_value(json_object_get(pass, "access_token"));
    if (!tok) {
        fprintf(stderr, "error: no pass stored for run '%s'; run 'crowdtrain-agent pass --run %s'\n",
                cfg.run, cfg.run);
        goto out;
    }
    struct cm_pass_claims claims;
    rc = verify_pass(&c, tok, &claims);
    if (rc == CM_EEXPIRED) {
        fprintf(stderr, "error: the stored pass has expired; run 'crowdtrain-agent pass --run %s'\n", cfg.run);
        goto out;
    }
    if (rc != CM_OK) {
        fprintf(stderr, "error: the stored pass does not verify: %s\n", cm_strerror(rc));
        goto out;
    }
    print_pass(&claims, pass, full, 1);
    status = 0;
out:
    json_decref(session);
    json_decref(pass);
    cm_opts_free(&PASS, &cfg);
    return status;
}
