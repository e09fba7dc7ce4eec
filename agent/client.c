/* libcurl client for the coordinator and the agent's state files (see
 * client.h). */
#include "agent/client.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_passreq.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define REPLY_MAX (4u << 20)

struct rbuf {
    char *p;
    size_t len;
    int overflow;
};

static size_t on_data(char *d, size_t sz, size_t n, void *ud)
{
    struct rbuf *b = ud;
    size_t len = sz * n;
    if (b->len + len > REPLY_MAX) {
        b->overflow = 1;
        return 0;
    }
    char *np = realloc(b->p, b->len + len + 1);
    if (!np)
        return 0;
    b->p = np;
    memcpy(b->p + b->len, d, len);
    b->len += len;
    b->p[b->len] = '\0';
    return len;
}

/* curl's progress callback: nonzero aborts the transfer (Ctrl-C). */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    const volatile sig_atomic_t *cancel = arg;
    return *cancel != 0;
}

static void cancel_opts(CURL *h, const struct agent_client *c)
{
    if (!c->cancel)
        return;
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)c->cancel);
}

int agent_request(const struct agent_client *c, const char *method, const char *path, json_t *body,
                  struct agent_reply *out)
{
    out->status = 0;
    out->json = NULL;
    CURL *h = curl_easy_init();
    if (!h)
        return CM_ENOMEM;
    char url[2048], auth[256];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    struct curl_slist *hl = curl_slist_append(NULL, "Accept: application/json");
    char *payload = NULL;
    if (body) {
        payload = json_dumps(body, JSON_COMPACT);
        hl = curl_slist_append(hl, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload ? payload : "{}");
    }
    if (c->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hl = curl_slist_append(hl, auth);
    }
    struct rbuf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    long total_ms = c->timeout_ms > 0 ? c->timeout_ms : 30000L;
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, total_ms < 10000L ? total_ms : 10000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, total_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https,http");
    if (c->ca_cert)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_cert);
    cancel_opts(h, c);
    CURLcode rc = curl_easy_perform(h);
    int ret = CM_OK;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
        ret = CM_ECANCELED;
    } else if (rc != CURLE_OK) {
        fprintf(stderr, "error: %s %s: %s%s\n", method, url,
                b.overflow ? "answer too large" : curl_easy_strerror(rc),
                rc == CURLE_PEER_FAILED_VERIFICATION
                    ? " (a self-signed coordinator needs --ca-cert <its tls-cert.pem>)"
                    : "");
        ret = rc == CURLE_OPERATION_TIMEDOUT ? CM_ETIMEOUT : CM_ECONN;
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
        if (b.p)
            out->json = json_loadb(b.p, b.len, 0, NULL);
    }
    free(b.p);
    free(payload);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return ret;
}

static int post_signed_pass(const struct agent_client *c, const char *path, const char *run,
                            const char *username, const struct cm_ed25519 *key, int64_t ts,
                            struct agent_reply *out)
{
    struct cm_passreq pr;
    int rc = cm_passreq_sign(key, run, username, ts, &pr);
    if (rc != CM_OK) {
        fprintf(stderr, "error: could not sign the pass request: %s\n", cm_strerror(rc));
        return rc;
    }
    json_t *body = cm_passreq_to_json(&pr);
    if (!body)
        return CM_ENOMEM;
    rc = agent_request(c, "POST", path, body, out);
    json_decref(body);
    return rc;
}

int agent_request_pass(const struct agent_client *c, const char *run, const char *username,
                       const struct cm_ed25519 *key, int64_t now_s, struct agent_reply *out)
{
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", run);
    int rc = post_signed_pass(c, path, run, username, key, now_s, out);
    const char *code = rc == CM_OK && out->status == 400
                           ? json_string_value(json_object_get(json_object_get(out->json, "error"), "code"))
                           : NULL;
    if (!code || strcmp(code, "stale_request") != 0)
        return rc;
    struct agent_reply t = {0};
    int trc = agent_request(c, "GET", "/api/v1/time", NULL, &t);
    json_t *ms = trc == CM_OK && t.status == 200 ? json_object_get(t.json, "time_ms") : NULL;
    if (json_is_integer(ms)) {
        fprintf(stderr, "warning: this machine's clock is %lld s off the coordinator's; signing the pass "
                        "request with the coordinator's time\n",
                (long long)(now_s - json_integer_value(ms) / 1000));
        agent_reply_free(out);
        rc = post_signed_pass(c, path, run, username, key, (int64_t)(json_integer_value(ms) / 1000), out);
    }
    agent_reply_free(&t);
    return rc; /* without the coordinator's time: the stale_request answer */
}

