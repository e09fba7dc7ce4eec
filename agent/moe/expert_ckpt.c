/* Expert checkpoints on an expert server: save and upload, list, fetch
 * and load (expert_ckpt.h). The file layout is common/moe/moe_ckpt.h; the
 * coordinator's side coordinator/api_expert_ckpt.c. */
#include "agent/moe/expert_ckpt.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "moe/moe_ckpt.h"

static void params_hash(const float *p, size_t n, char hex[65])
{
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(p, n * sizeof(float), h); /* little-endian hosts only, as the file (ckpt.c) */
    cm_hex_encode(h, sizeof h, hex);
}

int moe_xckpt_upload(const struct agent_client *coord, const char *run, const char *dir,
                     struct moe_server *srv, const char *uid, int C, int F, struct moe_xckpt_info *info,
                     char *err, size_t cap)
{
    size_t n = 0;
    int rc = moe_server_expert_size(srv, uid, &n, NULL);
    if (rc != CM_OK || n != moe_ckpt_nparams(C, F)) {
        snprintf(err, cap, "expert %s is not hosted here with width %d, hidden %d", uid, C, F);
        return rc ? rc : CM_EINVAL;
    }
    float *buf = malloc(3 * n * sizeof(float));
    if (!buf)
        return CM_ENOMEM;
    long step = 0;
    char config[MOE_CKPT_CONFIG_MAX + 1], file[4400], path[512];
    if ((rc = moe_server_save(srv, uid, buf, buf + n, buf + 2 * n, n, &step)) != CM_OK ||
        (rc = moe_ckpt_config(uid, C, F, config, sizeof config)) != CM_OK) {
        snprintf(err, cap, "saving expert %s: %s", uid, cm_strerror(rc));
        free(buf);
        return rc;
    }
    struct cm_ckpt_buf opt[2] = {{MOE_CKPT_OPT_M, buf + n, n}, {MOE_CKPT_OPT_V, buf + 2 * n, n}};
    struct cm_ckpt c = {.step = (uint64_t)step, .params = buf, .n_params = n, .opt = opt, .n_opt = 2,
                        .config = config, .config_len = (uint32_t)strlen(config)};
    uint8_t sha[32];
    snprintf(file, sizeof file, "%s/expert-upload.ckpt", dir);
    rc = cm_ckpt_write(file, &c, sha);
    info->step = step;
    cm_hex_encode(sha, sizeof sha, info->sha256);
    params_hash(buf, n, info->params_sha256);
    free(buf);
    if (rc != CM_OK) {
        snprintf(err, cap, "writing %s: %s", file, cm_strerror(rc));
        return rc;
    }
    snprintf(path, sizeof path, "/api/v1/runs/%s/experts/%s/checkpoint", run, uid);
    struct agent_reply r = {0};
    rc = agent_upload_file(coord, path, file, info->sha256, &r);
    if (rc == CM_OK && r.status != 201 && r.status != 200) {
        json_t *e = json_object_get(r.json, "error");
        snprintf(err, cap, "HTTP %ld: %s", r.status,
                 json_string_value(json_object_get(e, "message")) ? json_string_value(json_object_get(e, "message"))
                                                                  : "no message");
        rc = CM_EPROTO;
    } else if (rc != CM_OK) {
        snprintf(err, cap, "uploading: %s", cm_strerror(rc));
    }
    agent_reply_free(&r);
    unlink(file);
    return rc;
}

int moe_xckpt_list(const struct agent_client *coord, const char *run, const struct moe_grid *grid,
                   struct moe_uid *uids, size_t cap, size_t *n)
{
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s/experts", run);
    struct agent_reply r = {0};
    int rc = agent_request(coord, "GET", path, NULL, &r);
    *n = 0;
    if (rc != CM_OK)
        return rc;
    json_t *a = json_object_get(r.json, "experts");
    if (r.status != 200 || !json_is_array(a)) {
        agent_reply_free(&r);
        return CM_EPROTO;
    }
    for (size_t i = 0; i < json_array_size(a) && *n < cap; i++) {
        const char *u = json_string_value(json_object_get(json_array_get(a, i), "uid"));
        if (u && moe_uid_parse(grid, u, &uids[*n]) == CM_OK)
            (*n)++;
    }
    agent_reply_free(&r);
    return CM_OK;
}

int moe_xckpt_fetch(const struct agent_client *coord, const char *run, const char *dir, const char *uid,
                    int C, int F, struct cm_ckpt *out, struct moe_xckpt_info *info, char *err, size_t cap)
{
    char path[256], file[4400];
    long status = 0;
    snprintf(path, sizeof path, "/api/v1/runs/%s/experts/%s/checkpoint", run, uid);
    snprintf(file, sizeof file, "%s/expert-download.ckpt", dir);
    int rc = agent_download_file(coord, path, file, &status, info->sha256);
    if (rc != CM_OK || status != 200) {
        unlink(file);
        if (rc == CM_OK && status == 404) {
            snprintf(err, cap, "no checkpoint");
            return CM_ENOTFOUND;
        }
        if (rc == CM_OK)
            snprintf(err, cap, "downloading: HTTP %ld", status);
        else
            snprintf(err, cap, "downloading: %s", cm_strerror(rc));
        return rc == CM_OK ? CM_EPROTO : rc;
    }
    struct cm_ckpt c;
    rc = cm_ckpt_read(file, &c);
    unlink(file);
    if (rc != CM_OK) {
        snprintf(err, cap, "reading the checkpoint: %s", cm_strerror(rc));
        return rc;
    }
    if ((rc = moe_ckpt_check(&c, uid, C, F, err, cap)) == CM_OK && c.step > (uint64_t)0x7fffffffffffffffLL) {
        snprintf(err, cap, "step out of range");
        rc = CM_EINVAL;
    }
    if (rc != CM_OK) {
        cm_ckpt_cleanup(&c);
        return rc;
    }
    info->step = (long)c.step;
    params_hash(c.params, c.n_params, info->params_sha256);
    *out = c;
    return CM_OK;
}

int moe_xckpt_apply(struct moe_server *srv, const char *uid, const struct cm_ckpt *c)
{
    const struct cm_ckpt_buf *m = cm_ckpt_find(c, MOE_CKPT_OPT_M), *v = cm_ckpt_find(c, MOE_CKPT_OPT_V);
    if (!m || !v)
        return CM_EINVAL;
    return moe_server_load(srv, uid, c->params, m->data, v->data, c->n_params, (long)c->step);
}

int moe_xckpt_load(const struct agent_client *coord, const char *run, const char *dir,
                   struct moe_server *srv, const char *uid, int C, int F, struct moe_xckpt_info *info,
                   char *err, size_t cap)
{
    struct cm_ckpt c;
    int rc = moe_xckpt_fetch(coord, run, dir, uid, C, F, &c, info, err, cap);
    if (rc != CM_OK)
        return rc;
    if ((rc = moe_xckpt_apply(srv, uid, &c)) != CM_OK)
        snprintf(err, cap, "loading into the server: %s", cm_strerror(rc));
    cm_ckpt_cleanup(&c);
    return rc;
}
