/* Logging for every Crowdtrain process: one line per event on stderr,
 * "2026-11-22T11:12:24.123Z level module: message". Thread-safe. The level
 * comes from cm_log_set_level() or the CROWDTRAIN_LOG_LEVEL environment
 * variable (error, warn, info, debug). */
#ifndef CM_LOG_H
#define CM_LOG_H

enum cm_log_level { CM_LOG_ERROR = 0, CM_LOG_WARN, CM_LOG_INFO, CM_LOG_DEBUG };

void cm_log_set_level(enum cm_log_level level);
/* Parses "error|warn|info|debug"; returns CM_EINVAL for anything else. */
int cm_log_parse_level(const char *s, enum cm_log_level *out);
int cm_log_enabled(enum cm_log_level level);
void cm_log(enum cm_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CM_LOGE(mod, ...) cm_log(CM_LOG_ERROR, mod, __VA_ARGS__)
#define CM_LOGW(mod, ...) cm_log(CM_LOG_WARN, mod, __VA_ARGS__)
#define CM_LOGI(mod, ...) cm_log(CM_LOG_INFO, mod, __VA_ARGS__)
#define CM_LOGD(mod, ...)                                       \
    do {                                                        \
        if (cm_log_enabled(CM_LOG_DEBUG))                       \
            cm_log(CM_LOG_DEBUG, mod, __VA_ARGS__);             \
    } while (0)

#endif
