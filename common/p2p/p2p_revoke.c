/* Revocation list parser and refresher (see p2p_revoke.h). */
#include "p2p/p2p_revoke.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_log.h"

void p2p_revocations_cleanup(struct p2p_revocations *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->pass_ids[i]);
    free(r->pass_ids);
    r->pass_ids = NULL;
    r->n = 0;
}

int p2p_revocations_parse(const char *json, size_t len, const char *run,
                          struct p2p_revocations *out)
{
    memset(out, 0, sizeof *out);
    if (len > P2P_REVOKE_MAX_BODY)
        return CM_ETOOBIG;
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return CM_EPARSE;
    int rc = CM_EPARSE;
    json_t *jrun = json_object_get(root, "run"), *jgen = json_object_get(root, "generated_at"),
           *jrev = json_object_get(root, "revoked");
    if (!json_is_object(root) || !json_is_string(jrun) || !json_is_integer(jgen) ||
        !json_is_array(jrev))
        goto out;
    if (!run || strcmp(json_string_value(jrun), run)) {
        rc = CM_EAUTH;
        goto out;
    }
    size_t n = json_array_size(jrev);
    if (n > P2P_REVOKE_MAX_ENTRIES) {
        rc = CM_ETOOBIG;
        goto out;
    }
    if (n && !(out->pass_ids = calloc(n, sizeof *out->pass_ids))) {
        rc = CM_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(jrev, i);
        json_t *id = json_object_get(e, "pass_id");
        if (!json_is_object(e) || !json_is_string(id) ||
            !json_is_integer(json_object_get(e, "revoked_at")) ||
            !json_is_integer(json_object_get(e, "expires_at")))
            goto fail;
        size_t l = json_string_length(id);
        if (l == 0 || l > CM_PASS_ID_MAX)
            goto fail;
        if (!(out->pass_ids[out->n] = strdup(json_string_value(id)))) {
            rc = CM_ENOMEM;
            goto fail;
        }
        out->n++;
    }
    out->generated_at = json_integer_value(jgen);
    rc = CM_OK;
    goto out;
fail:
    p2p_revocations_cleanup(out);
out:
    json_decref(root);
    return rc;
}

struct body {
    char *p;
    size_t n;
    int too_big;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
    size_t n = size * nmemb;
    if (b->n + n > P2P_REVOKE_MAX_BODY) {
        b->too_big = 1;
        return 0; /* aborts the transfer */
    }
    char *x = realloc(b->p, b->n + n + 1);
    if (!x)
        return 0;
    memcpy(x + b->n, ptr, n);
    b->p = x;
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

int p2p_revoke_fetch(struct p2p_auth *auth, const struct p2p_revoke_config *cfg)
{
    if (!cfg->coordinator_url || !cfg->run || !cm_name_valid(cfg->run))
        return CM_EINVAL;
    char url[1024];
    size_t ul = strlen(cfg->coordinator_url);
    while (ul && cfg->coordinator_url[ul - 1] == '/')
        ul--;
    if (snprintf(url, sizeof url, "%.*s/api/v1/runs/%s/revocations", (int)ul, cfg->coordinator_url,
                 cfg->run) >= (int)sizeof url)
        return CM_EINVAL;
    CURL *c = curl_easy_init();
    if (!c)
        return CM_ENOMEM;
    struct body b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https,http");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(cfg->timeout_ms ? cfg->timeout_ms : 10000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (cfg->ca_file)
        curl_easy_setopt(c, CURLOPT_CAINFO, cfg->ca_file);
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    int rc;
    if (b.too_big) {
        rc = CM_ETOOBIG;
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        rc = CM_ETIMEOUT;
    } else if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE) {
        rc = CM_EAUTH;
    } else if (cc != CURLE_OK) {
        rc = CM_ECONN;
    } else if (status != 200) {
        rc = CM_EPROTO;
    } else {
        struct p2p_revocations r;
        rc = p2p_revocations_parse(b.p ? b.p : "", b.n, cfg->run, &r);
        if (rc == CM_OK) {
            rc = p2p_auth_set_revoked(auth, (const char *const *)r.pass_ids, r.n, r.generated_at);
            p2p_revocations_cleanup(&r);
        }
    }
    if (rc)
        CM_LOGW("p2p", "revocation list from %s: %s%s%s", url, cm_strerror(rc),
                cc != CURLE_OK ? " — " : "", cc != CURLE_OK ? curl_easy_strerror(cc) : "");
    free(b.p);
    return rc;
}

struct p2p_revoke_refresher {
    struct p2p_auth *auth;
    struct p2p_revoke_config cfg;
    char *url, *run, *ca;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

static void *refresher_main(void *arg)
{
    struct p2p_revoke_refresher *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += r->cfg.interval_s ? r->cfg.interval_s : 60;
        while (!r->stop && pthread_cond_timedwait(&r->cv, &r->mu, &ts) != ETIMEDOUT)
            ;
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->mu);
        p2p_revoke_fetch(r->auth, &r->cfg);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int p2p_revoke_refresher_start(struct p2p_auth *auth, const struct p2p_revoke_config *cfg,
                               struct p2p_revoke_refresher **out)
{
    if (!cfg->coordinator_url || !cfg->run)
        return CM_EINVAL;
    struct p2p_revoke_refresher *r = calloc(1, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    r->auth = auth;
    r->cfg = *cfg;
    r->url = strdup(cfg->coordinator_url);
    r->run = strdup(cfg->run);
    r->ca = cfg->ca_file ? strdup(cfg->ca_file) : NULL;
    if (!r->url || !r->run || (cfg->ca_file && !r->ca)) {
        free(r->url);
        free(r->run);
        free(r->ca);
        free(r);
        return CM_ENOMEM;
    }
    r->cfg.coordinator_url = r->url;
    r->cfg.run = r->run;
    r->cfg.ca_file = r->ca;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc = p2p_revoke_fetch(auth, &r->cfg);
    if (pthread_create(&r->th, NULL, refresher_main, r)) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r->url);
        free(r->run);
        free(r->ca);
        free(r);
        return CM_EIO;
    }
    *out = r;
    return rc;
}

void p2p_revoke_refresher_stop(struct p2p_revoke_refresher *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->url);
    free(r->run);
    free(r->ca);
    free(r);
}
