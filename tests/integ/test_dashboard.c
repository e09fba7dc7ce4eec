/* ct-timeout: 300 */
/* The web dashboard against a live coordinator and real PostgreSQL
 * (coordinator/api_web.c, web/, docs/dashboard.md).
 *
 * Setup seeds a run the way a real one fills up: an organizer creates it
 * (its description carries an HTML/script injection), allowlists three
 * volunteers who log in and get access passes for four devices, the devices
 * report capabilities (so a schedule gives them roles), and every device
 * sends one signed contribution report per averaging round for STEPS
 * steps, signed with its peer key over the documented bytes exactly as an
 * agent does (docs/accounting.md). One device inflates its count at a few
 * steps, which must show up as flagged. The rows are then aged so the run
 * looks an hour old (reports arrive here in a second, a real run takes an
 * hour); nothing else is touched in the database.
 *
 * Then:
 *  - static files: content types, CSP, caching headers, and path tricks
 *    (.., encoded .., dot files, symlinks, directories, unknown extensions)
 *    refused;
 *  - the small read endpoints the pages use (/me/passes, /me/sessions,
 *    /leaderboard) and their roles;
 *  - the browser suite, tests/browser/run.mjs: playwright-core driving
 *    Debian's chromium through every page with screenshots under
 *    <build>/tests/screenshots/; afterwards the organizer actions it took in
 *    the browser must be in GET /api/v1/audit.
 * Skips (exit 77) only when node or chromium is not installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"

#define PW "a-long-password"
#define RUN "fmnist-demo"
#define STEPS 40
#define NDEV 4
#define XSS "<script>window.__xss=1</script><img src=x onerror=\"window.__xss=2\">"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char g_root[PATH_MAX], g_build[PATH_MAX], g_webdir[PATH_MAX], g_tmp[PATH_MAX];
static char g_node[PATH_MAX], g_chromium[PATH_MAX];
static char *g_org, *g_aud, *g_tok[3];
static const char *const USERS[3] = {"bob", "carol", "dave"};
/* device -> owner (index into USERS); bob runs two machines */
static const int OWNER[NDEV] = {0, 0, 1, 2};
static const double SPS[NDEV] = {40, 25, 60, 0}; /* dave's device only aggregates */
static struct cm_ed25519 g_dev[NDEV];
static char g_pk[NDEV][64];
static char *g_pass[NDEV];
static char g_js[NAME_MAX + 1], g_css[NAME_MAX + 1];

/* ---- small helpers ---- */

static long req(const char *method, const char *path, const char *bearer, const char *body,
                json_t **out)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, bearer, body, &r);
    long s = r.status;
    if (out)
        *out = json_incref(r.json);
    ct_resp_free(&r);
    return s;
}

static int find_in_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    char *copy = strdup(path), *save = NULL;
    int found = 0;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/%s", d, name);
        found = access(out, X_OK) == 0;
    }
    free(copy);
    return found;
}

static int copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *data = ct_read_file(from, &n);
    if (!data)
        return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    free(data);
    return ok ? 0 : -1;
}

/* Signs and posts one contribution report like an agent (docs/accounting.md:
 * signed bytes "crowdtrain-report/1" 0x0A payload). Returns the status. */
