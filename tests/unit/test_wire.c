/* test_wire.c: message header encoding, and rejection of truncated and garbage input. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_error.h"
#include "auth.h"
#include "authmsg.h"
#include "bundle.h"
#include "utf8.h"
#include "wire.h"

static ps_msg_t sample(void)
{
    ps_msg_t m = {.type = PS_MSG_DECLARE, .req_id = 0x123456789abcull, .epoch = 7, .rank = 3,
                  .tensor = 11, .chunk = 2, .step = 99, .length = 4096, .status = PS_ECONFLICT,
                  .pid = 4242, .workers = 4, .shard = 1, .has_decl = 1};
    strcpy(m.error, "tensor 'x' declared with shape [1] but exists with shape [2]");
    strcpy(m.cluster, "demo");
    strcpy(m.decl.name, "fc1.weight");
    m.decl.ndim = 2;
    m.decl.shape[0] = 784;
    m.decl.shape[1] = 256;
    m.decl.init = 3;
    m.decl.seed = 1;
    m.decl.id = 5;
    m.decl.first_chunk = 17;
    m.decl.total_steps = 2340;
    m.decl.assigned = 1;
    return m;
}

START_TEST(roundtrip)
{
    ps_msg_t m = sample(), d;
    uint8_t buf[PS_WIRE_HDR_MAX];
    size_t len;
    char err[256];
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_int_eq(d.type, m.type);
    ck_assert_uint_eq(d.req_id, m.req_id);
    ck_assert_uint_eq(d.epoch, 7);
    ck_assert_int_eq(d.rank, 3);
    ck_assert_uint_eq(d.tensor, 11);
    ck_assert_uint_eq(d.chunk, 2);
    ck_assert_uint_eq(d.step, 99);
    ck_assert_uint_eq(d.length, 4096);
    ck_assert_int_eq(d.status, PS_ECONFLICT);
    ck_assert_str_eq(d.error, m.error);
    ck_assert_str_eq(d.cluster, "demo");
    ck_assert(d.has_decl);
    ck_assert_str_eq(d.decl.name, "fc1.weight");
    ck_assert_int_eq(d.decl.ndim, 2);
    ck_assert_uint_eq(d.decl.shape[1], 256);
    ck_assert_uint_eq(d.decl.first_chunk, 17);
    ck_assert_uint_eq(d.decl.total_steps, 2340);
    ck_assert(d.decl.assigned);
    ck_assert_uint_eq(ps_decl_numel(&d.decl), 784 * 256);
}
END_TEST

START_TEST(small_push_header)
{
    ps_msg_t m = {.type = PS_MSG_PUSH, .req_id = 1ull << 40, .rank = 3, .tensor = 5,
                  .chunk = 100, .step = 1u << 20, .length = 1 << 20};
    uint8_t buf[128];
    size_t len;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_uint_lt(len, 64); /* data headers stay small */
    ck_assert_int_eq(ps_msg_encode(&m, buf, 4, &len), PS_EINVAL);
}
END_TEST

/* The checkpoint's cancel (psctl gave it up): its id travels as `count`, both types are named,
 * and the range ends after its reply (an older psd refuses the type: "unknown message type"). */
START_TEST(ckpt_cancel)
{
    ps_msg_t m = {.type = PS_MSG_CKPT_CANCEL, .req_id = 9, .rank = -1,
                  .count = 0x41c04d9fc722af0full}, d;
    uint8_t buf[PS_WIRE_HDR_MAX];
    size_t len;
    char err[256];
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_int_eq(d.type, PS_MSG_CKPT_CANCEL);
    ck_assert_uint_eq(d.count, m.count);
    ck_assert_str_eq(ps_msg_type_name(PS_MSG_CKPT_CANCEL), "ckpt_cancel");
    ck_assert_str_eq(ps_msg_type_name(PS_MSG_CKPT_CANCEL_REPLY), "ckpt_cancel_reply");
    ck_assert(ps_msg_type_valid(PS_MSG_CKPT_CANCEL_REPLY));
    ck_assert(!ps_msg_type_valid(PS_MSG_CKPT_END_));
    ck_assert_str_eq(ps_msg_type_name(PS_MSG_CKPT_END_), "unknown");
    m.type = PS_MSG_CKPT_END_;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "unknown message type 52"));
}
END_TEST

