/* Two DHT swarms in separate network namespaces, joined by a veth pair,
 * talk through one bootstrap node: swarm A (with the bootstrap node) lives
 * in one namespace, swarm B in the other and knows only the bootstrap
 * address. Each side stores values, then reads every value the other side
 * stored. The link is shaped with tc tbf to 50 Mbit/s so the test also runs
 * over a rate-limited path. Needs root and `ip netns`; skips (exit 77) with
 * the reason otherwise. */
/* ct-timeout: 180 */
#include <fcntl.h>
#include <stdarg.h>
#include <sys/select.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_log.h"
#include "tests/harness/ct_net.h"
#include "tests/harness/p2p_swarm.h"

#define NODES 25
#define NVALUES 20

static char ns_a[32], ns_b[32];

static void cleanup_ns(void)
{
    ct_sh("ip netns del %s 2>/dev/null", ns_a);
    ct_sh("ip netns del %s 2>/dev/null", ns_b);
}

static void skip(const char *why)
{
    printf("skipped: %s\n", why);
    exit(77);
}

static int enter_ns(const char *ns)
{
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET)) {
        perror("setns");
        return -1;
    }
    close(fd);
    return 0;
}

struct cnt {
    int done, ok;
    const char *expect;
};

static void put_cb(void *arg, const struct dht_result *r)
{
    struct cnt *c = arg;
    c->done++;
    c->ok += r->status == CM_OK;
}

static void get_cb(void *arg, const struct dht_result *r)
{
    struct cnt *c = arg;
    c->done++;
    const struct dht_record *p = dht_result_plain(r);
    if (r->status == CM_OK && p)
        c->ok++;
}

/* One side: a swarm in namespace ns listening on ip. Side A writes the
 * bootstrap port to `to`; side B reads it from `from`. Each writes its own
 * keys, tells the other (one byte), waits for the other, reads the other's
 * keys. Returns the process exit status. */
