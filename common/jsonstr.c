/* jsonstr.c: see jsonstr.h. */
#include "jsonstr.h"

#include <stdio.h>
#include <string.h>

#include "utf8.h"

size_t ps_json_str(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (size_t len; *s; s += len) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        const char *put = esc;
        int k;
        len = ps_utf8_len((const unsigned char *)s);
        if (len == 0) { /* not UTF-8 (a foreign peer's error text, a damaged store's name) */
            len = 1;
            k = snprintf(esc, sizeof esc, "\\ufffd");
        } else if (ch == '"' || ch == '\\')
            k = snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch < 0x20)
            k = snprintf(esc, sizeof esc, "\\u%04x", ch);
        else {
            put = s;
            k = (int)len;
        }
        if (n + (size_t)k < cap) memcpy(out + n, put, (size_t)k);
        n += (size_t)k;
    }
    if (cap) out[n < cap ? n : cap - 1] = '\0';
    return n;
}
