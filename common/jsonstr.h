/* jsonstr.h: a text written as the body of a JSON string, for what psd and psctl print as
 * JSON (status replies, export headers). */
#ifndef PS_JSONSTR_H
#define PS_JSONSTR_H

#include <stddef.h>

/**
 * @brief Write @p s (NUL-terminated; borrowed) into @p out (@p cap bytes, the caller's) as a
 *  JSON string's body, without its quotes: a quote and a backslash escaped, a control byte as
 *  \\u00XX, a byte that does not begin well-formed UTF-8 as \\ufffd (a peer's or a damaged
 *  store's text must not make the JSON invalid). Always NUL-terminated when @p cap > 0, cut
 *  where it does not fit.
 * @return the length the whole text needs (without the NUL): more than @p cap - 1 when cut.
 */
size_t ps_json_str(char *out, size_t cap, const char *s);

#endif
