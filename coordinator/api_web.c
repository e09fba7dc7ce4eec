/* The web dashboard (web/, built into build/web/dist) served from the same
 * origin as the API, and the few read endpoints its volunteer page needs.
 *
 * Static files: GET / is index.html; GET /app/{file} is one file of the
 * built app, looked up by a plain name (no '/', no leading '.', a known
 * extension) in --web-dir, opened with O_NOFOLLOW and served only when it is
 * a regular file, so nothing outside the directory can be reached. Names the
 * build stamps with a content hash ("main-ABCD1234.js") are cached for a
 * year; index.html is revalidated every time, so a new build shows at once.
 * Every page carries a Content-Security-Policy that allows only this
 * origin's scripts, styles and API: even a string that slipped past the
 * app's escaping could not run as script.
 *
 * Read endpoints for the pages: the logged-in user's own access passes
 * (devices) across runs and their own sessions, and a run's leaderboard of
 * verified contributions. docs/dashboard.md describes them. */
#include "coordinator/api.h"
#include "coordinator/run_cache.h"
#include "cm_err.h"
#include "cm_log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WEB_NAME_MAX 128
#define WEB_CSP                                                                                   \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "          \
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

static const struct {
    const char *ext;
    const char *type;
} TYPES[] = {
    {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},   {".map", "application/json"},
    {".svg", "image/svg+xml"},             {".png", "image/png"},
    {".ico", "image/x-icon"},              {".woff2", "font/woff2"},
    {".txt", "text/plain; charset=utf-8"},
};

/* NULL when the name may not be served. */
static const char *web_type(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > WEB_NAME_MAX || name[0] == '.')
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '.' && c != '-' && c != '_')
            return NULL;
    }
    const char *dot = strrchr(name, '.');
    if (!dot)
        return NULL;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(dot, TYPES[i].ext))
            return TYPES[i].type;
    return NULL;
}

/* "main-ABCD1234.js": the build put a content hash in the name (esbuild's
 * [name]-[hash], 8 characters of A-Z 0-9), so the file never changes. */
static int web_hashed(const char *name)
{
    const char *dot = strrchr(name, '.');
    const char *dash = NULL;
    for (const char *p = name; p < dot; p++)
        if (*p == '-')
            dash = p;
    if (!dash || dot - dash - 1 != 8)
        return 0;
    for (const char *p = dash + 1; p < dot; p++)
        if (!isupper((unsigned char)*p) && !isdigit((unsigned char)*p))
            return 0;
    return 1;
}

static void web_headers(struct coord_resp *resp, int immutable)
{
    snprintf(resp->hdr_name[0], sizeof resp->hdr_name[0], "Content-Security-Policy");
    snprintf(resp->hdr_value[0], sizeof resp->hdr_value[0], "%s", WEB_CSP);
    snprintf(resp->hdr_name[1], sizeof resp->hdr_name[1], "Cache-Control");
    snprintf(resp->hdr_value[1], sizeof resp->hdr_value[1], "%s",
             immutable ? "public, max-age=31536000, immutable" : "no-cache");
}

static void web_serve(struct coord_req *req, struct coord_resp *resp, const char *name)
{
    const char *type = web_type(name);
    if (!type) {
        coord_resp_error(resp, 404, "not_found", "no such file");
        return;
    }
    const char *dir = req->srv->cfg->web_dir;
    if (!dir || !dir[0]) {
        coord_resp_error(resp, 404, "dashboard_not_built",
                         "this coordinator has no dashboard files: build them with `make web` "
                         "and pass --web-dir");
        return;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        coord_resp_error(resp, 404, "dashboard_not_built",
                         "the dashboard directory %s cannot be opened: %s", dir, strerror(errno));
        return;
    }
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    close(dfd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        coord_resp_error(resp, 404, "not_found", "no such file");
        return;
    }
    resp->status = 200;
    resp->has_fd = 1;
    resp->fd = fd;
    resp->fd_len = (uint64_t)st.st_size;
    resp->content_type = type;
    web_headers(resp, web_hashed(name));
}

void api_web_index(struct coord_req *req, struct coord_resp *resp)
{
    web_serve(req, resp, "index.html");
}

void api_web_file(struct coord_req *req, struct coord_resp *resp)
{
    if (req->nparams < 1) {
        coord_resp_error(resp, 404, "not_found", "no such file");
        return;
    }
    web_serve(req, resp, req->params[0]);
}

