/* test_store.c: the shard store: records survive close and reopen, the
 * data_dir lock, identity checks, old -> new updates, the record hashes, and the upgrade of
 * format 1 records. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "crc32c.h"
#include "ps/ps_error.h"
#include "checkpoint.h"
#include "run.h"
#include "store.h"

static char g_dir[256];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/psd-test-store-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
}

static int open_store(psd_store_t *st, const char *cluster, uint64_t chunk_bytes, uint32_t nstate,
                      char *err)
{
    return psd_store_open(st, g_dir, 64, cluster, chunk_bytes, nstate, err, 512);
}

static void write_chunk(psd_store_t *st, uint32_t t, uint32_t c, uint64_t version, float base)
{
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(st, &tx), 0);
    psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_reserve(&tx, t, c, 1000, 2, &h), 0);
    *h = (psd_chunk_hdr_t){.version = version, .n = 1000, .nstate = 2};
    for (int i = 0; i < 3000; i++) psd_chunk_params(h)[i] = base + (float)i;
    psd_store_chunk_seal(h);
    ck_assert_int_eq(psd_store_commit(&tx), 0);
}

static int ntensors, nchunks;
static uint64_t seen_version;
static int count_tensor(void *arg, uint32_t key_id, const ps_decl_t *d)
{
    ntensors++;
    ck_assert_str_eq(d->name, "w");
    ck_assert_uint_eq(key_id, d->id);
    return 0;
}
static int count_chunk(void *arg, uint32_t t, uint32_t c, const psd_chunk_hdr_t *h)
{
    nchunks++;
    seen_version = h->version;
    return 0;
}
static int napplied;
static uint64_t seen_applied[4];
static void count_applied(void *arg, uint32_t t, uint32_t c, const void *val, size_t len)
{
    napplied++;
    ck_assert_uint_eq(t, 0);
    ck_assert_uint_eq(c, 0);
    ck_assert_uint_eq(len, sizeof seen_applied);
    memcpy(seen_applied, val, len);
}
static int count_record(void *arg, uint32_t t, uint32_t c, const void *val, size_t len)
{
    (*(int *)arg)++;
    return 0;
}

/* A header claiming an absurd number of state arrays names no record size: the product used
 * to wrap in 32 bits (nstate 0xFFFFFFFF: 1 + nstate = 0), so a 32-byte record passed the size
 * checks and its hash then read n floats past its end. */
START_TEST(damaged_nstate_fits_no_record)
{
    ck_assert_uint_eq(psd_chunk_bytes(8, 0xFFFFFFFFu), SIZE_MAX);
    ck_assert_uint_eq(psd_chunk_bytes(8, PS_CHUNK_MAX_STATE + 1), SIZE_MAX);
    ck_assert_uint_eq(psd_chunk_bytes(8, 2), 32 + 8 * 3 * 4);
    ck_assert_uint_eq(psd_chunk_bytes(0xFFFFFFFFu, 2), 32 + (size_t)0xFFFFFFFFu * 12);
}
END_TEST

START_TEST(survives_reopen)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    ps_decl_t d = {.name = "w", .ndim = 1, .shape = {1000}, .id = 0};
    ck_assert_int_eq(psd_store_put_tensor(&tx, &d), 0);
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    write_chunk(&st, 0, 0, 5, 1.0f);
    /* The chunk's applied-push record (asp resends after a restart) comes back too, and walks
     * of chunk records (verify, checkpoints) do not see it. */
    uint64_t applied[4] = {11, 22, 33, 44};
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    ck_assert_int_eq(psd_store_put_applied(&tx, 0, 0, applied, sizeof applied), 0);
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    psd_store_close(&st);

    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    ntensors = nchunks = napplied = 0;
    ck_assert_int_eq(psd_store_load(&st, count_tensor, count_chunk, count_applied, NULL), 0);
    ck_assert_int_eq(ntensors, 1);
    ck_assert_int_eq(nchunks, 1);
    ck_assert_uint_eq(seen_version, 5);
    ck_assert_int_eq(napplied, 1);
    ck_assert_mem_eq(seen_applied, applied, sizeof applied);
    MDB_txn *snap;
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    int nrecords = 0;
    ck_assert_int_eq(psd_store_chunks_each(&st, snap, count_record, &nrecords), 0);
    ck_assert_int_eq(nrecords, 1);
    const psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 0, 0, &h), 0);
    const float *p = psd_chunk_params((psd_chunk_hdr_t *)h);
    /* parameters and both optimizer state vectors */
    ck_assert_float_eq(p[0], 1.0f);
    ck_assert_float_eq(p[1999], 2000.0f);
    ck_assert_float_eq(p[2999], 3000.0f);
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 0, 1, &h), PS_ENOENT);
    mdb_txn_abort(snap);
    psd_store_close(&st);
}
END_TEST