void agent_reply_free(struct agent_reply *r)
{
    json_decref(r->json);
    r->json = NULL;
}

void agent_reply_report(const char *what, const struct agent_reply *r)
{
    json_t *e = json_object_get(r->json, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    fprintf(stderr, "error: %s: %s (HTTP %ld)\n", what, msg ? msg : "unexpected answer", r->status);
}

int agent_state_dir(const char *flag, char *out, size_t cap)
{
    const char *env = getenv("CROWDTRAIN_CONFIG_DIR"), *xdg = getenv("XDG_CONFIG_HOME"),
               *home = getenv("HOME");
    if (flag)
        snprintf(out, cap, "%s", flag);
    else if (env && *env)
        snprintf(out, cap, "%s", env);
    else if (xdg && *xdg)
        snprintf(out, cap, "%s/crowdtrain", xdg);
    else if (home && *home)
        snprintf(out, cap, "%s/.config/crowdtrain", home);
    else {
        fprintf(stderr, "error: no state directory: set --config-dir or HOME\n");
        return CM_EINVAL;
    }
    /* Create parents as needed (e.g. ~/.config on a fresh account). */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", out);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0700);
            *p = '/';
        }
    }
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: creating %s: %s\n", out, strerror(errno));
        return CM_EIO;
    }
    return CM_OK;
}

int agent_state_write(const char *dir, const char *name, json_t *j)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "error: writing %s: %s\n", tmp, strerror(errno));
        return CM_EIO;
    }
    int ok = json_dumpfd(j, fd, JSON_INDENT(2)) == 0 && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    if (close(fd) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        fprintf(stderr, "error: writing %s failed\n", path);
        return CM_EIO;
    }
    return CM_OK;
}

json_t *agent_state_read(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, F_OK) != 0)
        return NULL;
    json_error_t e;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!json_is_object(j)) {
        fprintf(stderr, "error: %s is not a valid state file (%s); delete it and log in again\n",
                path, e.text);
        json_decref(j);
        return NULL;
    }
    return j;
}

int agent_file_sha256(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return CM_EIO;
    struct cm_sha256_ctx s;
    int rc = cm_sha256_init(&s);
    char buf[65536];
    size_t n;
    while (rc == CM_OK && (n = fread(buf, 1, sizeof buf, f)) > 0)
        rc = cm_sha256_update(&s, buf, n);
    if (ferror(f))
        rc = CM_EIO;
    fclose(f);
    uint8_t h[CM_SHA256_LEN];
    if (rc == CM_OK)
        rc = cm_sha256_final(&s, h);
    else
        cm_sha256_cleanup(&s);
    if (rc == CM_OK)
        cm_hex_encode(h, sizeof h, hex);
    return rc;
}

struct dl {
    FILE *f;
    char sha[65];
};

static size_t dl_write(char *d, size_t sz, size_t n, void *ud)
{
    struct dl *x = ud;
    return fwrite(d, sz, n, x->f) * sz;
}

static size_t dl_header(char *d, size_t sz, size_t n, void *ud)
{
    struct dl *x = ud;
    size_t len = sz * n;
    static const char H[] = "x-checkpoint-sha256:";
    if (len > sizeof H && strncasecmp(d, H, sizeof H - 1) == 0) {
        const char *v = d + sizeof H - 1;
        while (*v == ' ')
            v++;
        size_t vl = strcspn(v, "\r\n");
        if (vl == 64)
            snprintf(x->sha, sizeof x->sha, "%.64s", v);
    }
    return len;
}