char *coord_web_default_dir(void)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        /* build/bin/crowdtrain-coordinator -> build/web/dist (a build tree);
           PREFIX/bin/crowdtrain-coordinator -> PREFIX/share/crowdtrain/web
           (`make install`, any PREFIX, and the Debian package) */
        static const char *const rel[] = {"../web/dist", "../share/crowdtrain/web"};
        const char *bindir = dirname(exe);
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char cand[PATH_MAX + 32];
            snprintf(cand, sizeof cand, "%s/%s/index.html", bindir, rel[i]);
            if (access(cand, R_OK) != 0)
                continue;
            cand[strlen(cand) - strlen("/index.html")] = '\0';
            char *real = realpath(cand, NULL);
            if (real)
                return real;
        }
    }
    if (access("/usr/share/crowdtrain/web/index.html", R_OK) == 0)
        return strdup("/usr/share/crowdtrain/web");
    return NULL;
}

/* ---- the logged-in user's own devices and sessions ---- */

COORD_DB_STMT(S_MY_PASSES, 1,
              "SELECT p.id, r.name, encode(p.peer_public_key, 'hex'), "
              "extract(epoch from p.issued_at)::bigint, extract(epoch from p.expires_at)::bigint, "
              "coalesce(extract(epoch from p.revoked_at)::bigint, 0), coalesce(p.revoke_reason, ''), "
              "p.expires_at > now() FROM passes p JOIN runs r ON r.id = p.run_id "
              "WHERE p.user_id = $1 ORDER BY p.id DESC LIMIT 1000");

void api_me_passes(struct coord_req *req, struct coord_resp *resp)
{
    if (!coord_req_db(req, resp))
        return;
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {uid};
    PGresult *r = coord_db_exec(req->db, &S_MY_PASSES, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        uint8_t raw[CM_ED25519_PUB_LEN];
        size_t n = 0;
        char b64[64] = "";
        const char *hex = PQgetvalue(r, i, 2);
        if (cm_hex_decode(hex, strlen(hex), raw, sizeof raw, &n) == CM_OK && n == sizeof raw)
            cm_b64url_encode(raw, sizeof raw, b64);
        long long revoked = strtoll(PQgetvalue(r, i, 5), NULL, 10);
        int live = !strcmp(PQgetvalue(r, i, 7), "t");
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s}", "pass_id", PQgetvalue(r, i, 0),
                              "run", PQgetvalue(r, i, 1), "peer_public_key", b64, "issued_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 3), NULL, 10), "expires_at",
                              (json_int_t)strtoll(PQgetvalue(r, i, 4), NULL, 10), "state",
                              revoked ? "revoked" : live ? "active" : "expired");
        if (revoked) {
            json_object_set_new(o, "revoked_at", json_integer(revoked));
            json_object_set_new(o, "revoke_reason", json_string(PQgetvalue(r, i, 6)));
        }
        json_array_append_new(a, o);
    }
    PQclear(r);
    coord_resp_json(resp, 200, json_pack("{s:s, s:o}", "username", req->user.username, "passes", a));
}

/* Sessions are named by the first 12 hex digits of their token's SHA-256:
 * enough to tell them apart, useless for logging in. */
COORD_DB_STMT(S_MY_SESSIONS, 1,
              "SELECT substr(encode(token_hash, 'hex'), 1, 12), "
              "extract(epoch from created_at)::bigint, extract(epoch from expires_at)::bigint "
              "FROM sessions WHERE user_id = $1 AND expires_at > now() "
              "ORDER BY created_at DESC LIMIT 1000");

void api_me_sessions(struct coord_req *req, struct coord_resp *resp)
{
    const char *authz = coord_req_header(req, "Authorization");
    char mine[16] = "";
    if (authz && strlen(authz) > 7) { /* authenticated: "Bearer " was checked */
        uint8_t h[CM_SHA256_LEN];
        char hex[2 * CM_SHA256_LEN + 1];
        cm_sha256(authz + 7, strlen(authz + 7), h);
        cm_hex_encode(h, sizeof h, hex);
        snprintf(mine, sizeof mine, "%.12s", hex);
    }
    if (!coord_req_db(req, resp))
        return;
    char uid[24];
    snprintf(uid, sizeof uid, "%lld", (long long)req->user.id);
    const char *p[] = {uid};
    PGresult *r = coord_db_exec(req->db, &S_MY_SESSIONS, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++)
        json_array_append_new(
            a, json_pack("{s:s, s:I, s:I, s:b}", "id", PQgetvalue(r, i, 0), "created_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10), "expires_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10), "current",
                         !strcmp(PQgetvalue(r, i, 0), mine)));
    PQclear(r);
    coord_resp_json(resp, 200,
                    json_pack("{s:s, s:o}", "username", req->user.username, "sessions", a));
}