START_TEST(snapshot_is_stable)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    write_chunk(&st, 1, 0, 1, 10.0f);
    MDB_txn *snap;
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    const psd_chunk_hdr_t *old;
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 1, 0, &old), 0);
    /* An update old -> new: the snapshot keeps seeing the old record. */
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    const psd_chunk_hdr_t *cur;
    ck_assert_int_eq(psd_store_chunk_get(&st, tx.r, 1, 0, &cur), 0);
    psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_reserve(&tx, 1, 0, 1000, 2, &h), 0);
    *h = *cur;
    h->version++;
    for (int i = 0; i < 3000; i++) psd_chunk_params(h)[i] = psd_chunk_params((psd_chunk_hdr_t *)cur)[i] * 2;
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    ck_assert_uint_eq(old->version, 1);
    ck_assert_float_eq(psd_chunk_params((psd_chunk_hdr_t *)old)[3], 13.0f);
    mdb_txn_abort(snap);
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 1, 0, &cur), 0);
    ck_assert_uint_eq(cur->version, 2);
    ck_assert_float_eq(psd_chunk_params((psd_chunk_hdr_t *)cur)[3], 26.0f);
    mdb_txn_abort(snap);
    psd_store_close(&st);
}
END_TEST

START_TEST(second_open_refused)
{
    psd_store_t a, b;
    char err[512];
    ck_assert_int_eq(open_store(&a, "demo", 4000, 2, err), 0);
    pid_t pid = fork();
    if (pid == 0) {
        /* flock is per open file description: another process is refused. */
        int rc = open_store(&b, "demo", 4000, 2, err);
        _exit(rc == PS_EBUSY && strstr(err, "in use by another psd") ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    psd_store_close(&a);
    ck_assert_int_eq(open_store(&b, "demo", 4000, 2, err), 0);
    psd_store_close(&b);
}
END_TEST

START_TEST(identity_checked)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    psd_store_close(&st);
    ck_assert_int_eq(open_store(&st, "other", 4000, 2, err), PS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "cluster"));
    ck_assert_int_eq(open_store(&st, "demo", 8000, 2, err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "data_dir was made with chunk_bytes 4000, this manifest has 8000"),
                  "%s", err);
    ck_assert_int_eq(open_store(&st, "demo", 4000, 0, err), PS_ECONFIG);
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    psd_store_close(&st);
}
END_TEST

/* A named identity string is recorded by the first open that checks it, kept across reopens,
 * and a different value is refused with the stored one named. */
START_TEST(identity_string_checked)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 1, err), 0);
    ck_assert_int_eq(psd_store_identity(&st, "optimizer state kind", "momentum velocity", err,
                                        sizeof err),
                     0);
    ck_assert_int_eq(psd_store_identity(&st, "optimizer state kind", "momentum velocity", err,
                                        sizeof err),
                     0);
    psd_store_close(&st);
    ck_assert_int_eq(open_store(&st, "demo", 4000, 1, err), 0);
    ck_assert_int_eq(psd_store_identity(&st, "optimizer state kind",
                                        "adagrad squared-gradient sums", err, sizeof err),
                     PS_ECONFIG);
    ck_assert_msg(strstr(err, "data_dir was made with another optimizer state kind (stored "
                              "'momentum velocity', this manifest has 'adagrad squared-gradient "
                              "sums')") != NULL,
                  "%s", err);
    psd_store_close(&st);
}
END_TEST

/* psd --restore refuses a checkpoint whose optimizer state is another kind, even when it keeps
 * as many floats per parameter; adam's and adamw's moments are the same state. */
