/* Hosts on separate networks for integration tests: see ct_net.h. */
#include "ct_net.h"
#include "ct_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ct_net *g_made; /* destroyed at exit */

int ct_sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "ct_net: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

/* Namespaces "ct<pid>-..." of tests that died without cleaning up. */
static void remove_stale(void)
{
    DIR *d = opendir("/var/run/netns");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid = 0, len = 0;
        if (sscanf(e->d_name, "ct%d-%n", &pid, &len) != 1 || len == 0 || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno == EPERM)
            continue;
        char cmd[400];
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", e->d_name);
        if (system(cmd) != 0)
            fprintf(stderr, "ct_net: could not delete the stale namespace %s\n", e->d_name);
    }
    closedir(d);
}

static void at_exit(void)
{
    if (g_made)
        ct_net_destroy(g_made);
}

static int new_ns(const char *ns)
{
    return ct_sh("ip netns add %s", ns) || ct_sh("ip -n %s link set lo up", ns);
}

int ct_net_init(struct ct_net *n)
{
    memset(n, 0, sizeof *n);
    if (geteuid() != 0) {
        printf("skipped: network namespaces need root\n");
        return CT_SKIP;
    }
    if (system("ip netns list >/dev/null 2>&1") != 0 || system("iptables -V >/dev/null 2>&1") != 0) {
        printf("skipped: needs ip (iproute2) with netns support and iptables\n");
        return CT_SKIP;
    }
    remove_stale();
    snprintf(n->prefix, sizeof n->prefix, "ct%d", (int)getpid());
    snprintf(n->sw, sizeof n->sw, "%s-sw", n->prefix);
    if (new_ns(n->sw) || ct_sh("ip -n %s link add br0 type bridge", n->sw) ||
        ct_sh("ip -n %s link set br0 up", n->sw)) {
        ct_net_destroy(n);
        return -1;
    }
    if (!g_made) {
        g_made = n;
        atexit(at_exit);
    }
    return 0;
}

/* A veth pair: `inner` (named eth0, or wan) in ns with ip/prefix, and its
 * peer `outer` attached to bridge br0 of brns. */
static int link_to(const char *brns, const char *outer, const char *ns, const char *inner, const char *cidr)
{
    return ct_sh("ip -n %s link add %s type veth peer name %s netns %s", brns, outer, inner, ns) ||
           ct_sh("ip -n %s link set %s master br0 up", brns, outer) ||
           ct_sh("ip -n %s addr add %s dev %s", ns, cidr, inner) || ct_sh("ip -n %s link set %s up", ns, inner);
}

/* A host on the switch (router < 0: 10.77.0.(10+i)) or on a router's LAN
 * (192.168.(router+1).(10+k), default route through the router); its
 * eth0's peer is "h<i>" on the switch or "l<i>" on the router's bridge. */
static int add_host(struct ct_net *n, const char *name, int router)
{
    if (n->nhosts >= CT_NET_MAX_HOSTS || router >= n->nrouters) {
        fprintf(stderr, "ct_net: more than %d hosts, or no router %d\n", CT_NET_MAX_HOSTS, router);
        return -1;
    }
    int i = n->nhosts;
    struct ct_net_host *h = &n->h[i];
    snprintf(h->name, sizeof h->name, "%s", name);
    char pre[16];
    memcpy(pre, n->prefix, sizeof pre);
    snprintf(h->ns, sizeof h->ns, "%s-h%d", pre, i);
    if (router < 0)
        snprintf(h->ip, sizeof h->ip, "10.77.0.%d", 10 + i);
    else
        snprintf(h->ip, sizeof h->ip, "192.168.%d.%d", router + 1, 10 + n->r[router].nlan);
    h->router = router;
    char outer[16], cidr[32];
    snprintf(outer, sizeof outer, router < 0 ? "h%d" : "l%d", i);
    snprintf(cidr, sizeof cidr, "%s/24", h->ip);
    if (new_ns(h->ns) || link_to(router < 0 ? n->sw : n->r[router].ns, outer, h->ns, "eth0", cidr) ||
        (router >= 0 && ct_sh("ip -n %s route add default via 192.168.%d.1", h->ns, router + 1)))
        return -1;
    if (router >= 0)
        n->r[router].nlan++;
    n->nhosts++;
    return i;
}

int ct_net_public(struct ct_net *n, const char *name)
{
    return add_host(n, name, -1);
}

int ct_net_router(struct ct_net *n, int symmetric)
{
    if (n->nrouters >= CT_NET_MAX_ROUTERS)
        return -1;
    int r = n->nrouters;
    char pre[16];
    memcpy(pre, n->prefix, sizeof pre);
    snprintf(n->r[r].ns, sizeof n->r[r].ns, "%s-r%d", pre, r);
    snprintf(n->r[r].wan_ip, sizeof n->r[r].wan_ip, "10.77.0.%d", 200 + r);
    n->r[r].symmetric = symmetric;
    char outer[16], cidr[32];
    snprintf(outer, sizeof outer, "r%d", r);
    snprintf(cidr, sizeof cidr, "%s/24", n->r[r].wan_ip);
    const char *ns = n->r[r].ns;
    if (new_ns(ns) || link_to(n->sw, outer, ns, "wan", cidr) || ct_sh("ip -n %s link add br0 type bridge", ns) ||
        ct_sh("ip -n %s addr add 192.168.%d.1/24 dev br0", ns, r + 1) || ct_sh("ip -n %s link set br0 up", ns) ||
        ct_sh("ip netns exec %s sysctl -q -w net.ipv4.ip_forward=1", ns) ||
        ct_sh("ip netns exec %s iptables -t nat -A POSTROUTING -o wan -j MASQUERADE%s", ns,
           symmetric ? " --random-fully" : ""))
        return -1;
    n->nrouters++;
    return r;
}

