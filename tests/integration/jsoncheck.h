/* jsoncheck.h: a strict JSON (RFC 8259) checker for the tests of what psd, psctl and psbench
 * write as JSON (/status, status --json, meta.json, export headers, psbench --json). */
#ifndef PS_TESTS_JSONCHECK_H
#define PS_TESTS_JSONCHECK_H

#include <stddef.h>

/**
 * @brief Check that @p text[@p len] is exactly one JSON value, with optional whitespace around
 *  it: objects, arrays, strings (escapes as the RFC lists them, no control byte, valid UTF-8
 *  without surrogates or overlong forms), numbers by the RFC's grammar (no NaN, Infinity,
 *  leading zeros or '+'), true, false, null; no key twice in one object; nesting at most 64.
 *  @p text must be NUL-terminated or readable 3 bytes past @p len (UTF-8 is read with
 *  ps_utf8_len).
 * @return NULL when it is; else a static string naming the first fault and its byte offset
 *  with the text around it (overwritten by the next call; not thread-safe).
 */
const char *jc_invalid(const char *text, size_t len);

#endif
