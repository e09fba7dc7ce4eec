/* `crowdtrain-agent dht get|put`: a debugging window on a run's DHT. It
 * starts a short-lived DHT node (client mode unless --listen is given) with
 * this peer's key and access pass from the state directory (written by
 * `crowdtrain-agent login --run RUN`), bootstraps from the pass's bootstrap
 * peers (or --bootstrap), does one get or put, prints the result, and stops.
 * Keys are strings; values are printed as text when printable, else hex. */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/client.h"
#include "agent/commands.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_opts.h"
#include "cm_token.h"
#include "dht/dht_node.h"

struct dht_cfg {
    char *run, *config_dir, *bootstrap, *listen, *subkey;
    long timeout_ms, ttl_s;
    double up_mbps, down_mbps;
};

#define D(f) offsetof(struct dht_cfg, f)
static const struct cm_opt DHT_OPTS[] = {
    {"run", CM_OPT_STR, D(run), NULL, "RUN", "the run whose DHT to use (its pass must be stored)", 0},
    {"config-dir", CM_OPT_STR, D(config_dir), NULL, "DIR",
     "state directory (default ~/.config/crowdtrain)", 0},
    {"bootstrap", CM_OPT_STR, D(bootstrap), NULL, "HOST:PORT[,...]",
     "peers to bootstrap from (default: the pass's bootstrap list)", 0},
    {"listen", CM_OPT_STR, D(listen), NULL, "IP:PORT",
     "accept connections here (default: client mode, no inbound connections)", 0},
    {"subkey", CM_OPT_STR, D(subkey), NULL, "S", "put: write this dictionary entry of the key", 0},
    {"ttl", CM_OPT_INT, D(ttl_s), "3600", "SECONDS", "put: lifetime of the value", 0},
    {"timeout-ms", CM_OPT_INT, D(timeout_ms), "15000", "MS", "deadline of the operation", 0},
    {"max-upload-mbps", CM_OPT_DBL, D(up_mbps), "0", "N", "upload cap, Mbit/s (0: none)", 0},
    {"max-download-mbps", CM_OPT_DBL, D(down_mbps), "0", "N", "download cap, Mbit/s (0: none)", 0},
};
static const struct cm_cmd_spec DHT_SPEC = {
    "crowdtrain-agent dht get --run RUN KEY\n"
    "       crowdtrain-agent dht put --run RUN KEY VALUE [--subkey S] [--ttl SECONDS]",
    "Reads or writes one key of a run's DHT, for debugging. get prints the plain\n"
    "value (\"value\" line) and every dictionary entry (\"entry SUBKEY AUTHOR-KID\n"
    "EXPIRES VALUE\"); exit status 1 when the key has no live value.",
    DHT_OPTS, sizeof DHT_OPTS / sizeof DHT_OPTS[0], 1};

static void print_bytes(const uint8_t *p, size_t n)
{
    int text = 1;
    for (size_t i = 0; i < n; i++)
        if (!isprint(p[i]) && p[i] != ' ')
            text = 0;
    if (text) {
        fwrite(p, 1, n, stdout);
        return;
    }
    fputs("hex:", stdout);
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
}

/* Loads the coordinator keys of a stored pass into keys (at most max). */
static size_t pass_keys(json_t *pass, uint8_t (*keys)[CM_ED25519_PUB_LEN], size_t max)
{
    size_t n = 0, len;
    json_t *arr = json_object_get(pass, "coordinator_keys"), *v;
    size_t i;
    json_array_foreach(arr, i, v)
    {
        const char *s = json_string_value(v);
        if (n < max && s &&
            cm_b64url_decode(s, strlen(s), keys[n], CM_ED25519_PUB_LEN, &len) == CM_OK &&
            len == CM_ED25519_PUB_LEN)
            n++;
    }
    const char *one = json_string_value(json_object_get(pass, "coordinator_public_key"));
    if (n == 0 && one &&
        cm_b64url_decode(one, strlen(one), keys[0], CM_ED25519_PUB_LEN, &len) == CM_OK &&
        len == CM_ED25519_PUB_LEN)
        n = 1;
    return n;
}