START_TEST(truncated_rejected)
{
    ps_msg_t m = sample(), d;
    uint8_t buf[PS_WIRE_HDR_MAX];
    size_t len;
    char err[256];
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    int rejected = 0;
    for (size_t cut = 0; cut < len; cut++)
        rejected += ps_msg_decode(&d, buf, cut, err, sizeof err) == PS_EPROTO;
    /* Every cut inside a field fails; a cut at a field boundary may decode, but then
     * the version/type checks or missing fields still hold it to a valid message. */
    ck_assert_uint_gt(rejected, len / 2);
    ck_assert_int_eq(ps_msg_decode(&d, buf, 0, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
}
END_TEST

START_TEST(garbage_rejected)
{
    ps_msg_t d;
    char err[256];
    srand(7);
    uint8_t buf[512];
    for (int round = 0; round < 2000; round++) {
        size_t len = 1 + (size_t)(rand() % (int)sizeof buf);
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rand();
        int rc = ps_msg_decode(&d, buf, len, err, sizeof err);
        ck_assert(rc == 0 || rc == PS_EPROTO);
        if (rc == 0) ck_assert(ps_msg_type_valid(d.type));
    }
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    ck_assert_int_eq(ps_msg_decode(&d, junk, sizeof junk, err, sizeof err), PS_EPROTO);
}
END_TEST

START_TEST(invalid_fields_rejected)
{
    uint8_t buf[PS_WIRE_HDR_MAX];
    size_t len;
    char err[256];
    ps_msg_t m = sample(), d;
    m.decl.ndim = 0; /* no dimensions */
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "dimensions"));

    m = sample();
    m.decl.shape[1] = 0;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "zero dimension"));

    /* 65536^4 wraps a 64-bit product to 0: refused, not taken for an empty tensor. */
    m = sample();
    m.decl.ndim = 4;
    for (int i = 0; i < 4; i++) m.decl.shape[i] = 65536;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "larger than"));

    m = sample();
    m.type = (ps_msg_type_t)55; /* 40..49 are the checkpoint messages now */
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "unknown message type"));

    m = sample();
    m.decl.name[0] = '\0';
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);

    /* A header from a newer protocol version is refused by name. */
    m = sample();
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_uint_eq(buf[0], 0x08); /* field 1, varint */
    buf[1] = PS_WIRE_VERSION + 1;
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "wire version"));
}
END_TEST

/* Names go into JSON and safetensors headers as they are: one that is not UTF-8 made
 * `psctl export` write a header no reader takes (a probe, session 34). */
/* A store's run travels in hello replies and the runs digest in heartbeats; the digest tells
 * every run and its shard (order matters: two shards' stores swapped are another cluster), is
 * never 0, and a restore's mark is 0 only for no restore. */
START_TEST(runs_digest)
{
    ps_msg_t m = {.type = PS_MSG_HELLO_REPLY, .flags = PS_FLAG_RUN, .run = 11, .run_origin = 22,
                  .run_base = 33, .joined_runs = 44, .floor = 55, .floor_run = 66,
                  .floor_key = 77}, d;
    uint8_t buf[512];
    size_t len;
    char err[256];
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_uint_eq(d.run, 11);
    ck_assert_uint_eq(d.run_origin, 22);
    ck_assert_uint_eq(d.run_base, 33);
    ck_assert_uint_eq(d.joined_runs, 44);
    ck_assert_uint_eq(d.floor, 55);
    ck_assert_uint_eq(d.floor_run, 66);
    ck_assert_uint_eq(d.floor_key, 77);
    uint64_t a[3] = {5, 6, 7}, b[3] = {5, 6, 8}, sw[3] = {6, 5, 7}, z[1] = {0};
    uint64_t h = ps_runs_digest(a, 3);
    ck_assert_uint_ne(h, 0);
    ck_assert_uint_eq(h, ps_runs_digest(a, 3));
    ck_assert_uint_ne(h, ps_runs_digest(b, 3));
    ck_assert_uint_ne(h, ps_runs_digest(sw, 3));
    ck_assert_uint_ne(h, ps_runs_digest(a, 2));
    ck_assert_uint_ne(ps_runs_digest(z, 1), 0);
    ck_assert_uint_eq(ps_run_restored_mark(0), 0);
    ck_assert_uint_ne(ps_run_restored_mark(22), 0);
    ck_assert_uint_ne(ps_run_restored_mark(22), ps_run_restored_mark(23));
}
END_TEST

