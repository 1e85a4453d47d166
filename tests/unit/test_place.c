/* test_place.c: chunk geometry and chunk -> shard placement. */
#include <check.h>

#include "place.h"

START_TEST(geometry)
{
    ck_assert_uint_eq(ps_chunk_count(0, 256), 0);
    ck_assert_uint_eq(ps_chunk_count(1, 256), 1);
    ck_assert_uint_eq(ps_chunk_count(256, 256), 1);
    ck_assert_uint_eq(ps_chunk_count(257, 256), 2);
    ck_assert_uint_eq(ps_chunk_len(257, 256, 0), 256);
    ck_assert_uint_eq(ps_chunk_len(257, 256, 1), 1);
}
END_TEST

START_TEST(deterministic)
{
    for (uint64_t o = 0; o < 1000; o++) {
        ck_assert_uint_eq(ps_place_shard(o, 3), ps_place_shard(o, 3));
        ck_assert_uint_lt(ps_place_shard(o, 7), 7);
    }
}
END_TEST

/* A model of 100 chunks in tensors of uneven sizes, numbered as the
 * coordinator numbers them: each tensor's first chunk follows the last one's. */
START_TEST(balanced_over_three)
{
    const uint64_t chunk_elems = 1000;
    const uint64_t numel[] = {784 * 256 / 4, 256, 128 * 128, 128, 1280, 10,
                              1000,          1,   1999,      22001}; /* 51+1+17+1+2+1+1+1+2+23 */
    uint32_t per_shard[3] = {0};
    uint64_t next = 0, total = 0;
    for (size_t t = 0; t < sizeof numel / sizeof numel[0]; t++) {
        uint32_t n = ps_chunk_count(numel[t], chunk_elems);
        for (uint32_t c = 0; c < n; c++) per_shard[ps_place_shard(next + c, 3)]++;
        next += n;
        total += n;
    }
    ck_assert_uint_eq(total, 100);
    for (int s = 0; s < 3; s++) {
        double share = per_shard[s] / (100.0 / 3);
        ck_assert_msg(share > 0.9 && share < 1.1, "shard %d holds %u of 100 chunks", s,
                      per_shard[s]);
    }
}
END_TEST

/* Declaring a new tensor never moves the chunks of earlier tensors. */
START_TEST(stable_under_growth)
{
    uint32_t before[50];
    for (uint64_t o = 0; o < 50; o++) before[o] = ps_place_shard(o, 4);
    for (uint64_t o = 0; o < 50; o++) ck_assert_uint_eq(ps_place_shard(o, 4), before[o]);
    ck_assert_uint_eq(ps_place_shard(5, 1), 0);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("place");
    TCase *tc = tcase_create("place");
    tcase_add_test(tc, geometry);
    tcase_add_test(tc, deterministic);
    tcase_add_test(tc, balanced_over_three);
    tcase_add_test(tc, stable_under_growth);
    suite_add_tcase(s, tc);
    return s;
}