static long post_report(int d, long step, double samples, double loss, const double *seen)
{
    uint8_t rid[CM_SHA256_LEN];
    char rs[32], round[2 * CM_SHA256_LEN + 1];
    snprintf(rs, sizeof rs, "round-%ld", step);
    cm_sha256(rs, strlen(rs), rid);
    cm_hex_encode(rid, sizeof rid, round);
    char members[1024];
    size_t o = 0;
    members[o++] = '{';
    for (int j = 0; j < NDEV; j++)
        if (j != d)
            o += (size_t)snprintf(members + o, sizeof members - o, "%s\"%s\":%g",
                                  o > 1 ? "," : "", g_pk[j], seen[j]);
    snprintf(members + o, sizeof members - o, "}");
    char payload[4096];
    char lossf[64] = "";
    if (samples > 0)
        snprintf(lossf, sizeof lossf, "\"loss\":%.6f,", loss);
    snprintf(payload, sizeof payload,
             "{\"format\":\"crowdtrain-report/1\",\"run\":\"" RUN "\",\"peer\":\"%s\","
             "\"step\":%ld,\"group\":\"g0\",\"round\":\"%s\",\"samples\":%g,\"compute_s\":%g,"
             "%s\"sps\":%g,\"round_ms\":%g,\"parts\":%d,\"parts_averaged\":%d,\"members\":%s,"
             "\"excluded\":[],\"t\":%lld}",
             g_pk[d], step, round, samples, SPS[d] > 0 ? samples / SPS[d] : 0.0, lossf, SPS[d],
             180.0 + 10 * d, NDEV, step == 7 && d == 2 ? NDEV - 1 : NDEV, members,
             (long long)time(NULL));
    size_t plen = strlen(payload);
    static const char prefix[] = "crowdtrain-report/1\n";
    char msg[sizeof prefix + sizeof payload];
    memcpy(msg, prefix, sizeof prefix - 1);
    memcpy(msg + sizeof prefix - 1, payload, plen);
    uint8_t sig[CM_ED25519_SIG_LEN];
    if (cm_ed25519_sign(&g_dev[d], msg, sizeof prefix - 1 + plen, sig) != CM_OK)
        return -1;
    char p64[6000], s64[128];
    cm_b64url_encode(payload, plen, p64);
    cm_b64url_encode(sig, sizeof sig, s64);
    char *body = malloc(16384);
    snprintf(body, 16384, "{\"pass\":\"%s\",\"payload\":\"%s\",\"sig\":\"%s\"}", g_pass[d], p64,
             s64);
    long s = req("POST", "/api/v1/runs/" RUN "/reports", NULL, body, NULL);
    free(body);
    return s;
}

/* One averaging round of all devices at `step`: each contributes by its
 * speed; dave's aggregator computes nothing; carol's device claims double
 * at every 10th step (the others saw the truth). */
static int seed_step(long step)
{
    double truth[NDEV], claim[NDEV];
    for (int d = 0; d < NDEV; d++) {
        truth[d] = SPS[d] > 0 ? 16 * (SPS[d] / 5) : 0;
        claim[d] = (d == 2 && step % 10 == 5) ? 2 * truth[d] : truth[d];
    }
    for (int d = 0; d < NDEV; d++) {
        double loss = 0.35 + 1.95 * exp(-(double)step / 12.0) + 0.02 * d;
        long s = post_report(d, step, claim[d], loss, truth);
        if (s != 201) {
            fprintf(stderr, "report of device %d at step %ld: HTTP %ld\n", d, step, s);
            return -1;
        }
    }
    return 0;
}