/* The session token travels as given (ps_msg_encode_sealed in place of the message's own);
 * a token of another length is refused on receipt. */
START_TEST(session_token)
{
    ps_msg_t m = {.type = PS_MSG_PUSH, .rank = 1}, d;
    uint8_t buf[PS_WIRE_HDR_MAX], tok[PS_SESSION_MAX];
    size_t len;
    char err[256];
    for (int i = 0; i < PS_SESSION_MAX; i++) tok[i] = (uint8_t)(0xa0 + i);
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_uint_eq(d.session_len, 0);
    ck_assert_int_eq(ps_msg_encode_sealed(&m, tok, sizeof tok, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_uint_eq(d.session_len, PS_SESSION_MAX);
    ck_assert(memcmp(d.session, tok, sizeof tok) == 0);
    ck_assert_int_eq(ps_msg_encode(&d, buf, sizeof buf, &len), 0); /* its own, when it has one */
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert(d.session_len == PS_SESSION_MAX && memcmp(d.session, tok, sizeof tok) == 0);
    ck_assert_int_eq(ps_msg_encode_sealed(&m, tok, sizeof tok + 1, buf, sizeof buf, &len),
                     PS_EINVAL);
    m.session_len = PS_SESSION_MAX - 1; /* encoded as it is; refused on receipt */
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_msg(strstr(err, "session token of 15 bytes (16 expected)"), "%s", err);
}
END_TEST

START_TEST(decl_names_utf8)
{
    static const char *const good[] = {"fc1.weight", "\xe5\xb1\x82.bias", "a\xf0\x9f\x98\x80",
                                       "\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf4\x8f\xbf\xbf"};
    static const struct {
        const char *name;
        long at;
    } bad[] = {{"\xff\xfe\x80", 0},   {"ab\x80", 2},        {"\xc0\xaf", 0} /* overlong */,
               {"x\xe0\x9f\xbf", 1} /* overlong */, {"\xed\xa0\x80", 0} /* surrogate */,
               {"\xf4\x90\x80\x80", 0} /* past U+10FFFF */, {"\xe5\xb1", 0} /* cut */,
               {"\xf8\x88\x80\x80\x80", 0}};
    ps_decl_t d = {.ndim = 1, .shape = {4}};
    char err[256];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(d.name, sizeof d.name, "%s", good[i]);
        ck_assert_msg(ps_decl_check(&d, err, sizeof err) == 0, "good name %zu refused: %s", i,
                      err);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(d.name, sizeof d.name, "%s", bad[i].name);
        ck_assert_int_eq(ps_decl_check(&d, err, sizeof err), PS_EINVAL);
        char want[64];
        snprintf(want, sizeof want, "not valid UTF-8 (byte %ld is 0x%02x)", bad[i].at,
                 (unsigned char)bad[i].name[bad[i].at]);
        ck_assert_msg(strstr(err, want) != NULL, "bad name %zu: %s, want %s", i, err, want);
    }
    /* safetensors keeps this key for the file's metadata (psctl export). */
    snprintf(d.name, sizeof d.name, "__metadata__");
    ck_assert_int_eq(ps_decl_check(&d, err, sizeof err), PS_EINVAL);
    ck_assert_msg(strstr(err, "'__metadata__' is the key safetensors keeps") != NULL, "%s", err);
}
END_TEST

/* A push's replay tags travel as written; more than PS_REPLAY_MAX are refused both ways. */
START_TEST(replay_tags)
{
    uint8_t buf[PS_WIRE_HDR_MAX];
    size_t len;
    char err[256];
    ps_msg_t m = {.type = PS_MSG_PUSH, .rank = 2, .step = 41, .nreplay = 2,
                  .replay = {PS_REPLAY_TAG(40, 1), PS_REPLAY_TAG(1ull << 40, 63)}},
             d;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), 0);
    ck_assert_uint_eq(d.nreplay, 2);
    ck_assert_uint_eq(PS_REPLAY_STEP(d.replay[0]), 40);
    ck_assert_uint_eq(PS_REPLAY_RANK(d.replay[0]), 1);
    ck_assert_uint_eq(PS_REPLAY_STEP(d.replay[1]), 1ull << 40);
    ck_assert_uint_eq(PS_REPLAY_RANK(d.replay[1]), 63);
    m.nreplay = PS_REPLAY_MAX + 1;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), PS_EINVAL);
    /* A peer's header with too many: field 57 (varint) appended PS_REPLAY_MAX + 1 times. */
    m.nreplay = 0;
    ck_assert_int_eq(ps_msg_encode(&m, buf, sizeof buf, &len), 0);
    for (int i = 0; i <= PS_REPLAY_MAX; i++) {
        buf[len++] = 0xc8; /* key 57 << 3 | 0 = 0x1c8 as a varint */
        buf[len++] = 0x03;
        buf[len++] = (uint8_t)i;
    }
    ck_assert_int_eq(ps_msg_decode(&d, buf, len, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "replay tags"));
}
END_TEST

