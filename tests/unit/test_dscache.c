/* test_dscache.c: the decoded dataset cache (worker/dscache.c): a saved split reads back byte for
 * byte, a damaged or cut file is a miss, the name follows the sources, and "off" turns it off. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dscache.h"

static char dir[256], ipath[300], lpath[300];

static void setup(void)
{
    snprintf(dir, sizeof dir, "%s/dscache.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("PS_DATASET_CACHE", dir, 1);
    snprintf(ipath, sizeof ipath, "%s/images.gz", dir);
    snprintf(lpath, sizeof lpath, "%s/labels.gz", dir);
    FILE *f = fopen(ipath, "w");
    fputs("images", f);
    fclose(f);
    f = fopen(lpath, "w");
    fputs("labels", f);
    fclose(f);
}

static void teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    unsetenv("PS_DATASET_CACHE");
}

static uint8_t pixels[3 * 5];
static uint8_t labels[3] = {1, 9, 0};

static ps_dataset_t sample(void)
{
    for (int i = 0; i < 15; i++) pixels[i] = (uint8_t)(i * 17);
    return (ps_dataset_t){.n = 3, .dim = 5, .pixels = pixels, .labels = labels};
}

START_TEST(test_roundtrip)
{
    char path[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    ck_assert_ptr_nonnull(strstr(path, dir));
    ps_dataset_t d = sample(), m = {0};
    ck_assert_int_eq(ps_dscache_load(&m, path), -1); /* nothing there yet */
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), 0);
    ck_assert_ptr_ne(m.pixels, pixels); /* a copy the dataset owns */
    ck_assert_uint_eq(m.n, 3);
    ck_assert_uint_eq(m.dim, 5);
    ck_assert_int_eq(memcmp(m.pixels, pixels, sizeof pixels), 0);
    ck_assert_int_eq(memcmp(m.labels, labels, sizeof labels), 0);
    ps_dataset_free(&m);
    ck_assert_ptr_null(m.pixels);
}
END_TEST

START_TEST(test_damage_is_a_miss)
{
    char path[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    ps_dataset_t d = sample(), m = {0};
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    /* one bit of one image value */
    FILE *f = fopen(path, "r+");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 4096 + 7, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, 4096 + 7, SEEK_SET), 0);
    fputc(c ^ 1, f);
    fclose(f);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    /* saved again, then cut short */
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ck_assert_int_eq(truncate(path, 4096 + 20), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_ptr_null(m.pixels);
}
END_TEST

/* A whole, intact cache file under another key's name (another split's or dataset's, renamed
 * by mistake or by another user in a shared directory) is a miss: before, the test split was
 * trained on as the training set, silently (found by a review). */
START_TEST(test_other_key_is_a_miss)
{
    char path[4200], other[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    ps_dataset_t d = sample(), m = {0};
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    snprintf(other, sizeof other, "%s/psd-dataset-0123456789abcdef.bin", dir);
    ck_assert_int_eq(rename(path, other), 0);
    ck_assert_int_eq(ps_dscache_load(&m, other), -1);
    ck_assert_int_eq(rename(other, path), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), 0); /* under its own name, still good */
    ps_dataset_free(&m);
}
END_TEST

/* A split larger than one read block and than the 2 MiB-page threshold reads back exactly,
 * the damaged last block is a miss, and a dataset whose n was lowered after loading (as
 * job.train_samples does) is released whole; a header whose sizes wrap is a miss. */
START_TEST(test_large_split)
{
    enum { N = 16001, DIM = 784 }; /* 12.5 MB of pixels: four 4 MiB reads */
    char path[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    ps_dataset_t d = {.n = N, .dim = DIM, .pixels = malloc((size_t)N * DIM), .labels = malloc(N)};
    ck_assert(d.pixels && d.labels);
    for (size_t i = 0; i < (size_t)N * DIM; i++) d.pixels[i] = (uint8_t)(i % 251);
    for (size_t i = 0; i < N; i++) d.labels[i] = (uint8_t)(i % 10);
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ps_dataset_t m = {0};
    ck_assert_int_eq(ps_dscache_load(&m, path), 0);
    ck_assert_uint_eq(m.n, N);
    ck_assert_uint_eq(m.pixels_bytes, (size_t)N * DIM);
    ck_assert_int_eq(memcmp(m.pixels, d.pixels, m.pixels_bytes), 0);
    ck_assert_int_eq(memcmp(m.labels, d.labels, N), 0);
    m.n = 10; /* job.train_samples */
    ps_dataset_free(&m);
    ck_assert_ptr_null(m.pixels);
    /* the last label flipped: a miss, nothing kept */
    FILE *f = fopen(path, "r+");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, -1, SEEK_END), 0);
    fputc(d.labels[N - 1] ^ 1, f);
    fclose(f);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_ptr_null(m.pixels);
    /* n and dim whose product wraps around 2^64 */
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    f = fopen(path, "r+");
    ck_assert_ptr_nonnull(f);
    uint32_t huge[2] = {0x80000000u, 0x80000000u};
    ck_assert_int_eq(fseek(f, 8, SEEK_SET), 0); /* after the magic: n, dim */
    ck_assert_uint_eq(fwrite(huge, sizeof huge, 1, f), 1);
    fclose(f);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    free(d.pixels);
    free(d.labels);
}
END_TEST

