/* jsonfield.h: one value of a flat JSON object, as psd's status replies print them
 * ("key": value, or "key": "value"). For tools that read those replies (psctl, psbench); not a
 * JSON parser: it takes the first occurrence of the key anywhere in the text. */
#ifndef PS_JSONFIELD_H
#define PS_JSONFIELD_H

#include <stdio.h>
#include <string.h>

/**
 * @brief The value of the first "@p key": in @p json, without quotes, into the caller's @p buf
 *  (@p len > 0 bytes; always NUL-terminated, cut to @p len - 1).
 * @return @p buf, or NULL when @p json is NULL or has no such key (@p buf untouched).
 */
static inline const char *ps_json_field(const char *json, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = json ? strstr(json, pat) : NULL;
    if (p == NULL) return NULL;
    p += strlen(pat);
    if (*p == '"') p++;
    size_t n = strcspn(p, "\",}");
    if (n >= len) n = len - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return buf;
}

#endif
