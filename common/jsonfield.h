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

/* The value of the four hex digits at @p p (those of a \u escape), or -1 when they are
 * not four hex digits: it stops at the first other byte, so never reads past a text's NUL
 * (sscanf's %4x would also take fewer digits, spaces, a sign or "0x"). */
static inline long ps_json_hex4(const char *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The first byte of the string value of the first "@p key": "..." in @p json, or NULL. */
static inline const char *ps_json_str_at(const char *json, const char *key)
{
    char pat[72];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = json ? strstr(json, pat) : NULL;
    return p ? p + strlen(pat) : NULL;
}

/**
 * @brief The string value of the first "@p key": "..." in @p json, for showing it: its JSON
 *  escapes of a quote, a backslash or a slash undone, a control byte (\u00XX, \n, ...) shown as
 *  the text \xXX (never written raw to a terminal); other bytes as they are. Into the caller's
 *  @p buf (@p len > 0 bytes; always NUL-terminated, cut to @p len - 1 at a whole escape).
 * @return @p buf, or NULL when @p json is NULL or has no such string (@p buf untouched).
 */
static inline const char *ps_json_str_field(const char *json, const char *key, char *buf,
                                            size_t len)
{
    const char *p = ps_json_str_at(json, key);
    if (p == NULL) return NULL;
    size_t n = 0;
    while (*p && *p != '"') {
        char out[12] = {*p, 0};
        if (*p == '\\' && p[1]) {
            static const char simple[] = "bfnrt", ctrl[] = "\b\f\n\r\t";
            const char *e = strchr(simple, p[1]);
            long v = p[1] == 'u' ? ps_json_hex4(p + 2) : -1;
            if (v >= 0) {
                if (v < 0x20 || v == 0x7f)
                    snprintf(out, sizeof out, "\\x%02x", (unsigned)v);
                else if (v < 0x80)
                    out[0] = (char)v;
                else
                    snprintf(out, sizeof out, "\\u%04x", (unsigned)v);
                p += 6;
            } else if (e != NULL && p[1] != '\0') {
                snprintf(out, sizeof out, "\\x%02x", (unsigned)ctrl[e - simple]);
                p += 2;
            } else { /* \" \\ \/ */
                out[0] = p[1];
                p += 2;
            }
        } else {
            p++;
        }
        size_t k = strlen(out);
        if (n + k >= len) break;
        memcpy(buf + n, out, k);
        n += k;
    }
    buf[n] = '\0';
    return buf;
}

/**
 * @brief The string value of the first "@p key": "..." in @p json, exactly: its escapes undone
 *  to the bytes they stand for (\" \\ \/ \b \f \n \r \t, and \u00XX below 0x80, as psd
 *  writes a tensor's control bytes), for a name sent back to psd (the checkpoint follower's
 *  forget of a tensor named in status). Into the caller's @p buf (@p len > 0 bytes).
 * @return @p buf, or NULL when there is no such string, an escape it cannot give back as one
 *  byte (\u0000, \u0080 and up, malformed), or the value does not fit (@p buf then holds no
 *  name to use).
 */
static inline const char *ps_json_str_exact(const char *json, const char *key, char *buf,
                                            size_t len)
{
    const char *p = ps_json_str_at(json, key);
    if (p == NULL || len == 0) return NULL;
    size_t n = 0;
    for (; *p != '"'; n++) {
        if (*p == '\0' || n + 1 >= len) return NULL;
        char c = *p++;
        if (c == '\\') {
            static const char simple[] = "\"\\/bfnrt", bytes[] = "\"\\/\b\f\n\r\t";
            const char *e = *p ? strchr(simple, *p) : NULL;
            long v = *p == 'u' ? ps_json_hex4(p + 1) : -1;
            if (e != NULL) {
                c = bytes[e - simple];
                p++;
            } else if (v > 0 && v < 0x80) {
                c = (char)v;
                p += 5;
            } else {
                return NULL;
            }
        }
        buf[n] = c;
    }
    buf[n] = '\0';
    return buf;
}

#endif
