/* test_integrity.c: CRC-32C (common/crc32c.c): known values, the hardware and portable
 * versions agree at every length and alignment, and CRCs continue across calls, also beside
 * XXH3 in one pass; the Merkle
 * tree (common/merkle.c): its root by definition, and updates equal a rebuild. */
#include <float.h>
#include <math.h>
#include <check.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "crc32c.h"
#include "merkle.h"

START_TEST(crc_known_values)
{
    ck_assert_uint_eq(ps_crc32c(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(ps_crc32c_sw(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(ps_crc32c(0, "", 0), 0);
    uint8_t zeros[32] = {0}; /* RFC 3720 B.4: 32 bytes of zeros */
    ck_assert_uint_eq(ps_crc32c(0, zeros, 32), 0x8a9136aau);
    uint8_t ones[32];
    memset(ones, 0xff, sizeof ones);
    ck_assert_uint_eq(ps_crc32c(0, ones, 32), 0x62a8ab43u);
}
END_TEST

START_TEST(crc_hw_matches_sw)
{
    size_t cap = 3 * 8192 * 2 + 1000;
    uint8_t *b = malloc(cap);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < cap; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    /* Around the three-stream blocks (3 x 256, 3 x 8192) and the folding path's edges (from
     * 1 KiB, 256-byte groups, a tail of 0-255 bytes). */
    const size_t lens[] = {0,    1,    7,    8,    9,    255,   256,   767,   768,   769,
                           1023, 1024, 1025, 1279, 1280, 1281,  1535,  3000,  24575, 24576,
                           24577, 50000, cap - 8};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t off = 0; off < 8; off++) {
            uint32_t hw = ps_crc32c(0, b + off, lens[k]), sw = ps_crc32c_sw(0, b + off, lens[k]);
            ck_assert_msg(hw == sw, "len %zu offset %zu: %08x vs %08x", lens[k], off, hw, sw);
            /* Continuing: the CRC of a then b is the CRC of a continued over b. */
            size_t cut = lens[k] / 3;
            ck_assert_uint_eq(ps_crc32c(ps_crc32c(0, b + off, cut), b + off + cut, lens[k] - cut),
                              hw);
        }
    /* One flipped bit changes it. */
    uint32_t before = ps_crc32c(0, b, 4096);
    b[1234] ^= 4;
    ck_assert_uint_ne(ps_crc32c(0, b, 4096), before);
    free(b);
}
END_TEST

static uint64_t pair(uint64_t l, uint64_t r)
{
    uint64_t b[2] = {l, r}; /* little-endian machine: the byte order merkle.h defines */
    return XXH3_64bits(b, sizeof b);
}

/* The fused copy gives the CRC's value and an exact copy, at every length and alignment
 * around the 256-byte groups and the 1 KiB switch, continuing a CRC; it writes nothing past
 * the end. The same for the streaming-store copy (dst 64-byte aligned: streamed; else the
 * plain path), under each CRC implementation this CPU has. */
START_TEST(crc_copy_matches)
{
    enum { MAX = 9000 };
    static unsigned char src[MAX + 64];
    static _Alignas(64) unsigned char dst[MAX + 128];
    static const char *const impls[] = {"sse4.2+vpclmulqdq", "sse4.2", "slicing-by-8"};
    const char *impl = impls[_i];
    /* Each implementation this CPU has: a slower one reaches the paths the best one skips
     * (without the folding copy, ps_crc32c_copy_nt is the CRC of the source, then
     * ps_memcpy_nt). The expected CRCs are the portable ones. */
    if (ps_crc32c_use(impl) != 0) {
        ck_assert_int_ne(strcmp(impl, "slicing-by-8"), 0); /* every CPU has that */
        return;
    }
    ck_assert_str_eq(ps_crc32c_impl(), impl);
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 131 + 7);
    size_t lens[] = {0, 1, 7, 255, 256, 511, 512, 1023, 1024, 1025, 1279, 1280, 4096, 4099, MAX};
    for (int nt = 0; nt < 2; nt++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
            for (size_t so = 0; so < 3; so++)
                for (size_t d = 0; d < 3; d++) {
                    memset(dst, 0xa5, sizeof dst);
                    size_t n = lens[k], doff = d == 2 ? 64 : d * 5;
                    uint32_t want = ps_crc32c_sw(0x1234u, src + so, n);
                    uint32_t got = nt ? ps_crc32c_copy_nt(0x1234u, dst + doff, src + so, n)
                                      : ps_crc32c_copy(0x1234u, dst + doff, src + so, n);
                    ck_assert_uint_eq(got, want);
                    ck_assert_int_eq(memcmp(dst + doff, src + so, n), 0);
                    ck_assert_uint_eq(dst[doff + n], 0xa5);
                    if (doff) ck_assert_uint_eq(dst[doff - 1], 0xa5);
                }
    ps_crc32c_use(NULL);
}
END_TEST

/* ps_crc32c_floats and ps_crc32c_copy_nt_floats give the CRC's value (and the copy an exact
 * copy) and find a NaN or an infinity wherever it sits: in the folded 256-byte groups, the
 * 64-byte head of the streamed copy, the tail, under each CRC implementation this CPU has;
 * the largest float, a denormal, -0 are finite. */
START_TEST(crc_floats_find_nonfinite)
{
    enum { MAX = 2300 }; /* floats: 9200 bytes, past 1 KiB and many 256-byte groups */
    static float src[MAX + 4];
    static _Alignas(64) unsigned char dst[4 * MAX + 128];
    static const char *const impls[] = {"sse4.2+vpclmulqdq", "sse4.2", "slicing-by-8"};
    if (ps_crc32c_use(impls[_i]) != 0) return; /* a CPU without it */
    for (size_t i = 0; i < MAX + 4; i++) src[i] = (float)i * 0.37f - 100.0f;
    size_t lens[] = {0, 1, 63, 64, 65, 255, 256, 257, 320, 1000, MAX};
    const float odd_values[] = {NAN, -NAN, INFINITY, -INFINITY};
    const float even_values[] = {FLT_MAX, -FLT_MAX, FLT_MIN / 4, -0.0f};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t so = 0; so < 2; so++)
            for (size_t d = 0; d < 6; d++) {
                /* dst at a 64-byte boundary, past it by 12 bytes, or by 1, 2, 3 and 62 (a
                 * record in an LMDB leaf page is only 2-byte aligned) */
                size_t n = lens[k], doff = (size_t[]){0, 12, 1, 2, 3, 62}[d];
                float *in = src + so;
                size_t at[] = {0, n / 2, n ? n - 1 : 0, 16, 17, 64, 65};
                for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
                    for (size_t v = 0; v < 9; v++) {
                        if (at[a] >= n && n) continue;
                        float keep = n ? in[at[a]] : 0;
                        int want_odd = v < 4;
                        if (n && v < 8) in[at[a]] = v < 4 ? odd_values[v] : even_values[v - 4];
                        if (!n) want_odd = 0;
                        uint32_t want = ps_crc32c_sw(0x99u, in, n * 4);
                        int odd = 0, odd2 = 0;
                        ck_assert_uint_eq(ps_crc32c_floats(0x99u, in, n * 4, &odd), want);
                        ck_assert_uint_eq(ps_crc32c_copy_nt_floats(0x99u, dst + doff, in,
                                                                   n * 4, &odd2), want);
                        ck_assert_int_eq(memcmp(dst + doff, in, n * 4), 0);
                        ck_assert_msg(odd == want_odd && odd2 == want_odd,
                                      "%s: %zu floats, value %zu at %zu: odd %d / %d, want %d",
                                      impls[_i], n, v, at[a], odd, odd2, want_odd);
                        odd = 1; /* never cleared */
                        ps_crc32c_floats(0, in, n * 4, &odd);
                        ck_assert_int_eq(odd, 1);
                        if (n) in[at[a]] = keep;
                    }
            }
    ps_crc32c_use(NULL);
}
END_TEST

/* ps_crc32c_xxh3 is ps_crc32c_floats and XXH3_64bits_update side by side: the CRC, the
 * non-finite check and the hash stream, which the library's next update and digest carry on
 * with, equal the separate calls' and the one-shot XXH3 of the whole; at every stream position
 * around its 64-byte stripes and 256-byte buffer, lengths around the 1.5 KiB switch and the
 * 256-byte groups, data on and off 64-byte boundaries, a non-finite value in the head, the
 * middle or the tail, the default secret and a custom one (17 stripes a block), under each CRC
 * implementation this CPU has. */
START_TEST(crc_xxh3_matches_separate)
{
    enum { MAX = 20000, PRE = 17000 };
    static _Alignas(64) unsigned char src[PRE + MAX + 256];
    static const char *const impls[] = {"sse4.2+vpclmulqdq", "sse4.2", "slicing-by-8"};
    if (ps_crc32c_use(impls[_i]) != 0) return; /* a CPU without it */
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 151 + 11);
    static unsigned char secret[200];
    for (size_t i = 0; i < sizeof secret; i++) secret[i] = (unsigned char)(i * 37 + 5);
    const size_t pres[] = {0, 4, 60, 64, 100, 192, 256, 260, 1088, 16384, PRE};
    const size_t lens[] = {0, 4, 1024, 1532, 1536, 1540, 2044, 2048, 4096, 16380, 16384, MAX};
    /* Where the data sits past the prefix's end: 2 too (records in an LMDB leaf page are only
     * 2-byte aligned; a review, session 71). */
    const size_t shifts[] = {0, 16, 48, 4, 2};
    for (int sec = 0; sec < 2; sec++)
        for (size_t a = 0; a < sizeof pres / sizeof pres[0]; a++)
            for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
                for (size_t d = 0; d < sizeof shifts / sizeof shifts[0]; d++)
                    for (int nan_at = -1; nan_at < 3; nan_at++) {
                        size_t pre = pres[a], n = lens[k], sh = shifts[d];
                        /* The stream: the prefix at src + sh, the data right after it. */
                        unsigned char *in = src + sh + pre;
                        size_t at = nan_at == 0 ? (n > 4 ? 4 : 0) : nan_at == 1 ? n / 2 : n - 4;
                        /* +Inf in the head, NaN in the middle, -Inf in the tail: the check
                         * must find infinities too (a review, session 71: one for NaNs only
                         * passed). */
                        float keep = 0, nan = nan_at == 0 ? INFINITY : nan_at == 1 ? NAN
                                                                                : -INFINITY;
                        if (nan_at >= 0 && n) {
                            at &= ~(size_t)3;
                            memcpy(&keep, in + at, 4);
                            memcpy(in + at, &nan, 4);
                        }
                        XXH3_state_t st;
                        if (sec)
                            XXH3_64bits_reset_withSecret(&st, secret, sizeof secret);
                        else
                            XXH3_64bits_reset(&st);
                        XXH3_64bits_update(&st, src + sh, pre);
                        int odd = 0;
                        uint32_t crc = ps_crc32c_xxh3(0x77u, &st, in, n, &odd);
                        ck_assert_uint_eq(crc, ps_crc32c_sw(0x77u, in, n));
                        ck_assert_int_eq(odd, nan_at >= 0 && n > 0);
                        XXH3_state_t st2 = st;
                        uint64_t whole = sec ? XXH3_64bits_withSecret(src + sh, pre + n, secret,
                                                                      sizeof secret)
                                             : XXH3_64bits(src + sh, pre + n);
                        ck_assert_msg(XXH3_64bits_digest(&st) == whole,
                                      "%s: prefix %zu, %zu bytes, secret %d: digest differs",
                                      impls[_i], pre, n, sec);
                        XXH3_64bits_update(&st2, in + n, 100); /* the stream goes on */
                        ck_assert_uint_eq(XXH3_64bits_digest(&st2),
                                          sec ? XXH3_64bits_withSecret(src + sh, pre + n + 100,
                                                                       secret, sizeof secret)
                                              : XXH3_64bits(src + sh, pre + n + 100));
                        if (nan_at >= 0 && n) memcpy(in + at, &keep, 4);
                    }
    ps_crc32c_use(NULL);
}
END_TEST

/* The streamed copy copies exactly, at every length and alignment around its 16-byte head,
 * its 64-byte groups and the 256-byte plain-copy limit; it writes nothing past the end. */
START_TEST(memcpy_nt_matches)
{
    enum { MAX = 5000 };
    static unsigned char src[MAX + 64];
    static _Alignas(64) unsigned char dst[MAX + 128];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 89 + 3);
    size_t lens[] = {0, 1, 15, 255, 256, 270, 271, 272, 319, 320, 1024, 4099, MAX};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t so = 0; so < 3; so++)
            for (size_t doff = 0; doff < 17; doff += 4) {
                memset(dst, 0xa5, sizeof dst);
                size_t n = lens[k];
                ps_memcpy_nt(dst + doff, src + so, n);
                ck_assert_int_eq(memcmp(dst + doff, src + so, n), 0);
                ck_assert_uint_eq(dst[doff + n], 0xa5);
                if (doff) ck_assert_uint_eq(dst[doff - 1], 0xa5);
            }
}
END_TEST

