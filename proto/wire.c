/* wire.c: ps_msg_t <-> packed ps.Header (the only user of protobuf-c). */
#include <stdio.h>
#include <string.h>

#include "ps.pb-c.h"
#include "ps/ps_error.h"
#include "utf8.h"
#include "wire.h"

/* The offset of the first byte of @p s that does not continue valid UTF-8 (no overlong forms,
 * no surrogates, at most U+10FFFF), or -1 when all of it is valid. */
static long utf8_bad_at(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *b = p;
    for (size_t n; *p; p += n)
        if ((n = ps_utf8_len(p)) == 0) return (long)(p - b);
    return -1;
}

/* The name's own rules (ps_decl_check): NUL-terminated and not empty (what memory safety
 * needs), then what psctl export needs (@p exportable). */
static int name_check(const ps_decl_t *d, bool exportable, char *err, size_t errlen)
{
    if (memchr(d->name, '\0', sizeof d->name) == NULL) {
        snprintf(err, errlen, "tensor name longer than %d bytes", PS_NAME_MAX - 1);
        return PS_EINVAL;
    }
    if (d->name[0] == '\0') {
        snprintf(err, errlen, "empty tensor name");
        return PS_EINVAL;
    }
    if (!exportable) return 0;
    if (strcmp(d->name, "__metadata__") == 0) { /* psctl export's header would hold it twice */
        snprintf(err, errlen, "tensor name '__metadata__' is the key safetensors keeps for a "
                 "file's metadata (psctl export)");
        return PS_EINVAL;
    }
    /* Names go into JSON (status, checkpoints' meta.json) and safetensors headers as they are:
     * one that is not UTF-8 made `psctl export` write a header no reader takes. */
    long bad = utf8_bad_at(d->name);
    if (bad >= 0) {
        snprintf(err, errlen, "tensor name is not valid UTF-8 (byte %ld is 0x%02x)", bad,
                 (unsigned char)d->name[bad]);
        return PS_EINVAL;
    }
    return 0;
}

/* What both checks share: the name (its export rules with @p exportable), shape, init. */
static int decl_check(const ps_decl_t *d, bool exportable, char *err, size_t errlen)
{
    int rc = name_check(d, exportable, err, errlen);
    if (rc) return rc;
    if (d->ndim < 1 || d->ndim > PS_MAX_DIMS) {
        snprintf(err, errlen, "tensor '%s' has %d dimensions (1..%d allowed)", d->name, d->ndim,
                 PS_MAX_DIMS);
        return PS_EINVAL;
    }
    uint64_t numel = 1;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] == 0) {
            snprintf(err, errlen, "tensor '%s' has a zero dimension (%d)", d->name, i);
            return PS_EINVAL;
        }
        /* Checked at every factor: a product may not wrap past the limit. */
        if (__builtin_mul_overflow(numel, (uint64_t)d->shape[i], &numel) ||
            numel > PS_MAX_TENSOR_VALUES) {
            snprintf(err, errlen, "tensor '%s' is larger than %llu values", d->name,
                     (unsigned long long)PS_MAX_TENSOR_VALUES);
            return PS_EINVAL;
        }
    }
    if (ps_decl_init_kind(d) > 5 || (d->init & ~(0xffu | PS_DECL_MEAN))) {
        snprintf(err, errlen, "tensor '%s' has unknown initializer %u (0 zeros, 1 normal, "
                 "2 uniform, 3 xavier, 4 constant, 5 values sent; | 256: a mean of the "
                 "pushes)", d->name, d->init);
        return PS_EINVAL;
    }
    return 0;
}

int ps_decl_check(const ps_decl_t *d, char *err, size_t errlen)
{
    return decl_check(d, true, err, errlen);
}

int ps_decl_check_stored(const ps_decl_t *d, char *err, size_t errlen)
{
    return decl_check(d, false, err, errlen);
}

uint64_t ps_decl_numel(const ps_decl_t *d)
{
    if (d->ndim <= 0) return 0;
    uint64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}

