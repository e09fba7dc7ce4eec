/* Integration-test harness (see ct_harness.h). */
#include "ct_harness.h"
#include "cm_err.h"
#include "cm_passreq.h"
#include "ckpt/ckpt.h"
#include "cm_crypto.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libpq-fe.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int ct_tempdir(const char *tag, char *out, size_t cap)
{
    snprintf(out, cap, "/tmp/ct-%s-XXXXXX", tag);
    return mkdtemp(out) ? 0 : -1;
}

void ct_rmrf(const char *dir)
{
    if (!dir || !*dir || strncmp(dir, "/tmp/", 5) != 0)
        return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
                ct_rmrf(p);
            else
                unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

const char *ct_bin(const char *name)
{
    static char path[4][1100];
    static int next;
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return name;
    exe[n] = '\0';
    char *t = strstr(exe, "/tests/");
    if (t)
        *t = '\0';
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/bin/%s", exe, name);
    return p;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &l) != 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    close(s);
    return ntohs(a.sin_port);
}

static int pg_bindir(char *out, size_t cap)
{
    glob_t g;
    if (glob("/usr/lib/postgresql/*/bin/postgres", 0, NULL, &g) != 0 || g.gl_pathc == 0)
        return -1;
    snprintf(out, cap, "%s", g.gl_pathv[g.gl_pathc - 1]);
    globfree(&g);
    char *s = strrchr(out, '/');
    *s = '\0';
    return 0;
}

/* Forks a child that drops to the postgres user when root, dies with us,
 * and execs argv with stdout/stderr to logpath. */
