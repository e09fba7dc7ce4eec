/* A connection flood against the coordinator, for bench_coordinator.sh
 * (issue 22): keeps `per_addr` connections open from each of `naddr`
 * loopback addresses (127.0.1.1, 127.0.1.2, ...) for `seconds`, reopening
 * every one the server closes, so the pressure never lets up.
 *
 *   idle: TCP connections that never send a byte (not even a TLS hello);
 *   slow: TLS connections that send a request line and then one header line
 *         per second, never finishing the headers (slowloris).
 *
 *   bench_flood PORT CA idle|slow NADDR PER_ADDR SECONDS
 *
 * Prints how many connections it opened, how many the server closed, and
 * how many were open at the end. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct slot {
    int fd;
    SSL *ssl;
    int addr; /* index of the source address */
    double next_line;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint16_t g_port;
static SSL_CTX *g_ctx;
static int g_slow;
static long g_opened, g_failed;

static void slot_close(struct slot *s)
{
    if (s->ssl)
        SSL_free(s->ssl);
    s->ssl = NULL;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

static int slot_open(struct slot *s)
{
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (s->fd < 0)
        return -1;
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000100u + 1u + (unsigned)s->addr); /* 127.0.1.x */
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(g_port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {2, 0};
    setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (bind(s->fd, (struct sockaddr *)&src, sizeof src) != 0 ||
        connect(s->fd, (struct sockaddr *)&dst, sizeof dst) != 0)
        goto fail;
    if (g_slow) {
        s->ssl = SSL_new(g_ctx);
        SSL_set_fd(s->ssl, s->fd);
        SSL_set_tlsext_host_name(s->ssl, "localhost");
        const char *line = "GET /api/v1/runs HTTP/1.1\r\nHost: localhost\r\n";
        if (SSL_connect(s->ssl) != 1 || SSL_write(s->ssl, line, (int)strlen(line)) <= 0)
            goto fail;
        s->next_line = now_s() + 1.0;
    }
    g_opened++;
    return 0;
fail:
    ERR_clear_error();
    slot_close(s);
    g_failed++;
    return -1;
}

/* 1 when the server has closed the slot's connection. */
static int slot_dead(struct slot *s)
{
    char b[512];
    ssize_t n = recv(s->fd, b, sizeof b, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: bench_flood PORT CA idle|slow NADDR PER_ADDR SECONDS\n");
        return 2;
    }
    g_port = (uint16_t)atoi(argv[1]);
    g_slow = !strcmp(argv[3], "slow");
    int naddr = atoi(argv[4]), per = atoi(argv[5]);
    double seconds = atof(argv[6]);
    int n = naddr * per;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    g_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(g_ctx, argv[2], NULL);
    SSL_CTX_set_verify(g_ctx, SSL_VERIFY_PEER, NULL);
    struct slot *slots = calloc((size_t)n, sizeof *slots);
    if (!slots)
        return 1;
    for (int i = 0; i < n; i++) {
        slots[i].fd = -1;
        slots[i].addr = i % naddr;
    }
    double end = now_s() + seconds;
    long closed_by_server = 0;
    while (now_s() < end) {
        double t = now_s();
        for (int i = 0; i < n && now_s() < end; i++) {
            struct slot *s = &slots[i];
            if (s->fd >= 0 && slot_dead(s)) {
                closed_by_server++;
                slot_close(s);
            }
            if (s->fd < 0) {
                slot_open(s);
                continue;
            }
            if (g_slow && t >= s->next_line) {
                if (SSL_write(s->ssl, "X-Slow: 1\r\n", 11) <= 0) {
                    ERR_clear_error();
                    closed_by_server++;
                    slot_close(s);
                }
                s->next_line = t + 1.0;
            }
        }
        usleep(20000);
    }
    int open = 0;
    for (int i = 0; i < n; i++)
        if (slots[i].fd >= 0 && !slot_dead(&slots[i]))
            open++;
    printf("flood %s: %d addresses x %d: opened %ld, refused or failed %ld, closed by the server "
           "%ld, open at the end %d\n",
           argv[3], naddr, per, g_opened, g_failed, closed_by_server, open);
    for (int i = 0; i < n; i++)
        slot_close(&slots[i]);
    free(slots);
    SSL_CTX_free(g_ctx);
    return 0;
}