int ct_net_router_stealth(struct ct_net *n, int router)
{
    if (router < 0 || router >= n->nrouters)
        return -1;
    return ct_sh("ip netns exec %s iptables -A INPUT -i wan -p tcp -m conntrack --ctstate NEW -j DROP",
                 n->r[router].ns);
}

int ct_net_private(struct ct_net *n, const char *name, int router)
{
    return router < 0 ? -1 : add_host(n, name, router);
}

int ct_net_cap(struct ct_net *n, int host, double mbit)
{
    if (host < 0 || host >= n->nhosts || mbit <= 0)
        return -1;
    const struct ct_net_host *h = &n->h[host];
    const char *outer_ns = h->router < 0 ? n->sw : n->r[h->router].ns;
    char outer[16];
    snprintf(outer, sizeof outer, h->router < 0 ? "h%d" : "l%d", host);
    /* burst: at least one MTU and ~2 ms at the rate */
    long burst = (long)(mbit * 1e6 / 8 / 500);
    if (burst < 16 * 1024)
        burst = 16 * 1024;
    /* the queue: 100 ms at the rate, as a home router's buffer (CT_NET_QUEUE_MS
       for experiments) */
    const char *q = getenv("CT_NET_QUEUE_MS");
    long qms = q ? strtol(q, NULL, 10) : 100;
    if (qms < 1 || qms > 10000)
        qms = 100;
    if (getenv("CT_NET_NO_SSAI"))
        ct_sh("ip netns exec %s sysctl -qw net.ipv4.tcp_slow_start_after_idle=0", h->ns);
    return ct_sh("ip netns exec %s tc qdisc replace dev eth0 root tbf rate %.0fkbit burst %ld latency %ldms", h->ns,
              mbit * 1000, burst, qms) ||
           ct_sh("ip netns exec %s tc qdisc replace dev %s root tbf rate %.0fkbit burst %ld latency %ldms", outer_ns,
              outer, mbit * 1000, burst, qms);
}

int ct_net_enter(const struct ct_net *n, int host)
{
    if (host < 0 || host >= n->nhosts)
        return -1;
    char path[300];
    snprintf(path, sizeof path, "/var/run/netns/%s", n->h[host].ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

pid_t ct_net_spawn(const struct ct_net *n, int host, const char *const *argv, const char *logpath)
{
    if (host < 0 || host >= n->nhosts)
        return -1;
    return ct_spawn_ns(n->h[host].ns, argv, logpath);
}

int ct_net_run(const struct ct_net *n, int host, const char *const *argv, const char *stdin_text, char **out,
               int timeout_s)
{
    if (host < 0 || host >= n->nhosts)
        return -1;
    return ct_run_ns(n->h[host].ns, argv, stdin_text, out, timeout_s);
}

int ct_net_volunteers(const struct ct_net *n, const struct ct_coord *c, const char *org, const char *run,
                      const char *url, int first, int count, const int *hosts, char (*dirs)[256])
{
    for (int i = 0; i < count; i++) {
        char name[16];
        snprintf(name, sizeof name, "vol%d", first + i);
        if (ct_volunteer_account(c, org, run, name, dirs[i]) != 0)
            return -1;
        const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", url, "--ca-cert", c->ca,
                              "--username", name, "--password-stdin", "--config-dir", dirs[i], NULL};
        char *out = NULL;
        int rc = ct_net_run(n, hosts[i], argv, "volunteer-pw\n", &out, 60);
        if (rc != 0)
            fprintf(stderr, "login of %s on %s: %s\n", name, n->h[hosts[i]].name, out ? out : "");
        free(out);
        if (rc != 0)
            return -1;
    }
    return 0;
}

void ct_net_destroy(struct ct_net *n)
{
    char cmd[128];
    for (int i = 0; i < n->nhosts; i++) {
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", n->h[i].ns);
        if (system(cmd) != 0) { /* already gone */
        }
    }
    for (int r = 0; r < n->nrouters; r++) {
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", n->r[r].ns);
        if (system(cmd) != 0) {
        }
    }
    if (n->sw[0]) {
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", n->sw);
        if (system(cmd) != 0) {
        }
    }
    n->nhosts = n->nrouters = 0;
    n->sw[0] = 0;
    if (g_made == n)
        g_made = NULL;
}

int ct_net_collab(struct ct_net *n, const char *prefix, int count, int *hosts, int *on_hosts)
{
    *on_hosts = 0;
    int rc = ct_net_init(n);
    if (rc == CT_SKIP) {
        printf("(on loopback)\n");
        return 0;
    }
    int coord = rc == 0 ? ct_net_public(n, "coord") : -1;
    if (coord != 0 || ct_net_enter(n, coord) != 0)
        return -1;
    for (int i = 0; i < count; i++) {
        char name[32];
        snprintf(name, sizeof name, "%.20s%d", prefix, i);
        if ((hosts[i] = ct_net_public(n, name)) < 0)
            return -1;
    }
    *on_hosts = 1;
    return 0;
}