/* --bootstrap a,b, or else the pass's list: *out heap strings (the caller
 * frees them and the array, also on failure). */
static int bootstrap_list(char *flag, const json_t *pass, char ***out, size_t *n)
{
    if (flag) {
        for (char *s = strtok(flag, ","); s; s = strtok(NULL, ",")) {
            char **nb = realloc(*out, (*n + 1) * sizeof **out);
            if (!nb)
                return CM_ENOMEM;
            *out = nb;
            (*out)[(*n)++] = strdup(s);
        }
        return CM_OK;
    }
    json_t *arr = json_object_get(pass, "bootstrap"), *v;
    size_t i;
    json_array_foreach(arr, i, v)
    {
        if (!json_is_string(v))
            continue;
        char **nb = realloc(*out, (*n + 1) * sizeof **out);
        if (!nb)
            return CM_ENOMEM;
        *out = nb;
        (*out)[(*n)++] = strdup(json_string_value(v));
    }
    return CM_OK;
}

/* `dht get`: one line per live record. Returns the exit status. */
static int get_and_print(struct dht_node *node, const char *key, uint32_t timeout_ms)
{
    struct dht_result res = {0};
    int status = 1;
    int rc = dht_get(node, key, strlen(key), timeout_ms, &res);
    if (rc == CM_ENOTFOUND) {
        fprintf(stderr, "%s: no live value\n", key);
    } else if (rc != CM_OK) {
        fprintf(stderr, "error: get %s: %s\n", key, cm_strerror(rc));
    } else {
        for (size_t i = 0; i < res.nrec; i++) {
            const struct dht_record *r = &res.rec[i];
            char kid[CM_KID_LEN + 1];
            cm_key_id(r->author, kid);
            if (r->subkey_len == 0) {
                fputs("value ", stdout);
            } else {
                fputs("entry ", stdout);
                print_bytes(r->subkey, r->subkey_len);
                printf(" %s %lld ", kid, (long long)(r->expires_ms / 1000));
            }
            print_bytes(r->value, r->value_len);
            putchar('\n');
        }
        status = 0;
    }
    dht_result_cleanup(&res);
    return status;
}