static pid_t spawn_as_pg(const char *const *argv, const char *logpath, int die_with_parent)
{
    struct passwd *pw = geteuid() == 0 ? getpwnam("postgres") : NULL;
    if (geteuid() == 0 && !pw)
        return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (pw && (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0))
        _exit(126);
    if (die_with_parent) {
        prctl(PR_SET_PDEATHSIG, SIGQUIT);
        if (getppid() != parent)
            _exit(1);
    }
    int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

int ct_pg_exec(struct ct_pg *pg, const char *sql)
{
    PGconn *c = PQconnectdb(pg->url);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "ct_pg_exec: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "ct_pg_exec: %s", PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

int ct_pg_scalar(struct ct_pg *pg, const char *sql, long *out)
{
    PGconn *c = PQconnectdb(pg->url);
    PGresult *r = PQstatus(c) == CONNECTION_OK ? PQexec(c, sql) : NULL;
    int ok = r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    if (ok)
        *out = atol(PQgetvalue(r, 0, 0));
    else
        fprintf(stderr, "ct_pg_scalar: %s", PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* A fresh cluster in `data`, copied from a template made by initdb once per
 * user and server binaries (/tmp/ct-pgtemplate-UID-HASH/data): initdb takes
 * about 1.4 s on 2 cores, a copy 0.1 s, and `make test` starts some sixty
 * clusters. The template appears atomically (initdb elsewhere, then
 * rename), so tests starting together never copy a half-made one; it stays
 * between runs as a cache. -1 when any of it fails (the caller runs initdb
 * itself). */
static int pg_from_template(const char *bindir, const char *initdb, const char *data)
{
    uint32_t h = 2166136261u;
    for (const char *c = bindir; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    char tpl[128], tdata[160], ver[180];
    snprintf(tpl, sizeof tpl, "/tmp/ct-pgtemplate-%u-%08x", (unsigned)geteuid(), (unsigned)h);
    snprintf(tdata, sizeof tdata, "%s/data", tpl);
    snprintf(ver, sizeof ver, "%s/PG_VERSION", tdata);
    if (access(ver, R_OK) != 0) {
        char tmp[64], tmpdata[96], log[96];
        if (ct_tempdir("pgtemplate-new", tmp, sizeof tmp) != 0)
            return -1;
        chmod(tmp, 0755);
        struct passwd *pw = geteuid() == 0 ? getpwnam("postgres") : NULL;
        snprintf(tmpdata, sizeof tmpdata, "%s/data", tmp);
        snprintf(log, sizeof log, "%s/initdb.log", tmp);
        const char *iargv[] = {initdb, "-D", tmpdata, "-A", "trust", "-U", "crowdtrain", "-E", "UTF8",
                               "--no-sync", "--no-instructions", NULL};
        pid_t p = -1;
        int st = 0;
        if ((!pw || chown(tmp, pw->pw_uid, pw->pw_gid) == 0) && (p = spawn_as_pg(iargv, log, 1)) > 0 &&
            waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0 && rename(tmp, tpl) == 0)
            ;
        else
            ct_rmrf(tmp); /* failed, or another test made it first */
        if (access(ver, R_OK) != 0)
            return -1;
    }
    const char *cargv[] = {"/bin/cp", "-a", tdata, data, NULL};
    return ct_run(cargv, NULL, NULL, 60) == 0 ? 0 : -1; /* 40 MB: a minute is plenty */
}

int ct_pg_start(struct ct_pg *pg)
{
    memset(pg, 0, sizeof *pg);
    char bindir[512], initdb[600], postgres[600], data[400], log[400], sock[300];
    if (pg_bindir(bindir, sizeof bindir) != 0) {
        printf("SKIP: PostgreSQL server binaries not found under /usr/lib/postgresql\n");
        return CT_SKIP;
    }
    if (ct_tempdir("pg", pg->dir, sizeof pg->dir) != 0)
        return -1;
    chmod(pg->dir, 0755);
    struct passwd *pw = geteuid() == 0 ? getpwnam("postgres") : NULL;
    if (pw && chown(pg->dir, pw->pw_uid, pw->pw_gid) != 0)
        return -1;
    snprintf(initdb, sizeof initdb, "%s/initdb", bindir);
    snprintf(postgres, sizeof postgres, "%s/postgres", bindir);
    snprintf(data, sizeof data, "%s/data", pg->dir);
    snprintf(log, sizeof log, "%s/postgres.log", pg->dir);
    snprintf(sock, sizeof sock, "%s", pg->dir);
    const char *iargv[] = {initdb, "-D", data, "-A", "trust", "-U", "crowdtrain", "-E", "UTF8",
                           "--no-sync", "--no-instructions", NULL};
    int st = 0;
    if (pg_from_template(bindir, initdb, data) != 0) {
        ct_rmrf(data); /* a partial copy */
        pid_t p = spawn_as_pg(iargv, log, 1);
        if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "initdb failed; see %s\n", log);
            return -1;
        }
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        pg->port = free_port();
        char port[16];
        snprintf(port, sizeof port, "%d", pg->port);
        const char *pargv[] = {postgres, "-D", data, "-p", port, "-k", sock,
                               "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                               "-c", "full_page_writes=off", "-c", "max_connections=200",
                               "-c", "shared_buffers=32MB", NULL};
        pg->pid = spawn_as_pg(pargv, log, 1);
        if (pg->pid < 0)
            return -1;
        snprintf(pg->url, sizeof pg->url, "postgresql://crowdtrain@127.0.0.1:%d/postgres",
                 pg->port);
        double t0 = now_s();
        while (now_s() - t0 < 30) {
            if (waitpid(pg->pid, &st, WNOHANG) == pg->pid) {
                pg->pid = 0;
                break; /* port taken or crash: retry */
            }
            PGconn *c = PQconnectdb(pg->url);
            int ok = PQstatus(c) == CONNECTION_OK;
            PQfinish(c);
            if (ok) {
                if (ct_pg_exec(pg, "CREATE DATABASE crowdtrain") != 0)
                    return -1;
                snprintf(pg->url, sizeof pg->url,
                         "postgresql://crowdtrain@127.0.0.1:%d/crowdtrain", pg->port);
                return 0;
            }
            usleep(50000);
        }
        if (pg->pid > 0) {
            kill(pg->pid, SIGKILL);
            waitpid(pg->pid, &st, 0);
            pg->pid = 0;
        }
    }
    fprintf(stderr, "PostgreSQL did not start; see %s\n", log);
    return -1;
}

void ct_pg_stop(struct ct_pg *pg)
{
    if (pg->pid > 0) {
        kill(pg->pid, SIGINT); /* fast shutdown */
        double t0 = now_s();
        int st;
        while (waitpid(pg->pid, &st, WNOHANG) == 0) {
            if (now_s() - t0 > 15) {
                kill(pg->pid, SIGKILL);
                waitpid(pg->pid, &st, 0);
                break;
            }
            usleep(20000);
        }
        pg->pid = 0;
    }
    if (pg->dir[0] && !getenv("CT_KEEP"))
        ct_rmrf(pg->dir);
    pg->dir[0] = '\0';
}

struct buf {
    char *p;
    size_t len;
};

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    struct buf *b = ud;
    size_t len = sz * n;
    char *np = realloc(b->p, b->len + len + 1);
    if (!np)
        return 0;
    b->p = np;
    memcpy(b->p + b->len, d, len);
    b->len += len;
    b->p[b->len] = '\0';
    return len;
}

static int http_raw_from(const struct ct_coord *c, const char *src, const char *method,
                         const char *path, const char *const *headers, const void *body,
                         size_t body_len, struct ct_resp *out)
{
    memset(out, 0, sizeof *out);
    CURL *h = curl_easy_init();
    if (!h)
        return -1;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    struct buf b = {0};
    struct curl_slist *hl = NULL;
    for (const char *const *p = headers; p && *p; p++)
        hl = curl_slist_append(hl, *p);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CAINFO, c->ca);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (src)
        curl_easy_setopt(h, CURLOPT_INTERFACE, src);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK)
        out->curl_error = (int)rc;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    out->body = b.p;
    out->len = b.len;
    if (b.p)
        out->json = json_loadb(b.p, b.len, 0, NULL);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return rc == CURLE_OK ? 0 : -1;
}