START_TEST(restore_checks_state_kind)
{
    char ck[300], shard[320], meta[340], data_dir[300];
    snprintf(ck, sizeof ck, "%s/ck", g_dir);
    snprintf(shard, sizeof shard, "%s/shard-0", ck);
    snprintf(meta, sizeof meta, "%s/%s", shard, PSD_CKPT_META);
    snprintf(data_dir, sizeof data_dir, "%s/data", g_dir); /* missing: a restore may fill it */
    ck_assert_int_eq(mkdir(ck, 0700), 0);
    ck_assert_int_eq(mkdir(shard, 0700), 0);
    static const struct {
        const char *ck;
        int nstate;
        ps_optim_kind_t now;
        int rc;
        const char *cons, *why; /* the checkpoint's consistency (the manifest's: bsp) */
    } cases[] = {
        {"momentum", 1, PS_OPT_ADAGRAD, PS_ECONFIG, "bsp", "keeps"},
        {"adagrad", 1, PS_OPT_MOMENTUM, PS_ECONFIG, "bsp", "keeps"},
        {"adagrad", 1, PS_OPT_ADAGRAD, 0, "bsp", NULL},
        {"adam", 2, PS_OPT_ADAMW, 0, "bsp", NULL},
        /* bsp's steps are not asp's batches (a review, session 72: restored silently) */
        {"adam", 2, PS_OPT_ADAM, PS_ECONFIG, "asp", "the checkpoint was taken under asp, this "
                                                    "manifest's job is bsp"},
    };
    static ps_manifest_t m; /* large: off the stack */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(meta, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f,
                "{\"format\": 1, \"step\": 5, \"consistency\": \"%s\", \"cluster\": "
                "\"demo\", \"shard\": 0, \"nshards\": 1, \"chunk_bytes\": 4096, \"optimizer\": "
                "\"%s\", \"optimizer_state\": %d, \"records_bytes\": 0}\n",
                cases[i].cons, cases[i].ck, cases[i].nstate);
        ck_assert_int_eq(fclose(f), 0);
        memset(&m, 0, sizeof m);
        snprintf(m.cluster, sizeof m.cluster, "demo");
        m.chunk_bytes = 4096;
        m.job.optimizer.name = cases[i].now;
        char err[512] = "";
        int rc = psd_restore_check(&m, data_dir, ck, err, sizeof err);
        ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d: %s", i, rc, err);
        if (rc)
            ck_assert_msg(strstr(err, cases[i].why) &&
                              (strcmp(cases[i].why, "keeps") != 0 || strstr(err, cases[i].ck)),
                          "case %zu: %s", i, err);
    }
    ck_assert_str_eq(psk_optim_state_name(PSK_ADAM), psk_optim_state_name(PSK_ADAMW));
    ck_assert_ptr_null(psk_optim_state_name((psk_optim_kind_t)PSK_OPTIM_KINDS));
}
END_TEST

/* A record on overflow pages is populated when reserved: the store's high-water mark covers
 * it, only grows, and a record smaller than a page leaves it alone. */
START_TEST(reserve_populates_new_pages)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 1 << 20, 2, err), 0);
    ck_assert_uint_eq(st.populated, 0);
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    psd_chunk_hdr_t *a, *b, *small;
    ck_assert_int_eq(psd_store_chunk_reserve(&tx, 0, 0, 65536, 2, &a), 0);
    uintptr_t after_a = st.populated;
#ifdef MADV_POPULATE_WRITE
    ck_assert_uint_ge(after_a, (uintptr_t)a + psd_chunk_bytes(65536, 2));
#endif
    ck_assert_int_eq(psd_store_chunk_reserve(&tx, 0, 1, 8, 2, &small), 0);
    ck_assert_uint_eq(st.populated, after_a);
    ck_assert_int_eq(psd_store_chunk_reserve(&tx, 0, 2, 65536, 2, &b), 0);
    ck_assert_uint_ge(st.populated, after_a);
    /* the pages are writable as before */
    memset(a, 0, psd_chunk_bytes(65536, 2));
    memset(b, 0, psd_chunk_bytes(65536, 2));
    memset(small, 0, psd_chunk_bytes(8, 2));
    psd_store_abort(&tx);
    psd_store_close(&st);
}
END_TEST

/* A store whose map is full says so (PS_ESTOREFULL, whose text names map_size_mb), not a bare
 * "shard store error"; what was committed before stays readable. */
