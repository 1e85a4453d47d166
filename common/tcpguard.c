/* tcpguard.c: keeps a peer's crafted frames on UCX 1.13's TCP transport from aborting this
 * process (psd, psworker, pslaunch, psctl, and libps's programs) or writing into its memory.
 *
 * UCX's TCP transport listens on ports of its own (one per interface, picked by UCX), in every
 * process that uses it, and takes any peer that opens a connection there with its magic number
 * and a connection request: no connection request on a shard's port, no proof of a secret.
 * What follows are frames (an id byte, a 4-byte length, that many bytes), which UCX trusts:
 *   - a put request (id 33) names an address and a length, and UCX copies the bytes after it
 *     there: any peer could write anywhere in the process (with 0x10 psd died of SIGSEGV);
 *   - an id above 35, a frame longer than UCX's receive buffer, a put acknowledgement of
 *     another length than 4, a connection request of another length than UCX's, or a second
 *     one unlike the first on the same connection each fail an assertion (abort);
 *   - a connection request for an existing endpoint carries the key of that endpoint, and an
 *     even key is taken as a pointer (common/amguard.c says more of such ids).
 * UCP's messages (ids below 32) pass on to common/amguard.c's checks.
 *
 * sockhooks.c, in the executable, defines recv and send for UCX and hands every socket's bytes
 * here (psd's shard port excepted: server/cmguard.c parses it). A connection is UCX's TCP
 * transport when its initiator's first 8 bytes are UCX's magic number: those accepted (the
 * magic received) and those this process opened (the magic sent). Their frames are followed as
 * they are read, a header and a connection or put request's bytes kept, the rest counted; a
 * frame found wrong fails the read that brings it (the frame is never whole for UCX, which
 * parses frames once whole) as a reset connection, which UCX closes. Any other socket passes
 * after its first bytes. A put request passes only into a receive in flight
 * (ps_tcpguard_expect, called before each ucp_am_recv_data_nbx: UCP's rendezvous over TCP puts
 * the data where the receiver's RTR said), and the bytes it announces are then counted past. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "ps/ps_log.h"
#include "tcpaccept.h"
#include "tcpguard.h"

#define TG_MAX_FD PS_TCPGUARD_MAX_FD
#define TG_MAGIC 0xCAFEBABE12345678ull /* UCT_TCP_MAGIC_NUMBER */
#define TG_HDR 5                        /* uct_tcp_am_hdr_t: id, length u32 */
#define TG_CM 32                        /* UCT_TCP_EP_CM_AM_ID (UCT_AM_ID_MAX) */
#define TG_PUT_REQ 33
#define TG_PUT_ACK 34
#define TG_KEEPALIVE 35
#define TG_PUT_HDR 20          /* uct_tcp_ep_put_req_hdr_t: addr, length, sn */
#define TG_CM_EVENT 4          /* uct_tcp_cm_conn_event_t */
#define TG_CM_REQ 1            /* UCT_TCP_CM_CONN_REQ */
#define TG_CM_REQ_FIXED 13     /* event, flags, cm_id; the sender's address follows */
#define TG_CM_MAX (13 + 28)    /* a connection request with an IPv6 address */
#define TG_CONNECT_TO_EP 0x01  /* its flag: cm_id is the key of an endpoint */
#define TG_RX_SEG 65536        /* UCX_TCP_RX_SEG_SIZE's default: a frame's data at most */
#define TG_LOG_WARN_FIRST 20

enum { K_NEW, K_FRAMES, K_OTHER, K_REFUSED };

typedef struct {
    uint8_t kind;      /* K_*, for what is received */
    uint8_t sent;      /* first bytes sent that matched the magic; 0xff: they did not */
    uint8_t magic_got; /* magic bytes received so far (a connection psd accepted) */
    uint8_t hdr_got;   /* bytes of the current frame's header */
    uint8_t hdr[TG_HDR];
    uint8_t cm_got; /* bytes of the current connection manager frame */
    uint8_t cm[TG_CM_MAX];
    uint8_t have_req; /* a connection request came: req_hash is its body's */
    uint32_t left;    /* bytes of the current frame still to come */
    uint64_t req_hash;
    uint64_t put_left; /* bytes of a put still to come (after its request), not frames */
} tg_fd_t;

/* A receive in flight (ps_tcpguard_expect). */
typedef struct {
    uintptr_t at;
    size_t len;
} tg_span_t;

static tg_fd_t g_fd[TG_MAX_FD];
static uint32_t g_body_max = TG_RX_SEG; /* UCX's buffer is the segment and a header */
static uint64_t g_refused;
static int g_active; /* ps_tcpguard_init ran: this program's reads are checked (atomic) */
static pthread_mutex_t g_span_lock = PTHREAD_MUTEX_INITIALIZER;
static tg_span_t *g_span; /* [g_nspan], grown as needed, never shrunk */
static size_t g_nspan, g_span_cap;

