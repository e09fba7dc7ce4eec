/* Identity-provider login (see idp.h). */
#include "coordinator/idp.h"
#include "coordinator/auth.h"
#include "cm_err.h"
#include "cm_log.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USERINFO_MAX 65536

struct body {
    char buf[USERINFO_MAX + 1];
    size_t len;
    int overflow;
};

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
    struct body *b = ud;
    size_t len = sz * n;
    if (b->len + len > USERINFO_MAX) {
        b->overflow = 1;
        return 0; /* aborts the transfer */
    }
    memcpy(b->buf + b->len, p, len);
    b->len += len;
    return len;
}

int coord_idp_userinfo(const struct coord_config *cfg, const char *token,
                       struct coord_idp_identity *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c)
        return CM_ENOMEM;
    struct body *b = calloc(1, sizeof *b);
    char *hdr = NULL;
    struct curl_slist *h = NULL;
    int rc = CM_ENOMEM;
    if (!b || asprintf(&hdr, "Authorization: Bearer %s", token) < 0) {
        hdr = NULL;
        goto out;
    }
    h = curl_slist_append(NULL, hdr);
    h = curl_slist_append(h, "Accept: application/json");
    curl_easy_setopt(c, CURLOPT_URL, cfg->idp_userinfo_url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    if (cfg->idp_ca_cert)
        curl_easy_setopt(c, CURLOPT_CAINFO, cfg->idp_ca_cert);
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
        CM_LOGW("idp", "asking %s: %s", cfg->idp_userinfo_url,
                b->overflow ? "answer larger than 64 KiB" : curl_easy_strerror(cc));
        rc = cc == CURLE_OPERATION_TIMEDOUT ? CM_ETIMEOUT : b->overflow ? CM_ETOOBIG : CM_ECONN;
        goto out;
    }
    if (status == 401 || status == 403) {
        rc = CM_EAUTH;
        goto out;
    }
    if (status != 200) {
        CM_LOGW("idp", "%s answered HTTP %ld", cfg->idp_userinfo_url, status);
        rc = CM_EPROTO;
        goto out;
    }
    json_error_t e;
    json_t *j = json_loadb(b->buf, b->len, JSON_REJECT_DUPLICATES, &e);
    rc = CM_EPARSE;
    if (!json_is_object(j)) {
        json_decref(j);
        goto out;
    }
    json_t *sub = json_object_get(j, "sub");
    const char *uname = NULL;
    static const char *keys[] = {"preferred_username", "username", "login", "nickname"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0] && !uname; i++)
        uname = json_string_value(json_object_get(j, keys[i]));
    if (json_is_string(sub) && json_string_length(sub) > 0 &&
        json_string_length(sub) < sizeof out->subject && uname && cm_name_valid(uname)) {
        snprintf(out->subject, sizeof out->subject, "%s", json_string_value(sub));
        snprintf(out->username, sizeof out->username, "%s", uname);
        rc = CM_OK;
    } else if (json_is_integer(sub) && uname && cm_name_valid(uname)) {
        snprintf(out->subject, sizeof out->subject, "%lld", (long long)json_integer_value(sub));
        snprintf(out->username, sizeof out->username, "%s", uname);
        rc = CM_OK;
    } else {
        CM_LOGW("idp", "userinfo answer lacks a 'sub' or a usable username");
    }
    json_decref(j);
out:
    curl_slist_free_all(h);
    free(hdr);
    free(b);
    curl_easy_cleanup(c);
    return rc;
}

COORD_DB_STMT(S_IDENT, 2,
              "SELECT u.id, u.username, u.role, u.disabled FROM external_identities e "
              "JOIN users u ON u.id = e.user_id WHERE e.provider = $1 AND e.subject = $2");
COORD_DB_STMT(S_PROVISION, 3,
              "WITH u AS (INSERT INTO users (username, role) VALUES ($3, 'volunteer') "
              "           ON CONFLICT DO NOTHING RETURNING id) "
              "INSERT INTO external_identities (provider, subject, user_id) "
              "SELECT $1, $2, id FROM u RETURNING user_id");

int coord_idp_map(struct coord_req *req, const char *provider, const struct coord_idp_identity *id,
                  int64_t *uid, char username[CM_NAME_MAX + 1], char role[16])
{
    const char *p[] = {provider, id->subject, id->username};
    PGresult *r = coord_db_exec(req->db, &S_IDENT, p, NULL);
    if (!r)
        return CM_EDB;
    if (PQntuples(r) == 1) {
        int disabled = strcmp(PQgetvalue(r, 0, 3), "t") == 0;
        *uid = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        snprintf(username, CM_NAME_MAX + 1, "%s", PQgetvalue(r, 0, 1));
        snprintf(role, 16, "%s", PQgetvalue(r, 0, 2));
        PQclear(r);
        return disabled ? CM_EPERM : CM_OK;
    }
    PQclear(r);
    char state[6];
    r = coord_db_exec(req->db, &S_PROVISION, p, state);
    if (!r)
        return state[0] == '2' && state[1] == '3' ? CM_EEXISTS : CM_EDB;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return CM_EEXISTS;
    }
    *uid = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    snprintf(username, CM_NAME_MAX + 1, "%s", id->username);
    snprintf(role, 16, "volunteer");
    req->user.id = *uid;
    snprintf(req->user.username, sizeof req->user.username, "%s", id->username);
    req->authenticated = 1;
    json_t *d = json_pack("{s:s, s:s}", "provider", provider, "subject", id->subject);
    coord_audit(req, "user.provision", id->username, d);
    json_decref(d);
    CM_LOGI("idp", "created volunteer account '%s' for %s subject %s", id->username, provider,
            id->subject);
    return CM_OK;
}
