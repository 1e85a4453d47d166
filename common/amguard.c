/* amguard.c: keeps a peer's crafted UCP message from crashing this process inside UCX 1.13.
 *
 * UCP finds the endpoint or the request a message is about by an 8-byte id that the *sender*
 * writes into the message (ucs_ptr_map): an odd id is a key looked up in a hash, an even one is
 * taken as a pointer and dereferenced. Every endpoint and request of psd and libps has an odd
 * id (their endpoints use peer error handling, which makes UCP hand out keys: psd's cmguard
 * refuses other connection requests), so a message naming an even id is crafted: before, one
 * 45-byte message on a data connection (UCX's TCP transport accepts any peer that sends its
 * magic number and a connection request) killed psd with SIGSEGV in ucp_am_handler_reply, with
 * no proof of the secret needed. UCP also trusts the lengths inside its headers (a user header
 * longer than the message is read past its end; UCP asserts on some), the wireup message's
 * type (an unknown one aborts) and the rendezvous opcode (a tag one on a worker without tags).
 *
 * So before the first worker is made, each of the ten handlers UCP registers for a context with
 * UCP_FEATURE_AM (ucp_am_handlers[], exported by libucp: wireup, rendezvous RTS / ATS / RTR /
 * DATA / ATP, active messages single / first / middle / single with reply) gets a wrapper that
 * checks the message against UCP 1.13's formats (ucp_am.h, rndv.h, proto_am.h, wireup.h) and
 * drops it (UCS_OK: the transport frees it) when an id UCP would look up is even, a header does
 * not fit, or a field is out of its range. Each drop is counted and logged. A message that
 * passes is handed to UCP's handler unchanged: one indirect call and a few compares more. The
 * handlers are the process's; only messages to the workers psd and libps made (ps_amguard_watch)
 * are checked: another library's workers in a user's process that loaded libps (torch's UCX
 * backends) may use endpoints without peer error handling, whose ids are pointers.
 *
 * UCP copies a multi-fragment message's middle fragments to the offset they name, without a
 * bound (the total comes in the first): a middle passes only where the message's bytes so far
 * end (frag_middle). Not checked (docs/DESIGN-NOTES.md, Known limits): the worker addresses
 * inside wireup messages and the packed memory keys inside rendezvous messages (UCP parses
 * them). Transport-level frames below UCP (UCX's TCP put requests: psd's tcpguard.c) are not
 * seen here. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "amguard.h"
#include "ps/ps_log.h"

/* ucp_am_handler_t of UCP 1.13 (ucp_context.h). */
typedef struct {
    uint64_t features;
    uct_am_callback_t cb;
    void *tracer;
    uint32_t flags;
    uct_am_callback_t proxy_cb;
} ucp13_am_handler_t;

/* UCP 1.13's message ids (ucp_types.h) of the handlers a UCP_FEATURE_AM context registers. */
enum {
    ID_WIREUP = 1,
    ID_RNDV_RTS = 9,
    ID_RNDV_ATS = 10,
    ID_RNDV_RTR = 11,
    ID_RNDV_DATA = 12,
    ID_RNDV_ATP = 16,
    ID_AM_SINGLE = 23,
    ID_AM_FIRST = 24,
    ID_AM_MIDDLE = 25,
    ID_AM_SINGLE_REPLY = 26,
    ID_COUNT = 27, /* UCP_AM_ID_LAST */
};