START_TEST(full_map_named)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 1 << 20, 2, err), 0); /* a 64 MiB map */
    write_chunk(&st, 0, 0, 7, 1.0f);
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    int rc = 0;
    psd_chunk_hdr_t *h;
    for (uint32_t c = 1; c < 16 && rc == 0; c++) /* 12 MiB records */
        rc = psd_store_chunk_reserve(&tx, 0, c, 1u << 20, 2, &h);
    ck_assert_int_eq(rc, PS_ESTOREFULL);
    ck_assert_ptr_nonnull(strstr(ps_strerror(rc), "map_size_mb"));
    psd_store_abort(&tx);
    nchunks = 0;
    ck_assert_int_eq(psd_store_load(&st, NULL, count_chunk, count_applied, NULL), 0);
    ck_assert_int_eq(nchunks, 1);
    ck_assert_uint_eq(seen_version, 7);
    psd_store_close(&st);
}
END_TEST

/* Seal writes the CRC-32C of the params and the XXH3-64 of params and state. */
START_TEST(seal_hashes_record)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    write_chunk(&st, 1, 0, 3, 1.5f);
    MDB_txn *snap;
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    const psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 1, 0, &h), 0);
    ck_assert_uint_eq(h->format, PSD_CHUNK_FORMAT);
    const float *p = psd_chunk_params((psd_chunk_hdr_t *)h);
    ck_assert_uint_eq(h->crc32c, ps_crc32c(0, p, 1000 * 4));
    ck_assert_uint_eq(h->hash, XXH3_64bits(p, 3000 * 4));
    ck_assert_uint_eq(psd_store_chunk_hash(h), h->hash);
    mdb_txn_abort(snap);
    psd_store_close(&st);
}
END_TEST

/* A store written before chunk hashes (format 1: 16-byte header, no "Mrecord_format") is
 * upgraded at open: same version and values, hashes filled in. */
START_TEST(format1_upgraded)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    MDB_txn *txn;
    ck_assert_int_eq(mdb_txn_begin(st.env, NULL, 0, &txn), 0);
    MDB_val fk = {14, "Mrecord_format"};
    ck_assert_int_eq(mdb_del(txn, st.dbi, &fk, NULL), 0);
    uint8_t key[9] = {'C', 0, 0, 0, 2, 0, 0, 0, 5};
    size_t len = 16 + 3000 * 4;
    uint8_t *rec = malloc(len);
    uint64_t version = 7;
    uint32_t n = 1000, ns = 2;
    memcpy(rec, &version, 8);
    memcpy(rec + 8, &n, 4);
    memcpy(rec + 12, &ns, 4);
    for (int i = 0; i < 3000; i++) {
        float v = 0.25f * (float)i;
        memcpy(rec + 16 + 4 * i, &v, 4);
    }
    MDB_val k = {9, key}, v = {len, rec};
    ck_assert_int_eq(mdb_put(txn, st.dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    psd_store_close(&st);

    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    MDB_txn *snap;
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    const psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 2, 5, &h), 0);
    ck_assert_uint_eq(h->version, 7);
    ck_assert_uint_eq(h->n, 1000);
    ck_assert_int_eq(memcmp(psd_chunk_params((psd_chunk_hdr_t *)h), rec + 16, 3000 * 4), 0);
    ck_assert_uint_eq(h->hash, XXH3_64bits(rec + 16, 3000 * 4));
    mdb_txn_abort(snap);
    psd_store_close(&st);
    free(rec);
}
END_TEST

/* A store's run (run.h) loads as it was stored; a record written before `origin` (24 bytes)
 * loads with its id, parent and base and origin 0 (it was taken for malformed: a new run). */