/* Entries come back as written: headers, data, 8-byte aligned data, and the end. */
START_TEST(bundle_roundtrip)
{
    uint8_t buf[4096];
    size_t used = 0;
    float g[3] = {1.5f, -2.0f, 3.25f};
    ps_msg_t push = {.type = PS_MSG_PUSH, .req_id = 7, .tensor = 2, .chunk = 1, .length = 12};
    ps_msg_t pull = {.type = PS_MSG_PULL, .req_id = 8, .tensor = 3};
    ck_assert_int_eq(ps_bundle_add(buf, sizeof buf, &used, &push, g, sizeof g), 0);
    ck_assert_int_eq(ps_bundle_add(buf, sizeof buf, &used, &pull, NULL, 0), 0);
    ck_assert_uint_eq(used % 8, 0);
    char err[256];
    ck_assert_int_eq(ps_bundle_check(buf, used, 2, err, sizeof err), 0);
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, buf, used, 2);
    ps_msg_t m;
    const void *d;
    size_t dl;
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(m.type, PS_MSG_PUSH);
    ck_assert_uint_eq(m.req_id, 7);
    ck_assert_uint_eq(dl, sizeof g);
    ck_assert_uint_eq(((const uint8_t *)d - buf) % 8, 0);
    ck_assert_int_eq(memcmp(d, g, sizeof g), 0);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(m.type, PS_MSG_PULL);
    ck_assert_uint_eq(dl, 0);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 0);
    /* Full: refused, nothing written. */
    size_t small = 0;
    ck_assert_int_eq(ps_bundle_add(buf, 16, &small, &push, g, sizeof g), PS_EINVAL);
    ck_assert_uint_eq(small, 0);
}
END_TEST

/* Broken framing is named, and refused whole by the check; a spoiled header spoils only its
 * entry; a bundle inside a bundle is refused. */
START_TEST(bundle_malformed)
{
    uint8_t buf[4096];
    size_t used = 0;
    char err[256];
    ps_msg_t pull = {.type = PS_MSG_PULL, .req_id = 8, .tensor = 3};
    ps_msg_t nested = {.type = PS_MSG_BUNDLE, .count = 1};
    ck_assert_int_eq(ps_bundle_add(buf, sizeof buf, &used, &pull, NULL, 0), 0);
    size_t one = used;
    ck_assert_int_eq(ps_bundle_add(buf, sizeof buf, &used, &nested, NULL, 0), 0);
    ck_assert_int_eq(ps_bundle_add(buf, sizeof buf, &used, &pull, NULL, 0), 0);
    /* count says more, or fewer, than there are */
    ck_assert_int_eq(ps_bundle_check(buf, used, 4, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "truncated"));
    ck_assert_int_eq(ps_bundle_check(buf, used, 2, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "bytes after the last entry"));
    /* cut short inside an entry */
    ck_assert_int_eq(ps_bundle_check(buf, one - 1, 1, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "bytes left"));
    /* the nested one is refused, the next one still read */
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, buf, used, 3);
    ps_msg_t m;
    const void *d;
    size_t dl;
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "is a bundle itself"));
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(m.type, PS_MSG_PULL);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 0);
    /* bytes after the entries the count announced: named once, then the end (a reader
     * looping until 0, as libps does without ps_bundle_check, stops) */
    ps_bundle_iter_init(&it, buf, used, 2);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "is a bundle itself"));
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), PS_EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "bytes after the last entry"));
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 0);
    /* a garbage header: its entry refused, the framing intact */
    buf[one + 8] ^= 0xff;
    buf[one + 9] ^= 0xff;
    ps_bundle_iter_init(&it, buf, used, 3);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), PS_EPROTO);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 1);
    /* a length field out of range ends the bundle */
    uint32_t huge = 1u << 30;
    memcpy(buf + 4, &huge, 4);
    ps_bundle_iter_init(&it, buf, used, 3);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), PS_EPROTO);
    ck_assert_int_eq(ps_bundle_next(&it, &m, &d, &dl, err, sizeof err), 0);
}
END_TEST