/* Sizes of UCP 1.13's packed headers. */
#define AM_HDR 8             /* ucp_am_hdr_t: am_id u16, flags u16, header_length u32 */
#define AM_REPLY_FTR 8       /* ucp_am_reply_ftr_t: ep_id */
#define AM_FIRST_FTR 24      /* ucp_am_first_ftr_t: msg_id, ep_id, total_size */
#define AM_MID_HDR 8         /* ucp_am_mid_hdr_t: offset */
#define AM_MID_FTR 16        /* ucp_am_mid_ftr_t: msg_id, ep_id */
#define RTS_HDR 41           /* ucp_rndv_rts_hdr_t: am hdr, ep_id, req_id, address, size, opcode */
#define RTS_OPCODE_AM 1      /* UCP_RNDV_RTS_AM (a tag RTS needs UCP_FEATURE_TAG) */
#define RTR_HDR 40           /* ucp_rndv_rtr_hdr_t: sreq_id, rreq_id, address, size, offset */
#define REPLY_HDR 9          /* ucp_reply_hdr_t: req_id, status (a packed 1-byte enum); ATS
                                and ATP carry a size after it (17 bytes) */
#define DATA_HDR 16          /* ucp_request_data_hdr_t: req_id, offset */
#define WIREUP_HDR 20        /* ucp_wireup_msg_t: type, err_mode, conn_sn u16, src, dst ids */
#define WIREUP_EP_REMOVED 5 /* the last UCP_WIREUP_MSG_* */
#define USER_AM_IDS 0x6u           /* the ids psd and libps register: 1 and 2 (proto/wire.h,
                                      PS_AM_CTRL, PS_AM_DATA); UCP 1.13 leaves the slots below
                                      the highest registered one uninitialised (ucp_am.c:264
                                      clears slot `id`, not `i`) and calls what it finds there */
#define AM_TOTAL_MAX (1ull << 32)  /* a multi-fragment message: at most 4 GiB */
#define LOG_WARN_FIRST 20          /* refusals logged at warn level; then every 1000th */

/* The head of UCP 1.13's ucp_worker_iface_t, a proxy handler's argument (ucp_worker.h). */
typedef struct {
    uct_iface_h iface;
    uct_iface_attr_t attr;
    ucp_worker_h worker;
} ucp13_worker_iface_t;

#define WATCH_MAX 16 /* workers checked at once */

static uct_am_callback_t g_cb[ID_COUNT], g_proxy[ID_COUNT];
static ucp_worker_h g_watch[WATCH_MAX];
static uint64_t g_refused;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static uint64_t le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint16_t le16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* An id UCP looks up: an odd key. (An even one is a pointer to UCP.) */
static bool key_ok(uint64_t id)
{
    return (id & 1) != 0;
}

/* The checks of an active message's ucp_am_hdr_t at @p p, with @p room bytes after the header
 * for the user header. NULL when fine, else what is wrong. */
static const char *am_hdr_check(const uint8_t *p, size_t room)
{
    uint16_t id = le16(p);
    if (id >= 32 || !((USER_AM_IDS >> id) & 1)) return "an active message id not registered";
    if (le32(p + 4) > room) return "a user header longer than the message";
    return NULL;
}

/* Multi-fragment messages begun (a first fragment passed) and not yet whole, per worker,
 * endpoint and message id: a middle fragment passes only at the offset where the bytes so far
 * end, and within the total. Our senders put a message's fragments on one lane, in order
 * (ps_ucx_init_tls sets MAX_EAGER_RAILS=1, UCX's default). A fixed table: a message begun
 * long ago may be pushed out by newer ones (then its middles are dropped: never passed
 * unchecked). */
#define FRAG_SLOTS 8192 /* a power of 2; ~0.4 MB */
#define FRAG_PROBE 16
typedef struct {
    ucp_worker_h w; /* NULL: free */
    uint64_t ep, msg, total, got, stamp;
} frag_t;
static frag_t g_frag[FRAG_SLOTS];
static uint64_t g_frag_clock;
static pthread_mutex_t g_frag_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t frag_home(ucp_worker_h w, uint64_t ep, uint64_t msg)
{
    uint64_t h = ((uint64_t)(uintptr_t)w ^ (ep * 0x9e3779b97f4a7c15ull) ^ (msg * 0xc2b2ae3d27d4eb4full));
    return (size_t)((h ^ (h >> 29)) & (FRAG_SLOTS - 1));
}

