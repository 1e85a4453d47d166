/* test_storeview.c: libps's read-only view of a shard's store (common/storeview.h): it reads
 * the committed record with its version and CRC checked, never an uncommitted one, refuses a
 * store of another identity, notices a record whose bytes do not match its CRC, and a reset
 * view does not keep the writer from reusing pages, and two views in one process share its
 * environment. Views are opened in a child process. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "store.h"
#include "storeview.h"

static char g_dir[256];
static psd_store_t g_st;

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/psd-test-view-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    char err[512];
    ck_assert_msg(psd_store_open(&g_st, g_dir, 64, "demo", 4096, 2, err, sizeof err) == 0, "%s",
                  err);
}

static void teardown(void)
{
    psd_store_close(&g_st);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
}

static uint64_t store_id(void)
{
    int fd;
    ck_assert_int_eq(mdb_env_get_fd(g_st.env, &fd), 0);
    return ps_storeview_file_id(fd);
}

/* Begin a write of chunk (t, 0) with @p n params = base + i at @p version; sealed, not committed. */
static psd_chunk_hdr_t *begin_chunk(psd_wtxn_t *tx, uint32_t t, uint32_t n, uint64_t version,
                                    float base)
{
    ck_assert_int_eq(psd_store_begin(&g_st, tx), 0);
    psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_reserve(tx, t, 0, n, 2, &h), 0);
    *h = (psd_chunk_hdr_t){.version = version, .n = n, .nstate = 2};
    for (uint32_t i = 0; i < 3 * n; i++) psd_chunk_params(h)[i] = base + (float)i;
    psd_store_chunk_seal(h);
    return h;
}

static void put_chunk(uint32_t t, uint32_t n, uint64_t version, float base)
{
    psd_wtxn_t tx;
    begin_chunk(&tx, t, n, version, base);
    ck_assert_int_eq(psd_store_commit(&tx), 0);
}

/*
 * The view lives in a child process, as in a worker: LMDB does not support opening one
 * environment twice in a process. The test sends it reads; it answers each with the read's
 * return code, or 1 if the read succeeded with the wrong version or values.
 */
typedef struct {
    uint32_t t, n;
    uint64_t min_version, want_version;
    float want_base;
} rd_t;

typedef struct {
    pid_t pid;
    int to, from;
} reader_t;

#define SECOND_VIEW UINT32_MAX /* rd_t.t: open and close a second view instead of a read */

static void reader_main(int in, int out, uint64_t id)
{
    ps_storeview_t v;
    char err[512];
    int rc = ps_storeview_open(&v, g_dir, id, err, sizeof err);
    if (write(out, &rc, sizeof rc) != sizeof rc || rc) _exit(0);
    static float buf[1 << 20];
    rd_t r;
    while (read(in, &r, sizeof r) == sizeof r) {
        if (r.t == SECOND_VIEW) { /* a second view of the store opened and closed beside v */
            ps_storeview_t v2;
            rc = ps_storeview_open(&v2, g_dir, id, err, sizeof err);
            if (rc == 0) ps_storeview_close(&v2);
            if (write(out, &rc, sizeof rc) != sizeof rc) break;
            continue;
        }
        uint64_t version = 0;
        rc = ps_storeview_read(&v, r.t, 0, r.min_version, buf, r.n, &version, NULL);
        if (rc == 0 && version != r.want_version) rc = 1;
        for (uint32_t i = 0; rc == 0 && i < r.n; i++)
            if (buf[i] != r.want_base + (float)i) rc = 1;
        if (write(out, &rc, sizeof rc) != sizeof rc) break;
    }
    ps_storeview_close(&v);
    _exit(0);
}

/* Start a reader of the store with identity @p id; returns ps_storeview_open's result. */
static int reader_start(reader_t *rd, uint64_t id)
{
    int a[2], b[2];
    ck_assert_int_eq(pipe(a), 0);
    ck_assert_int_eq(pipe(b), 0);
    rd->pid = fork();
    ck_assert_int_ge(rd->pid, 0);
    if (rd->pid == 0) {
        close(a[1]);
        close(b[0]);
        reader_main(a[0], b[1], id);
    }
    close(a[0]);
    close(b[1]);
    rd->to = a[1];
    rd->from = b[0];
    int rc = -1;
    ck_assert_int_eq(read(rd->from, &rc, sizeof rc), sizeof rc);
    return rc;
}

static int reader_read(reader_t *rd, uint32_t t, uint32_t n, uint64_t min_version,
                       uint64_t want_version, float want_base)
{
    rd_t r = {t, n, min_version, want_version, want_base};
    ck_assert_int_eq(write(rd->to, &r, sizeof r), sizeof r);
    int rc = -1;
    ck_assert_int_eq(read(rd->from, &rc, sizeof rc), sizeof rc);
    return rc;
}

