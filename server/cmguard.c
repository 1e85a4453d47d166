/* cmguard.c: keeps stray bytes and crafted connection requests on a shard's port from aborting
 * psd inside UCX 1.13.
 *
 * UCX 1.13's TCP connection manager (tcp_sockcm), which owns the port psd listens on, reads a
 * connecting peer's messages (a 16-byte header whose first 8 bytes are the length of the data
 * that follows, then that data) with recv() calls of up to its whole buffer, and asserts that
 * it never read past the message its header announced: 17 zero bytes abort the process
 * (tcp_sockcm_ep.c:825, "offset <= length"), as does a length that wraps when 16 is added.
 * UCP then parses the first message's data, the connection request, trusting it: a wrong
 * address version, an endpoint id of 0, a NaN or negative transport attribute, or status 1 in
 * the second message each fail an assertion, and a field that announces more than was sent
 * makes it read past the request. psd cannot check the bytes itself: UCX accepts and reads the
 * connection.
 *
 * So psd's executable has common/sockhooks.c (accept, accept4, recv, send, close and socket,
 * which the dynamic linker binds UCX's calls to: psd is linked with export_dynamic), and hooks
 * into them here (ps_sockhooks_port). A connection accepted on the shard's port is marked; on
 * a marked one, recv never returns bytes
 * past the end of the current message (it reads a header first, then at most the length it
 * announced), and a message UCX's client does not send reads as the end of the connection,
 * which UCX handles as a peer that went away: a request longer than UCX's buffer, one that is
 * not what a psd client's UCP 1.13 packs (parsed below as it passes, field by field, its last
 * bytes withheld unless the whole parses: UCX looks at a message only once it is complete), a
 * second message with data or a status, a third one. This stops stray bytes (scanners, health
 * checks, other protocols) and requests crafted against UCP's parser; what a well-formed
 * request asks for (which transports, at which addresses) is UCP's to judge, as from any
 * client. The bytes of every other socket go to common/tcpguard.c, which follows the frames of
 * UCX's TCP data connections; other sockets and files pass after their first bytes. */
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmguard.h"
#include "sockhooks.h"
#include "tcpaccept.h"
#include "tcpguard.h"

#define CM_MAX_FD 65536
#define CM_HDR 16                 /* uct_tcp_sockcm_priv_data_hdr_t: size_t length, status */
#define CM_MSG_MAX 2048           /* UCX's buffer (UCX_TCP_CM_PRIV_DATA_LEN, 2 KiB): a longer
                                     message fills it and UCX then spins on 0-byte reads */
#define CM_REQ_MIN 16             /* a connection request with no data never reaches the parser
                                     below (0 made UCP read stale memory); 47 bytes here */

/* The connection request as UCP 1.13 packs it (ucp_cm_ep_priv_data_pack, ucp_address_pack)
 * and the server unpacks it (ucp_conn_request_unpack_sa_data, ucp_address_unpack): sockaddr
 * data v1, then a worker address v1 without device addresses, little-endian. */
#define CM_SA_V1_PEER 0x01  /* sa_data header: version 1 (0 in bits 5-7), error mode PEER */
#define CM_SA_CM_ADDR 2     /* UCP_WIREUP_SA_DATA_CM_ADDR, the one address mode it takes */
#define CM_ADDR_V1 0x00     /* address header bits 0-3: UCP_OBJECT_VERSION_V1 */
#define CM_ADDR_UUID 0x20   /* header flag WORKER_UUID: 8 bytes follow */
#define CM_ADDR_CLIENT 0x40 /* header flag CLIENT_ID: 8 bytes follow */
#define CM_ADDR_DEBUG 0x10  /* header flag DEBUG_INFO: no name follows in a CM request */
#define CM_ADDR_FLAGS (CM_ADDR_UUID | CM_ADDR_CLIENT | CM_ADDR_DEBUG)
#define CM_MD_EMPTY 0x80  /* md byte: a device without transports */
#define CM_NULL_RSC 0xff  /* md byte: no device at all */
#define CM_LAST 0x80      /* last device / transport / endpoint address */
#define CM_DEV_PATHS 0x40 /* device length byte: a path count follows */
#define CM_DEV_SYS 0x20   /* device length byte: a system device follows */
#define CM_DEV_LEN 0x1f
#define CM_TL_HAS_EP 0x40 /* transport length byte: endpoint addresses follow */
#define CM_TL_LEN 0x3f
#define CM_LANE 0x3f       /* endpoint address lane byte */
#define CM_TL_ATTR 16      /* ucp_address_packed_iface_attr_t: 3 floats, prio and flags */
#define CM_MAX_TLS 128     /* UCP_MAX_RESOURCES */
#define CM_MAX_LANES 6     /* UCP_MAX_LANES */
#define CM_TCP_CSUM 0x19cf /* ucs_crc16_string("tcp") */
#define CM_TCP_IFACE 2     /* uct_tcp_iface_addr_t (the port), read whole by UCT */
#define CM_TCP_EP 10       /* uct_tcp_ep_addr_t (port, endpoint id), read whole by UCT */