static int web_copy(void)
{
    /* The built app, plus traps: a symlink out of the directory, a dot file,
     * a directory with a served extension. */
    char dist[PATH_MAX + 16];
    snprintf(dist, sizeof dist, "%s/web/dist", g_build);
    DIR *dir = opendir(dist);
    if (!dir) {
        fprintf(stderr, "%s: %s (the build makes it: make web)\n", dist, strerror(errno));
        return -1;
    }
    if (ct_tempdir("web", g_webdir, sizeof g_webdir) != 0) {
        closedir(dir);
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        char a[PATH_MAX * 2], b[PATH_MAX * 2];
        snprintf(a, sizeof a, "%s/%s", dist, e->d_name);
        snprintf(b, sizeof b, "%s/%s", g_webdir, e->d_name);
        rc |= copy_file(a, b);
        if (!strncmp(e->d_name, "main-", 5)) {
            const char *ext = strrchr(e->d_name, '.');
            if (ext && !strcmp(ext, ".js"))
                snprintf(g_js, sizeof g_js, "%s", e->d_name);
            if (ext && !strcmp(ext, ".css"))
                snprintf(g_css, sizeof g_css, "%s", e->d_name);
        }
    }
    closedir(dir);
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/leak.txt", g_webdir);
    rc |= symlink("/etc/hostname", p);
    snprintf(p, sizeof p, "%s/.secret.txt", g_webdir);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("secret\n", f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/sub.css", g_webdir);
    rc |= mkdir(p, 0755);
    return rc || !g_js[0] || !g_css[0] ? -1 : 0;
}

static int setup(void **state)
{
    (void)state;
    /* <root>/<build>/tests/integ/test_dashboard: the build dir is what ct_bin
     * uses; the repository is its parent. */
    snprintf(g_build, sizeof g_build, "%s", ct_bin("x"));
    *strrchr(g_build, '/') = '\0';
    *strrchr(g_build, '/') = '\0';
    snprintf(g_root, sizeof g_root, "%s", g_build);
    *strrchr(g_root, '/') = '\0';
    const char *chr = getenv("CT_CHROMIUM");
    snprintf(g_chromium, sizeof g_chromium, "%s", chr ? chr : "/usr/bin/chromium");
    if (!find_in_path("node", g_node, sizeof g_node) || access(g_chromium, X_OK) != 0) {
        printf("skipped: the browser tests need node and chromium (%s): "
               "scripts/install-deps.sh installs them\n",
               g_node[0] && access(g_node, X_OK) == 0 ? g_chromium : "node");
        exit(CT_SKIP);
    }
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || web_copy() != 0 || ct_tempdir("dash", g_tmp, sizeof g_tmp) != 0)
        return -1;
    const char *extra[] = {"--web-dir", g_webdir, NULL};
    if (ct_create_user(g_pg.url, "olivia", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, extra) != 0 || !(g_org = ct_login(&g_c, "olivia", PW)))
        return -1;
    char body[4096];
    snprintf(body, sizeof body,
             "{\"username\":\"audrey\",\"role\":\"auditor\",\"password\":\"" PW "\"}");
    if (req("POST", "/api/v1/users", g_org, body, NULL) != 201 ||
        !(g_aud = ct_login(&g_c, "audrey", PW)))
        return -1;
    json_t *desc = json_string("Fashion-MNIST MLP, four volunteers. " XSS);
    char *desc_s = json_dumps(desc, JSON_ENCODE_ANY);
    json_decref(desc);
    snprintf(body, sizeof body,
             "{\"name\":\"" RUN "\",\"target_batch_size\":256,\"model_summary\":\"MLP 784-256-128-10\","
             "\"description\":%s,\"config\":{\"steps\":400,\"model_parameters\":235146}}",
             desc_s);
    free(desc_s);
    if (req("POST", "/api/v1/runs", g_org, body, NULL) != 201 ||
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"empty-run\",\"target_batch_size\":64,\"model_summary\":\"nothing yet\"}",
            NULL) != 201 ||
        /* a run with a mixture-of-experts layer (4 x 4 grid) and no expert server yet */
        req("POST", "/api/v1/runs", g_org,
            "{\"name\":\"moe-demo\",\"target_batch_size\":256,\"model_summary\":\"DMoE 4x4\","
            "\"config\":{\"steps\":100,\"batch_size\":64,\"data\":{\"train\":\"data/train.json\"},"
            "\"model\":{\"type\":\"dmoe\",\"inputs\":784,\"hidden\":[128],\"classes\":10,"
            "\"grid_dims\":2,\"grid_size\":4,\"k\":4,\"experts\":{\"hidden\":64}}}}",
            NULL) != 201)
        return -1;
    for (int u = 0; u < 3; u++) {
        char path[128];
        snprintf(body, sizeof body,
                 "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"" PW "\"}", USERS[u]);
        snprintf(path, sizeof path, "/api/v1/runs/" RUN "/allowlist/%s", USERS[u]);
        if (req("POST", "/api/v1/users", g_org, body, NULL) != 201 ||
            req("PUT", path, g_org, NULL, NULL) != 201 || !(g_tok[u] = ct_login(&g_c, USERS[u], PW)))
            return -1;
    }
    /* Each device: key pair, pass, capability report (schedule roles). */
    for (int d = 0; d < NDEV; d++) {
        json_t *j = NULL;
        if (cm_ed25519_generate(&g_dev[d]) != CM_OK)
            return -1;
        cm_b64url_encode(g_dev[d].pub, CM_ED25519_PUB_LEN, g_pk[d]);
        if (ct_pass_body(RUN, USERS[OWNER[d]], &g_dev[d], body, sizeof body) != 0 ||
            req("POST", "/api/v1/runs/" RUN "/passes", g_tok[OWNER[d]], body, &j) != 201) {
            json_decref(j);
            return -1;
        }
        g_pass[d] = strdup(json_string_value(json_object_get(j, "access_token")));
        json_decref(j);
        snprintf(body, sizeof body,
                 "{\"peer_public_key\":\"%s\",\"samples_per_s\":%g,\"upload_mbps\":%d,"
                 "\"download_mbps\":%d,\"accepts_inbound\":%s}",
                 g_pk[d], SPS[d], d == 3 ? 1000 : 50, d == 3 ? 1000 : 100,
                 d == 1 ? "false" : "true");
        long cs = req("POST", "/api/v1/runs/" RUN "/capabilities", g_tok[OWNER[d]], body, NULL);
        if (cs != 200 && cs != 201) {
            fprintf(stderr, "capabilities of device %d: HTTP %ld\n", d, cs);
            return -1;
        }
    }
    for (long s = 0; s < STEPS; s++)
        if (seed_step(s) != 0)
            return -1;
    /* An hour-old run: step s arrived (STEPS - s) minutes ago, give or take. */
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE contrib_reports SET received_at = now() - (%d - step) * interval '75 seconds'",
             STEPS);
    if (ct_pg_exec(&g_pg, sql) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int d = 0; d < NDEV; d++) {
        cm_ed25519_cleanup(&g_dev[d]);
        free(g_pass[d]);
    }
    for (int u = 0; u < 3; u++)
        free(g_tok[u]);
    free(g_org);
    free(g_aud);
    if (g_webdir[0])
        ct_rmrf(g_webdir);
    if (g_tmp[0])
        ct_rmrf(g_tmp);
    return rc;
}