static frag_t *frag_find(ucp_worker_h w, uint64_t ep, uint64_t msg)
{
    size_t home = frag_home(w, ep, msg);
    for (size_t i = 0; i < FRAG_PROBE; i++) {
        frag_t *f = &g_frag[(home + i) & (FRAG_SLOTS - 1)];
        if (f->w == w && f->ep == ep && f->msg == msg) return f;
    }
    return NULL;
}

/* The first fragment of message @p msg (@p here of @p total bytes) passes unless it is begun
 * already (UCP asserts it is not). */
static const char *frag_first(ucp_worker_h w, uint64_t ep, uint64_t msg, uint64_t here,
                              uint64_t total)
{
    pthread_mutex_lock(&g_frag_lock);
    const char *why = NULL;
    if (frag_find(w, ep, msg)) {
        why = "a first fragment of a message begun already";
    } else {
        size_t home = frag_home(w, ep, msg);
        frag_t *slot = NULL;
        for (size_t i = 0; i < FRAG_PROBE; i++) { /* a free one, else the oldest */
            frag_t *f = &g_frag[(home + i) & (FRAG_SLOTS - 1)];
            if (f->w == NULL) {
                slot = f;
                break;
            }
            if (slot == NULL || f->stamp < slot->stamp) slot = f;
        }
        *slot = (frag_t){w, ep, msg, total, here, ++g_frag_clock};
    }
    pthread_mutex_unlock(&g_frag_lock);
    return why;
}

/* A middle fragment of @p len bytes at @p offset of message @p msg. */
static const char *frag_middle(ucp_worker_h w, uint64_t ep, uint64_t msg, uint64_t offset,
                               uint64_t len)
{
    pthread_mutex_lock(&g_frag_lock);
    const char *why = NULL;
    frag_t *f = frag_find(w, ep, msg);
    if (f == NULL)
        why = "a middle fragment of no message begun";
    else if (offset != f->got || len > f->total - f->got)
        why = "a middle fragment out of its message's place";
    else if ((f->got += len) == f->total)
        f->w = NULL; /* whole */
    pthread_mutex_unlock(&g_frag_lock);
    return why;
}