/* A file that is not this user's own, written only by it, regular, with labels of the
 * dataset's classes is not used, whatever its CRC says (in /tmp another user could plant
 * training data, or a label of 200 that aborted every worker, or a FIFO that hung them). */
START_TEST(test_untrusted_is_a_miss)
{
    char path[4200], other[4300];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    ps_dataset_t d = sample(), m = {0};
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ck_assert_int_eq(chmod(path, 0666), 0); /* others may write it */
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), 0);
    ps_dataset_free(&m);
    snprintf(other, sizeof other, "%s.real", path); /* a link to an intact file */
    ck_assert_int_eq(rename(path, other), 0);
    ck_assert_int_eq(symlink(other, path), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0); /* no writer: an open that waited would hang */
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_int_eq(unlink(path), 0);
    uint8_t bad[3] = {1, 200, 0}; /* saved with its CRC: only the label check refuses it */
    d.labels = bad;
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), -1);
    ck_assert_ptr_null(m.pixels);
}
END_TEST

/* A writer killed before its rename leaves "<file>.tmp.<pid>": one of this pid (a container's
 * pid 1 again) no longer stops the cache from being written, and one of a process that is
 * gone, untouched for over 10 minutes, is removed by the next save (nothing removed them). */
START_TEST(test_leftover_tmp_files)
{
    char path[4200], mine[4300], dead[4300];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    pid_t child = fork();
    if (child == 0) _exit(0);
    ck_assert_int_gt(child, 0);
    ck_assert_int_eq(waitpid(child, NULL, 0), child); /* its pid now names no process */
    snprintf(mine, sizeof mine, "%s.tmp.%ld", path, (long)getpid());
    snprintf(dead, sizeof dead, "%s.tmp.%ld", path, (long)child);
    const char *left[2] = {mine, dead};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(left[i], "w");
        ck_assert_ptr_nonnull(f);
        fputs("half", f);
        fclose(f);
    }
    struct timeval old[2] = {{.tv_sec = time(NULL) - 3600}, {.tv_sec = time(NULL) - 3600}};
    ck_assert_int_eq(utimes(dead, old), 0);
    ps_dataset_t d = sample(), m = {0};
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    ck_assert_int_eq(ps_dscache_load(&m, path), 0);
    ps_dataset_free(&m);
    ck_assert_int_eq(access(mine, F_OK), -1);
    ck_assert_int_eq(access(dead, F_OK), -1);
}
END_TEST

START_TEST(test_name_follows_sources)
{
    char a[4200], b[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, a, sizeof a), 0);
    FILE *f = fopen(lpath, "a");
    fputs("more", f);
    fclose(f);
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, b, sizeof b), 0);
    ck_assert_str_ne(a, b);
    /* Replaced by a file of the same size and modification time (cp -p, rsync -a): before, the
     * same name, and the old decoded copy was trained on. */
    struct stat st;
    ck_assert_int_eq(stat(lpath, &st), 0);
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.new", lpath);
    f = fopen(tmp, "w");
    fputs("labelsMORE", f); /* as long as "labelsmore" */
    fclose(f);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, tmp, ts, 0), 0);
    ck_assert_int_eq(rename(tmp, lpath), 0);
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, a, sizeof a), 0);
    ck_assert_str_ne(a, b);
    setenv("PS_DATASET_CACHE", "off", 1);
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, b, sizeof b), -1);
    /* "on" and its kin: the default place ($TMPDIR), not a directory named "on" (a review,
     * session 71). */
    const char *tmpdir = getenv("TMPDIR");
    setenv("TMPDIR", dir, 1);
    setenv("PS_DATASET_CACHE", "On", 1);
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, b, sizeof b), 0);
    ck_assert_msg(strncmp(b, dir, strlen(dir)) == 0 && b[strlen(dir)] == '/', "%s", b);
    if (tmpdir) setenv("TMPDIR", tmpdir, 1);
    else unsetenv("TMPDIR");
}
END_TEST