/* ---- static files ---- */

struct hdrs {
    char ctype[128], csp[512], cache[128], nosniff[64];
    size_t body;
};

static size_t on_header(char *b, size_t size, size_t n, void *ud)
{
    struct hdrs *h = ud;
    size_t len = size * n;
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), b);
    line[strcspn(line, "\r\n")] = '\0';
    char *colon = strchr(line, ':');
    if (!colon)
        return len;
    *colon = '\0';
    const char *v = colon + 1;
    while (*v == ' ')
        v++;
    if (!strcasecmp(line, "Content-Type"))
        snprintf(h->ctype, sizeof h->ctype, "%s", v);
    else if (!strcasecmp(line, "Content-Security-Policy"))
        snprintf(h->csp, sizeof h->csp, "%s", v);
    else if (!strcasecmp(line, "Cache-Control"))
        snprintf(h->cache, sizeof h->cache, "%s", v);
    else if (!strcasecmp(line, "X-Content-Type-Options"))
        snprintf(h->nosniff, sizeof h->nosniff, "%s", v);
    return len;
}

static size_t on_body(char *b, size_t size, size_t n, void *ud)
{
    (void)b;
    ((struct hdrs *)ud)->body += size * n;
    return size * n;
}

/* GET (or `method`) a path exactly as written (no ../ normalization). */
static long fetch(const char *method, const char *path, struct hdrs *h)
{
    memset(h, 0, sizeof *h);
    char url[1024];
    snprintf(url, sizeof url, "%s%s", g_c.url, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_CAINFO, g_c.ca);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    return status;
}

static void test_static_files(void **state)
{
    (void)state;
    struct hdrs h;
    assert_int_equal(fetch("GET", "/", &h), 200);
    assert_string_equal(h.ctype, "text/html; charset=utf-8");
    assert_non_null(strstr(h.csp, "default-src 'none'"));
    assert_non_null(strstr(h.csp, "script-src 'self'"));
    assert_non_null(strstr(h.csp, "frame-ancestors 'none'"));
    assert_string_equal(h.cache, "no-cache");
    assert_string_equal(h.nosniff, "nosniff");
    char path[512], file[PATH_MAX + NAME_MAX + 2];
    snprintf(path, sizeof path, "/app/%s", g_js);
    snprintf(file, sizeof file, "%s/%s", g_webdir, g_js);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(fetch("GET", path, &h), 200);
    assert_string_equal(h.ctype, "text/javascript; charset=utf-8");
    assert_string_equal(h.cache, "public, max-age=31536000, immutable");
    assert_int_equal(h.body, (size_t)st.st_size);
    snprintf(path, sizeof path, "/app/%s", g_css);
    assert_int_equal(fetch("GET", path, &h), 200);
    assert_string_equal(h.ctype, "text/css; charset=utf-8");
    assert_int_equal(fetch("GET", "/app/index.html", &h), 200);
    assert_string_equal(h.cache, "no-cache");
    /* Nothing outside the directory, nothing hidden, nothing unknown. */
    static const char *const refused[] = {
        "/app/leak.txt",           "/app/.secret.txt",       "/app/sub.css",
        "/app/..%2f..%2fetc%2fpasswd", "/app/%2e%2e",        "/app/../../etc/passwd",
        "/app/..",                 "/app/nothere.js",        "/app/main.exe",
        "/app/%2fetc%2fpasswd",    "/app/x/../index.html",   "/app/main.js%2f",
        "/app/",                   "/app",                   "/index.html",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        long s = fetch("GET", refused[i], &h);
        if (s != 404)
            fail_msg("GET %s: expected 404, got %ld", refused[i], s);
        assert_string_equal(h.ctype, "application/json");
    }
    assert_int_equal(fetch("POST", "/", &h), 405);
    /* The API keeps its own caching rule. */
    assert_int_equal(fetch("GET", "/api/v1/health", &h), 200);
    assert_string_equal(h.cache, "no-store");
}