/* What the next byte of a connection request is. */
enum {
    F_EP_ID,       /* 8 bytes: the client endpoint's id */
    F_SA_HEADER,   /* sa_data version and error handling mode */
    F_ADDR_MODE,   /* how the address is packed */
    F_DEV_INDEX,   /* unused by the server (it takes device 0) */
    F_ADDR_HEADER, /* the worker address's version and flags */
    F_SKIP,        /* bytes no one checks: uuid, client id, addresses */
    F_MD,          /* a device: its memory domain index and flags */
    F_DEV_LEN,     /* its address length and flags */
    F_PATHS,       /* its path count */
    F_SYS_DEV,     /* its system device */
    F_TL_CSUM,     /* a transport: its name's checksum (2 bytes) */
    F_TL_ATTR,     /* its attributes (CM_TL_ATTR bytes) */
    F_TL_LEN,      /* its address length and flags */
    F_EP_LEN,      /* an endpoint address's length */
    F_EP_LANE,     /* its lane and flag */
    F_END,         /* the address is complete: no byte may follow */
};

typedef struct {
    uint8_t field;           /* F_*: what the next byte is */
    uint8_t then;            /* the field after F_SKIP */
    uint8_t skip;            /* bytes F_SKIP still passes over */
    uint8_t got;             /* bytes of a multi-byte field read so far */
    uint8_t buf[CM_TL_ATTR]; /* that field */
    uint8_t dev;             /* the current device's length byte (its flags) */
    uint8_t tl;              /* the current transport's length byte (its flags) */
    uint16_t csum;           /* the current transport's name checksum */
    uint8_t tls;             /* transports so far */
    uint8_t eps;             /* endpoint addresses of the current transport */
} cm_req_t;

typedef struct {
    uint8_t on;      /* accepted on the guarded port (atomic: set and cleared by other calls) */
    uint8_t dead;    /* a message was refused: every read is the end of the connection */
    uint8_t hdr_got; /* header bytes of the current message read so far */
    uint8_t hdr[CM_HDR];
    uint8_t msgs;  /* messages whose header was read */
    uint64_t left; /* data bytes of the current message still to read */
    cm_req_t req;  /* the connection request's parse so far */
} cm_fd_t;

static cm_fd_t g_fd[CM_MAX_FD];
static struct sockaddr_storage g_addr; /* the guarded listening address (psd_cmguard_listen) */
static int g_on;                       /* g_addr is set (atomic) */
static uint64_t g_msg_max = CM_MSG_MAX; /* UCX_TCP_CM_PRIV_DATA_LEN when set */

static void cm_accepted(int lfd, int fd);
static void cm_reset(int fd);
static int cm_recv(int fd, void *buf, size_t len, int flags, ssize_t *ret);
static const ps_sockhooks_port_t g_hooks = {cm_accepted, cm_reset, cm_recv};

void psd_cmguard_listen(const struct sockaddr *sa, socklen_t len)
{
    uint64_t max = ps_ucx_env_bytes("UCX_TCP_CM_PRIV_DATA_LEN", 1ull << 30);
    if (max) g_msg_max = max;
    if (len > sizeof g_addr) return;
    memcpy(&g_addr, sa, len);
    __atomic_store_n(&g_on, 1, __ATOMIC_RELEASE);
    ps_sockhooks_port(&g_hooks);
}

/* Whether @p a (a listening socket's own address) is the guarded one: the same family and port,
 * and the same IP unless the guarded one is a wildcard. UCX's data transport listens on
 * ephemeral ports of each interface: the same number on another IP is not psd's port. */
static bool guarded(const struct sockaddr_storage *a)
{
    const struct sockaddr_storage *g = &g_addr;
    if (a->ss_family != g->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)g;
        return x->sin_port == y->sin_port && (y->sin_addr.s_addr == htonl(INADDR_ANY) ||
                                              x->sin_addr.s_addr == y->sin_addr.s_addr);
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)g;
        return x->sin6_port == y->sin6_port &&
               (IN6_IS_ADDR_UNSPECIFIED(&y->sin6_addr) ||
                memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0);
    }
    return false;
}

/* A connection accepted on listening socket @p lfd: marked when that is the guarded address. */
static void cm_accepted(int lfd, int fd)
{
    if (fd >= CM_MAX_FD) return;
    cm_fd_t *s = &g_fd[fd];
    memset(s, 0, sizeof *s);
    if (!__atomic_load_n(&g_on, __ATOMIC_ACQUIRE)) return;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &len) != 0) return;
    __atomic_store_n(&s->on, guarded(&ss), __ATOMIC_RELEASE);
}