uint64_t ps_ucx_env_bytes(const char *var, uint64_t max)
{
    const char *e = getenv(var); /* UCX's memory units: 64k, 1m... */
    if (e == NULL || *e == '\0') return 0;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    unsigned long long unit = (*end == 'k' || *end == 'K') ? 1ull << 10
                            : (*end == 'm' || *end == 'M') ? 1ull << 20
                            : (*end == 'g' || *end == 'G') ? 1ull << 30 : 1;
    return v > 0 && v <= max / unit ? v * unit : 0;
}

void ps_tcpguard_init(int limit_fds)
{
    __atomic_store_n(&g_active, 1, __ATOMIC_RELEASE);
    /* A socket numbered past the table would pass unchecked (a peer that holds 65536 idle
     * connections open, which UCX keeps, would get its next one past): no such numbers. And
     * as many as the hard limit allows up to there: at Debian's soft 1024, a peer's idle
     * connections used them up, UCX lost its TCP listener to EMFILE, and psd no longer heard
     * its own host's clients, for good (a helper's probe, session 59). */
    struct rlimit rl;
    if (limit_fds && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t want = rl.rlim_max < TG_MAX_FD ? rl.rlim_max : TG_MAX_FD;
        if (rl.rlim_cur != want) {
            rl.rlim_cur = want;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
    }
    uint64_t seg = ps_ucx_env_bytes("UCX_TCP_RX_SEG_SIZE", 1ull << 31);
    if (seg) g_body_max = (uint32_t)seg;
}

int ps_tcpguard_expect(const void *buf, size_t len)
{
    if (!__atomic_load_n(&g_active, __ATOMIC_ACQUIRE)) return 0; /* no one checks the puts */
    pthread_mutex_lock(&g_span_lock);
    int rc = 0;
    if (g_nspan == g_span_cap) {
        size_t cap = g_span_cap ? 2 * g_span_cap : 64;
        tg_span_t *p = realloc(g_span, cap * sizeof *p);
        if (p) g_span = p, g_span_cap = cap;
        else rc = -1;
    }
    if (rc == 0) g_span[g_nspan++] = (tg_span_t){(uintptr_t)buf, len};
    pthread_mutex_unlock(&g_span_lock);
    return rc;
}

void ps_tcpguard_forget_spans(void)
{
    pthread_mutex_lock(&g_span_lock);
    g_nspan = 0;
    pthread_mutex_unlock(&g_span_lock);
}

void ps_tcpguard_done(const void *buf)
{
    if (!__atomic_load_n(&g_active, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&g_span_lock);
    for (size_t i = 0; i < g_nspan; i++) {
        if (g_span[i].at == (uintptr_t)buf) {
            g_span[i] = g_span[--g_nspan];
            break;
        }
    }
    pthread_mutex_unlock(&g_span_lock);
}

/* Whether [@p at, @p at + @p len) lies in a receive in flight. */
static bool expected(uint64_t at, uint64_t len)
{
    bool ok = false;
    pthread_mutex_lock(&g_span_lock);
    for (size_t i = 0; i < g_nspan && !ok; i++)
        ok = at >= g_span[i].at && len <= g_span[i].len && at - g_span[i].at <= g_span[i].len - len;
    pthread_mutex_unlock(&g_span_lock);
    return ok;
}

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* FNV-1a of @p n bytes at @p p. */
static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Refuse connection @p fd for what @p fmt says: logged; its reads fail from now on. */
static int refuse(int fd, tg_fd_t *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(int fd, tg_fd_t *s, const char *fmt, ...)
{
    s->kind = K_REFUSED;
    uint64_t k = __atomic_add_fetch(&g_refused, 1, __ATOMIC_RELAXED);
    char why[128], peer[INET6_ADDRSTRLEN + 8] = "?";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        char ip[INET6_ADDRSTRLEN] = "?";
        const void *addr = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                                     : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
        unsigned port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                        : ((struct sockaddr_in *)&ss)->sin_port);
        inet_ntop(ss.ss_family, addr, ip, sizeof ip);
        snprintf(peer, sizeof peer, "%s:%u", ip, port);
    }
    int level = (k <= TG_LOG_WARN_FIRST || k % 1000 == 0) ? PS_LOG_WARN : PS_LOG_DEBUG;
    PS_LOG(level, "tcp", "closed a connection to UCX's TCP transport from %s: %s (%llu closed "
           "so far)", peer, why, (unsigned long long)k);
    return -1;
}

/* A frame's header is whole: what UCX would do with it is safe. */
static int header_check(int fd, tg_fd_t *s)
{
    unsigned id = s->hdr[0];
    uint32_t len = (uint32_t)le(s->hdr + 1, 4);
    if (id > TG_KEEPALIVE) return refuse(fd, s, "frame id %u (UCX has 0 to %u)", id, TG_KEEPALIVE);
    if (id == TG_PUT_REQ && len != TG_PUT_HDR)
        return refuse(fd, s, "a put request of %u bytes (UCX's has %u)", len, TG_PUT_HDR);
    if (id == TG_PUT_ACK && len != 4)
        return refuse(fd, s, "a put acknowledgement of %u bytes (UCX's has %u)", len, 4);
    if (id == TG_CM && (len < TG_CM_EVENT || len > TG_CM_MAX))
        return refuse(fd, s, "a connection frame of %u bytes (at most %u)", len, TG_CM_MAX);
    if (len > g_body_max)
        return refuse(fd, s, "a frame of %u bytes (UCX's buffer takes %u)", len, g_body_max);
    return 0;
}

/* UCX's ucs_sockaddr_cmp(@p a, @p b) of two addresses of family @p family: the address's bytes,
 * then the port. */
static int addr_cmp(const struct sockaddr_storage *a, const struct sockaddr_storage *b, int family)
{
    const struct sockaddr_in6 *a6 = (const void *)a, *b6 = (const void *)b;
    const struct sockaddr_in *a4 = (const void *)a, *b4 = (const void *)b;
    int r = family == AF_INET6 ? memcmp(&a6->sin6_addr, &b6->sin6_addr, 16)
                               : memcmp(&a4->sin_addr, &b4->sin_addr, 4);
    if (r) return r;
    return family == AF_INET6 ? (int)ntohs(a6->sin6_port) - (int)ntohs(b6->sin6_port)
                              : (int)ntohs(a4->sin_port) - (int)ntohs(b4->sin_port);
}

/* A connection manager frame is whole (s->cm, s->cm_got bytes). */
static int cm_check(int fd, tg_fd_t *s)
{
    if (le(s->cm, TG_CM_EVENT) != TG_CM_REQ) {
        /* An ack before the request would make an accepted endpoint connected with no peer
         * address, which the request then fails an assertion on (tcp_cm.c:557). */
        if (s->sent != 8 && !s->have_req)
            return refuse(fd, s, "a connection event %u before the connection request",
                          (unsigned)le(s->cm, TG_CM_EVENT));
        return 0; /* acks and fin: UCX looks at the event */
    }
    if (s->sent == 8) /* UCX asserts the endpoint is accepting it, or has it already */
        return refuse(fd, s, "a connection request on a connection this process opened");
    struct sockaddr_storage local, peer;
    socklen_t salen = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &salen) != 0 ||
        (local.ss_family != AF_INET && local.ss_family != AF_INET6))
        return refuse(fd, s, "a connection request on a socket that is not IP");
    int family = local.ss_family;
    unsigned sa = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (s->cm_got != TG_CM_REQ_FIXED + sa) /* UCX asserts its own length */
        return refuse(fd, s, "a connection request of %u bytes (UCX's has %u)", s->cm_got,
                      TG_CM_REQ_FIXED + sa);
    memset(&peer, 0, sizeof peer);
    memcpy(&peer, s->cm + TG_CM_REQ_FIXED, sa);
    if (peer.ss_family != family) /* UCX asserts it can compare it with its own */
        return refuse(fd, s, "a connection request from address family %u on one of %d",
                      peer.ss_family, family);
    /* Connecting to an endpoint: UCX asserts the side with the greater address accepts, and
     * takes the endpoint's key from the request (an even one as a pointer). */
    if ((s->cm[4] & TG_CONNECT_TO_EP) &&
        (!(le(s->cm + 5, 8) & 1) || addr_cmp(&peer, &local, family) >= 0))
        return refuse(fd, s, "a connection request to an endpoint UCX would not accept");
    uint64_t h = fnv(s->cm + TG_CM_EVENT, s->cm_got - TG_CM_EVENT);
    if (s->have_req && h != s->req_hash) /* UCX asserts a second one repeats the first */
        return refuse(fd, s, "a second connection request unlike the first");
    if (!s->have_req) ps_tcpaccept_settled(fd); /* its connection request came whole */
    s->have_req = 1;
    s->req_hash = h;
    return 0;
}