START_TEST(run_record_loads)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 2, err), 0);
    psd_run_t r, got;
    ck_assert_int_eq(psd_run_load(&st, 9, &r, err, sizeof err), 0); /* none yet: a new one */
    ck_assert_uint_ne(r.id, 0);
    ck_assert_uint_eq(r.base_step, 9);
    ck_assert_uint_eq(r.origin, 0);
    psd_run_t want = {.id = 11, .parent = 22, .base_step = 33, .origin = 44};
    for (int v1 = 0; v1 < 2; v1++) {
        psd_wtxn_t tx;
        ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
        ck_assert_int_eq(psd_store_put_blob(&tx, PSD_RUN_BLOB, &want,
                                            v1 ? PSD_RUN_V1_BYTES : sizeof want), 0);
        ck_assert_int_eq(psd_store_commit(&tx), 0);
        ck_assert_int_eq(psd_run_load(&st, 5, &got, err, sizeof err), 0);
        ck_assert_uint_eq(got.id, 11);
        ck_assert_uint_eq(got.parent, 22);
        ck_assert_uint_eq(got.base_step, 33);
        ck_assert_uint_eq(got.origin, v1 ? 0 : 44);
    }
    psd_store_close(&st);
}
END_TEST

/* Format 2 records (hash over params then state in one run) are rehashed at open to the
 * blocked order; values and version stay. One that does not match its format 2 seal is
 * refused first (session 61). */