/* ---- the run's leaderboard ----
 * What the participants of the sahajBERT run saw (seed 001, "participants"
 * chart): each volunteer's verified contribution, their devices, and whether
 * they are active now. Any logged-in user may read it: it names people by
 * username and shows only verified totals; claimed samples, flags and
 * per-device keys stay with organizers and auditors
 * (GET /api/v1/runs/{run}/contributions). Read from the views
 * contrib_user_totals (sql/005_contributions.sql) and, for the samples a
 * volunteer's expert servers answered for trainers, contrib_expert_user_totals
 * (sql/011_expert_credit.sql; docs/accounting.md, "Expert servers"). */
#define LEADER_ACTIVE "interval '10 minutes'"

COORD_DB_STMT(S_LEADERS, 1,
              "WITH t AS (SELECT * FROM contrib_user_totals WHERE run = $1), "
              "x AS (SELECT * FROM contrib_expert_user_totals WHERE run = $1) "
              "SELECT coalesce(t.username, x.username), coalesce(t.peers, 0), coalesce(t.steps, 0), "
              "coalesce(t.verified_samples, 0), coalesce(t.compute_s, 0), "
              "extract(epoch from least(t.first_at, x.first_at))::bigint, "
              "extract(epoch from greatest(t.last_at, x.last_at))::bigint, "
              "(SELECT count(DISTINCT c.peer_public_key) FROM contrib_reports c "
              " JOIN users u ON u.id = c.user_id WHERE c.run_id = r.id AND u.username = t.username "
              " AND c.received_at > now() - " LEADER_ACTIVE "), "
              "coalesce(x.expert_samples, 0) "
              "FROM runs r, t FULL JOIN x ON x.username = t.username WHERE r.name = $1 "
              "ORDER BY 4 DESC, 9 DESC, 1 LIMIT 1000");
COORD_DB_STMT(S_LEADER_RUN, 1, "SELECT 1 FROM runs WHERE name = $1");

/* Every logged-in volunteer's page polls the leaderboard, and the totals are
 * an aggregate over all of the run's reports: answers are kept for a few
 * seconds per run so that polling browsers cost one query per run per TTL. */
static struct coord_run_cache g_leaders = COORD_RUN_CACHE_INIT(5);

void api_leaderboard(struct coord_req *req, struct coord_resp *resp)
{
    if (!api_name_param(req, resp, 0, "run") || coord_run_cache_serve(&g_leaders, req->params[0], resp) ||
        !coord_req_db(req, resp))
        return;
    const char *p[] = {req->params[0]};
    PGresult *r = coord_db_exec(req->db, &S_LEADER_RUN, p, NULL);
    if (!r) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    int known = PQntuples(r) == 1;
    PQclear(r);
    if (!known) {
        coord_resp_error(resp, 404, "not_found", "no such run");
        return;
    }
    if (!(r = coord_db_exec(req->db, &S_LEADERS, p, NULL))) {
        coord_resp_error(resp, 500, "internal", "database error");
        return;
    }
    json_t *a = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        long long active = strtoll(PQgetvalue(r, i, 7), NULL, 10);
        json_array_append_new(
            a, json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:I, s:b}", "username",
                         PQgetvalue(r, i, 0), "devices",
                         (json_int_t)strtoll(PQgetvalue(r, i, 1), NULL, 10), "steps",
                         (json_int_t)strtoll(PQgetvalue(r, i, 2), NULL, 10), "verified_samples",
                         strtod(PQgetvalue(r, i, 3), NULL), "expert_samples",
                         strtod(PQgetvalue(r, i, 8), NULL), "compute_s",
                         strtod(PQgetvalue(r, i, 4), NULL), "first_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 5), NULL, 10), "last_at",
                         (json_int_t)strtoll(PQgetvalue(r, i, 6), NULL, 10), "active_devices",
                         (json_int_t)active, "active", active > 0));
    }
    PQclear(r);
    json_t *doc = json_pack("{s:s, s:i, s:I, s:o}", "run", req->params[0], "active_window_s", 600,
                            "generated_at", (json_int_t)time(NULL), "users", a);
    if (doc)
        coord_run_cache_store(&g_leaders, req->params[0], doc);
    coord_resp_json(resp, 200, doc);
}