int ct_http_raw(const struct ct_coord *c, const char *method, const char *path,
                const char *const *headers, const void *body, size_t body_len, struct ct_resp *out)
{
    return http_raw_from(c, NULL, method, path, headers, body, body_len, out);
}

int ct_http_from(const struct ct_coord *c, const char *src, const char *method, const char *path,
                 const char *bearer, const char *body, struct ct_resp *out)
{
    char auth[512];
    const char *hdrs[3] = {"Content-Type: application/json", NULL, NULL};
    if (bearer) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
        hdrs[1] = auth;
    }
    return http_raw_from(c, src, method, path, hdrs, body, body ? strlen(body) : 0, out);
}

int ct_http(const struct ct_coord *c, const char *method, const char *path, const char *bearer,
            const char *body, struct ct_resp *out)
{
    return ct_http_from(c, NULL, method, path, bearer, body, out);
}

void ct_resp_free(struct ct_resp *r)
{
    json_decref(r->json);
    free(r->body);
    memset(r, 0, sizeof *r);
}

char *ct_login(const struct ct_coord *c, const char *user, const char *password)
{
    char body[512];
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"password\":\"%s\"}", user, password);
    struct ct_resp r;
    ct_http(c, "POST", "/api/v1/session", NULL, body, &r);
    const char *t = json_string_value(json_object_get(r.json, "token"));
    char *out = r.status == 201 && t ? strdup(t) : NULL;
    if (!out)
        fprintf(stderr, "login %s failed: %ld %s\n", user, r.status, r.body ? r.body : "");
    ct_resp_free(&r);
    return out;
}

/* In a forked child: moves it into the network namespace /var/run/netns/ns
 * (NULL: stays); exits the child on failure. */
static void child_netns(const char *ns)
{
    if (!ns)
        return;
    char path[300];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "cannot enter network namespace %s: %s\n", ns, strerror(errno));
        _exit(126);
    }
    close(fd);
}

int ct_run(const char *const *argv, const char *stdin_text, char **out, int timeout_s)
{
    return ct_run_ns(NULL, argv, stdin_text, out, timeout_s);
}

