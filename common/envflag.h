/* envflag.h: on/off switches read from the environment (PS_DIRECT_PULL=0 and the like). */
#ifndef PS_ENVFLAG_H
#define PS_ENVFLAG_H

#include <stdbool.h>

/**
 * @brief Whether environment variable @p var turns its feature off: "0", "off", "false" or
 *  "no", in any case. Unset, empty, "1", "on", "true" or "yes" leave it on; any other value
 *  leaves it on too and is warned about (PS_LOG, once per call site that passes it): before,
 *  `PS_DIRECT_PULL=off` was taken as on without a word (an input probe, session 63).
 *  Any thread; reads the environment (getenv) only.
 */
bool ps_env_off(const char *var);

/** @brief Whether string @p v (NULL: no) is one of ps_env_off's words for off. */
bool ps_env_word_off(const char *v);

#endif
