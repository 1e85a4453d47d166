/* log.c: stderr logging with a time stamp, level and module. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"

int ps_log_level = PS_LOG_INFO;

void ps_log_write(int level, const char *module, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[1024];
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s %-8s ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level & 3], module);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    /* One line per call, whatever the message quotes (a peer's tensor name may hold a newline
     * and a forged line after it, or a terminal's escape sequence): control bytes become '?'. */
    for (size_t i = (size_t)n; i < len; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) line[i] = '?';
    line[len++] = '\n';
    fwrite(line, 1, len, stderr); /* one write per line keeps lines whole */
}

int ps_log_set_level(const char *name)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    bool env = name == NULL;
    if (env) name = getenv("PS_LOG_LEVEL");
    if (name == NULL || (env && *name == '\0')) return 0;
    for (int i = 0; i < 5; i++)
        if (strcasecmp(name, names[i]) == 0) { /* WARN as warn */
            ps_log_level = i;
            return 0;
        }
    if (env) /* the callers go on at the level they have: said, not ignored (a probe) */
        PS_LOG(PS_LOG_WARN, "log", "PS_LOG_LEVEL=%.40s is not debug, info, warn, error or off: "
               "logging at %s", name, names[ps_log_level]);
    return PS_EINVAL;
}