/* wire.c packs headers and unpacks the data path's itself (protobuf-c's generic code was most of
 * a small message's cost): the bytes and the results must be protobuf-c's, for any header and
 * for anything a peer can send. A fixed seed: the same cases every run. */
static uint64_t wr_state = 0x9e3779b97f4a7c15ull;

static uint64_t wr_rnd(void)
{
    wr_state ^= wr_state << 13;
    wr_state ^= wr_state >> 7;
    wr_state ^= wr_state << 17;
    return wr_state;
}

/* A value of a random magnitude: 0 often, then 1..64 bits, all ones now and then. */
static uint64_t wr_val(void)
{
    switch (wr_rnd() % 8) {
    case 0:
    case 1: return 0;
    case 2: return ~0ull;
    default: return wr_rnd() >> (wr_rnd() % 64);
    }
}

static void wr_text(char *dst, size_t cap)
{
    size_t n = wr_rnd() % 3 == 0 ? 0 : wr_rnd() % cap; /* < cap: room for the NUL */
    for (size_t i = 0; i < n; i++) dst[i] = (char)(' ' + wr_rnd() % 95);
    dst[n] = '\0';
}

static ps_msg_t wr_msg(void)
{
    ps_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = (ps_msg_type_t)(1 + wr_rnd() % (PS_MSG_MAX_ - 1));
    m.req_id = wr_val(), m.epoch = wr_val(), m.step = wr_val(), m.length = wr_val();
    m.rank = (int32_t)wr_val(), m.status = (int32_t)wr_val(); /* negatives: ten bytes */
    m.tensor = (uint32_t)wr_val(), m.chunk = (uint32_t)wr_val(), m.codec = (uint32_t)wr_val();
    m.crc32c = (uint32_t)wr_val(), m.pid = (uint32_t)wr_val(), m.workers = (uint32_t)wr_val();
    m.shard = (uint32_t)wr_val(), m.consistency = (uint32_t)wr_val();
    uint32_t fbits = (uint32_t)wr_val(); /* any float: 0, -0.0, NaNs, infinities too */
    if (wr_rnd() % 4 == 0) fbits = 0x80000000u;
    memcpy(&m.codec_fraction, &fbits, 4);
    m.codec_block = (uint32_t)wr_val(), m.codec_flags = (uint32_t)wr_val();
    m.members = wr_val(), m.data_epoch = wr_val(), m.batch_offset = wr_val();
    m.batch_count = (uint32_t)wr_val(), m.samples = wr_val(), m.flags = (uint32_t)wr_val();
    m.step_max = wr_val(), m.count = wr_val(), m.store_id = wr_val();
    m.area_fd = (uint32_t)wr_val(), m.area_id = wr_val(), m.area_size = wr_val();
    m.area_offset = wr_val(), m.tensor_set = wr_val(), m.run = wr_val();
    m.run_origin = wr_val(), m.run_base = wr_val(), m.joined_runs = wr_val();
    m.poll_ms = (uint32_t)wr_val(), m.launcher = (uint32_t)wr_val();
    m.job_seed1 = wr_val(), m.job_batch = (uint32_t)wr_val();
    m.floor = wr_val(), m.floor_run = wr_val(), m.floor_key = wr_val();
    if (wr_rnd() % 2) wr_text(m.host, sizeof m.host);
    if (wr_rnd() % 4 == 0) wr_text(m.store, sizeof m.store);
    if (wr_rnd() % 2) wr_text(m.error, sizeof m.error);
    if (wr_rnd() % 2) wr_text(m.cluster, sizeof m.cluster);
    if (wr_rnd() % 4 == 0) {
        m.auth_len = (uint32_t)(wr_rnd() % (sizeof m.auth + 1));
        for (uint32_t i = 0; i < m.auth_len; i++) m.auth[i] = (uint8_t)wr_rnd();
    }
    if (wr_rnd() % 2) {
        m.session_len = PS_SESSION_MAX;
        for (int i = 0; i < PS_SESSION_MAX; i++) m.session[i] = (uint8_t)wr_rnd();
    }
    if (wr_rnd() % 3 == 0) { /* now and then past 127 bytes: a two-byte length */
        bool big = wr_rnd() % 4 == 0;
        m.nreplay = (uint32_t)(wr_rnd() % (PS_REPLAY_MAX + 1));
        for (uint32_t i = 0; i < m.nreplay; i++)
            m.replay[i] = big ? 1ull << 63 | wr_rnd() : wr_val();
    }
    if (wr_rnd() % 8 == 0) { /* a declaration: protobuf-c packs those either way */
        m.has_decl = 1;
        strcpy(m.decl.name, "layer.w");
        m.decl.ndim = 1 + (int)(wr_rnd() % PS_MAX_DIMS);
        for (int i = 0; i < m.decl.ndim; i++) m.decl.shape[i] = 1 + (uint32_t)(wr_rnd() % 9);
        m.decl.id = (uint32_t)wr_val();
    }
    return m;
}