void ps_shape_str(const uint32_t *shape, int ndim, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%u", i ? ", " : "", shape[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

const char *ps_msg_type_name(int type)
{
    static const char *names[] = {"invalid", "hello",      "hello_reply", "declare",
                                  "declare_reply", "push", "push_ack",    "pull",
                                  "pull_reply",    "error", "leave",       "heartbeat",
                                  "status",        "status_reply", "batch",
                                  "batch_reply",   "epoch", "scale",       "scale_reply",
                                  "launch",        "launch_reply", "echo",      "echo_reply",
                                  "bundle",        "leave_reply", "auth",        "forget",
                                  "forget_reply",  "values", "values_reply"};
    static const char *durable[] = {"export_begin", "export_begin_reply", "export_tensor",
                                    "export_tensor_reply", "export_chunk", "export_chunk_reply",
                                    "export_end", "verify", "verify_reply"};
    static const char *ckpt[] = {"ckpt_begin", "ckpt_begin_reply", "ckpt_arm", "ckpt_arm_reply",
                                 "ckpt_go", "ckpt_go_reply", "ckpt_status", "ckpt_status_reply",
                                 "repair", "repair_reply", "ckpt_cancel", "ckpt_cancel_reply"};
    if (type >= PS_MSG_CKPT_BEGIN && type < PS_MSG_CKPT_END_) return ckpt[type - PS_MSG_CKPT_BEGIN];
    if (type >= PS_MSG_EXPORT_BEGIN && type < PS_MSG_DURABLE_END_)
        return durable[type - PS_MSG_EXPORT_BEGIN];
    return type >= 0 && type < PS_MSG_MAX_ ? names[type] : "unknown";
}

/* protobuf-c's generic pack and unpack walk the header's 46 field descriptors on every call
 * (get_packed_size, then pack; unpack scans, then fills): ~0.4 us to pack and ~0.2 us to unpack
 * a push's header, four of each on a small round's path. Headers are packed here instead, with
 * the same bytes (proto3: fields in number order, zero values left out; tests/unit/test_wire.c
 * compares both), and the headers of the data path are unpacked here: varint fields, the float,
 * the session token and the replay tags. Anything else (a declaration, a string, an unknown
 * field, a wire type or a varint out of the usual, more fields than protobuf-c's unpack has room
 * for) goes to protobuf-c's unpack, which decides. */
static bool wire_reference; /* ps_wire_use_protobuf(): protobuf-c's pack and unpack only */

void ps_wire_use_protobuf(bool on)
{
    wire_reference = on;
}

typedef struct {
    uint8_t *p, *end;
    bool full;
} wr_t;

/* A varint of @p v; past the end of the buffer, nothing more is written and full is set. */
static inline void wr_varint(wr_t *w, uint64_t v)
{
    do {
        if (w->p == w->end) {
            w->full = true;
            return;
        }
        *w->p++ = (uint8_t)(v >= 0x80 ? v | 0x80 : v);
        v >>= 7;
    } while (v);
}

/* Field @p f with wire type @p wt: its key. */
static inline void wr_key(wr_t *w, uint32_t f, uint32_t wt)
{
    wr_varint(w, (uint64_t)f << 3 | wt);
}

static inline void wr_u64(wr_t *w, uint32_t f, uint64_t v)
{
    if (v == 0) return;
    wr_key(w, f, 0);
    wr_varint(w, v);
}

/* int32 and enums: a negative value is its 64-bit sign extension (ten bytes). */
static inline void wr_i32(wr_t *w, uint32_t f, int32_t v)
{
    wr_u64(w, f, (uint64_t)(int64_t)v);
}

static inline void wr_bytes(wr_t *w, uint32_t f, const void *b, size_t n)
{
    if (n == 0) return;
    wr_key(w, f, 2);
    wr_varint(w, n);
    if ((size_t)(w->end - w->p) < n) {
        w->full = true;
        return;
    }
    memcpy(w->p, b, n);
    w->p += n;
}

static inline void wr_str(wr_t *w, uint32_t f, const char *s)
{
    wr_bytes(w, f, s, s ? strlen(s) : 0);
}

/* @p h packed as protobuf-c packs it (no declaration: protobuf-c packs those). */
static int header_pack(const Ps__Header *h, uint8_t *buf, size_t cap, size_t *len)
{
    wr_t w = {buf, buf + cap, false};
    wr_u64(&w, 1, h->version);
    wr_i32(&w, 2, (int32_t)h->type);
    wr_u64(&w, 3, h->req_id);
    wr_u64(&w, 4, h->epoch);
    wr_i32(&w, 5, h->rank);
    wr_u64(&w, 6, h->tensor);
    wr_u64(&w, 7, h->chunk);
    wr_u64(&w, 8, h->step);
    wr_u64(&w, 9, h->codec);
    wr_u64(&w, 10, h->length);
    wr_u64(&w, 11, h->crc32c);
    wr_i32(&w, 12, h->status);
    wr_str(&w, 13, h->error);
    wr_str(&w, 15, h->cluster);
    wr_u64(&w, 16, h->pid);
    wr_bytes(&w, 17, h->auth.data, h->auth.len);
    wr_u64(&w, 18, h->workers);
    wr_u64(&w, 19, h->shard);
    wr_u64(&w, 20, h->consistency);
    if (h->codec_fraction != 0) { /* -0.0 is left out too, as protobuf-c does */
        wr_key(&w, 21, 5);
        if (w.end - w.p >= 4) {
            memcpy(w.p, &h->codec_fraction, 4); /* little-endian, as the wire */
            w.p += 4;
        } else {
            w.full = true;
        }
    }
    wr_u64(&w, 22, h->codec_block);
    wr_u64(&w, 23, h->codec_flags);
    wr_u64(&w, 24, h->members);
    wr_u64(&w, 25, h->data_epoch);
    wr_u64(&w, 26, h->batch_offset);
    wr_u64(&w, 27, h->batch_count);
    wr_u64(&w, 28, h->samples);
    wr_u64(&w, 29, h->flags);
    wr_u64(&w, 30, h->step_max);
    wr_u64(&w, 31, h->count);
    wr_str(&w, 50, h->host);
    wr_str(&w, 51, h->store);
    wr_u64(&w, 52, h->store_id);
    wr_u64(&w, 53, h->area_fd);
    wr_u64(&w, 54, h->area_id);
    wr_u64(&w, 55, h->area_size);
    wr_u64(&w, 56, h->area_offset);
    if (h->n_replay) { /* proto3 packs repeated scalars: one key, the length, the varints */
        size_t n = 0;
        for (size_t i = 0; i < h->n_replay; i++) {
            uint64_t v = h->replay[i];
            do {
                n++;
            } while (v >>= 7);
        }
        wr_key(&w, 57, 2);
        wr_varint(&w, n);
        for (size_t i = 0; i < h->n_replay; i++) wr_varint(&w, h->replay[i]);
    }
    wr_u64(&w, 58, h->tensor_set);
    wr_bytes(&w, 59, h->session.data, h->session.len);
    wr_u64(&w, 60, h->run);
    wr_u64(&w, 61, h->run_origin);
    wr_u64(&w, 62, h->run_base);
    wr_u64(&w, 63, h->joined_runs);
    wr_u64(&w, 64, h->poll_ms);
    wr_u64(&w, 65, h->launcher);
    wr_u64(&w, 66, h->job_seed1);
    wr_u64(&w, 67, h->job_batch);
    wr_u64(&w, 68, h->floor);
    wr_u64(&w, 69, h->floor_run);
    wr_u64(&w, 70, h->floor_key);
    if (w.full) return PS_EINVAL;
    *len = (size_t)(w.p - buf);
    return 0;
}

/* A varint of at most @p max bytes at *@p p (< @p end): false when it runs past either. */
static inline bool rd_varint(const uint8_t **p, const uint8_t *end, int max, uint64_t *v)
{
    const uint8_t *q = *p;
    uint64_t r = 0;
    for (int i = 0; i < max && q < end; i++) {
        uint8_t b = *q++;
        r |= (uint64_t)(b & 0x7f) << (7 * i); /* the tenth byte's bits past 64 drop out */
        if (!(b & 0x80)) {
            *p = q;
            *v = r;
            return true;
        }
    }
    return false;
}

/* Fields a header may have for protobuf-c's unpack to fit ps_msg_decode's arena (3 KiB): the
 * message, then its record of the fields scanned past the first 16 (32 bytes each, in slabs of
 * 32 and 64), the replay tags and each copy of a session token. 48 fields and one token fit;
 * past that protobuf-c can run out and refuse the header, so it decides. */
#define UNPACK_FIELDS_MAX 48

/* @p buf unpacked into @p h (PS__HEADER__INIT first) as protobuf-c would, its replay tags into
 * @p replay (PS_REPLAY_MAX), its session pointing into @p buf. @return false where protobuf-c
 * must decide (see above): @p h is then to be ignored. */
static bool header_unpack(Ps__Header *h, uint64_t *replay, const uint8_t *buf, size_t len)
{
    const uint8_t *p = buf, *end = buf + len;
    int fields = 0, sessions = 0;
    *h = (Ps__Header)PS__HEADER__INIT;
    while (p < end) {
        uint64_t key, v;
        if (++fields > UNPACK_FIELDS_MAX || !rd_varint(&p, end, 5, &key)) return false;
        uint32_t f = (uint32_t)(key >> 3), wt = (uint32_t)(key & 7);
        if (wt == 5 && f == 21) {
            if (end - p < 4) return false;
            memcpy(&h->codec_fraction, p, 4);
            p += 4;
            continue;
        }
        if (wt == 2 && (f == 57 || f == 59)) {
            /* a length: five bytes at most, as protobuf-c reads one */
            if (!rd_varint(&p, end, 5, &v) || v > (uint64_t)(end - p)) return false;
            const uint8_t *q = p, *qe = p + v;
            p = qe;
            if (f == 59) {
                if (++sessions > 1) return false; /* a second token: a second copy there */
                h->session.len = (size_t)v;
                h->session.data = v ? (uint8_t *)q : NULL; /* protobuf-c's, for none */
                continue;
            }
            while (q < qe) {
                if (h->n_replay == PS_REPLAY_MAX || !rd_varint(&q, qe, 10, &v)) return false;
                replay[h->n_replay++] = v;
            }
            continue;
        }
        if (wt != 0 || !rd_varint(&p, end, 10, &v)) return false;
        switch (f) {
        case 1: h->version = (uint32_t)v; break;
        case 2: h->type = (Ps__MsgType)(int32_t)v; break;
        case 3: h->req_id = v; break;
        case 4: h->epoch = v; break;
        case 5: h->rank = (int32_t)v; break;
        case 6: h->tensor = (uint32_t)v; break;
        case 7: h->chunk = (uint32_t)v; break;
        case 8: h->step = v; break;
        case 9: h->codec = (uint32_t)v; break;
        case 10: h->length = v; break;
        case 11: h->crc32c = (uint32_t)v; break;
        case 12: h->status = (int32_t)v; break;
        case 16: h->pid = (uint32_t)v; break;
        case 18: h->workers = (uint32_t)v; break;
        case 19: h->shard = (uint32_t)v; break;
        case 20: h->consistency = (uint32_t)v; break;
        case 22: h->codec_block = (uint32_t)v; break;
        case 23: h->codec_flags = (uint32_t)v; break;
        case 24: h->members = v; break;
        case 25: h->data_epoch = v; break;
        case 26: h->batch_offset = v; break;
        case 27: h->batch_count = (uint32_t)v; break;
        case 28: h->samples = v; break;
        case 29: h->flags = (uint32_t)v; break;
        case 30: h->step_max = v; break;
        case 31: h->count = v; break;
        case 52: h->store_id = v; break;
        case 53: h->area_fd = (uint32_t)v; break;
        case 54: h->area_id = v; break;
        case 55: h->area_size = v; break;
        case 56: h->area_offset = v; break;
        case 58: h->tensor_set = v; break;
        case 60: h->run = v; break;
        case 61: h->run_origin = v; break;
        case 62: h->run_base = v; break;
        case 63: h->joined_runs = v; break;
        case 64: h->poll_ms = (uint32_t)v; break;
        case 65: h->launcher = (uint32_t)v; break;
        case 66: h->job_seed1 = v; break;
        case 67: h->job_batch = (uint32_t)v; break;
        case 68: h->floor = v; break;
        case 69: h->floor_run = v; break;
        case 70: h->floor_key = v; break;
        default: return false; /* 57 unpacked, or a field this build does not know */
        }
    }
    h->replay = h->n_replay ? replay : NULL;
    return true;
}

int ps_msg_encode(const ps_msg_t *m, uint8_t *buf, size_t cap, size_t *len)
{
    return ps_msg_encode_sealed(m, m->session, m->session_len, buf, cap, len);
}

int ps_msg_encode_sealed(const ps_msg_t *m, const uint8_t *session, size_t session_len,
                         uint8_t *buf, size_t cap, size_t *len)
{
    Ps__Header h = PS__HEADER__INIT;
    Ps__TensorDecl d = PS__TENSOR_DECL__INIT;
    uint32_t shape[PS_MAX_DIMS];

    h.version = PS_WIRE_VERSION;
    h.type = (Ps__MsgType)m->type;
    h.req_id = m->req_id;
    h.epoch = m->epoch;
    h.rank = m->rank;
    h.tensor = m->tensor;
    h.chunk = m->chunk;
    h.step = m->step;
    h.codec = m->codec;
    h.length = m->length;
    h.crc32c = m->crc32c;
    h.status = m->status;
    h.pid = m->pid;
    h.workers = m->workers;
    h.shard = m->shard;
    h.consistency = m->consistency;
    h.codec_fraction = m->codec_fraction;
    h.codec_block = m->codec_block;
    h.codec_flags = m->codec_flags;
    h.members = m->members;
    h.data_epoch = m->data_epoch;
    h.batch_offset = m->batch_offset;
    h.batch_count = m->batch_count;
    h.samples = m->samples;
    h.flags = m->flags;
    h.host = (char *)(m->host[0] ? m->host : "");
    h.step_max = m->step_max;
    h.count = m->count;
    h.store_id = m->store_id;
    h.area_fd = m->area_fd;
    h.area_id = m->area_id;
    h.area_size = m->area_size;
    h.area_offset = m->area_offset;
    h.tensor_set = m->tensor_set;
    h.run = m->run;
    h.run_origin = m->run_origin;
    h.run_base = m->run_base;
    h.joined_runs = m->joined_runs;
    h.poll_ms = m->poll_ms;
    h.launcher = m->launcher;
    h.job_seed1 = m->job_seed1;
    h.job_batch = m->job_batch;
    h.floor = m->floor;
    h.floor_run = m->floor_run;
    h.floor_key = m->floor_key;
    if (m->nreplay > PS_REPLAY_MAX) return PS_EINVAL;
    h.n_replay = m->nreplay;
    h.replay = (uint64_t *)m->replay; /* only read, as the strings below */
    h.store = (char *)(m->store[0] ? m->store : "");
    /* Strings are only read by pack; the casts drop const for protobuf-c's API. */
    h.error = (char *)(m->error[0] ? m->error : "");
    h.cluster = (char *)(m->cluster[0] ? m->cluster : "");
    h.auth.len = m->auth_len <= sizeof m->auth ? m->auth_len : 0;
    h.auth.data = (uint8_t *)m->auth;
    if (session_len > PS_SESSION_MAX) return PS_EINVAL;
    h.session.len = session_len;
    h.session.data = (uint8_t *)session;
    if (m->has_decl) {
        d.name = (char *)m->decl.name;
        memcpy(shape, m->decl.shape, sizeof shape);
        d.n_shape = (size_t)m->decl.ndim;
        d.shape = shape;
        d.init = m->decl.init;
        d.init_arg = m->decl.init_arg;
        d.seed = m->decl.seed;
        d.id = m->decl.id;
        d.first_chunk = m->decl.first_chunk;
        d.total_steps = m->decl.total_steps;
        d.assigned = m->decl.assigned != 0;
        h.decl = &d;
    }
    if (h.decl == NULL && !wire_reference) return header_pack(&h, buf, cap, len);
    size_t need = ps__header__get_packed_size(&h);
    if (need > cap) return PS_EINVAL;
    *len = ps__header__pack(&h, buf);
    return 0;
}

/* A bump allocator over a stack buffer: unpacking a header makes no malloc. */
typedef struct {
    uint8_t mem[2 * PS_WIRE_HDR_MAX + 1024];
    size_t used;
} arena_t;

static void *arena_alloc(void *data, size_t size)
{
    arena_t *a = data;
    size = (size + 15) & ~(size_t)15;
    if (size > sizeof a->mem - a->used) return NULL;
    void *p = a->mem + a->used;
    a->used += size;
    return p;
}

static void arena_free(void *data, void *ptr) {}

static int copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) return -1;
    memcpy(dst, src ? src : "", n + 1);
    return 0;
}