/* A socket closed or made: never marked (should a marked one have been closed some other
 * way). */
static void cm_reset(int fd)
{
    if (fd < CM_MAX_FD) __atomic_store_n(&g_fd[fd].on, 0, __ATOMIC_RELEASE);
}

/* ---- the connection request -------------------------------------------------------------- */

/* Pass over @p n bytes, then read field @p then. */
static void req_skip(cm_req_t *r, unsigned n, uint8_t then)
{
    r->skip = (uint8_t)n;
    r->field = n ? F_SKIP : then;
    r->then = then;
}

/* Keep byte @p b of a field of @p n bytes: true once the field is whole (in r->buf). */
static bool req_collect(cm_req_t *r, uint8_t b, unsigned n)
{
    r->buf[r->got++] = b;
    if (r->got < n) return false;
    r->got = 0;
    return true;
}

/* A device's optional bytes after its length byte, in the order address.c packs them (those
 * after field @p done), then its address (none from a client: the CM gives the server the
 * peer's address instead), then its first transport. */
static void req_dev_next(cm_req_t *r, uint8_t done)
{
    if (done < F_PATHS && (r->dev & CM_DEV_PATHS))
        r->field = F_PATHS;
    else if (done < F_SYS_DEV && (r->dev & CM_DEV_SYS))
        r->field = F_SYS_DEV;
    else
        req_skip(r, r->dev & CM_DEV_LEN, F_TL_CSUM);
}

/* What follows a transport's last byte: the next transport, the next device or the end. */
static uint8_t req_after_tl(const cm_req_t *r)
{
    if (!(r->tl & CM_LAST)) return F_TL_CSUM;
    return (r->dev & CM_LAST) ? F_END : F_MD;
}

/* Whether packed attributes @p a are ones UCP 1.13 packs: overhead and latency finite and not
 * negative, bandwidth finite and positive (a NaN, or a negative overhead, fails an assertion in
 * lane selection, select.c "score >= 0.0"; a negative bandwidth is how UCX 1.11 and older
 * packed it). Priority and capability flags only steer the selection. */
static bool req_attr_ok(const uint8_t *a)
{
    float overhead, bandwidth, lat_ovh;
    memcpy(&overhead, a, 4);
    memcpy(&bandwidth, a + 4, 4);
    memcpy(&lat_ovh, a + 8, 4);
    return isfinite(overhead) && overhead >= 0 && isfinite(bandwidth) && bandwidth > 0 &&
           isfinite(lat_ovh) && lat_ovh >= 0;
}

/* Byte @p b of a connection request, in parse state @p r: false if no psd client's UCP 1.13
 * packs it there. Lengths are checked against what the message holds by its end (F_END). */
static bool req_byte(cm_req_t *r, uint8_t b)
{
    switch (r->field) {
    case F_EP_ID: /* UCP asserts the id is not 0 (ucp_ep.inl "remote_id != 0") */
        if (!req_collect(r, b, 8)) return true;
        r->field = F_SA_HEADER;
        for (int i = 0; i < 8; i++)
            if (r->buf[i]) return true;
        return false;
    case F_SA_HEADER: /* a psd client's: v1, PEER (UCX_SA_DATA_VERSION=v2 is not one) */
        r->field = F_ADDR_MODE;
        return b == CM_SA_V1_PEER;
    case F_ADDR_MODE:
        r->field = F_DEV_INDEX;
        return b == CM_SA_CM_ADDR;
    case F_DEV_INDEX:
        r->field = F_ADDR_HEADER;
        return true;
    case F_ADDR_HEADER: /* another version fails an assertion (address.c "addr version");
                           v2 (UCX_ADDRESS_VERSION=v2) is not parsed here; AM_ONLY no psd
                           client asks for; with UCX_ADDRESS_DEBUG_INFO a client sets DEBUG_INFO
                           but packs no name, and the server reads none */
        if ((b & 0x0f) != CM_ADDR_V1 || (b & 0xf0 & ~CM_ADDR_FLAGS)) return false;
        req_skip(r, ((b & CM_ADDR_UUID) ? 8u : 0u) + ((b & CM_ADDR_CLIENT) ? 8u : 0u), F_MD);
        return true;
    case F_SKIP:
        if (--r->skip == 0) r->field = r->then;
        return true;
    case F_MD: /* a client packs only devices with transports, and at least one */
        r->field = F_DEV_LEN;
        return b != CM_NULL_RSC && !(b & CM_MD_EMPTY);
    case F_DEV_LEN:
        r->dev = b;
        req_dev_next(r, F_DEV_LEN);
        return true;
    case F_PATHS: /* packed only when more than 1 */
        req_dev_next(r, F_PATHS);
        return b >= 2;
    case F_SYS_DEV: /* packed only when known */
        req_dev_next(r, F_SYS_DEV);
        return b != 0xff;
    case F_TL_CSUM:
        if (r->got == 0 && r->tls++ == CM_MAX_TLS) return false;
        if (!req_collect(r, b, 2)) return true;
        r->csum = (uint16_t)(r->buf[0] | r->buf[1] << 8);
        r->field = F_TL_ATTR;
        return true;
    case F_TL_ATTR:
        if (!req_collect(r, b, CM_TL_ATTR)) return true;
        r->field = F_TL_LEN;
        return req_attr_ok(r->buf);
    case F_TL_LEN: /* UCT reads a TCP address whole, whatever length came with it */
        r->tl = b;
        r->eps = 0;
        req_skip(r, b & CM_TL_LEN, (b & CM_TL_HAS_EP) ? F_EP_LEN : req_after_tl(r));
        return r->csum != CM_TCP_CSUM || (b & CM_TL_LEN) == CM_TCP_IFACE;
    case F_EP_LEN:
        req_skip(r, b, F_EP_LANE);
        return b > 0 && r->eps++ < CM_MAX_LANES && (r->csum != CM_TCP_CSUM || b == CM_TCP_EP);
    case F_EP_LANE:
        r->field = (b & CM_LAST) ? req_after_tl(r) : F_EP_LEN;
        return (b & ~(CM_LAST | CM_LANE)) == 0 && (b & CM_LANE) < CM_MAX_LANES;
    default: /* F_END: bytes after the address */
        return false;
    }
}

