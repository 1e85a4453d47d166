/* utf8.h: UTF-8 well-formedness, for what psd and its tools write as JSON text. */
#ifndef PS_UTF8_H
#define PS_UTF8_H

#include <stddef.h>

/**
 * @brief The bytes of the well-formed UTF-8 sequence that starts at @p p (1 to 4; 1 for an ASCII
 *  byte), or 0 when none starts there (a stray continuation byte, an overlong form, a surrogate,
 *  a code point past U+10FFFF, or a sequence cut by the NUL at its end). @p p is NUL-terminated.
 */
static inline size_t ps_utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    int n = c < 0x80 ? 0
            : (c & 0xe0) == 0xc0 ? 1
            : (c & 0xf0) == 0xe0 ? 2
            : (c & 0xf8) == 0xf0 ? 3
                                 : -1;
    if (n < 0 || (n == 1 && c < 0xc2) || (n == 3 && c > 0xf4)) return 0;
    for (int i = 1; i <= n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0; /* the NUL stops it too */
    if ((n == 2 && c == 0xe0 && p[1] < 0xa0) || (n == 2 && c == 0xed && p[1] >= 0xa0) ||
        (n == 3 && c == 0xf0 && p[1] < 0x90) || (n == 3 && c == 0xf4 && p[1] >= 0x90))
        return 0; /* overlong, a surrogate, or past U+10FFFF */
    return (size_t)n + 1;
}

#endif
