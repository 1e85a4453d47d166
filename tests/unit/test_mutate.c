/* test_mutate.c: what a confused or hostile peer can send, mutated at random from valid input
 * (a fixed seed: the same cases every run). A manifest with a bad byte gets one
 * "FILE:LINE: ..." line; a mutated wire header decodes to something valid or is refused with a
 * reason; a mutated bundle is read to its end in a bounded number of calls, each entry's data
 * inside the bundle; a mutated compressed payload is refused by psk_codec_check exactly when
 * the decoder refuses it, and a refused decode writes nothing. None of them may crash (the
 * suite is also run under AddressSanitizer by hand: see docs/DESIGN-NOTES.md, "Hostile input"). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "codec.h"
#include "manifest.h"
#include "ps/ps_error.h"
#include "wire.h"
#include "../fuzz/fuzz.h" /* fuzz_xorshift */

#define ITERS 4000

static uint64_t rs;

static uint64_t rnd(void) { return fuzz_xorshift(&rs); }

/* Bytes that mean something to YAML, and values at the edges of the parser's ranges. */
static const char *const tokens[] = {":", "{", "}", "[", "]", ",", "\n", " ", "- ", "#", "'",
                                     "\"", "&a ", "*a", "!!str ", "0", "-1", "1e309", "nan",
                                     ".inf", "99999999999999999999", "~", "null", "true", "? ",
                                     "|", ">", "---\n", "...\n", "\t", "\\", "<<: *a", "\xff"};

/* 1..4 random edits of buf[*len] (cap bytes of room): a byte set or flipped, a run deleted, a
 * token inserted, or a run of the text copied elsewhere. */
static void mutate_text(char *buf, size_t *len, size_t cap)
{
    for (int k = 1 + (int)(rnd() % 4); k > 0; k--) {
        size_t at = *len ? rnd() % *len : 0, n;
        switch (rnd() % 5) {
        case 0:
            if (*len) buf[at] = (char)rnd();
            break;
        case 1:
            n = 1 + rnd() % 8;
            if (at + n > *len) n = *len - at;
            memmove(buf + at, buf + at + n, *len - at - n);
            *len -= n;
            break;
        case 2: {
            const char *t = tokens[rnd() % (sizeof tokens / sizeof *tokens)];
            n = strlen(t);
            if (*len + n >= cap) break;
            memmove(buf + at + n, buf + at, *len - at);
            memcpy(buf + at, t, n);
            *len += n;
            break;
        }
        case 3: {
            if (*len == 0) break;
            size_t from = rnd() % *len;
            char run[40];
            n = 1 + rnd() % sizeof run;
            if (from + n > *len) n = *len - from;
            if (*len + n >= cap) break;
            memcpy(run, buf + from, n);
            memmove(buf + at + n, buf + at, *len - at);
            memcpy(buf + at, run, n);
            *len += n;
            break;
        }
        default:
            if (*len) buf[at] ^= (char)(1u << (rnd() % 8));
            break;
        }
    }
}

/* Every key the parser knows, most of them at a value other than the default. */
static const char manifest[] =
    "cluster: demo\n"
    "chunk_bytes: 1048576\n"
    "map_size_mb: 512\n"
    "fusion_bytes: 65536\n"
    "spin_us: 500\n"
    "apply_threads: 2\n"
    "servers:\n"
    "  - {host: 127.0.0.1, port: 7300, data_dir: /tmp/psd-demo/0}\n"
    "  - {host: 127.0.0.1, port: 7301, data_dir: /tmp/psd-demo/1}\n"
    "checkpoint: {dir: /tmp/ck, every_steps: 100, keep: 3}\n"
    "job:\n"
    "  model: mlp\n"
    "  layers: [784, 256, 128, 10]\n"
    "  batch_size: 64\n"
    "  epochs: 10\n"
    "  workers: 4\n"
    "  consistency: ssp\n"
    "  staleness: 4\n"
    "  optimizer: {name: adagrad, lr: 0.001, eps: 1.0e-8, weight_decay: 0.0, lr_decay: 0.1,\n"
    "              initial_accumulator_value: 0.1, schedule: cosine, warmup_steps: 10}\n"
    "  compression:\n"
    "    codec: topk:0.01\n"
    "    rules: [{match: '*.bias', codec: none}, {match: 'fc1.*', codec: int8}]\n"
    "    pull: fp16\n"
    "    block: 256\n";

