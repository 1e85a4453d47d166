/* seeds.c: the inputs each harness starts from (fuzz.h, fuzz_seeds): valid ones in that
 * harness's form, so that the fuzzer begins past the first checks, and every input that once
 * failed ("crash-*", named for the bug), which the replay tests run with the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "codec.h"
#include "fuzz.h"
#include "httphead.h"
#include "wire.h"

static fuzz_seed_fn emit;
static void *emit_arg;

static void put_named(const char *target, const char *name, const void *p, size_t n)
{
    emit(target, name, p, n, emit_arg);
}

static void put(const char *target, int i, const void *p, size_t n)
{
    char name[32];
    snprintf(name, sizeof name, "seed-%03d", i);
    put_named(target, name, p, n);
}

/* Message @p i of a varied set: each type, with a declaration, replay tags or a session. */
static void message(ps_msg_t *m, int i)
{
    memset(m, 0, sizeof *m);
    m->type = (ps_msg_type_t)(1 + i % (PS_MSG_MAX_ - 1));
    m->req_id = 1000 + (uint64_t)i;
    m->epoch = (uint64_t)i % 3;
    m->rank = i % 5 - 1;
    m->tensor = (uint32_t)i % 7;
    m->chunk = (uint32_t)i % 11;
    m->step = (uint64_t)i * 977;
    m->length = (uint64_t)i * 4096;
    m->codec_fraction = 0.01f * (float)(i % 5);
    m->members = 0x5ull << (i % 60);
    snprintf(m->host, sizeof m->host, "host%d", i);
    if (i % 4 == 1) {
        m->has_decl = 1;
        snprintf(m->decl.name, sizeof m->decl.name, "fc%d.weight", i);
        m->decl.ndim = 1 + i % 3;
        for (int d = 0; d < m->decl.ndim; d++)
            m->decl.shape[d] = 3 + (uint32_t)(i + d);
    }
    if (i % 4 == 2) {
        m->nreplay = 1 + (uint32_t)i % 4;
        for (uint32_t k = 0; k < m->nreplay; k++)
            m->replay[k] = (uint64_t)i << 20 | k;
    }
    if (i % 4 == 3) {
        m->session_len = PS_SESSION_MAX;
        memset(m->session, 0xA5, PS_SESSION_MAX);
        snprintf(m->error, sizeof m->error, "error %d", i);
    }
}

