/* httphead.h: the request head of psd's HTTP endpoint (httpd.h), gathered as its bytes arrive
 * and parsed. No I/O and no allocation: httpd.c reads into it, tests/fuzz/fuzz_httphead.c feeds
 * it any bytes. The outcome does not depend on how the bytes are cut into reads. */
#ifndef PSD_HTTPHEAD_H
#define PSD_HTTPHEAD_H

#include <stdbool.h>
#include <stddef.h>

#define PSD_HTTP_HEAD_MAX 8192

typedef struct {
    size_t len;                       /* bytes of head[] received (and kept) */
    char head[PSD_HTTP_HEAD_MAX + 1]; /* NUL-terminated at len */
} psd_http_head_t;

typedef struct {
    int status;       /* 0: a GET or HEAD of path; else the answer's status (400, 405, 431,
                         501) */
    const char *why;  /* status != 0: what is wrong, one line (static storage) */
    const char *path; /* status 0: the target's path, query and fragment cut off ('/' first, no
                         control, space or non-ASCII byte); points into the head, or to a
                         static "/" (an absolute form without a path) */
    bool head_only;   /* the method is HEAD (status 0, or a refused path of a HEAD) */
} psd_http_req_t;

/**
 * @brief @p n more bytes were received at @p h->head + @p h->len (at most
 *  PSD_HTTP_HEAD_MAX - @p h->len of them: where a read may write).
 * @return false while the head is not complete; true when it is complete or refused, with
 *  @p req said (then the head is not to be fed again: its path lives in it).
 * @note Blank lines before the request line are dropped (RFC 9112); the head ends at the
 *  first empty line ("\r\n\r\n" or "\n\n"), and bytes after it are not looked at; a NUL byte
 *  before that end, or PSD_HTTP_HEAD_MAX bytes without it, refuse the request.
 */
bool psd_http_head_add(psd_http_head_t *h, size_t n, psd_http_req_t *req);

#endif