/* The name a cache file of @p ipath and @p lpath had before session 56 (PSDSC002, floats): the
 * FNV-1a of each source's path and stat fields, without the format (dscache.c cache_path); with
 * @p salted, sessions 56-70's: the format first, not the user. */
#define DSC_MAGIC_TEST "PSDSC003" /* dscache.c's DSC_MAGIC, with its NUL: sizeof 9 */
static void old_name(char *out, size_t len, int salted)
{
    uint64_t h = 0xcbf29ce484222325ull;
    if (salted)
        for (size_t k = 0; k < sizeof DSC_MAGIC_TEST; k++)
            h = (h ^ (unsigned char)DSC_MAGIC_TEST[k]) * 0x100000001b3ull;
    const char *src[2] = {ipath, lpath};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        ck_assert_int_eq(stat(src[i], &st), 0);
        int64_t meta[7] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                           (int64_t)st.st_mtim.tv_nsec, (int64_t)st.st_ctim.tv_sec,
                           (int64_t)st.st_ctim.tv_nsec, (int64_t)st.st_ino,
                           (int64_t)st.st_dev};
        const unsigned char *b = (const unsigned char *)src[i];
        for (size_t k = 0; k <= strlen(src[i]); k++) h = (h ^ b[k]) * 0x100000001b3ull;
        b = (const unsigned char *)meta;
        for (size_t k = 0; k < sizeof meta; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    }
    snprintf(out, len, "%s/psd-dataset-%016llx.bin", dir, (unsigned long long)h);
}

/* The floats' copy of an earlier version (another name: the format is in this one's) is removed
 * by ps_dscache_drop_old, as load_split calls it after a save: ~220 MB no newer psworker reads.
 * Only a regular file: a link there is left, and so is this version's copy. */
START_TEST(test_old_copy_removed)
{
    char path[4200], old[4200], real[4300], salted[4200];
    ck_assert_int_eq(ps_dscache_path(ipath, lpath, path, sizeof path), 0);
    old_name(old, sizeof old, 0);
    ck_assert_str_ne(old, path);
    /* Sessions 56-70's name (no user in it: a second user's copy took the first's name and was
     * never written; a review, session 71) is another, and is dropped too. */
    old_name(salted, sizeof salted, 1);
    ck_assert_str_ne(salted, path);
    ps_dataset_t d = sample();
    ck_assert_int_eq(ps_dscache_save(&d, path), 0);
    struct stat ms;
    ck_assert_int_eq(stat(path, &ms), 0);
    ck_assert_uint_eq(ms.st_mode & 0777, 0600); /* was 0644, whatever the source's mode */
    FILE *f = fopen(old, "w");
    ck_assert_ptr_nonnull(f);
    fputs("PSDSC002", f);
    fclose(f);
    f = fopen(salted, "w");
    ck_assert_ptr_nonnull(f);
    fputs("PSDSC003", f);
    fclose(f);
    ps_dscache_drop_old(ipath, lpath);
    ck_assert_int_eq(access(old, F_OK), -1);
    ck_assert_int_eq(access(salted, F_OK), -1);
    ck_assert_int_eq(access(path, F_OK), 0);
    snprintf(real, sizeof real, "%s.elsewhere", path);
    f = fopen(real, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(symlink(real, old), 0);
    ps_dscache_drop_old(ipath, lpath);
    struct stat st;
    ck_assert_int_eq(lstat(old, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(access(real, F_OK), 0);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("dscache");
    TCase *tc = tcase_create("dscache");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_damage_is_a_miss);
    tcase_add_test(tc, test_other_key_is_a_miss);
    tcase_add_test(tc, test_large_split);
    tcase_add_test(tc, test_name_follows_sources);
    tcase_add_test(tc, test_untrusted_is_a_miss);
    tcase_add_test(tc, test_leftover_tmp_files);
    tcase_add_test(tc, test_old_copy_removed);
    suite_add_tcase(s, tc);
    return s;
}