START_TEST(format2_upgraded)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4000, 1, err), 0);
    MDB_txn *txn;
    ck_assert_int_eq(mdb_txn_begin(st.env, NULL, 0, &txn), 0);
    MDB_val fk = {14, "Mrecord_format"}, fv = {8, (uint64_t[]){2}};
    ck_assert_int_eq(mdb_put(txn, st.dbi, &fk, &fv, 0), 0);
    uint32_t n = 10000; /* several hash blocks */
    size_t len = psd_chunk_bytes(n, 1);
    psd_chunk_hdr_t *rec = calloc(1, len);
    *rec = (psd_chunk_hdr_t){.version = 3, .n = n, .nstate = 1, .format = 2};
    for (uint32_t i = 0; i < 2 * n; i++) psd_chunk_params(rec)[i] = 0.5f * (float)i;
    rec->hash = XXH3_64bits(rec + 1, (size_t)2 * n * 4); /* the format 2 definition */
    rec->crc32c = ps_crc32c(0, rec + 1, (size_t)n * 4);
    /* First one value flipped after the seal: refused, naming the record, not sealed anew. */
    psd_chunk_params(rec)[5] += 1.0f;
    uint8_t key[9] = {'C', 0, 0, 0, 1, 0, 0, 0, 0};
    MDB_val k = {9, key}, v = {len, rec};
    ck_assert_int_eq(mdb_put(txn, st.dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    psd_store_close(&st);
    ck_assert_int_eq(open_store(&st, "demo", 4000, 1, err), PS_ESTORE);
    ck_assert_msg(strstr(err, "chunk record 1/0 does not match its format 2 seal"), "%s", err);
    psd_chunk_params(rec)[5] -= 1.0f;
    MDB_env *env;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_set_mapsize(env, (size_t)64 << 20), 0);
    ck_assert_int_eq(mdb_env_open(env, g_dir, 0, 0600), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    MDB_dbi dbi;
    ck_assert_int_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    ck_assert_int_eq(open_store(&st, "demo", 4000, 1, err), 0);
    MDB_txn *snap;
    ck_assert_int_eq(psd_store_snapshot(&st, &snap), 0);
    const psd_chunk_hdr_t *h;
    ck_assert_int_eq(psd_store_chunk_get(&st, snap, 1, 0, &h), 0);
    ck_assert_uint_eq(h->version, 3);
    ck_assert_uint_eq(h->format, PSD_CHUNK_FORMAT);
    ck_assert_int_eq(memcmp(h + 1, rec + 1, (size_t)2 * n * 4), 0);
    ck_assert_uint_eq(h->hash, psd_store_chunk_hash(h));
    ck_assert_uint_ne(h->hash, rec->hash); /* blocked order differs for n > PSD_HASH_BLOCK */
    mdb_txn_abort(snap);
    psd_store_close(&st);
    free(rec);
}
END_TEST

/* A `before` callback: writes the gradient of [off, off + len) only when asked, so the update
 * must call it for every value before using it, and counts the values it covered. */
typedef struct {
    float *g;
    size_t covered;
} lazy_grad_t;

static const float *fill_grad(void *arg, size_t off, size_t len)
{
    lazy_grad_t *lg = arg;
    for (size_t i = off; i < off + len; i++) lg->g[i] = 0.1f - 0.002f * (float)(i % 101);
    lg->covered += len;
    return lg->g + off;
}

/* The fused update writes what the plain kernel writes, and seals the record with the hash
 * and CRC that recomputing them from the stored bytes gives: every optimizer, a record inside
 * one span of the update's loop and one over several spans with a partial hash block, with
 * the params written in place and streamed (the record sits 16 bytes into a 64-byte aligned
 * buffer, as on an LMDB overflow page, so the streamed copy's unaligned head is covered). */
START_TEST(update_seals_like_recompute)
{
    /* The last blocks: 123 values (the two calls), 500 (the fused one; a review, session 71). */
    static const uint32_t sizes[] = {3 * 4096 + 123, 70001, 4096 + 500};
    for (int k = 0; k < 2 * PSK_OPTIM_KINDS; k++) {
        int kind = k % PSK_OPTIM_KINDS;
        bool stream = k >= PSK_OPTIM_KINDS;
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
            uint32_t n = sizes[z], ns = (uint32_t)psk_optim_state_count(kind);
            size_t len = psd_chunk_bytes(n, ns);
            /* a as on an overflow page: 16 bytes of page header, then the record. */
            size_t alen = (len + 64 + 63) & ~(size_t)63; /* aligned_alloc: a multiple */
            unsigned char *abuf = aligned_alloc(64, alen);
            ck_assert_ptr_nonnull(abuf);
            memset(abuf, 0, alen);
            psd_chunk_hdr_t *old = calloc(1, len), *a = (psd_chunk_hdr_t *)(abuf + 16),
                            *b = calloc(1, len);
            *old = (psd_chunk_hdr_t){.version = 4, .n = n, .nstate = ns};
            float *g = malloc(n * 4), *g2 = calloc(n, 4);
            for (uint32_t i = 0; i < n; i++) {
                psd_chunk_params(old)[i] = 0.01f * (float)(i % 97);
                for (uint32_t c = 0; c < ns; c++)
                    psd_chunk_state(old)[(size_t)c * n + i] = 0.001f * (float)(i % (13 + c));
                g[i] = 0.1f - 0.002f * (float)(i % 101);
            }
            psk_optim_t o = {.kind = kind, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                             .eps = 1e-8f, .momentum = 0.9f, .weight_decay = 0.01f};
            *a = *old;
            lazy_grad_t lg = {.g = g2};
            /* Update 3 of a chunk at version 4 (two bsp steps without a gradient): the
             * optimizer's t is the one given, not the version. */
            bool finite = psd_store_chunk_update(a, psd_chunk_params(old),
                                                 ns ? psd_chunk_state(old) : NULL, g2, 0.5f, &o,
                                                 3, fill_grad, &lg, stream);
            ck_assert_uint_eq(lg.covered, n);
            ck_assert_msg(finite, "kind %d n %u stream %d: said not finite", kind, n, stream);
            *b = *old;
            psk_optim_apply_cpu(psd_chunk_params(b), ns ? psd_chunk_state(b) : NULL,
                                psd_chunk_params(old), ns ? psd_chunk_state(old) : NULL, g, 0.5f,
                                n, 3, &o);
            b->version++;
            psd_store_chunk_seal(b);
            ck_assert_uint_eq(a->version, 5);
            ck_assert_msg(memcmp(a + 1, b + 1, len - sizeof *a) == 0, "kind %d n %u stream %d",
                          kind, n, stream);
            ck_assert_uint_eq(a->hash, b->hash);
            ck_assert_uint_eq(a->crc32c, b->crc32c);
            ck_assert_uint_eq(a->format, b->format);
            /* And both as the separate passes compute them (the library's XXH3 update, the
             * CRC alone): seal and the update fold the two into one pass. */
            ck_assert_uint_eq(b->hash, psd_store_chunk_hash(b));
            ck_assert_uint_eq(b->crc32c, psd_store_params_crc(b));
            /* A gradient that makes a parameter an infinity (in the last block: the fused
             * pass's tail) is said: the return is false, in both paths. */
            float gi = g[n - 2];
            g[n - 2] = INFINITY;
            *a = *old;
            ck_assert_msg(!psd_store_chunk_update(a, psd_chunk_params(old),
                                                  ns ? psd_chunk_state(old) : NULL, g, 0.5f, &o,
                                                  3, NULL, NULL, stream),
                          "kind %d n %u stream %d: an infinite parameter not said", kind, n,
                          stream);
            g[n - 2] = gi;
            free(old);
            free(abuf);
            free(b);
            free(g);
            free(g2);
        }
    }
}
END_TEST