static ps_manifest_t m; /* large: off the stack */

START_TEST(manifest_errors_name_the_line)
{
    static char buf[4096];
    char err[512];
    rs = 0x9E3779B97F4A7C15ull;
    ck_assert_int_eq(ps_manifest_parse(&m, "demo.yaml", manifest, strlen(manifest), err,
                                       sizeof err),
                     0);
    int refused = 0;
    for (int i = 0; i < ITERS; i++) {
        size_t len = strlen(manifest);
        memcpy(buf, manifest, len);
        mutate_text(buf, &len, sizeof buf);
        memset(err, 'x', sizeof err);
        if (ps_manifest_parse(&m, "demo.yaml", buf, len, err, sizeof err) == 0) continue;
        refused++;
        ck_assert_msg(strncmp(err, "demo.yaml:", 10) == 0 && memchr(err, '\0', sizeof err) &&
                          strchr(err, '\n') == NULL,
                      "case %d: error '%.200s' for:\n%.*s", i, err, (int)len, buf);
    }
    ck_assert_int_gt(refused, ITERS / 2); /* the mutations do reach the checks */
}
END_TEST

/* A header of each message type, with fields set at random. */
static size_t valid_header(uint8_t *buf, size_t cap, ps_msg_t *msg)
{
    *msg = (ps_msg_t){.type = (ps_msg_type_t)(1 + rnd() % (PS_MSG_MAX_ - 1)),
                      .req_id = rnd(),
                      .epoch = rnd() % 5,
                      .rank = (int32_t)(rnd() % 70) - 3,
                      .tensor = (uint32_t)(rnd() % 10),
                      .chunk = (uint32_t)(rnd() % 100),
                      .step = rnd() % 1000,
                      .length = rnd() % 100000,
                      .codec = (uint32_t)(rnd() % 8),
                      .members = rnd()};
    snprintf(msg->host, sizeof msg->host, "h%u", (unsigned)(rnd() % 100));
    if (rnd() % 3 == 0) {
        msg->has_decl = 1;
        snprintf(msg->decl.name, sizeof msg->decl.name, "fc%u.weight", (unsigned)(rnd() % 4));
        msg->decl.ndim = 1 + (int)(rnd() % 3);
        for (int d = 0; d < msg->decl.ndim; d++) msg->decl.shape[d] = 1 + (uint32_t)(rnd() % 999);
    }
    size_t len = 0;
    ck_assert_int_eq(ps_msg_encode(msg, buf, cap, &len), 0);
    return len;
}

START_TEST(wire_headers_decode_or_refuse)
{
    uint8_t buf[4096];
    char err[256];
    rs = 0xD1B54A32D192ED03ull;
    int decoded = 0;
    for (int i = 0; i < ITERS; i++) {
        ps_msg_t msg, out;
        size_t len = valid_header(buf, sizeof buf, &msg);
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--) {
            if (rnd() % 3 == 0)
                len = len ? rnd() % len : 0;
            else if (len)
                buf[rnd() % len] = (uint8_t)rnd();
        }
        err[0] = '\0';
        if (ps_msg_decode(&out, buf, len, err, sizeof err) != 0) {
            ck_assert_msg(err[0] != '\0', "case %d: refused without a reason", i);
            continue;
        }
        decoded++;
        ck_assert(ps_msg_type_valid(out.type));
        ck_assert(memchr(out.host, '\0', sizeof out.host) && memchr(out.error, '\0',
                                                                    sizeof out.error));
        ck_assert(memchr(out.decl.name, '\0', sizeof out.decl.name));
        ck_assert(out.decl.ndim >= 0 && out.decl.ndim <= PS_MAX_DIMS);
    }
    ck_assert_int_gt(decoded, 0);
}
END_TEST