static void common_opts(CURL *h, const struct agent_client *c, const char *url, struct curl_slist *hl)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    /* large transfers: no total timeout, but abort when slower than 1 KiB/s for 60 s */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https,http");
    if (c->ca_cert)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_cert);
    cancel_opts(h, c);
}

int agent_download_file(const struct agent_client *c, const char *path, const char *dest,
                        long *status, char sha_hex[65])
{
    *status = 0;
    char url[2048], auth[256], part[4200];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    snprintf(part, sizeof part, "%s.part", dest);
    struct dl x = {fopen(part, "wb"), ""};
    if (!x.f)
        return CM_EIO;
    CURL *h = curl_easy_init();
    struct curl_slist *hl = NULL;
    if (c->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hl = curl_slist_append(hl, auth);
    }
    common_opts(h, c, url, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, dl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    int ok = fflush(x.f) == 0 && fsync(fileno(x.f)) == 0;
    ok = fclose(x.f) == 0 && ok;
    if (cc != CURLE_OK) {
        if (cc != CURLE_ABORTED_BY_CALLBACK)
            fprintf(stderr, "error: GET %s: %s\n", url, curl_easy_strerror(cc));
        unlink(part);
        return cc == CURLE_ABORTED_BY_CALLBACK ? CM_ECANCELED : CM_ECONN;
    }
    if (*status != 200) {
        unlink(part);
        return CM_OK;
    }
    char got[65];
    if (!ok || !x.sha[0] || agent_file_sha256(part, got) != CM_OK || strcmp(got, x.sha) != 0) {
        fprintf(stderr, "error: %s: the download does not match its announced SHA-256\n", url);
        unlink(part);
        return CM_ECHECKSUM;
    }
    if (rename(part, dest) != 0) {
        unlink(part);
        return CM_EIO;
    }
    snprintf(sha_hex, 65, "%s", got);
    return CM_OK;
}

int agent_upload_file(const struct agent_client *c, const char *path, const char *src,
                      const char *sha_hex, struct agent_reply *out)
{
    out->status = 0;
    out->json = NULL;
    FILE *f = fopen(src, "rb");
    if (!f)
        return CM_EIO;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return CM_EIO;
    }
    char url[2048], auth[256], shah[128];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    snprintf(shah, sizeof shah, "X-Checkpoint-SHA256: %s", sha_hex);
    struct curl_slist *hl = curl_slist_append(NULL, shah);
    hl = curl_slist_append(hl, "Content-Type: application/octet-stream");
    if (c->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hl = curl_slist_append(hl, auth);
    }
    CURL *h = curl_easy_init();
    struct rbuf b = {0};
    common_opts(h, c, url, hl);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READDATA, f);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)st.st_size);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    fclose(f);
    if (b.p)
        out->json = json_loadb(b.p, b.len, 0, NULL);
    free(b.p);
    if (cc != CURLE_OK) {
        if (cc != CURLE_ABORTED_BY_CALLBACK)
            fprintf(stderr, "error: PUT %s: %s\n", url, curl_easy_strerror(cc));
        return cc == CURLE_ABORTED_BY_CALLBACK ? CM_ECANCELED : CM_ECONN;
    }
    return CM_OK;
}

int agent_run_config(const struct agent_client *c, const char *run, json_t **config, double *target)
{
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s", run);
    struct agent_reply r;
    int rc = agent_request(c, "GET", path, NULL, &r);
    if (rc != CM_OK)
        return rc;
    if (r.status != 200) {
        agent_reply_report("reading the run", &r);
        agent_reply_free(&r);
        return CM_ENOTFOUND;
    }
    if (target)
        *target = (double)json_integer_value(json_object_get(r.json, "target_batch_size"));
    json_t *cfg = json_object_get(r.json, "config");
    *config = cfg ? json_deep_copy(cfg) : json_null();
    agent_reply_free(&r);
    return *config ? CM_OK : CM_ENOMEM;
}