#define FAIL(...)                              \
    do {                                       \
        snprintf(err, errlen, __VA_ARGS__);    \
        return PS_EPROTO;                      \
    } while (0)

int ps_msg_decode(ps_msg_t *m, const void *buf, size_t len, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (buf == NULL || len == 0) FAIL("empty message header");
    if (len > PS_WIRE_HDR_MAX) FAIL("message header of %zu bytes exceeds %d", len, PS_WIRE_HDR_MAX);
    Ps__Header fast;
    uint64_t fast_replay[PS_REPLAY_MAX];
    Ps__Header *h = &fast;
    arena_t arena;
    if (wire_reference || !header_unpack(&fast, fast_replay, buf, len)) {
        arena.used = 0;
        ProtobufCAllocator alloc = {arena_alloc, arena_free, &arena};
        h = ps__header__unpack(&alloc, len, buf);
        if (h == NULL) FAIL("malformed message header (%zu bytes)", len);
    }
    /* The arena lives on this stack frame: copy out everything, then return. */
    if (h->version != PS_WIRE_VERSION)
        FAIL("wire version %u, this build speaks %d", h->version, PS_WIRE_VERSION);
    if (!ps_msg_type_valid((int)h->type)) FAIL("unknown message type %d", (int)h->type);
    m->type = (ps_msg_type_t)h->type;
    m->req_id = h->req_id;
    m->epoch = h->epoch;
    m->rank = h->rank;
    m->tensor = h->tensor;
    m->chunk = h->chunk;
    m->step = h->step;
    m->codec = h->codec;
    m->length = h->length;
    m->crc32c = h->crc32c;
    m->status = h->status;
    m->pid = h->pid;
    m->workers = h->workers;
    m->shard = h->shard;
    m->consistency = h->consistency;
    m->codec_fraction = h->codec_fraction;
    m->codec_block = h->codec_block;
    m->codec_flags = h->codec_flags;
    m->members = h->members;
    m->data_epoch = h->data_epoch;
    m->batch_offset = h->batch_offset;
    m->batch_count = h->batch_count;
    m->samples = h->samples;
    m->flags = h->flags;
    if (copy_str(m->host, sizeof m->host, h->host)) FAIL("host name too long");
    m->step_max = h->step_max;
    m->count = h->count;
    m->store_id = h->store_id;
    m->area_fd = h->area_fd;
    m->area_id = h->area_id;
    m->area_size = h->area_size;
    m->area_offset = h->area_offset;
    m->tensor_set = h->tensor_set;
    m->run = h->run;
    m->run_origin = h->run_origin;
    m->run_base = h->run_base;
    m->joined_runs = h->joined_runs;
    m->poll_ms = h->poll_ms;
    m->launcher = h->launcher;
    m->job_seed1 = h->job_seed1;
    m->job_batch = h->job_batch;
    m->floor = h->floor;
    m->floor_run = h->floor_run;
    m->floor_key = h->floor_key;
    if (h->n_replay > PS_REPLAY_MAX)
        FAIL("%zu replay tags (%d allowed)", h->n_replay, PS_REPLAY_MAX);
    m->nreplay = (uint32_t)h->n_replay;
    for (size_t i = 0; i < h->n_replay; i++) m->replay[i] = h->replay[i];
    if (copy_str(m->store, sizeof m->store, h->store)) FAIL("store path too long");
    if (copy_str(m->error, sizeof m->error, h->error)) FAIL("error text too long");
    if (copy_str(m->cluster, sizeof m->cluster, h->cluster)) FAIL("cluster name too long");
    if (h->auth.len > sizeof m->auth) FAIL("auth proof of %zu bytes (at most %zu)", h->auth.len,
                                           sizeof m->auth);
    m->auth_len = (uint32_t)h->auth.len;
    if (h->auth.len) memcpy(m->auth, h->auth.data, h->auth.len);
    if (h->session.len != 0 && h->session.len != PS_SESSION_MAX)
        FAIL("session token of %zu bytes (%d expected)", h->session.len, PS_SESSION_MAX);
    m->session_len = (uint32_t)h->session.len;
    if (h->session.len) memcpy(m->session, h->session.data, h->session.len);
    if (h->decl) {
        Ps__TensorDecl *d = h->decl;
        m->has_decl = 1;
        if (copy_str(m->decl.name, sizeof m->decl.name, d->name))
            FAIL("tensor name longer than %d bytes", PS_NAME_MAX - 1);
        if (d->n_shape < 1 || d->n_shape > PS_MAX_DIMS)
            FAIL("tensor '%s' has %zu dimensions (1..%d allowed)", m->decl.name, d->n_shape,
                 PS_MAX_DIMS);
        m->decl.ndim = (int)d->n_shape;
        for (size_t i = 0; i < d->n_shape; i++) m->decl.shape[i] = d->shape[i];
        m->decl.init = d->init;
        m->decl.init_arg = d->init_arg;
        if (ps_decl_check(&m->decl, err, errlen)) return PS_EPROTO;
        m->decl.seed = d->seed;
        m->decl.id = d->id;
        m->decl.first_chunk = d->first_chunk;
        m->decl.total_steps = d->total_steps;
        m->decl.assigned = d->assigned;
    }
    return 0; /* the arena needs no free: it is this frame's */
}