/* ---- the read endpoints the pages use ---- */

static void test_own_records(void **state)
{
    (void)state;
    json_t *j = NULL;
    assert_int_equal(req("GET", "/api/v1/me/passes", NULL, NULL, NULL), 401);
    assert_int_equal(req("GET", "/api/v1/me/sessions", NULL, NULL, NULL), 401);
    /* bob sees his two devices' passes and nobody else's. */
    assert_int_equal(req("GET", "/api/v1/me/passes", g_tok[0], NULL, &j), 200);
    json_t *a = json_object_get(j, "passes");
    assert_int_equal(json_array_size(a), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *k = json_string_value(json_object_get(json_array_get(a, i), "peer_public_key"));
        assert_true(!strcmp(k, g_pk[0]) || !strcmp(k, g_pk[1]));
        assert_string_equal(json_string_value(json_object_get(json_array_get(a, i), "state")),
                            "active");
        assert_string_equal(json_string_value(json_object_get(json_array_get(a, i), "run")), RUN);
    }
    json_decref(j);
    assert_int_equal(req("GET", "/api/v1/me/passes", g_aud, NULL, &j), 200);
    assert_int_equal(json_array_size(json_object_get(j, "passes")), 0);
    json_decref(j);
    /* Two sessions for carol; exactly the asking one is current. */
    char *second = ct_login(&g_c, "carol", PW);
    assert_non_null(second);
    assert_int_equal(req("GET", "/api/v1/me/sessions", second, NULL, &j), 200);
    a = json_object_get(j, "sessions");
    assert_int_equal(json_array_size(a), 2);
    int current = 0;
    for (size_t i = 0; i < 2; i++) {
        current += json_is_true(json_object_get(json_array_get(a, i), "current"));
        assert_int_equal(strlen(json_string_value(json_object_get(json_array_get(a, i), "id"))), 12);
    }
    assert_int_equal(current, 1);
    json_decref(j);
    assert_int_equal(req("DELETE", "/api/v1/session", second, NULL, NULL), 204);
    free(second);
}

static void test_leaderboard_endpoint(void **state)
{
    (void)state;
    json_t *j = NULL;
    assert_int_equal(req("GET", "/api/v1/runs/" RUN "/leaderboard", NULL, NULL, NULL), 401);
    assert_int_equal(req("GET", "/api/v1/runs/nope/leaderboard", g_tok[2], NULL, NULL), 404);
    assert_int_equal(req("GET", "/api/v1/runs/" RUN "/leaderboard", g_tok[2], NULL, &j), 200);
    json_t *u = json_object_get(j, "users");
    /* dave's aggregator contributed no samples but reported; 3 users */
    assert_int_equal(json_array_size(u), 3);
    /* bob: 2 devices, (8 + 5) * 16 samples per step, all corroborated */
    json_t *bob = NULL, *carol = NULL;
    for (size_t i = 0; i < json_array_size(u); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(u, i), "username"));
        if (!strcmp(n, "bob"))
            bob = json_array_get(u, i);
        if (!strcmp(n, "carol"))
            carol = json_array_get(u, i);
    }
    assert_non_null(bob);
    assert_non_null(carol);
    assert_int_equal(json_integer_value(json_object_get(bob, "devices")), 2);
    assert_true(fabs(json_real_value(json_object_get(bob, "verified_samples")) -
                     STEPS * (128.0 + 80.0)) < 1e-6);
    /* carol inflated her claim at every 10th step: those rounds count nothing
     * for her (docs/accounting.md, "Verification") */
    int inflated = 0;
    for (long st = 0; st < STEPS; st++)
        inflated += st % 10 == 5;
    double cv = json_real_value(json_object_get(carol, "verified_samples"));
    if (fabs(cv - (STEPS - inflated) * 192.0) > 1e-6)
        fail_msg("carol's verified samples: %.17g, expected %.17g", cv, (STEPS - inflated) * 192.0);
    /* sorted by verified samples */
    assert_string_equal(json_string_value(json_object_get(json_array_get(u, 0), "username")),
                        "bob");
    /* the leaderboard shows no claimed samples or flags */
    assert_null(json_object_get(bob, "claimed_samples"));
    json_decref(j);
}

