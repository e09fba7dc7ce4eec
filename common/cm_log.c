/* Line-oriented, thread-safe logging to stderr (see cm_log.h). Each line is
 * formatted into a local buffer and written with one write(2), so lines from
 * different threads never interleave. */
#include "cm_log.h"
#include "cm_err.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_level = -1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void log_init_from_env(void)
{
    enum cm_log_level lv = CM_LOG_INFO;
    const char *e = getenv("CROWDTRAIN_LOG_LEVEL");
    if (e && cm_log_parse_level(e, &lv) != CM_OK)
        lv = CM_LOG_INFO;
    if (g_level < 0)
        g_level = (int)lv;
}

int cm_log_parse_level(const char *s, enum cm_log_level *out)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum cm_log_level)i;
            return CM_OK;
        }
    }
    return CM_EINVAL;
}

void cm_log_set_level(enum cm_log_level level)
{
    pthread_once(&g_once, log_init_from_env);
    g_level = (int)level;
}

int cm_log_enabled(enum cm_log_level level)
{
    pthread_once(&g_once, log_init_from_env);
    return (int)level <= g_level;
}

void cm_log(enum cm_log_level level, const char *module, const char *fmt, ...)
{
    static const char *tags[] = {"error", "warn", "info", "debug"};
    if (!cm_log_enabled(level))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level], module ? module : "-");
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
