/* envflag.c: on/off switches read from the environment (envflag.h). */
#include <stdlib.h>
#include <strings.h>

#include "envflag.h"
#include "ps/ps_log.h"

static bool one_of(const char *v, const char *const *words)
{
    for (; *words; words++)
        if (strcasecmp(v, *words) == 0) return true;
    return false;
}

bool ps_env_word_off(const char *v)
{
    static const char *const off[] = {"0", "off", "false", "no", NULL};
    return v && one_of(v, off);
}

bool ps_env_off(const char *var)
{
    static const char *const on[] = {"1", "on", "true", "yes", NULL};
    const char *v = getenv(var);
    if (v == NULL || *v == '\0') return false;
    if (ps_env_word_off(v)) return true;
    if (!one_of(v, on))
        PS_LOG(PS_LOG_WARN, "env", "%s=%s: want 0 / off / false / no to turn it off, or 1 / on "
               "/ true / yes; taken as on", var, v);
    return false;
}