/* ---- the pipeline page's runs ----
 * Two pipeline runs for the browser's "pipeline-page" test
 * (tests/browser/run.mjs): "pipe-wait" (2 stages x 2 replicas, no device
 * yet: the waiting state) and "pipe-demo" (2 stages x 1), whose two devices
 * of dave's report capabilities, get an assignment from GET /pipeline and
 * send PIPE_STEPS signed stage reports each as stage agents do
 * (docs/accounting.md, "Pipeline stages"); then GET /pipeline/stages
 * joins them. */
#define PIPE_STEPS 5
#define PIPE_CFG(s, d)                                                                            \
    "\"config\":{\"pipeline\":{\"stages\":" #s ",\"replicas\":" #d ","                           \
    "\"activation_bytes\":1e6,\"gradient_bytes\":1e6}}"

static long pipe_report(const struct cm_ed25519 *key, const char *pk, const char *pass,
                        const char *other, long step, double round_ms)
{
    char rs[96], round[2 * CM_SHA256_LEN + 1], payload[2048];
    uint8_t rid[CM_SHA256_LEN];
    snprintf(rs, sizeof rs, "crowdtrain-pipe-round/1\npipe-demo\n1\n%ld\n0", step);
    cm_sha256(rs, strlen(rs), rid);
    cm_hex_encode(rid, sizeof rid, round);
    /* a pipeline of 16 samples a step in 2 stages: 8 each */
    int n = snprintf(payload, sizeof payload,
                     "{\"format\":\"crowdtrain-report/1\",\"run\":\"pipe-demo\",\"peer\":\"%s\","
                     "\"step\":%ld,\"group\":\"pipeline.1.0\",\"round\":\"%s\",\"samples\":8,"
                     "\"compute_s\":%g,\"sps\":%g,\"round_ms\":%g,\"parts\":0,\"parts_averaged\":0,"
                     "\"members\":{\"%s\":8},\"excluded\":[],\"t\":%lld}",
                     pk, step, round, round_ms / 2e3, 8e3 / round_ms, round_ms, other,
                     (long long)time(NULL));
    static const char prefix[] = "crowdtrain-report/1\n";
    char msg[sizeof prefix + sizeof payload], p64[4096], s64[128], body[8192];
    memcpy(msg, prefix, sizeof prefix - 1);
    memcpy(msg + sizeof prefix - 1, payload, (size_t)n);
    uint8_t sig[CM_ED25519_SIG_LEN];
    if (cm_ed25519_sign(key, msg, sizeof prefix - 1 + (size_t)n, sig) != CM_OK)
        return -1;
    cm_b64url_encode(payload, (size_t)n, p64);
    cm_b64url_encode(sig, sizeof sig, s64);
    snprintf(body, sizeof body, "{\"pass\":\"%s\",\"payload\":\"%s\",\"sig\":\"%s\"}", pass, p64, s64);
    return req("POST", "/api/v1/runs/pipe-demo/reports", NULL, body, NULL);
}

