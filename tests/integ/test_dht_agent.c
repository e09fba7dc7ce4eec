/* Drives the real binary: `crowdtrain-agent dht put|get` with a config
 * directory holding a peer key and an access pass (as `login --run` writes
 * them), against a backbone DHT node started in this process with
 * dht_node_start() — the way `crowdtrain-coordinator serve` runs one. Two
 * agents write entries of one dictionary key; a third reads both; a missing
 * key exits 1; a revoked pass is refused by the backbone. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_err.h"
#include "dht/dht_node.h"
#include "tests/harness/p2p_testkit.h"

#define AGENT "build/bin/crowdtrain-agent"

static char tmp[256];

static void write_state(struct p2p_tk *tk, struct p2p_tk_peer *p, const char *dir,
                        uint16_t boot_port)
{
    char path[512];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/peer-ed25519.pem", dir);
    assert_int_equal(cm_ed25519_save(&p->key, path), 0);
    char ck[64], boot[64];
    cm_b64url_encode(tk->coord.pub, 32, ck);
    snprintf(boot, sizeof boot, "127.0.0.1:%u", boot_port);
    json_t *j = json_pack("{s:s, s:s, s:[s], s:[s], s:I, s:s}", "access_token", p->token,
                          "coordinator_public_key", ck, "coordinator_keys", ck, "bootstrap", boot,
                          "expires_at", (json_int_t)4000000000, "pass_id", "x");
    snprintf(path, sizeof path, "%s/pass-%s.json", dir, tk->run);
    assert_int_equal(json_dump_file(j, path, 0), 0);
    chmod(path, 0600);
    json_decref(j);
}

/* Runs a command, captures stdout into out; returns the exit status. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_agent_dht(void **state)
{
    (void)state;
    if (access(AGENT, X_OK)) {
        printf("%s not built\n", AGENT);
        exit(77);
    }
    snprintf(tmp, sizeof tmp, "/tmp/ct-dht-agent-XXXXXX");
    assert_non_null(mkdtemp(tmp));
    struct p2p_tk tk;
    struct p2p_tk_peer backbone, a, b, c;
    assert_int_equal(p2p_tk_init(&tk, "demo"), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "coordinator", "0", 3600, &backbone), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "alice", "1", 3600, &a), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "bob", "2", 3600, &b), 0);
    assert_int_equal(p2p_tk_peer_new(&tk, "carol", "3", 3600, &c), 0);
    struct dht_config cfg = {.key = &backbone.key, .token = backbone.token,
                             .listen_ip = "127.0.0.1", .ctx = {.auth = p2p_tk_auth_config(&tk)}};
    struct dht_node *bb;
    assert_int_equal(dht_node_start(&cfg, &bb), 0);
    uint16_t port = dht_node_port(bb);
    char da[300], db[300], dc[300], cmd[1024], out[4096];
    snprintf(da, sizeof da, "%s/a", tmp);
    snprintf(db, sizeof db, "%s/b", tmp);
    snprintf(dc, sizeof dc, "%s/c", tmp);
    write_state(&tk, &a, da, port);
    write_state(&tk, &b, db, port);
    write_state(&tk, &c, dc, port);

    snprintf(cmd, sizeof cmd, AGENT " dht put --config-dir %s --run demo progress 'step 5' "
                              "--subkey alice 2>&1", da);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "stored on 1 node\n"));
    snprintf(cmd, sizeof cmd, AGENT " dht put --config-dir %s --run demo progress 'step 6' "
                              "--subkey bob 2>&1", db);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, AGENT " dht put --config-dir %s --run demo model v7 2>&1", db);
    assert_int_equal(run(cmd, out, sizeof out), 0);

    snprintf(cmd, sizeof cmd, AGENT " dht get --config-dir %s --run demo progress", dc);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "entry alice "));
    assert_non_null(strstr(out, " step 5\n"));
    assert_non_null(strstr(out, "entry bob "));
    assert_non_null(strstr(out, " step 6\n"));
    snprintf(cmd, sizeof cmd, AGENT " dht get --config-dir %s --run demo model", dc);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_string_equal(out, "value v7\n");
    snprintf(cmd, sizeof cmd, AGENT " dht get --config-dir %s --run demo nothing 2>/dev/null", dc);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    /* usage errors */
    snprintf(cmd, sizeof cmd, AGENT " dht frob --config-dir %s --run demo x 2>/dev/null", dc);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    /* carol's pass is revoked at the backbone: her requests are refused. */
    const char *ids[] = {"3"};
    assert_int_equal(p2p_auth_set_revoked(p2p_ctx_auth(dht_node_ctx(bb)), ids, 1, 1), 0);
    snprintf(cmd, sizeof cmd,
             AGENT " dht get --config-dir %s --run demo model --timeout-ms 3000 2>&1", dc);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "bootstrap"));
    struct p2p_stats st;
    assert_int_equal(dht_stats(bb, NULL, &st), 0);
    assert_true(p2p_auth_rejects(p2p_ctx_auth(dht_node_ctx(bb)), P2P_REJ_REVOKED) >= 1);
    dht_node_stop(bb);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
    p2p_tk_peer_cleanup(&backbone);
    p2p_tk_peer_cleanup(&a);
    p2p_tk_peer_cleanup(&b);
    p2p_tk_peer_cleanup(&c);
    p2p_tk_cleanup(&tk);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_agent_dht)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