static void reader_stop(reader_t *rd)
{
    close(rd->to);
    close(rd->from);
    int status;
    ck_assert_int_eq(waitpid(rd->pid, &status, 0), rd->pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

START_TEST(reads_committed_record)
{
    put_chunk(3, 1000, 5, 10.0f);
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id()), 0);
    ck_assert_int_eq(reader_read(&rd, 3, 1000, 5, 5, 10.0f), 0);
    ck_assert_int_eq(reader_read(&rd, 3, 1000, 6, 5, 10.0f), PS_ESTALE);
    ck_assert_int_eq(reader_read(&rd, 3, 999, 0, 5, 10.0f), PS_ESTORE);
    ck_assert_int_eq(reader_read(&rd, 4, 1000, 0, 5, 10.0f), PS_ENOENT);
    reader_stop(&rd);
}
END_TEST

START_TEST(uncommitted_write_unseen)
{
    put_chunk(0, 4096, 1, 1.0f);
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id()), 0);
    psd_wtxn_t tx;
    begin_chunk(&tx, 0, 4096, 2, 7.0f);
    ck_assert_int_eq(reader_read(&rd, 0, 4096, 1, 1, 1.0f), 0);
    ck_assert_int_eq(reader_read(&rd, 0, 4096, 2, 1, 1.0f), PS_ESTALE);
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    ck_assert_int_eq(reader_read(&rd, 0, 4096, 2, 2, 7.0f), 0);
    reader_stop(&rd);
}
END_TEST

START_TEST(other_store_refused)
{
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id() + 1), PS_ESTALE);
    reader_stop(&rd);
    ps_storeview_t v;
    char err[512], missing[300];
    snprintf(missing, sizeof missing, "%s/nope", g_dir);
    ck_assert_int_lt(ps_storeview_open(&v, missing, store_id(), err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, missing));
    ck_assert_ptr_null(v.env);
}
END_TEST

/* Two views of one store in one process (two libps clients: psd.torch with a model per thread),
 * one closed: the other reads on, and the writer still sees its reader alive. Before, each view
 * opened its own environment; closing one cleared every reader slot of the process and dropped
 * its locks, and the other's reads failed ("reading chunk 0 of tensor 0 from its store failed
 * (shard store error)": a probe, sessions 45-46). */
START_TEST(second_view_closed)
{
    put_chunk(2, 1000, 3, 5.0f);
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id()), 0);
    ck_assert_int_eq(reader_read(&rd, 2, 1000, 3, 3, 5.0f), 0);
    ck_assert_int_eq(reader_read(&rd, SECOND_VIEW, 0, 0, 0, 0.0f), 0);
    int dead = -1;
    ck_assert_int_eq(mdb_reader_check(g_st.env, &dead), 0);
    ck_assert_int_eq(dead, 0); /* the reader's process keeps its lock */
    ck_assert_int_eq(reader_read(&rd, 2, 1000, 3, 3, 5.0f), 0);
    reader_stop(&rd);
}
END_TEST

START_TEST(crc_mismatch_noticed)
{
    psd_wtxn_t tx;
    psd_chunk_hdr_t *h = begin_chunk(&tx, 0, 1000, 4, 0.0f);
    psd_chunk_params(h)[500] = -1.0f; /* after the seal: the stored CRC no longer matches */
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id()), 0);
    ck_assert_int_eq(reader_read(&rd, 0, 1000, 0, 4, 0.0f), PS_ECRC);
    reader_stop(&rd);
}
END_TEST

/* A view read once, then 200 updates of a 768 KiB record (150 MB written) in a 64 MiB map, then
 * read again: a view between reads holds no snapshot, so the writer reuses the freed pages (had
 * the first read kept its snapshot, the map would fill). */
START_TEST(reset_view_keeps_no_pages)
{
    enum { N = 64 * 1024 };
    put_chunk(0, N, 0, 0.0f);
    reader_t rd;
    ck_assert_int_eq(reader_start(&rd, store_id()), 0);
    ck_assert_int_eq(reader_read(&rd, 0, N, 0, 0, 0.0f), 0);
    for (uint64_t s = 1; s <= 200; s++) put_chunk(0, N, s, (float)s);
    ck_assert_int_eq(reader_read(&rd, 0, N, 200, 200, 200.0f), 0);
    reader_stop(&rd);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("storeview");
    TCase *tc = tcase_create("storeview");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, reads_committed_record);
    tcase_add_test(tc, uncommitted_write_unseen);
    tcase_add_test(tc, other_store_refused);
    tcase_add_test(tc, crc_mismatch_noticed);
    tcase_add_test(tc, second_view_closed);
    tcase_add_test(tc, reset_view_keeps_no_pages);
    suite_add_tcase(s, tc);
    return s;
}