static void test_pipeline_runs(void **state)
{
    (void)state;
    json_t *j = NULL;
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"pipe-wait\",\"target_batch_size\":16,\"model_summary\":\"GPT in 2 "
                         "stages x 2\"," PIPE_CFG(2, 2) "}",
                         NULL),
                     201);
    assert_int_equal(req("POST", "/api/v1/runs", g_org,
                         "{\"name\":\"pipe-demo\",\"target_batch_size\":16,\"model_summary\":\"GPT in 2 "
                         "stages\"," PIPE_CFG(2, 1) "}",
                         NULL),
                     201);
    assert_int_equal(req("PUT", "/api/v1/runs/pipe-demo/allowlist/dave", g_org, NULL, NULL), 201);
    struct cm_ed25519 key[2];
    char pk[2][64], body[4096], *pass[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        assert_int_equal(cm_ed25519_generate(&key[d]), CM_OK);
        cm_b64url_encode(key[d].pub, CM_ED25519_PUB_LEN, pk[d]);
        assert_int_equal(ct_pass_body("pipe-demo", "dave", &key[d], body, sizeof body), 0);
        assert_int_equal(req("POST", "/api/v1/runs/pipe-demo/passes", g_tok[2], body, &j), 201);
        pass[d] = strdup(json_string_value(json_object_get(j, "access_token")));
        json_decref(j);
        snprintf(body, sizeof body,
                 "{\"peer_public_key\":\"%s\",\"samples_per_s\":%d,\"upload_mbps\":100,"
                 "\"download_mbps\":100,\"accepts_inbound\":true}",
                 pk[d], 50 - 20 * d);
        assert_int_equal(req("POST", "/api/v1/runs/pipe-demo/capabilities", g_tok[2], body, NULL), 200);
    }
    assert_int_equal(req("GET", "/api/v1/runs/pipe-demo/pipeline", NULL, NULL, &j), 200);
    json_t *asg = json_object_get(json_object_get(j, "pipeline"), "assignment");
    int first = !strcmp(json_string_value(json_array_get(json_array_get(asg, 0), 0)), pk[0]) ? 0 : 1;
    json_decref(j);
    /* stage 0 takes 200 ms a step, stage 1 300 ms: the pipeline's step is the slower one's */
    for (long st = 0; st < PIPE_STEPS; st++)
        for (int d = 0; d < 2; d++)
            assert_int_equal(pipe_report(&key[d], pk[d], pass[d], pk[1 - d], st, d == first ? 200 : 300),
                             201);
    /* dave is on pipe-demo's allowlist, bob on neither's; the waiting run has nothing yet */
    assert_int_equal(req("GET", "/api/v1/runs/pipe-demo/pipeline/stages", NULL, NULL, NULL), 401);
    assert_int_equal(req("GET", "/api/v1/runs/pipe-demo/pipeline/stages", g_tok[0], NULL, NULL), 403);
    assert_int_equal(req("GET", "/api/v1/runs/pipe-nope/pipeline/stages", g_org, NULL, NULL), 404);
    assert_int_equal(req("GET", "/api/v1/runs/" RUN "/pipeline/stages", g_org, NULL, NULL), 422);
    assert_int_equal(req("GET", "/api/v1/runs/pipe-wait/pipeline/stages", g_org, NULL, &j), 200);
    assert_true(json_is_null(json_object_get(j, "version")));
    assert_int_equal(json_integer_value(json_object_get(j, "live_devices")), 0);
    json_decref(j);
    assert_int_equal(req("GET", "/api/v1/runs/pipe-demo/pipeline/stages", g_tok[2], NULL, &j), 200);
    json_t *slots = json_object_get(j, "slots");
    assert_int_equal(json_array_size(slots), 2);
    for (int k = 0; k < 2; k++) {
        json_t *s = json_array_get(slots, (size_t)k);
        assert_string_equal(json_string_value(json_object_get(s, "username")), "dave");
        assert_int_equal(json_integer_value(json_object_get(s, "step")), PIPE_STEPS - 1);
        assert_true(fabs(json_number_value(json_object_get(s, "round_ms")) - (k ? 300 : 200)) < 1e-9);
        assert_true(fabs(json_number_value(json_object_get(s, "verified_samples")) - 8 * PIPE_STEPS) < 1e-9);
    }
    assert_true(fabs(json_number_value(json_object_get(json_object_get(j, "measured"), "step_s")) - 0.3) <
                1e-9);
    json_decref(j);
    for (int d = 0; d < 2; d++) {
        cm_ed25519_cleanup(&key[d]);
        free(pass[d]);
    }
}

/* ---- the browser suite ---- */