int ct_run_ns(const char *ns, const char *const *argv, const char *stdin_text, char **out, int timeout_s)
{
    int in[2], o[2];
    if (pipe(in) != 0 || pipe(o) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        child_netns(ns);
        dup2(in[0], 0);
        dup2(o[1], 1);
        dup2(o[1], 2);
        close(in[1]);
        close(o[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(o[1]);
    signal(SIGPIPE, SIG_IGN);
    if (stdin_text) {
        ssize_t w = write(in[1], stdin_text, strlen(stdin_text));
        (void)w;
    }
    close(in[1]);
    struct buf b = {0};
    double t0 = now_s();
    for (;;) {
        struct pollfd p = {o[0], POLLIN, 0};
        int remaining = (int)((timeout_s - (now_s() - t0)) * 1000);
        if (remaining <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        if (poll(&p, 1, remaining) <= 0)
            continue;
        char tmp[4096];
        ssize_t n = read(o[0], tmp, sizeof tmp);
        if (n <= 0)
            break;
        on_write(tmp, 1, (size_t)n, &b);
    }
    close(o[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (out)
        *out = b.p ? b.p : strdup("");
    else
        free(b.p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int ct_create_user(const char *db_url, const char *user, const char *role, const char *password)
{
    char pw[256];
    snprintf(pw, sizeof pw, "%s\n", password);
    const char *argv[] = {ct_bin("crowdtrain-coordinator"), "create-user", "--database-url", db_url,
                          "--username", user, "--role", role, "--password-stdin", NULL};
    char *out = NULL;
    int rc = ct_run(argv, pw, &out, 60);
    if (rc != 0)
        fprintf(stderr, "create-user %s: %s\n", user, out ? out : "");
    free(out);
    return rc;
}

int ct_coord_start(struct ct_coord *c, const char *db_url, const char *dir,
                   const char *const *extra)
{
    if (dir) {
        if (dir != c->dir)
            snprintf(c->dir, sizeof c->dir, "%s", dir);
    } else {
        memset(c, 0, sizeof *c);
        if (ct_tempdir("coord", c->dir, sizeof c->dir) != 0)
            return -1;
        c->own_dir = 1;
    }
    snprintf(c->ca, sizeof c->ca, "%s/tls-cert.pem", c->dir);
    snprintf(c->log, sizeof c->log, "%s/coordinator.log", c->dir);
    char urlfile[400];
    snprintf(urlfile, sizeof urlfile, "%s/coordinator.url", c->dir);
    unlink(urlfile);
    const char *argv[48] = {ct_bin("crowdtrain-coordinator"), "serve", "--database-url", db_url,
                            "--listen", "127.0.0.1:0", "--data-dir", c->dir, "--threads", "4",
                            "--db-pool", "8", "--dht-port", "0", "--dht-listen-ip", "127.0.0.1"};
    int n = 16;
    for (const char *const *p = extra; p && *p && n < 46; p++)
        argv[n++] = *p;
    argv[n] = NULL;
    pid_t parent = getpid();
    c->pid = fork();
    if (c->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    double t0 = now_s();
    while (now_s() - t0 < 20) {
        int st;
        if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
            c->pid = 0;
            fprintf(stderr, "coordinator exited during start; log %s\n", c->log);
            return -1;
        }
        FILE *f = fopen(urlfile, "r");
        if (f) {
            int ok = fgets(c->url, sizeof c->url, f) != NULL;
            fclose(f);
            c->url[strcspn(c->url, "\n")] = '\0';
            struct ct_resp r;
            if (ok && ct_http(c, "GET", "/api/v1/health", NULL, NULL, &r) == 0 && r.status == 200) {
                ct_resp_free(&r);
                return 0;
            }
            ct_resp_free(&r);
        }
        usleep(50000);
    }
    fprintf(stderr, "coordinator did not become healthy; log %s\n", c->log);
    return -1;
}

int ct_coord_stop(struct ct_coord *c, int sig)
{
    if (c->pid <= 0)
        return -1;
    kill(c->pid, sig);
    double t0 = now_s();
    int st = 0;
    while (waitpid(c->pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > 15) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            break;
        }
        usleep(10000);
    }
    c->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int ct_coord_cleanup(struct ct_coord *c)
{
    int rc = 0;
    if (c->pid > 0) {
        /* A graceful stop, so that sanitizer builds report leaks and errors
         * through the exit status; the log is shown when it is not 0. */
        int st = ct_coord_stop(c, SIGTERM);
        if (st != 0) {
            fprintf(stderr, "coordinator exited with status %d; its log %s:\n", st, c->log);
            FILE *f = fopen(c->log, "r");
            char line[1024];
            while (f && fgets(line, sizeof line, f))
                fputs(line, stderr);
            if (f)
                fclose(f);
            rc = -1;
        }
    }
    if (c->own_dir && !getenv("CT_KEEP"))
        ct_rmrf(c->dir);
    c->own_dir = 0;
    return rc;
}

pid_t ct_spawn(const char *const *argv, const char *logpath)
{
    return ct_spawn_ns(NULL, argv, logpath);
}

pid_t ct_spawn_ns(const char *ns, const char *const *argv, const char *logpath)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
    child_netns(ns);
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int nul = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    if (nul >= 0) {
        dup2(nul, 0);
        close(nul);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

int ct_wait(pid_t pid, int timeout_s)
{
    double t0 = now_s();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(20000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *ct_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        on_write(tmp, 1, n, &b);
    fclose(f);
    if (len)
        *len = b.len;
    return b.p ? b.p : strdup("");
}

int ct_pass_body(const char *run, const char *user, const struct cm_ed25519 *key, char *out, size_t cap)
{
    struct cm_passreq pr;
    if (cm_passreq_sign(key, run, user, (int64_t)time(NULL), &pr) != CM_OK)
        return -1;
    json_t *j = cm_passreq_to_json(&pr);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    int ok = s && strlen(s) < cap;
    if (ok)
        memcpy(out, s, strlen(s) + 1);
    free(s);
    return ok ? 0 : -1;
}

long ct_pass_request(const struct ct_coord *c, const char *bearer, const char *run, const char *user,
                     const struct cm_ed25519 *key, struct ct_resp *out)
{
    char body[512], path[160];
    memset(out, 0, sizeof *out);
    if (ct_pass_body(run, user, key, body, sizeof body) != 0)
        return 0;
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", run);
    ct_http(c, "POST", path, bearer, body, out);
    return out->status;
}

int ct_volunteer_account(const struct ct_coord *c, const char *org, const char *run, const char *name, char *dir)
{
    char b[200], path[256];
    struct ct_resp r;
    snprintf(b, sizeof b, "{\"username\":\"%s\",\"role\":\"volunteer\",\"password\":\"volunteer-pw\"}", name);
    ct_http(c, "POST", "/api/v1/users", org, b, &r);
    ct_resp_free(&r);
    snprintf(path, sizeof path, "/api/v1/runs/%s/allowlist/%s", run, name);
    ct_http(c, "PUT", path, org, NULL, &r);
    long st = r.status;
    ct_resp_free(&r);
    return st < 200 || st > 299 || ct_tempdir("agent", dir, 256) != 0 ? -1 : 0;
}

int ct_volunteers(const struct ct_coord *c, const char *org, const char *run, int n,
                  char (*dirs)[256])
{
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "vol%d", i);
        if (ct_volunteer_account(c, org, run, name, dirs[i]) != 0)
            return -1;
        const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", c->url, "--ca-cert",
                              c->ca, "--username", name, "--password-stdin", "--config-dir", dirs[i], NULL};
        char *out = NULL;
        int lrc = ct_run(argv, "volunteer-pw\n", &out, 60);
        if (lrc != 0)
            fprintf(stderr, "login of %s: %s\n", name, out ? out : "");
        free(out);
        if (lrc != 0)
            return -1;
    }
    return 0;
}

int ct_text_manifest(const char *dir, const char *name, size_t len, uint64_t seed, char *mpath, size_t cap)
{
    static const char *words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ",
                                  "lazy ", "dog ", "and ", "runs ", "away. ", "\n"};
    char txt[320], hex[65];
    snprintf(txt, sizeof txt, "%.250s/%s.txt", dir, name);
    snprintf(mpath, cap, "%.250s/%s.json", dir, name);
    char *buf = malloc(len + 16);
    if (!buf)
        return -1;
    size_t n = 0;
    while (n < len) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        const char *w = words[(seed >> 33) % 12];
        memcpy(buf + n, w, strlen(w));
        n += strlen(w);
    }
    FILE *f = fopen(txt, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = 0;
    uint8_t h[32];
    cm_sha256(buf, len, h);
    cm_hex_encode(h, 32, hex);
    free(buf);
    json_t *m = json_pack("{s:s, s:s, s:[{s:s+, s:I, s:s}]}", "name", name, "format", "text-bytes", "shards",
                          "url", "file://", txt, "size", (json_int_t)len, "sha256", hex);
    int rc = ok && m ? json_dump_file(m, mpath, 0) : -1;
    json_decref(m);
    return rc;
}

json_t *ct_fmnist_recipe(long steps)
{
    char ex[PATH_MAX], path[PATH_MAX + 64];
    if (!realpath("examples", ex))
        return NULL;
    snprintf(path, sizeof path, "%s/fmnist-collab.json", ex);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg)
        return NULL;
    json_t *data = json_object_get(cfg, "data");
    char tr[PATH_MAX + 64], ev[PATH_MAX + 64];
    snprintf(tr, sizeof tr, "%s/fmnist-train.manifest.json", ex);
    snprintf(ev, sizeof ev, "%s/fmnist-test.manifest.json", ex);
    json_object_set_new(data, "train", json_string(tr));
    json_object_set_new(data, "eval", json_string(ev));
    if (steps > 0)
        json_object_set_new(cfg, "steps", json_integer(steps));
    return cfg;
}

char *ct_run_body(const char *name, json_t *recipe)
{
    if (!recipe)
        return NULL;
    json_t *body = json_pack("{s:s, s:I, s:s, s:O}", "name", name, "target_batch_size",
                             json_integer_value(json_object_get(recipe, "batch_size")), "model_summary",
                             "MLP 784-256-128-10", "config", recipe);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return s;
}

double ct_median(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && v[k - 1] > v[k]; k--) {
            double t = v[k];
            v[k] = v[k - 1];
            v[k - 1] = t;
        }
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0;
}

uint8_t *ct_make_ckpt(const char *dir, uint64_t step, unsigned seed, size_t n, size_t *len,
                      char hex[65], uint8_t params[32])
{
    float *p = malloc(n * sizeof *p), *m = malloc(n * sizeof *m);
    uint8_t *b = NULL;
    if (!p || !m)
        goto out;
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)((i * 31 + seed * 7) % 1000) / 1000.0f;
        m[i] = (float)(i % 17) * 1e-3f;
    }
    struct cm_ckpt_buf opt[1] = {{.name = "adam.m", .data = m, .count = n}};
    static char config[] = "{\"model\":\"test\"}";
    struct cm_ckpt c = {.step = step, .params = p, .n_params = n, .opt = opt, .n_opt = 1,
                        .config = config, .config_len = (uint32_t)strlen(config)};
    char path[400];
    snprintf(path, sizeof path, "%s/made-%d.ckpt", dir, (int)getpid());
    uint8_t h[32];
    if (cm_ckpt_write(path, &c, h) != CM_OK)
        goto out;
    b = (uint8_t *)ct_read_file(path, len);
    unlink(path);
    cm_hex_encode(h, 32, hex);
    if (params)
        cm_sha256(p, n * sizeof *p, params);
out:
    free(p);
    free(m);
    return b;
}

int ct_wait_agents(const pid_t *pids, const char (*logs)[320], int n, int timeout_s)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st = ct_wait(pids[i], timeout_s);
        if (st != 0) {
            char *log = ct_read_file(logs[i], NULL);
            fprintf(stderr, "agent %d exited %d:\n%s\n", i, st, log ? log : "");
            free(log);
            bad++;
        }
    }
    return bad;
}