/* Follow @p n bytes of frames at @p p. */
static int frames(int fd, tg_fd_t *s, const uint8_t *p, size_t n)
{
    while (n > 0) {
        if (s->put_left) { /* a put's data: UCX writes it where the request said */
            size_t k = s->put_left < n ? (size_t)s->put_left : n;
            s->put_left -= k;
            p += k, n -= k;
            continue;
        }
        if (s->hdr_got < TG_HDR) {
            size_t want = (size_t)(TG_HDR - s->hdr_got), k = want < n ? want : n;
            memcpy(s->hdr + s->hdr_got, p, k);
            s->hdr_got = (uint8_t)(s->hdr_got + k);
            p += k, n -= k;
            if (s->hdr_got < TG_HDR) break;
            if (header_check(fd, s)) return -1;
            s->left = (uint32_t)le(s->hdr + 1, 4);
            s->cm_got = 0;
        } else {
            size_t k = s->left < n ? s->left : n;
            if (s->hdr[0] == TG_CM || s->hdr[0] == TG_PUT_REQ) { /* at most TG_CM_MAX */
                memcpy(s->cm + s->cm_got, p, k);
                s->cm_got = (uint8_t)(s->cm_got + k);
            }
            s->left -= (uint32_t)k;
            p += k, n -= k;
        }
        if (s->left == 0) { /* the frame is whole */
            if (s->hdr[0] == TG_CM && cm_check(fd, s)) return -1;
            if (s->hdr[0] == TG_PUT_REQ) {
                uint64_t at = le(s->cm, 8), len = le(s->cm + 8, 8);
                /* 0 bytes: UCX's flush asks for an acknowledgement so (at address 0) */
                if (len != 0 && !expected(at, len))
                    return refuse(fd, s, "a put request of %llu bytes to 0x%llx, where "
                                  "nothing is being received", (unsigned long long)len,
                                  (unsigned long long)at);
                s->put_left = len;
            }
            s->hdr_got = 0;
        }
    }
    return 0;
}