static int write_seed(const char *path)
{
    json_t *peers = json_array();
    for (int d = 0; d < NDEV; d++) {
        char kp[PATH_MAX + 32];
        snprintf(kp, sizeof kp, "%s/device-%d.pem", g_tmp, d);
        if (cm_ed25519_save(&g_dev[d], kp) != CM_OK)
            return -1;
        json_array_append_new(peers, json_pack("{s:s, s:s, s:s, s:s, s:f}", "username",
                                               USERS[OWNER[d]], "peer_public_key", g_pk[d],
                                               "pass", g_pass[d], "key_file", kp, "sps", SPS[d]));
    }
    char shots[PATH_MAX + 32];
    snprintf(shots, sizeof shots, "%s/tests/screenshots", g_build);
    json_t *seed = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:s,"
        " s:{s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s, s:s}}, s:o, s:s}",
        "url", g_c.url, "ca", g_c.ca, "run", RUN, "empty_run", "empty-run", "moe_run", "moe-demo", "chromium",
        g_chromium, "screenshots", shots, "steps", STEPS, "total_steps", 400, "xss", XSS,
        "revoke_reason", "lost laptop " XSS, "users", "organizer", "username", "olivia",
        "password", PW, "auditor", "username", "audrey", "password", PW, "volunteer", "username",
        "bob", "password", PW, "volunteer2", "username", "carol", "password", PW, "peers", peers,
        "newcomer", "erin");
    int rc = json_dump_file(seed, path, JSON_INDENT(1));
    json_decref(seed);
    return rc;
}

static int audit_has(json_t *entries, const char *action, const char *target)
{
    for (size_t i = 0; i < json_array_size(entries); i++) {
        json_t *e = json_array_get(entries, i);
        if (strcmp(json_string_value(json_object_get(e, "action")), action) != 0 ||
            strcmp(json_string_value(json_object_get(e, "target")), target) != 0 ||
            strcmp(json_string_value(json_object_get(e, "actor")), "olivia") != 0)
            continue;
        return 1;
    }
    return 0;
}

static void test_browser(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
    /* The pages' JavaScript is the same in both builds, and the endpoints
       they read are driven under the sanitizers by the tests above; the
       browser's ~25 s are spent once, in the normal build (make test's
       time budget). */
    printf("browser pages: checked in the normal build only\n");
    skip();
#endif
    char seed[PATH_MAX + 32], script[PATH_MAX + 64];
    snprintf(seed, sizeof seed, "%s/seed.json", g_tmp);
    snprintf(script, sizeof script, "%s/tests/browser/run.mjs", g_root);
    assert_int_equal(write_seed(seed), 0);
    const char *argv[] = {g_node, script, seed, NULL};
    char *out = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ct_run(argv, NULL, &out, 240);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s", out ? out : "(no output)\n");
    printf("browser suite: exit %d in %.1f s\n", rc,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    free(out);
    assert_int_equal(rc, 0);

    /* What the organizer did in the browser is in the audit log. */
    json_t *j = NULL;
    assert_int_equal(req("GET", "/api/v1/audit?limit=1000", g_aud, NULL, &j), 200);
    json_t *e = json_object_get(j, "entries");
    assert_true(audit_has(e, "allowlist.add", RUN "/erin"));
    assert_true(audit_has(e, "allowlist.remove", RUN "/erin"));
    int revoked = 0;
    for (size_t i = 0; i < json_array_size(e); i++) {
        json_t *x = json_array_get(e, i);
        if (!strcmp(json_string_value(json_object_get(x, "action")), "pass.revoke") &&
            !strcmp(json_string_value(json_object_get(x, "actor")), "olivia") &&
            !strcmp(json_string_value(json_object_get(json_object_get(x, "details"), "reason")),
                    "lost laptop " XSS))
            revoked++;
    }
    assert_int_equal(revoked, 1);
    json_decref(j);
    /* The pass it revoked is carol's, and the API says so. */
    assert_int_equal(req("GET", "/api/v1/me/passes", g_tok[1], NULL, &j), 200);
    json_t *p = json_array_get(json_object_get(j, "passes"), 0);
    assert_string_equal(json_string_value(json_object_get(p, "state")), "revoked");
    json_decref(j);
    /* The run the organizer paused in the browser. */
    assert_int_equal(req("GET", "/api/v1/runs/empty-run", NULL, NULL, &j), 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "paused");
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_files),
        cmocka_unit_test(test_own_records),
        cmocka_unit_test(test_leaderboard_endpoint),
        cmocka_unit_test(test_pipeline_runs),
        cmocka_unit_test(test_browser),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