int agent_cmd_dht(int argc, char **argv)
{
    struct dht_cfg cfg = {0};
    char *pos[3];
    int npos = 3;
    int rc = cm_opts_parse(&DHT_SPEC, &cfg, argc, argv, pos, &npos, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&DHT_SPEC, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status = 2, is_put = npos >= 1 && !strcmp(pos[0], "put");
    struct cm_ed25519 key = {0};
    json_t *pass = NULL;
    struct dht_node *node = NULL;
    char **boot = NULL;
    size_t nboot = 0;
    if (npos < 1 || (strcmp(pos[0], "get") && strcmp(pos[0], "put")) ||
        npos != (is_put ? 3 : 2)) {
        fprintf(stderr, "usage: %s\n", DHT_SPEC.usage);
        goto out;
    }
    if (!cfg.run || !cm_name_valid(cfg.run)) {
        fprintf(stderr, "error: --run RUN is required (see --help)\n");
        goto out;
    }
    if (cfg.timeout_ms <= 0 || cfg.ttl_s <= 0) {
        fprintf(stderr, "error: --timeout-ms and --ttl must be positive\n");
        goto out;
    }
    status = 1;
    char dir[4096], path[4200], name[128];
    if (agent_state_dir(cfg.config_dir, dir, sizeof dir) != CM_OK)
        goto out;
    snprintf(path, sizeof path, "%s/peer-ed25519.pem", dir);
    if ((rc = cm_ed25519_load(&key, path, 0)) != CM_OK) {
        fprintf(stderr, "error: peer key %s: %s (run 'crowdtrain-agent login' first)\n", path,
                cm_strerror(rc));
        goto out;
    }
    snprintf(name, sizeof name, "pass-%s.json", cfg.run);
    if (!(pass = agent_state_read(dir, name))) {
        fprintf(stderr, "error: no pass for run %s in %s (run 'crowdtrain-agent login --run %s')\n",
                cfg.run, dir, cfg.run);
        goto out;
    }
    const char *token = json_string_value(json_object_get(pass, "access_token"));
    uint8_t keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t nkeys = pass_keys(pass, keys, P2P_MAX_COORD_KEYS);
    if (!token || nkeys == 0) {
        fprintf(stderr, "error: %s/%s lacks access_token or coordinator keys\n", dir, name);
        goto out;
    }
    if (bootstrap_list(cfg.bootstrap, pass, &boot, &nboot) != CM_OK)
        goto out;
    if (nboot == 0) {
        fprintf(stderr, "error: no bootstrap peers (the pass lists none; give --bootstrap)\n");
        goto out;
    }
    char lip[256] = {0};
    uint16_t lport = 0;
    if (cfg.listen) {
        struct sockaddr_storage sa;
        if (p2p_addr_parse(cfg.listen, &sa) != CM_OK) {
            fprintf(stderr, "error: --listen %s: expected IP:PORT\n", cfg.listen);
            status = 2;
            goto out;
        }
        char *colon = strrchr(cfg.listen, ':');
        snprintf(lip, sizeof lip, "%.*s", (int)(colon - cfg.listen), cfg.listen);
        if (lip[0] == '[') { /* [v6] */
            memmove(lip, lip + 1, strlen(lip));
            lip[strlen(lip) - 1] = 0;
        }
        lport = (uint16_t)atoi(colon + 1);
    }
    struct dht_config dc = {
        .key = &key, .token = token, .listen_ip = cfg.listen ? lip : NULL, .listen_port = lport,
        .rpc_timeout_ms = 3000,
        .ctx = {.max_upload_mbps = cfg.up_mbps, .max_download_mbps = cfg.down_mbps,
                .auth = {.run = cfg.run, .coord_keys = (const uint8_t(*)[32])keys,
                         .n_coord_keys = nkeys}},
    };
    if ((rc = dht_node_start(&dc, &node)) != CM_OK) {
        fprintf(stderr, "error: cannot start a DHT node: %s\n", cm_strerror(rc));
        goto out;
    }
    rc = dht_bootstrap(node, (const char *const *)boot, nboot, (uint32_t)cfg.timeout_ms);
    if (rc != CM_OK) {
        fprintf(stderr, "error: bootstrap from %s%s: %s\n", boot[0], nboot > 1 ? ",..." : "",
                cm_strerror(rc));
        goto out;
    }
    if (is_put) {
        int stored = 0;
        int64_t exp = p2p_now_ms() + cfg.ttl_s * 1000;
        rc = dht_put(node, pos[1], strlen(pos[1]), cfg.subkey, cfg.subkey ? strlen(cfg.subkey) : 0,
                     pos[2], strlen(pos[2]), exp, (uint32_t)cfg.timeout_ms, &stored);
        if (rc != CM_OK) {
            fprintf(stderr, "error: put %s: %s\n", pos[1], cm_strerror(rc));
            goto out;
        }
        printf("stored on %d node%s\n", stored, stored == 1 ? "" : "s");
        status = 0;
    } else {
        status = get_and_print(node, pos[1], (uint32_t)cfg.timeout_ms);
    }
out:
    if (node)
        dht_node_stop(node);
    for (size_t i = 0; i < nboot; i++)
        free(boot[i]);
    free(boot);
    json_decref(pass);
    cm_ed25519_cleanup(&key);
    cm_opts_free(&DHT_SPEC, &cfg);
    return status;
}
