/* ps_log.h: level-checked logging. One stderr line per event:
 * time, level, module, message. The level is checked before the
 * arguments are evaluated. */
#ifndef PS_LOG_H
#define PS_LOG_H

enum { PS_LOG_DEBUG = 0, PS_LOG_INFO = 1, PS_LOG_WARN = 2, PS_LOG_ERROR = 3, PS_LOG_OFF = 4 };

extern int ps_log_level;

/** @brief Write one log line (use PS_LOG). @p module is a short static string. */
void ps_log_write(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** @brief Set the level from a name ("debug", "info", "warn", "error", "off", in any case);
 *  returns 0 or PS_EINVAL. Reads PS_LOG_LEVEL when @p name is NULL (unset or empty: 0; a name
 *  it does not know is said in the log, the level left as it was). */
int ps_log_set_level(const char *name);

#define PS_LOG(level, module, ...)                                  \
    do {                                                            \
        if ((level) >= ps_log_level) ps_log_write((level), (module), __VA_ARGS__); \
    } while (0)

#endif
