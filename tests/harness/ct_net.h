/* A test bed of hosts on separate networks (issue 17): network namespaces
 * that stand for volunteers' machines, so agents run with the command lines
 * a volunteer types and talk over real routes, addresses and NAT instead of
 * one loopback.
 *
 *   switch   a namespace holding the bridge "br0": the public Internet,
 *            10.77.0.0/24
 *   public   a host with eth0 on the switch, 10.77.0.(10+i)
 *   router   a home router: wan on the switch (10.77.0.(200+r)), a LAN bridge
 *            with 192.168.(r+1).1/24, IP forwarding and iptables MASQUERADE
 *            out of wan: port-preserving ("cone-like"), or with
 *            --random-fully ("symmetric-like": every mapping a new port)
 *   private  a host on a router's LAN, 192.168.(r+1).(10+k), default route
 *            through the router; nothing on the switch can open a
 *            connection to it
 *
 * Bandwidth: `tc tbf` on both ends of a host's link (its upload and its
 * download). Latency is the application's (p2p_ctx_config.latency_ms):
 * netem is not available everywhere.
 *
 * Needs root, `ip` and `iptables`; ct_net_init returns CT_SKIP otherwise.
 * Only the namespaces it made are touched (names "ct<pid>-..."); they are
 * deleted by ct_net_destroy, at exit, and by the next ct_net_init when the
 * test that made them died (its pid is gone). Processes started in them
 * die with the test (PR_SET_PDEATHSIG). */
#ifndef CT_NET_H
#define CT_NET_H

#include <sys/types.h>

#define CT_NET_MAX_HOSTS 32
#define CT_NET_MAX_ROUTERS 4

struct ct_net_host {
    char name[16];
    char ns[32];
    char ip[40];
    int router; /* -1: public */
};

struct ct_net {
    char prefix[16]; /* "ct<pid>" */
    char sw[32];     /* the switch's namespace */
    int nhosts, nrouters;
    struct ct_net_host h[CT_NET_MAX_HOSTS];
    struct {
        char ns[32];
        char wan_ip[40];
        int nlan, symmetric;
    } r[CT_NET_MAX_ROUTERS];
};

/* Runs a shell command (printf-style), printing it when it fails; its
 * system() status. */
int ct_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 0, CT_SKIP (with the reason printed), or -1. */
int ct_net_init(struct ct_net *n);
/* Each returns the new host's (router's) index, or -1. */
int ct_net_public(struct ct_net *n, const char *name);
int ct_net_router(struct ct_net *n, int symmetric);
int ct_net_private(struct ct_net *n, const char *name, int router);
/* Makes a router drop connections nobody behind it asked for, silently
 * (as many home routers do), instead of refusing them with a reset. */
int ct_net_router_stealth(struct ct_net *n, int router);
/* Caps host's upload and download at mbit Mbit/s (tc tbf; called again, it
 * replaces the cap). 0 on success. */
int ct_net_cap(struct ct_net *n, int host, double mbit);
/* Moves the calling process into host's namespace (before it starts
 * threads: setns moves only the calling thread). 0 on success. */
int ct_net_enter(const struct ct_net *n, int host);
/* ct_spawn / ct_run inside host's namespace. */
pid_t ct_net_spawn(const struct ct_net *n, int host, const char *const *argv, const char *logpath);
int ct_net_run(const struct ct_net *n, int host, const char *const *argv, const char *stdin_text, char **out,
               int timeout_s);
/* Volunteers for agent tests on separate hosts (ct_volunteers' twin):
 * accounts vol<first>..vol<first+n-1> (password "volunteer-pw"), allowlisted
 * on run by the organizer `org`, each with a state directory (dirs[i], 256
 * bytes) and logged in from its host hosts[i] at the coordinator's public
 * URL `url`, as a volunteer does it (README, "A volunteer joins"). 0 on
 * success. */
struct ct_coord;
int ct_net_volunteers(const struct ct_net *n, const struct ct_coord *c, const char *org, const char *run,
                      const char *url, int first, int count, const int *hosts, char (*dirs)[256]);
/* The collaborative tests' hosts: where namespaces can be made (root), a
 * first host "coord" (10.77.0.10) that the calling process enters (so
 * PostgreSQL and the coordinator it starts run there), then `count` public
 * hosts named prefix0, prefix1, ... (their indices in hosts[]); *on_hosts =
 * 1. Where they cannot (not root), loopback: *on_hosts = 0, said on stdout.
 * 0, or -1. */
int ct_net_collab(struct ct_net *n, const char *prefix, int count, int *hosts, int *on_hosts);
/* Deletes every namespace it made (their links go with them). */
void ct_net_destroy(struct ct_net *n);

#endif