void ps_tcpguard_sent(int fd, const void *buf, size_t n)
{
    if (fd < 0 || fd >= TG_MAX_FD) return;
    tg_fd_t *s = &g_fd[fd];
    if (s->sent >= 8 || s->kind != K_NEW || s->magic_got) return; /* decided, or receiving */
    uint8_t magic[8];
    for (int i = 0; i < 8; i++)
        magic[i] = (uint8_t)(TG_MAGIC >> (8 * i));
    size_t want = (size_t)(8 - s->sent), k = want < n ? want : n;
    if (memcmp(buf, magic + s->sent, k) != 0) {
        s->sent = 0xff;
        s->kind = K_OTHER;
        return;
    }
    s->sent = (uint8_t)(s->sent + k);
    if (s->sent == 8) s->kind = K_FRAMES; /* the peer's bytes are frames from the first */
}

int ps_tcpguard_received(int fd, const void *buf, size_t n)
{
    if (fd < 0 || fd >= TG_MAX_FD) return 0;
    tg_fd_t *s = &g_fd[fd];
    const uint8_t *p = buf;
    switch (s->kind) {
    case K_OTHER: return 0;
    case K_REFUSED: return -1;
    case K_FRAMES: return frames(fd, s, p, n);
    }
    /* K_NEW: psd did not open it with the magic; UCX reads an accepted one's magic first. */
    while (n > 0 && s->magic_got < 8) {
        if (*p != (uint8_t)(TG_MAGIC >> (8 * s->magic_got))) {
            s->kind = K_OTHER;
            return 0;
        }
        s->magic_got++;
        p++, n--;
    }
    if (s->magic_got < 8) return 0;
    s->kind = K_FRAMES;
    return frames(fd, s, p, n);
}

uint64_t ps_tcpguard_closed_total(void)
{
    return __atomic_load_n(&g_refused, __ATOMIC_RELAXED);
}

int ps_tcpguard_may_read(int fd, const void *buf, size_t len)
{
    if (fd < 0 || fd >= TG_MAX_FD) return 0;
    tg_fd_t *s = &g_fd[fd];
    if (s->kind != K_FRAMES || s->put_left == 0 || len == 0) return 0;
    size_t k = s->put_left < len ? (size_t)s->put_left : len;
    if (expected((uintptr_t)buf, k)) return 0;
    return refuse(fd, s, "a put's data to 0x%llx, where nothing is being received any more",
                  (unsigned long long)(uintptr_t)buf);
}

int ps_tcpguard_refused(int fd)
{
    return fd >= 0 && fd < TG_MAX_FD && g_fd[fd].kind == K_REFUSED;
}

void ps_tcpguard_reset(int fd)
{
    if (fd < 0 || fd >= TG_MAX_FD) return;
    memset(&g_fd[fd], 0, sizeof g_fd[fd]);
}