/* What is wrong with message @p id of @p n bytes at @p d for worker @p w, or NULL. */
static const char *check(ucp_worker_h w, unsigned id, const uint8_t *d, size_t n)
{
    switch (id) {
    case ID_AM_SINGLE:
        if (n < AM_HDR) return "shorter than its header";
        return am_hdr_check(d, n - AM_HDR);
    case ID_AM_SINGLE_REPLY:
        if (n < AM_HDR + AM_REPLY_FTR) return "shorter than its header and footer";
        if (!key_ok(le64(d + n - AM_REPLY_FTR))) return "an endpoint id that is not a key";
        return am_hdr_check(d, n - AM_HDR - AM_REPLY_FTR);
    case ID_AM_FIRST: {
        if (n < AM_HDR + AM_FIRST_FTR) return "shorter than its header and footer";
        const uint8_t *ftr = d + n - AM_FIRST_FTR;
        if (!key_ok(le64(ftr + 8))) return "an endpoint id that is not a key";
        const char *e = am_hdr_check(d, n - AM_HDR - AM_FIRST_FTR);
        if (e) return e;
        uint64_t here = n - AM_HDR - AM_FIRST_FTR - le32(d + 4), total = le64(ftr + 16);
        if (here > total || total > AM_TOTAL_MAX) return "a total size out of range";
        if (here == total) return NULL; /* the whole message in one: UCP takes it so */
        return frag_first(w, le64(ftr + 8), le64(ftr), here, total);
    }
    case ID_AM_MIDDLE:
        if (n <= AM_MID_HDR + AM_MID_FTR) return "not longer than its header and footer";
        if (!key_ok(le64(d + n - 8))) return "an endpoint id that is not a key";
        return frag_middle(w, le64(d + n - 8), le64(d + n - 16), le64(d),
                           n - AM_MID_HDR - AM_MID_FTR);
    case ID_RNDV_RTS:
        if (n < RTS_HDR) return "shorter than its header";
        if (d[40] != RTS_OPCODE_AM) return "not an active message's rendezvous";
        if (!key_ok(le64(d + 8))) return "an endpoint id that is not a key";
        return am_hdr_check(d, n - RTS_HDR);
    case ID_RNDV_RTR:
        if (n < RTR_HDR) return "shorter than its header";
        if (!key_ok(le64(d))) return "a request id that is not a key";
        return NULL;
    case ID_RNDV_ATS:
    case ID_RNDV_ATP:
        if (n < REPLY_HDR) return "shorter than its header";
        if (!key_ok(le64(d))) return "a request id that is not a key";
        return NULL;
    case ID_RNDV_DATA: /* UCP bounds offset + length by the receive, a sum that can wrap */
        if (n < DATA_HDR) return "shorter than its header";
        if (!key_ok(le64(d))) return "a request id that is not a key";
        if (le64(d + 8) >= AM_TOTAL_MAX) return "an offset out of range";
        return NULL;
    case ID_WIREUP: {
        if (n < WIREUP_HDR) return "shorter than its header";
        uint8_t type = d[0];
        uint64_t dst = le64(d + 12);
        if (type > WIREUP_EP_REMOVED) return "an unknown wireup message type";
        if (d[1] > UCP_ERR_HANDLING_MODE_PEER) return "an unknown error handling mode";
        /* Our endpoints all have a connection manager lane, so UCP packs their peer's id in
         * every wireup message (wireup.c:203); without one a request would have UCP make an
         * endpoint, and connect out, to whatever address it carries. */
        if (dst == 0) return "no destination endpoint";
        if (dst != 0 && !key_ok(dst)) return "an endpoint id that is not a key";
        return NULL;
    }
    }
    return NULL;
}

static void refused(unsigned id, size_t n, const char *why)
{
    uint64_t k = __atomic_add_fetch(&g_refused, 1, __ATOMIC_RELAXED);
    int level = (k <= LOG_WARN_FIRST || k % 1000 == 0) ? PS_LOG_WARN : PS_LOG_DEBUG;
    PS_LOG(level, "ucx",
           "dropped a crafted UCP message (UCP id %u, %zu bytes): %s (%llu dropped so far)",
           id, n, why, (unsigned long long)k);
}

/* Whether @p w is a worker of ours (ps_amguard_watch): another library's workers in the same
 * process (a user's program that loads libps) may hand out other ids. */
static bool watched(ucp_worker_h w)
{
    for (int i = 0; i < WATCH_MAX; i++)
        if (__atomic_load_n(&g_watch[i], __ATOMIC_ACQUIRE) == w) return true;
    return false;
}

/* Whether message @p id for worker @p w passes; logs and counts it when not. */
static bool pass(ucp_worker_h w, unsigned id, const void *data, size_t n)
{
    if (!watched(w)) return true;
    const char *why = check(w, id, data, n);
    if (why) refused(id, n, why);
    return why == NULL;
}

/* One wrapper per message id and kind (a handler does not learn its id). Dropping a message is
 * returning UCS_OK: the transport frees it. */
#define GUARD(ID)                                                                      \
    static ucs_status_t guard_cb_##ID(void *arg, void *data, size_t n, unsigned flags) \
    {                                                                                  \
        if (!pass(arg, ID, data, n)) return UCS_OK;                                    \
        return g_cb[ID](arg, data, n, flags);                                          \
    }                                                                                  \
    static ucs_status_t guard_px_##ID(void *arg, void *data, size_t n, unsigned flags) \
    {                                                                                  \
        if (!pass(((ucp13_worker_iface_t *)arg)->worker, ID, data, n)) return UCS_OK;  \
        return g_proxy[ID](arg, data, n, flags);                                       \
    }