START_TEST(merkle_definition)
{
    uint64_t l[5] = {11, 22, 33, 44, 55};
    ck_assert_uint_eq(ps_merkle_root_of(l, 0), 0);
    ck_assert_uint_eq(ps_merkle_root_of(l, 1), 11);
    ck_assert_uint_eq(ps_merkle_root_of(l, 2), pair(11, 22));
    /* Three leaves: the third moves up unchanged. */
    ck_assert_uint_eq(ps_merkle_root_of(l, 3), pair(pair(11, 22), 33));
    ck_assert_uint_eq(ps_merkle_root_of(l, 5),
                      pair(pair(pair(11, 22), pair(33, 44)), 55));
}
END_TEST

START_TEST(merkle_set_equals_rebuild)
{
    for (size_t n = 1; n < 40; n++) {
        uint64_t l[40];
        for (size_t i = 0; i < n; i++) l[i] = 1000 + i;
        ps_merkle_t t = {0};
        ck_assert_int_eq(ps_merkle_build(&t, l, n), 0);
        for (size_t i = 0; i < n; i += 3) {
            l[i] = 7 * i + 5;
            ps_merkle_set(&t, i, l[i]);
            ck_assert_uint_eq(ps_merkle_root(&t), ps_merkle_root_of(l, n));
        }
        uint64_t before = ps_merkle_root(&t);
        ps_merkle_set(&t, n - 1, l[n - 1] ^ 1);
        ck_assert_uint_ne(ps_merkle_root(&t), before);
        ps_merkle_close(&t);
    }
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("integrity");
    TCase *tc = tcase_create("crc32c");
    tcase_add_test(tc, crc_known_values);
    tcase_add_test(tc, crc_hw_matches_sw);
    tcase_add_loop_test(tc, crc_copy_matches, 0, 3);
    tcase_add_test(tc, memcpy_nt_matches);
    tcase_add_loop_test(tc, crc_floats_find_nonfinite, 0, 3);
    tcase_add_loop_test(tc, crc_xxh3_matches_separate, 0, 3);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("merkle");
    tcase_add_test(tm, merkle_definition);
    tcase_add_test(tm, merkle_set_equals_rebuild);
    suite_add_tcase(s, tm);
    return s;
}