/* Feed @p n bytes of a connection request to its parse @p r; @p ends: they are its last. */
static bool req_feed(cm_req_t *r, const uint8_t *p, size_t n, bool ends)
{
    for (size_t i = 0; i < n; i++)
        if (!req_byte(r, p[i])) return false;
    return !ends || r->field == F_END;
}

/* ---- reads on the shard's port ------------------------------------------------------------ */

/* recv on marked connection @p fd: never past the current message, and the end of the
 * connection for anything UCX's client does not send. */
static ssize_t cm_read(int fd, void *buf, size_t len, int flags)
{
    cm_fd_t *s = &g_fd[fd];
    if (s->dead) return 0;
    size_t cap = s->hdr_got < CM_HDR ? (size_t)(CM_HDR - s->hdr_got) : (size_t)s->left;
    if (len > cap) len = cap;
    ssize_t n = ps_sockhooks_real_recv(fd, buf, len, flags);
    if (n <= 0) return n;
    if (s->hdr_got < CM_HDR) {
        memcpy(s->hdr + s->hdr_got, buf, (size_t)n);
        s->hdr_got = (uint8_t)(s->hdr_got + n);
        if (s->hdr_got == CM_HDR) {
            uint64_t length;
            memcpy(&length, s->hdr, sizeof length);
            /* A client sends two messages: its connection request, then a header alone (the
             * notification that it connected), each with status UCS_OK (UCP asserts a status
             * it is handed is an error). Anything else is not UCX's client. */
            bool ok = s->msgs == 0 ? length >= CM_REQ_MIN && length <= g_msg_max
                    : s->msgs == 1 ? length == 0
                                   : false;
            ok = ok && s->hdr[8] == 0; /* the status byte */
            s->msgs++;
            if (!ok) {
                s->dead = 1; /* UCX sees the peer go away before its header was whole */
                return 0;
            }
            s->left = length;
            if (length == 0) s->hdr_got = 0; /* a header alone: the next message starts */
        }
    } else {
        /* The connection request passes as it comes, checked; UCX parses it once it has it
         * whole, so a request found wrong by its last byte at the latest never reaches UCP. */
        if (s->msgs == 1 && !req_feed(&s->req, buf, (size_t)n, (uint64_t)n == s->left)) {
            s->dead = 1;
            return 0;
        }
        s->left -= (uint64_t)n;
        if (s->left == 0) {
            s->hdr_got = 0;
            if (s->msgs == 1) ps_tcpaccept_settled(fd); /* its request came whole */
        }
    }
    return n;
}

/* recv on @p fd (sockhooks.c): a connection accepted on the shard's port is read here. */
static int cm_recv(int fd, void *buf, size_t len, int flags, ssize_t *ret)
{
    if (fd >= CM_MAX_FD || !__atomic_load_n(&g_fd[fd].on, __ATOMIC_ACQUIRE)) return 0;
    *ret = cm_read(fd, buf, len, flags);
    return 1;
}