/* A varint of @p v at @p p, padded with up to @p pad redundant bytes (still the same value to a
 * reader, up to ten bytes; more is malformed), or now and then ten bytes whose last has bits past
 * the 64th set (a reader drops them). @return its bytes. */
static size_t wr_put(uint8_t *p, uint64_t v, int pad)
{
    size_t n = 0;
    if (pad > 0 && wr_rnd() % 4 == 0) {
        for (int i = 0; i < 9; i++) p[n++] = (uint8_t)((v >> (7 * i)) | 0x80);
        p[n++] = (uint8_t)((v >> 63) | (wr_rnd() & 0x7e));
        return n;
    }
    while (v >= 0x80 || pad > 0) {
        p[n++] = (uint8_t)(v | 0x80);
        if (v < 0x80) pad--;
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Bytes a confused or hostile peer could send: fields known and unknown, wire types right and
 * wrong, padded varints, lengths past the end. */
static size_t wr_crafted(uint8_t *buf, size_t cap)
{
    static const uint32_t fields[] = {1, 2, 3, 5, 8, 12, 13, 14, 17, 21, 29, 50, 56, 57, 59,
                                      64, 65, 100, 0};
    size_t n = 0;
    if (wr_rnd() % 2) { /* a version and a type, so that the decode goes on past them */
        buf[n++] = 0x08, buf[n++] = 0x01, buf[n++] = 0x10;
        buf[n++] = (uint8_t)(1 + wr_rnd() % (PS_MSG_MAX_ - 1));
    }
    int nf = (int)(wr_rnd() % 4 ? wr_rnd() % 12 : wr_rnd() % 64); /* past 48 now and then */
    for (int i = 0; i < nf && n + 64 < cap; i++) {
        uint32_t f = fields[wr_rnd() % (sizeof fields / sizeof *fields)];
        uint32_t wt = wr_rnd() % 5 == 0 ? (uint32_t)(wr_rnd() % 8)
                      : f == 21             ? 5u
                      : f == 13 || f == 14 || f == 17 || f == 50 || f == 57 || f == 59 ? 2u
                                                                                       : 0u;
        n += wr_put(buf + n, (uint64_t)f << 3 | wt, wr_rnd() % 6 == 0 ? (int)(wr_rnd() % 6) : 0);
        int pad = wr_rnd() % 6 == 0 ? (int)(wr_rnd() % 11) : 0;
        if (wt == 2) {
            uint64_t len = wr_rnd() % 24;
            n += wr_put(buf + n, wr_rnd() % 10 == 0 ? len + 1 + wr_rnd() % 4 : len, pad);
            for (uint64_t k = 0; k < len; k++)
                buf[n++] = (uint8_t)(wr_rnd() % 3 ? wr_rnd() % 0x80 : wr_rnd());
        } else if (wt == 5 || wt == 1) {
            for (int k = 0; k < (wt == 5 ? 4 : 8); k++) buf[n++] = (uint8_t)wr_rnd();
        } else {
            n += wr_put(buf + n, wr_val(), pad);
        }
    }
    return n;
}

/* The same bytes as protobuf-c's pack, and the same room needed. */
START_TEST(pack_is_protobufs)
{
    uint8_t a[2048], b[2048];
    for (int it = 0; it < 20000; it++) {
        ps_msg_t m = wr_msg();
        size_t cap = it % 4 == 0 ? wr_rnd() % 200 : sizeof a, la = 0, lb = 0;
        ps_wire_use_protobuf(true);
        int ra = ps_msg_encode(&m, a, cap, &la);
        ps_wire_use_protobuf(false);
        int rb = ps_msg_encode(&m, b, cap, &lb);
        ck_assert_msg(ra == rb, "case %d: protobuf-c says %d, wire.c %d (cap %zu)", it, ra, rb,
                      cap);
        if (ra) continue;
        ck_assert_msg(la == lb && memcmp(a, b, la) == 0,
                      "case %d: wire.c packed %zu bytes, protobuf-c %zu, or other ones", it, lb,
                      la);
    }
}
END_TEST

static void unpack_both(const uint8_t *buf, size_t len, int it)
{
    static ps_msg_t ma, mb;
    char ea[256] = "", eb[256] = "";
    ps_wire_use_protobuf(true);
    int ra = ps_msg_decode(&ma, buf, len, ea, sizeof ea);
    ps_wire_use_protobuf(false);
    int rb = ps_msg_decode(&mb, buf, len, eb, sizeof eb);
    ck_assert_msg(ra == rb, "case %d (%zu bytes): protobuf-c says %d (%s), wire.c %d (%s)", it,
                  len, ra, ea, rb, eb);
    ck_assert_msg(memcmp(&ma, &mb, sizeof ma) == 0, "case %d: wire.c unpacked other values", it);
    if (ra == 0 || strcmp(ea, eb) == 0) return;
    char hex[3 * 64 + 1] = "";
    for (size_t i = 0; i < len && i < 64; i++) sprintf(hex + 3 * i, "%02x ", buf[i]);
    ck_abort_msg("case %d: protobuf-c says \"%s\", wire.c \"%s\" of %s", it, ea, eb, hex);
}

/* The same results as protobuf-c's unpack for headers as sent, mutated and made up. */
START_TEST(unpack_is_protobufs)
{
    uint8_t buf[2048];
    /* At 49 fields protobuf-c's unpack runs out of ps_msg_decode's arena and refuses: around
     * that edge, a push header's fields and then its version again and again. */
    for (int nf = 40; nf <= 60; nf++) {
        size_t len = 0;
        buf[len++] = 0x08, buf[len++] = 0x01, buf[len++] = 0x10, buf[len++] = PS_MSG_PUSH;
        for (int i = 2; i < nf; i++) buf[len++] = 0x08, buf[len++] = 0x01;
        unpack_both(buf, len, -nf);
    }
    for (int it = 0; it < 20000; it++) {
        size_t len = 0;
        if (it % 3 == 2) {
            len = wr_crafted(buf, sizeof buf);
        } else {
            ps_msg_t m = wr_msg();
            if (ps_msg_encode(&m, buf, sizeof buf, &len)) continue;
            if (it % 3 == 1 && len) { /* a byte changed, the end cut off, or all of it twice */
                switch (wr_rnd() % 3) {
                case 0: buf[wr_rnd() % len] ^= (uint8_t)(1 + wr_rnd() % 255); break;
                case 1: len = wr_rnd() % len; break;
                default:
                    if (2 * len > sizeof buf) break;
                    memcpy(buf + len, buf, len); /* each field again: the last one wins */
                    len *= 2;
                }
            }
        }
        unpack_both(buf, len, it);
    }
}
END_TEST

/* ps_utf8_len (common/utf8.h): what the declarations' check and the JSON writers (psd's status,
 * psctl's) take as UTF-8; the writers put U+FFFD for a byte it refuses (a review, session 71:
 * psctl copied such bytes from a foreign peer's error into its JSON). */
START_TEST(utf8_len)
{
    static const struct {
        const char *s;
        size_t len;
    } cases[] = {
        {"a", 1},           {"\xc3\xa9", 2},        {"\xe2\x80\xa8", 3}, {"\xf0\x9f\x98\x80", 4},
        {"\x80", 0},        {"\xc0\xaf", 0},        /* stray continuation, overlong '/' */
        {"\xe0\x80\xaf", 0}, {"\xed\xa0\x80", 0},    /* overlong, a surrogate */
        {"\xf4\x90\x80\x80", 0},                    /* past U+10FFFF */
        {"\xc3", 0},        {"\xe2\x80", 0},        /* cut by the NUL */
        {"\xff", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(ps_utf8_len((const unsigned char *)cases[i].s) == cases[i].len,
                      "case %zu: got %zu, want %zu", i,
                      ps_utf8_len((const unsigned char *)cases[i].s), cases[i].len);
}
END_TEST

/* With a secret: a message passes when sealed with the connection's token; an unsealed
 * PS_EAUTH (the refusal of the proof) only until a sealed message came on the connection, as
 * psd refuses a proof before it seals anything; a new proof (a reconnect) starts over. Before,
 * an unsealed refusal passed at any time: a peer without the secret made a worker's op fail
 * with PS_EAUTH (psworker exits 2 for good) with one message for a guessed request id. */
START_TEST(auth_refusal_only_before_proven)
{
    static ps_auth_t a = {.on = true, .key_len = 32};
    memset(a.key, 7, a.key_len);
    uint8_t proof[PS_AUTH_PROOF_LEN] = {1, 2, 3};
    ps_ucx_token_t tok = {.len = PS_AUTH_SESSION};
    ps_auth_session(&a, proof, tok.b);
    ps_msg_t refusal = {.type = PS_MSG_ERROR, .status = PS_EAUTH};
    ps_msg_t sealed = {.type = PS_MSG_BATCH_REPLY, .session_len = PS_AUTH_SESSION};
    memcpy(sealed.session, tok.b, PS_AUTH_SESSION);
    ps_msg_t unsealed = {.type = PS_MSG_BATCH_REPLY};
    ck_assert(ps_auth_from_shard(&a, &tok, &refusal)); /* the proof refused */
    ck_assert(!ps_auth_from_shard(&a, &tok, &unsealed));
    ck_assert(!tok.proven);
    ck_assert(ps_auth_from_shard(&a, &tok, &sealed));
    ck_assert(tok.proven);
    ck_assert(!ps_auth_from_shard(&a, &tok, &refusal)); /* a forger's, now */
    sealed.session[0] ^= 1;
    ck_assert(!ps_auth_from_shard(&a, &tok, &sealed));
    tok.proven = 0; /* a new proof's (send_proof sets it so) */
    ck_assert(ps_auth_from_shard(&a, &tok, &refusal));
    static const ps_auth_t off = {.on = false};
    ck_assert(ps_auth_from_shard(&off, &tok, &unsealed));
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, roundtrip);
    tcase_add_test(tc, utf8_len);
    tcase_add_test(tc, small_push_header);
    tcase_add_test(tc, ckpt_cancel);
    tcase_add_test(tc, truncated_rejected);
    tcase_add_test(tc, garbage_rejected);
    tcase_add_test(tc, invalid_fields_rejected);
    tcase_add_test(tc, decl_names_utf8);
    tcase_add_test(tc, session_token);
    tcase_add_test(tc, runs_digest);
    tcase_add_test(tc, replay_tags);
    tcase_add_test(tc, bundle_roundtrip);
    tcase_add_test(tc, bundle_malformed);
    tcase_add_test(tc, pack_is_protobufs);
    tcase_add_test(tc, unpack_is_protobufs);
    tcase_add_test(tc, auth_refusal_only_before_proven);
    suite_add_tcase(s, tc);
    return s;
}