static int side(struct p2p_tk *tk, const char *ns, const char *ip, const char *peer_ip, int is_a,
                int from, int to)
{
    if (enter_ns(ns))
        return 3;
    cm_log_set_level(CM_LOG_ERROR);
    struct p2p_swarm s;
    struct p2p_swarm_opts o = {.listen_ip = ip, .tk = tk, .name_prefix = is_a ? "a" : "b"};
    if (p2p_swarm_init(&s, NODES, &o))
        return 4;
    if (is_a) {
        if (p2p_swarm_join(&s, 8))
            return 5;
        uint16_t port = dht_node_port(s.nodes[0]);
        if (write(to, &port, sizeof port) != sizeof port)
            return 6;
    } else {
        uint16_t port;
        if (read(from, &port, sizeof port) != sizeof port)
            return 6;
        char a[64];
        struct sockaddr_storage boot;
        snprintf(a, sizeof a, "%s:%u", peer_ip, port);
        p2p_addr_parse(a, &boot);
        if (p2p_swarm_join_addr(&s, &boot, 8))
            return 7;
    }
    struct cnt pc = {0};
    int64_t exp = p2p_now_ms() + 600000;
    for (int i = 0; i < NVALUES; i++) {
        char k[32], v[32];
        snprintf(k, sizeof k, "%s-key-%d", is_a ? "a" : "b", i);
        snprintf(v, sizeof v, "%s-value-%d", is_a ? "a" : "b", i);
        dht_put_async(s.nodes[(size_t)i % NODES], k, strlen(k), NULL, 0, v, strlen(v), exp,
                      put_cb, &pc);
    }
    if (p2p_swarm_run_until(&s, &pc.done, NVALUES, 60000) || pc.ok != NVALUES)
        return 8;
    /* B tells A it has joined and stored; A answers the same. Then both read
     * while both swarms are alive. */
    char byte = 1;
    if (!is_a && write(to, &byte, 1) != 1)
        return 9;
    int dummy = 0;
    if (is_a) {
        /* keep serving while waiting for B */
        while (1) {
            struct timeval tv = {0, 0};
            fd_set fs;
            FD_ZERO(&fs);
            FD_SET(from, &fs);
            if (select(from + 1, &fs, NULL, NULL, &tv) > 0)
                break;
            uv_run(&s.loop, UV_RUN_NOWAIT);
            usleep(1000);
        }
        if (read(from, &byte, 1) != 1)
            return 9;
        if (write(to, &byte, 1) != 1)
            return 9;
    } else {
        while (1) {
            struct timeval tv = {0, 0};
            fd_set fs;
            FD_ZERO(&fs);
            FD_SET(from, &fs);
            if (select(from + 1, &fs, NULL, NULL, &tv) > 0)
                break;
            uv_run(&s.loop, UV_RUN_NOWAIT);
            usleep(1000);
        }
        if (read(from, &byte, 1) != 1)
            return 9;
    }
    struct cnt gc = {0};
    for (int i = 0; i < NVALUES; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s-key-%d", is_a ? "b" : "a", i);
        dht_get_async(s.nodes[(size_t)(i * 7) % NODES], k, strlen(k), get_cb, &gc);
    }
    if (p2p_swarm_run_until(&s, &gc.done, NVALUES, 60000))
        return 10;
    printf("side %s: read %d/%d of the other side's values\n", is_a ? "A" : "B", gc.ok, NVALUES);
    /* keep serving a little so the other side finishes its reads */
    p2p_swarm_run_until(&s, &dummy, 1, 3000);
    int rc = gc.ok == NVALUES ? 0 : 11;
    p2p_swarm_cleanup(&s);
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (geteuid() != 0)
        skip("needs root for ip netns");
    if (system("ip netns list >/dev/null 2>&1") != 0)
        skip("ip netns is unavailable");
    snprintf(ns_a, sizeof ns_a, "ctp2pa%d", (int)getpid());
    snprintf(ns_b, sizeof ns_b, "ctp2pb%d", (int)getpid());
    atexit(cleanup_ns);
    char va[16], vb[16];
    snprintf(va, sizeof va, "cta%d", (int)getpid() % 100000);
    snprintf(vb, sizeof vb, "ctb%d", (int)getpid() % 100000);
    if (ct_sh("ip netns add %s", ns_a) || ct_sh("ip netns add %s", ns_b))
        skip("cannot create network namespaces here");
    if (ct_sh("ip link add %s type veth peer name %s", va, vb) ||
        ct_sh("ip link set %s netns %s", va, ns_a) || ct_sh("ip link set %s netns %s", vb, ns_b) ||
        ct_sh("ip -n %s addr add 10.231.0.1/24 dev %s", ns_a, va) ||
        ct_sh("ip -n %s addr add 10.231.0.2/24 dev %s", ns_b, vb) ||
        ct_sh("ip -n %s link set %s up", ns_a, va) || ct_sh("ip -n %s link set %s up", ns_b, vb) ||
        ct_sh("ip -n %s link set lo up", ns_a) || ct_sh("ip -n %s link set lo up", ns_b)) {
        printf("FAIL: could not set up the veth pair\n");
        return 1;
    }
    /* A 50 Mbit/s link between the namespaces (tbf works in namespaces). */
    int shaped = ct_sh("ip netns exec %s tc qdisc add dev %s root tbf rate 50mbit burst 32kbit "
                    "latency 50ms",
                    ns_a, va) == 0;
    printf("namespaces %s and %s up, veth %s-%s%s\n", ns_a, ns_b, va, vb,
           shaped ? ", shaped to 50 Mbit/s" : " (tc tbf unavailable: unshaped)");
    struct p2p_tk tk;
    if (p2p_tk_init(&tk, "swarm"))
        return 1;
    int ab[2], ba[2];
    if (pipe(ab) || pipe(ba))
        return 1;
    pid_t pa = fork();
    if (pa == 0)
        _exit(side(&tk, ns_a, "10.231.0.1", "10.231.0.2", 1, ba[0], ab[1]));
    pid_t pb = fork();
    if (pb == 0)
        _exit(side(&tk, ns_b, "10.231.0.2", "10.231.0.1", 0, ab[0], ba[1]));
    int sa, sb;
    waitpid(pa, &sa, 0);
    waitpid(pb, &sb, 0);
    int ra = WIFEXITED(sa) ? WEXITSTATUS(sa) : 128, rb = WIFEXITED(sb) ? WEXITSTATUS(sb) : 128;
    printf("side A exit %d, side B exit %d\n", ra, rb);
    p2p_tk_cleanup(&tk);
    if (ra || rb) {
        printf("FAIL\n");
        return 1;
    }
    printf("PASS: both swarms read all of each other's values through the bootstrap node\n");
    return 0;
}