static void le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void fuzz_seeds(fuzz_seed_fn fn, void *arg)
{
    emit = fn;
    emit_arg = arg;
    static uint8_t buf[1 << 16];
    ps_msg_t m;
    for (int i = 0; i < 48; i++) {
        size_t n;
        message(&m, i);
        if (ps_msg_encode(&m, buf, sizeof buf, &n)) abort();
        put("wire", i, buf, n);
    }
    for (int i = 0; i < 8; i++) { /* bundle: u16 count, then the entries */
        size_t used = 0;
        uint8_t data[40];
        memset(data, i, sizeof data);
        int count = 1 + i % 4;
        for (int e = 0; e < count; e++) {
            message(&m, i * 4 + e);
            m.type = e % 2 ? PS_MSG_PUSH : PS_MSG_PULL;
            if (ps_bundle_add(buf + 2, sizeof buf - 2, &used, &m, data, (size_t)(e * 13))) abort();
        }
        le(buf, (uint64_t)count, 2);
        put("bundle", i, buf, used + 2);
    }
    /* codec: fuzz_codec's 4 bytes (codec, n, flags: header from the harness), then the body. */
    static const char *const codecs[] = {"none",      "fp16",     "bf16",        "int8",  "sign",
                                         "topk:0.01", "topk:0.5", "randomk:0.1", "topk:1"};
    for (int i = 0; i < 9; i++) {
        psk_codec_t c;
        size_t n = 37 + (size_t)i * 50, len;
        static float g[4096];
        for (size_t j = 0; j < n; j++)
            g[j] = (float)((int)(j * 7919 % 201) - 100) * 0.01f;
        if (psk_codec_parse(&c, codecs[i])) abort();
        size_t cap = psk_codec_max_bytes(&c, n);
        void *scr = calloc(1, psk_codec_scratch_bytes(&c, n) + 4);
        static uint8_t p[65536];
        if (psk_codec_encode_cpu(p, cap, &len, g, n, &c, scr)) abort();
        free(scr);
        buf[0] = (uint8_t)i;
        le(buf + 1, n - 1, 2);
        buf[3] = 0;
        memcpy(buf + 4, p + PSK_CODEC_HEADER_BYTES, len - PSK_CODEC_HEADER_BYTES);
        put("codec", i, buf, 4 + len - PSK_CODEC_HEADER_BYTES);
    }
    /* manifest: every section */
    static const char manifest[] =
        "cluster: demo\nchunk_bytes: 1048576\nmap_size_mb: 512\nfusion_bytes: 65536\n"
        "spin_us: 500\napply_threads: 2\nservers:\n"
        "  - {host: 127.0.0.1, port: 7300, data_dir: /tmp/psd-demo/0}\n"
        "  - {host: 127.0.0.1, port: 7301, data_dir: /tmp/psd-demo/1}\n"
        "checkpoint: {dir: /tmp/ck, every_steps: 100, keep: 3}\n"
        "job:\n  model: mlp\n  layers: [784, 256, 128, 10]\n  batch_size: 64\n  epochs: 10\n"
        "  workers: 4\n  consistency: ssp\n  staleness: 4\n"
        "  optimizer: {name: adagrad, lr: 0.001, eps: 1.0e-8, weight_decay: 0.0, lr_decay: 0.1,\n"
        "              initial_accumulator_value: 0.1, schedule: cosine, warmup_steps: 10}\n"
        "  compression:\n    codec: topk:0.01\n"
        "    rules: [{match: '*.bias', codec: none}, {match: 'fc1.*', codec: int8}]\n"
        "    pull: fp16\n    block: 256\n";
    put("manifest", 0, manifest, sizeof manifest - 1);
    /* json: a checkpoint's meta.json (shard 0's, then after the NUL shard 1's) */
    static const char meta[] =
        "{\"shard\": 0, \"nshards\": 2, \"cluster\": \"demo\", \"id\": \"00000000000000a1\", "
        "\"step\": 5, \"consistency\": \"bsp\", \"records\": 4, \"name\": \"fc\\u0001\\\"x\", "
        "\"untrained_first\": \"fc2.bias\"}\0"
        "{\"shard\": 1, \"nshards\": 2, \"cluster\": \"demo\", \"id\": \"00000000000000a1\", "
        "\"step\": 5, \"records\": 2}";
    put("json", 0, meta, sizeof meta - 1);
    /* tcpguard: 1 (UCX's magic first), a connection request from 127.0.0.1, messages,
     * a keepalive, a put acknowledgement, a connection ack. */
    size_t n = 0;
    buf[n++] = 1;
    uint8_t req[5 + 29] = {32};
    le(req + 1, 29, 4);
    le(req + 5, 1, 4);
    le(req + 5 + 5, 7, 8);
    uint8_t sa[16] = {2, 0, 0x9c, 0x40, 127, 0, 0, 1}; /* AF_INET, port 40000 */
    memcpy(req + 5 + 13, sa, 16);
    memcpy(buf + n, req, sizeof req);
    n += sizeof req;
    const uint8_t frames[][9] = {{23, 4, 0, 0, 0, 1, 2, 3, 4},
                                 {35, 0, 0, 0, 0},
                                 {34, 4, 0, 0, 0, 1, 0, 0, 0},
                                 {32, 4, 0, 0, 0, 2, 0, 0, 0}};
    const size_t flen[] = {9, 5, 9, 9};
    for (int i = 0; i < 4; i++) {
        memcpy(buf + n, frames[i], flen[i]);
        n += flen[i];
    }
    put("tcpguard", 0, buf, n);
    put("tcpguard", 1, buf, 1 + 34); /* the request alone */
    /* and a put request of 3072 bytes into fuzz_tcpguard's receive, its data, a message */
    n = 1 + 34;
    uint8_t putreq[5 + 20] = {33};
    le(putreq + 1, 20, 4);
    le(putreq + 5, FUZZ_TCPGUARD_SLOT + 1024, 8);
    le(putreq + 13, 3072, 8);
    memcpy(buf + n, putreq, sizeof putreq);
    n += sizeof putreq;
    memset(buf + n, 33, 3072);
    n += 3072;
    memcpy(buf + n, frames[0], flen[0]);
    n += flen[0];
    put("tcpguard", 2, buf, n);
    /* httphead: the byte that cuts the reads, then a request */
    static const char *const reqs[] = {
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9300\r\nAccept: */*\r\n\r\n",
        "HEAD /healthz HTTP/1.0\n\n",
        "\r\n\r\nGET /status?x=1#y HTTP/1.1\r\n\r\n",
        "GET http://127.0.0.1:9300/metrics HTTP/1.1\r\n\r\n",
        "GET http://h?q HTTP/1.1\r\n\r\n",
        "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
        "BREW /pot HTTP/1.1\r\n\r\n",
        "GET /a\x01 HTTP/1.1\r\n\r\n"};
    for (int i = 0; i < (int)(sizeof reqs / sizeof *reqs); i++) {
        buf[0] = (uint8_t)(7 * i);
        size_t rl = strlen(reqs[i]);
        memcpy(buf + 1, reqs[i], rl);
        put("httphead", i, buf, 1 + rl);
    }
    /* and a head longer than the endpoint takes (431) */
    buf[0] = 60;
    memcpy(buf + 1, "GET /", 5);
    memset(buf + 6, 'a', PSD_HTTP_HEAD_MAX + 100);
    put("httphead", 8, buf, 6 + PSD_HTTP_HEAD_MAX + 100);
    /* inputs that once failed, kept as regressions (tests/fuzz/README.md, "Found so far") */
    static const char esc1[] = "{\"name\": \"ab\\u1";
    put_named("json", "crash-short-u-escape-at-end", esc1, sizeof esc1 - 1);
    static const char esc2[] = "\"\x13nc\x13ncl2\"\": \"\xbf\x13n\x82\xdd\\uBs\"";
    put_named("json", "crash-short-u-escape-fuzzer", esc2, sizeof esc2 - 1);
    static const char nul[] = "\0GET /metrics HTTP/1.1\r\n\r\n\0"; /* cut: byte by byte */
    put_named("httphead", "crash-nul-after-head", nul, sizeof nul - 1);
    size_t n0;
    message(&m, 0);
    if (ps_msg_encode(&m, buf, sizeof buf, &n0)) abort();
    memcpy(buf + n0, "\xad\x01\x00\x00\x00\x80", 6); /* codec_fraction (21) = -0.0 */
    put_named("wire", "crash-negative-zero-fraction", buf, n0 + 6);
}