/* What run_apply relies on: a record psd_store_record_stable() calls stable may be written after
 * many later puts in the same transaction (small records that split leaf pages among them), and
 * what was written is what commits. */
START_TEST(stable_reserve_survives_later_puts)
{
    psd_store_t st;
    char err[512];
    ck_assert_int_eq(open_store(&st, "demo", 4096, 2, err), 0);
    ck_assert(!psd_store_record_stable(&st, 16, 2));
    ck_assert(psd_store_record_stable(&st, 1024, 2));
    enum { NBIG = 40, NSMALL = 400 };
    psd_wtxn_t tx;
    ck_assert_int_eq(psd_store_begin(&st, &tx), 0);
    psd_chunk_hdr_t *big[NBIG];
    for (uint32_t i = 0; i < NBIG; i++) {
        ck_assert_int_eq(psd_store_chunk_reserve(&tx, 1, i, 1024, 2, &big[i]), 0);
        for (uint32_t j = 0; j < NSMALL / NBIG; j++) { /* small records around it, written now */
            psd_chunk_hdr_t *h;
            uint32_t c = i * (NSMALL / NBIG) + j;
            ck_assert_int_eq(psd_store_chunk_reserve(&tx, 0, c, 16, 2, &h), 0);
            *h = (psd_chunk_hdr_t){.version = c, .n = 16, .nstate = 2};
            for (int k = 0; k < 48; k++) psd_chunk_params(h)[k] = (float)c;
            psd_store_chunk_seal(h);
        }
    }
    for (uint32_t i = 0; i < NBIG; i++) { /* written only now */
        *big[i] = (psd_chunk_hdr_t){.version = 1000 + i, .n = 1024, .nstate = 2};
        for (int k = 0; k < 3 * 1024; k++) psd_chunk_params(big[i])[k] = (float)(i * 7 + k);
        psd_store_chunk_seal(big[i]);
    }
    ck_assert_int_eq(psd_store_commit(&tx), 0);
    psd_store_close(&st);

    ck_assert_int_eq(open_store(&st, "demo", 4096, 2, err), 0);
    MDB_txn *r;
    ck_assert_int_eq(psd_store_snapshot(&st, &r), 0);
    for (uint32_t i = 0; i < NBIG; i++) {
        const psd_chunk_hdr_t *h;
        ck_assert_int_eq(psd_store_chunk_get(&st, r, 1, i, &h), 0);
        ck_assert_uint_eq(h->version, 1000 + i);
        for (int k = 0; k < 3 * 1024; k++)
            ck_assert_float_eq(psd_chunk_params((psd_chunk_hdr_t *)h)[k], (float)(i * 7 + k));
        ck_assert_uint_eq(h->hash, psd_store_chunk_hash(h));
    }
    for (uint32_t c = 0; c < NSMALL; c++) {
        const psd_chunk_hdr_t *h;
        ck_assert_int_eq(psd_store_chunk_get(&st, r, 0, c, &h), 0);
        ck_assert_uint_eq(h->version, c);
        ck_assert_float_eq(psd_chunk_params((psd_chunk_hdr_t *)h)[47], (float)c);
    }
    mdb_txn_abort(r);
    psd_store_close(&st);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, survives_reopen);
    tcase_add_test(tc, damaged_nstate_fits_no_record);
    tcase_add_test(tc, snapshot_is_stable);
    tcase_add_test(tc, second_open_refused);
    tcase_add_test(tc, full_map_named);
    tcase_add_test(tc, identity_checked);
    tcase_add_test(tc, identity_string_checked);
    tcase_add_test(tc, reserve_populates_new_pages);
    tcase_add_test(tc, restore_checks_state_kind);
    tcase_add_test(tc, seal_hashes_record);
    tcase_add_test(tc, format1_upgraded);
    tcase_add_test(tc, run_record_loads);
    tcase_add_test(tc, format2_upgraded);
    tcase_add_test(tc, update_seals_like_recompute);
    tcase_add_test(tc, stable_reserve_survives_later_puts);
    suite_add_tcase(s, tc);
    return s;
}
