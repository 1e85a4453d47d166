/* httphead.c: the request head of psd's HTTP endpoint (see httphead.h). */
#include "httphead.h"

#include <string.h>
#include <strings.h>

static bool refuse(psd_http_req_t *req, int status, const char *why)
{
    *req = (psd_http_req_t){.status = status, .why = why};
    return true;
}

/* Whether @p m is one of HTTP's methods (RFC 9110 and PATCH): those psd does not serve get
 * 405, any other word 501. */
static bool known_method(const char *m)
{
    static const char *const known[] = {"POST",    "PUT",   "DELETE", "CONNECT",
                                        "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(m, known[i]) == 0) return true;
    return false;
}

/* The request head is complete in @p head (NUL-terminated, no NUL before the end of the head):
 * check the request line and find the path, in place. */
static bool parse(char *head, psd_http_req_t *req)
{
    char *line = head;
    size_t ll = strcspn(line, "\r\n");
    line[ll] = '\0';
    char *method = line, *sp1 = strchr(line, ' ');
    if (sp1 == NULL) return refuse(req, 400, "the request line is not METHOD PATH HTTP/1.x");
    *sp1 = '\0';
    char *target = sp1 + 1, *sp2 = strchr(target, ' ');
    if (sp2 == NULL || strchr(sp2 + 1, ' ') ||
        (strcmp(sp2 + 1, "HTTP/1.1") != 0 && strcmp(sp2 + 1, "HTTP/1.0") != 0))
        return refuse(req, 400, "the request line is not METHOD PATH HTTP/1.x");
    *sp2 = '\0';
    for (const char *p = method; *p; p++)
        if (*p < 'A' || *p > 'Z') return refuse(req, 400, "the method is not a word in capitals");
    if (method[0] == '\0') return refuse(req, 400, "the request line has no method");
    bool head_only = strcmp(method, "HEAD") == 0;
    if (!head_only && strcmp(method, "GET") != 0)
        return refuse(req, known_method(method) ? 405 : 501, "only GET and HEAD are served");
    /* The absolute form (http://host[:port]/path, as a proxy sends it) means its path, and the
     * root when it has none (the authority ends at '/', '?', '#' or the end). */
    if (strncasecmp(target, "http://", 7) == 0) {
        target += 7 + strcspn(target + 7, "/?#");
        if (*target != '/') {
            *req = (psd_http_req_t){.path = "/", .head_only = head_only};
            return true;
        }
    }
    /* A HEAD's refusal is answered without its body too (RFC 9110, 9.3.2). */
    if (target[0] != '/') {
        refuse(req, 400, "the path does not start with '/'");
        req->head_only = head_only;
        return true;
    }
    for (const unsigned char *p = (const unsigned char *)target; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f) {
            refuse(req, 400, "the path holds a control or non-ASCII byte");
            req->head_only = head_only;
            return true;
        }
    target[strcspn(target, "?#")] = '\0';
    *req = (psd_http_req_t){.path = target, .head_only = head_only};
    return true;
}

bool psd_http_head_add(psd_http_head_t *h, size_t n, psd_http_req_t *req)
{
    /* Only the new bytes are looked at (and the 3 before them, where an end of the head may
     * begin): a client sending a byte at a time costs linear time, not quadratic. */
    size_t from = h->len > 3 ? h->len - 3 : 0;
    if (n > PSD_HTTP_HEAD_MAX - h->len) /* past the room (the caller's read is bounded so) */
        n = PSD_HTTP_HEAD_MAX - h->len;
    h->len += n;
    h->head[h->len] = '\0';
    /* Empty lines before the request line are ignored (RFC 9112), also when they come in a
     * read of their own: dropped here, so that they never look like the end of a head. */
    size_t lead = strspn(h->head, "\r\n");
    if (lead) {
        memmove(h->head, h->head + lead, h->len - lead + 1);
        h->len -= lead;
        from = 0;
    }
    /* The searches stop at a NUL: an end after one is not seen, and the NUL refuses the
     * request; bytes after the end (a NUL among them too) are not looked at. */
    if (strstr(h->head + from, "\r\n\r\n") || strstr(h->head + from, "\n\n") ||
        strstr(h->head + from, "\n\r\n")) /* a line end is LF, a CR before it optional */
        return parse(h->head, req);
    if (memchr(h->head + from, '\0', h->len - from)) /* the bytes before: looked at before */
        return refuse(req, 400, "the request holds a NUL byte");
    if (h->len >= PSD_HTTP_HEAD_MAX)
        return refuse(req, 431, "the request head is longer than 8192 bytes");
    return false;
}