START_TEST(bundles_end)
{
    static uint8_t b[8192];
    char err[256];
    rs = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < ITERS; i++) {
        uint8_t hdr[1024], data[64];
        ps_msg_t msg, out;
        size_t used = 0;
        uint32_t entries = 1 + (uint32_t)(rnd() % 4);
        for (uint32_t e = 0; e < entries; e++) {
            valid_header(hdr, sizeof hdr, &msg);
            msg.type = PS_MSG_PULL;
            size_t dl = rnd() % sizeof data;
            for (size_t j = 0; j < dl; j++) data[j] = (uint8_t)rnd();
            ck_assert_int_eq(ps_bundle_add(b, sizeof b, &used, &msg, data, dl), 0);
        }
        for (int k = (int)(rnd() % 3); k > 0 && used; k--) {
            if (rnd() % 2)
                b[rnd() % used] = (uint8_t)rnd();
            else
                used = rnd() % used;
        }
        uint32_t count = entries + (uint32_t)(rnd() % 3) - 1; /* the header's count may lie */
        int checked = ps_bundle_check(b, used, count, err, sizeof err);
        ps_bundle_iter_t it;
        ps_bundle_iter_init(&it, b, used, count);
        const void *d;
        size_t dl;
        int calls = 0, rc;
        while ((rc = ps_bundle_next(&it, &out, &d, &dl, err, sizeof err)) != 0) {
            ck_assert_msg(++calls <= (int)count + 1, "case %d: bundle of %u entries not ended "
                          "after %d calls (%s)", i, count, calls, err);
            if (rc > 0) ck_assert((const uint8_t *)d >= b && (const uint8_t *)d + dl <= b + used);
        }
        /* Framing the check accepts gives each entry once (a spoiled header as an error). */
        if (checked == 0) ck_assert_int_eq(calls, (int)count);
    }
}
END_TEST

START_TEST(payloads_checked_like_decoded)
{
    static const char *const codecs[] = {"none", "fp16", "bf16",        "int8",
                                         "sign", "topk:0.01", "topk:0.5", "randomk:0.1"};
    rs = 0x94D049BB133111EBull;
    for (int i = 0; i < ITERS / 4; i++) {
        psk_codec_t c;
        const char *name = codecs[rnd() % (sizeof codecs / sizeof *codecs)];
        ck_assert_int_eq(psk_codec_parse(&c, name), 0);
        if (rnd() % 2 && (strcmp(name, "int8") == 0 || strcmp(name, "sign") == 0))
            c.block = 1 + (uint32_t)(rnd() % 300);
        size_t n = 1 + rnd() % 3000, n2 = rnd() % 8 ? n : n + 1; /* n2: what the reader expects */
        float *g = malloc(n * sizeof *g), *out = malloc(n2 * sizeof *out);
        float *ref = malloc(n2 * sizeof *ref);
        size_t cap = psk_codec_max_bytes(&c, n), scr = psk_codec_scratch_bytes(&c, n), len;
        uint8_t *p = malloc(cap);
        void *s = scr ? malloc(scr) : NULL;
        ck_assert(g && out && ref && p && (s || !scr));
        for (size_t j = 0; j < n; j++) g[j] = (float)((int)(rnd() % 20001) - 10000) * 1e-3f;
        ck_assert_int_eq(psk_codec_encode_cpu(p, cap, &len, g, n, &c, s), 0);
        for (int k = (int)(rnd() % 4); k > 0 && len; k--) {
            if (rnd() % 3 == 0)
                len = rnd() % len;
            else
                p[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
        }
        for (size_t j = 0; j < n2; j++) out[j] = ref[j] = 0.5f;
        int chk = psk_codec_check(p, len, n2, &c);
        int rc = psk_codec_decode_add_cpu(out, n2, p, len, &c, 0.25f);
        ck_assert_msg((chk == 0) == (rc == 0), "case %d, %s, n %zu: check %d, decode %d", i, name,
                      n2, chk, rc);
        if (rc) ck_assert_msg(memcmp(out, ref, n2 * sizeof *out) == 0, "case %d: refused "
                              "payload written", i);
        free(g);
        free(out);
        free(ref);
        free(p);
        free(s);
    }
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("mutate");
    TCase *tc = tcase_create("mutate");
    tcase_add_test(tc, manifest_errors_name_the_line);
    tcase_add_test(tc, wire_headers_decode_or_refuse);
    tcase_add_test(tc, bundles_end);
    tcase_add_test(tc, payloads_checked_like_decoded);
    suite_add_tcase(s, tc);
    return s;
}