GUARD(ID_WIREUP)
GUARD(ID_RNDV_RTS)
GUARD(ID_RNDV_ATS)
GUARD(ID_RNDV_RTR)
GUARD(ID_RNDV_DATA)
GUARD(ID_RNDV_ATP)
GUARD(ID_AM_SINGLE)
GUARD(ID_AM_FIRST)
GUARD(ID_AM_MIDDLE)
GUARD(ID_AM_SINGLE_REPLY)

static const struct {
    unsigned id;
    const char *handler; /* UCP's function, as libucp exports it: the layout check */
    uct_am_callback_t cb, proxy;
} g_guards[] = {
#define ENTRY(ID, FN) {ID, FN, guard_cb_##ID, guard_px_##ID}
    ENTRY(ID_WIREUP, NULL),
    ENTRY(ID_RNDV_RTS, NULL),
    ENTRY(ID_RNDV_ATS, NULL),
    ENTRY(ID_RNDV_RTR, NULL),
    ENTRY(ID_RNDV_DATA, NULL),
    ENTRY(ID_RNDV_ATP, NULL),
    ENTRY(ID_AM_SINGLE, "ucp_am_handler"),
    ENTRY(ID_AM_FIRST, NULL),
    ENTRY(ID_AM_MIDDLE, NULL),
    ENTRY(ID_AM_SINGLE_REPLY, "ucp_am_handler_reply"),
#undef ENTRY
};

static void install_once(void)
{
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    if (major != 1 || minor != 13) {
        PS_LOG(PS_LOG_DEBUG, "ucx", "UCX %u.%u: UCP messages are not checked (the checks "
               "know UCX 1.13's formats)", major, minor);
        return;
    }
    ucp13_am_handler_t **table = dlsym(RTLD_DEFAULT, "ucp_am_handlers");
    bool ok = table != NULL;
    for (size_t i = 0; ok && i < sizeof g_guards / sizeof *g_guards; i++) {
        const ucp13_am_handler_t *h = table[g_guards[i].id];
        ok = h != NULL && h->cb != NULL &&
             (!g_guards[i].handler || (void *)h->cb == dlsym(RTLD_DEFAULT, g_guards[i].handler));
    }
    if (!ok) {
        PS_LOG(PS_LOG_WARN, "ucx", "UCX 1.13's message handlers are not where expected: "
               "UCP messages are not checked");
        return;
    }
    for (size_t i = 0; i < sizeof g_guards / sizeof *g_guards; i++) {
        ucp13_am_handler_t *h = table[g_guards[i].id];
        g_cb[g_guards[i].id] = h->cb;
        h->cb = g_guards[i].cb;
        if (h->proxy_cb) {
            g_proxy[g_guards[i].id] = h->proxy_cb;
            h->proxy_cb = g_guards[i].proxy;
        }
    }
}

void ps_amguard_install(void)
{
    pthread_once(&g_once, install_once);
}

int ps_amguard_watch(ucp_worker_h w)
{
    for (int i = 0; i < WATCH_MAX; i++) {
        ucp_worker_h none = NULL;
        if (__atomic_compare_exchange_n(&g_watch[i], &none, w, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 0;
    }
    PS_LOG(PS_LOG_WARN, "ucx", "more than %d UCP workers at once: the messages to this one are "
           "not checked", WATCH_MAX);
    return -1;
}

void ps_amguard_unwatch(ucp_worker_h w)
{
    for (int i = 0; i < WATCH_MAX; i++) {
        ucp_worker_h was = w;
        __atomic_compare_exchange_n(&g_watch[i], &was, NULL, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
}

uct_am_callback_t ps_amguard_handler(unsigned id)
{
    ucp13_am_handler_t **table = dlsym(RTLD_DEFAULT, "ucp_am_handlers");
    return table && id < ID_COUNT && table[id] ? table[id]->cb : NULL;
}

uint64_t ps_amguard_refused(void)
{
    return __atomic_load_n(&g_refused, __ATOMIC_RELAXED);
}
