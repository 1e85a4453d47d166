/* psctl_export.c: `psctl export --out FILE` (every tensor's parameters as one safetensors file,
 * at one step) and `psctl verify` (every shard rechecks its stored chunk hashes).
 *
 * export: each shard opens one read snapshot (MSG_EXPORT_BEGIN) and reports the lowest and
 * highest chunk version in it. Under bsp the export needs one step everywhere: when the shards'
 * snapshots differ (training is between two steps), they are released and taken again every
 * 50 ms for up to --wait seconds. Under asp there is no common step (nor with --any-step):
 * each shard's chunks come from its one snapshot, and the metadata says step (the lowest
 * version) and step_max. The
 * tensor table comes from shard 0; each chunk is read from its owner's snapshot and its CRC-32C
 * checked (asked again up to 5 times). The file is written as FILE.PID.N (export_tmp_make),
 * then renamed; a SIGINT, SIGTERM or SIGHUP meanwhile removes it (export_tmp_catch).
 *
 * verify: every shard rechecks its records from one snapshot on its thread pool (training goes
 * on); the mismatches are printed by tensor name and chunk index; exit status 1 if any. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "durable.h"
#include "place.h"
#include "ps/ps_error.h"
#include "sigignored.h"
#include "jsonstr.h"
#include "psctl_client.h"

typedef struct {
    ps_decl_t d;
    uint64_t numel;
    uint64_t begin; /* byte offset in the data section */
} xt_t;

/* Open one snapshot per shard at one step (@p one_step: bsp without --any-step) or as they
 * are.
 * @return 0 with *step, *step_max and *ntensors; else psctl's exit status (message printed). */
static int snapshots(ps_req_t *cl, const ps_manifest_t *m, double wait_s, bool one_step,
                     uint64_t *step, uint64_t *step_max, uint32_t *ntensors)
{
    int n = m->nservers;
    char err[512], where[512];
    /* By the clock: counting only the 50 ms naps, a slow shard's answers stretched --wait S
     * several times over (a review, session 71). */
    double t0 = psctl_mono_s();
    for (;;) {
        double waited = psctl_mono_s() - t0;
        uint64_t lo = UINT64_MAX, hi = 0;
        int consistent = 1;
        size_t wl = 0;
        for (int i = 0; i < n; i++) {
            ps_msg_t q = {.type = PS_MSG_EXPORT_BEGIN, .rank = -1}, r;
            int rc = ps_req_call(cl, (uint32_t)i, &q, &r, NULL, NULL, err, sizeof err);
            if (rc == 0 && r.type != PS_MSG_EXPORT_BEGIN_REPLY) rc = PS_EPROTO;
            if (rc) {
                fprintf(stderr, "psctl: export: %s\n", err);
                return 1;
            }
            if (i == 0) *ntensors = (uint32_t)r.count;
            if (r.step == UINT64_MAX) continue; /* holds no chunk */
            if (r.step != r.step_max || (lo != UINT64_MAX && (r.step != lo || r.step != hi)))
                consistent = 0;
            if (r.step < lo) lo = r.step;
            if (r.step_max > hi) hi = r.step_max;
            if (wl < sizeof where)
                wl += (size_t)snprintf(where + wl, sizeof where - wl, "%sshard %d at %llu..%llu",
                                       wl ? ", " : "", i, (unsigned long long)r.step,
                                       (unsigned long long)r.step_max);
        }
        *step = lo == UINT64_MAX ? 0 : lo;
        *step_max = hi;
        if (consistent || !one_step) return 0;
        if (waited >= wait_s) {
            fprintf(stderr, "psctl: export: no common step within %g s (%s): a step is being "
                    "applied (try again, or with a longer --wait), or a step waits for pushes "
                    "(no worker in the job: it completes once workers take part again, or "
                    "--any-step exports each chunk as it is; a tensor no worker trains holds it "
                    "back: psctl status names it)\n", wait_s, where);
            return 1;
        }
        usleep(50 * 1000); /* a new BEGIN replaces each shard's snapshot */
    }
}

/* The export's temporary file while it is written, named before it is made (g_export_named
 * set once the name is whole): a signal that ends psctl then removes it (before, an interrupted
 * export left a full-size temporary file beside OUT; a probe, session 42). The signal may come on
 * any thread (UCX runs its own), so the handler is in place before the file exists. */
static char g_export_tmp[4200];
static volatile sig_atomic_t g_export_named;

static void export_tmp_signal(int sig)
{
    if (g_export_named) unlink(g_export_tmp); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* @p on: the handler for SIGINT, SIGTERM and SIGHUP (not for one ignored at start); off: back
 * to the default. */
static void export_tmp_catch(bool on)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        struct sigaction sa = {.sa_handler = on ? export_tmp_signal : SIG_DFL};
        sigemptyset(&sa.sa_mask);
        if (!ps_signal_ignored(sigs[i])) sigaction(sigs[i], &sa, NULL);
    }
}

/* Make the temporary file beside @p out: OUT.PID.N (this process's pid: no live process has
 * the name; O_EXCL: never through a symlink or into a FIFO left there), with the handler in
 * place. @return its descriptor, or -1 (errno set). */
static int export_tmp_make(const char *out)
{
    export_tmp_catch(true);
    int fd = -1;
    for (unsigned n = 0; fd < 0 && n < 1000; n++) {
        g_export_named = 0;
        snprintf(g_export_tmp, sizeof g_export_tmp, "%s.%ld.%u", out, (long)getpid(), n);
        g_export_named = 1;
        fd = open(g_export_tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) g_export_named = 0; /* not ours */
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) export_tmp_catch(false);
    return fd;
}

int psctl_export(const ps_manifest_t *m, const char *out, double timeout_s, double wait_s,
                 bool any_step)
{
    bool one_step = m->job.consistency == PS_CONSIST_BSP && !any_step; /* else as it is */
    ps_req_t *cl;
    char err[512];
    /* A secret_file this host refuses is the manifest's (exit 2, as check and status say it). */
    int orc = ps_req_open(m, timeout_s, &cl, err, sizeof err);
    if (orc) {
        fprintf(stderr, "psctl: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    int ret = 1;
    uint64_t step, step_max;
    uint32_t nt = 0;
    xt_t *t = NULL;
    char *hdr = NULL, tmp[4200];
    FILE *f = NULL;
    void *data = NULL;
    if ((ret = snapshots(cl, m, wait_s, one_step, &step, &step_max, &nt)) != 0) goto out;
    ret = 1;
    t = calloc(nt ? nt : 1, sizeof *t);
    if (t == NULL) goto out;
    /* The tensor table, from the coordinator. */
    uint32_t k = 0;
    uint64_t off = 0;
    for (uint32_t id = 0; id < nt; id++) {
        ps_msg_t q = {.type = PS_MSG_EXPORT_TENSOR, .rank = -1, .tensor = id}, r;
        int rc = ps_req_call(cl, 0, &q, &r, NULL, NULL, err, sizeof err);
        if (rc == PS_ENOENT) continue; /* an id whose creation failed */
        if (rc == 0 && (r.type != PS_MSG_EXPORT_TENSOR_REPLY || !r.has_decl)) rc = PS_EPROTO;
        if (rc) {
            fprintf(stderr, "psctl: export: tensor %u: %s\n", id, err);
            goto out;
        }
        t[k].d = r.decl;
        t[k].numel = ps_decl_numel(&r.decl);
        t[k].begin = off;
        off += t[k].numel * 4;
        k++;
    }
    /* The header: JSON, padded with spaces to a multiple of 8 bytes. Room for every string
     * escaped at its longest (a control byte takes 6: \u00XX). safetensors keeps the key
     * "__metadata__" for itself: a tensor of that name would be a second one (a store made
     * before declarations refused the name). */
    size_t cap = 256 + 6 * strlen(m->cluster), hl = 0;
    for (uint32_t i = 0; i < k; i++) {
        if (strcmp(t[i].d.name, "__metadata__") == 0) {
            fprintf(stderr, "psctl: export: a tensor is named '__metadata__', the key "
                    "safetensors keeps for the file's metadata: it cannot be exported\n");
            goto out;
        }
        /* 98 bytes of each entry's own text with both offsets at 20 digits (64 was short:
         * past ~10 GB the writes below ran over the end; a review, session 71). */
        cap += 6 * strlen(t[i].d.name) + 128 + (size_t)t[i].d.ndim * 12;
    }
    if ((hdr = malloc(cap)) == NULL) goto out;
    hl += (size_t)snprintf(hdr + hl, cap - hl, "{\"__metadata__\": {\"step\": \"%llu\", ",
                           (unsigned long long)step);
    if (step_max != step)
        hl += (size_t)snprintf(hdr + hl, cap - hl, "\"step_max\": \"%llu\", ",
                               (unsigned long long)step_max);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "\"cluster\": \"");
    hl += ps_json_str(hdr + hl, cap - hl, m->cluster);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "\", \"consistency\": \"%s\", \"format\": \"pt\"}",
                           ps_consistency_name(m->job.consistency));
    for (uint32_t i = 0; i < k; i++) {
        hl += (size_t)snprintf(hdr + hl, cap - hl, ", \"");
        hl += ps_json_str(hdr + hl, cap - hl, t[i].d.name);
        hl += (size_t)snprintf(hdr + hl, cap - hl, "\": {\"dtype\": \"F32\", \"shape\": [");
        for (int d = 0; d < t[i].d.ndim; d++)
            hl += (size_t)snprintf(hdr + hl, cap - hl, "%s%u", d ? ", " : "", t[i].d.shape[d]);
        hl += (size_t)snprintf(hdr + hl, cap - hl, "], \"data_offsets\": [%llu, %llu]}",
                               (unsigned long long)t[i].begin,
                               (unsigned long long)(t[i].begin + t[i].numel * 4));
    }
    hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
    while (hl % 8 && hl + 1 < cap) hdr[hl++] = ' ';
    if (hl + 1 >= cap) {
        fprintf(stderr, "psctl: export: the header outgrew its %zu bytes\n", cap);
        goto out;
    }
    /* A name of its own beside OUT, then renamed over OUT. */
    int fd = export_tmp_make(out);
    snprintf(tmp, sizeof tmp, "%s", g_export_tmp); /* or the last name tried */
    mode_t mask = umask(0);
    umask(mask);
    if (fd >= 0 && (fchmod(fd, 0666 & ~mask) != 0 || (f = fdopen(fd, "wb")) == NULL)) {
        close(fd);
        unlink(tmp);
        fd = -1;
    }
    if (fd < 0) {
        fprintf(stderr, "psctl: export: --out %s: cannot make a file beside it (%s): %s\n", out,
                tmp, strerror(errno));
        goto out;
    }
    uint64_t hl64 = hl; /* little-endian, as safetensors wants (this machine's order) */
    if (fwrite(&hl64, 8, 1, f) != 1 || fwrite(hdr, 1, hl, f) != hl) {
        fprintf(stderr, "psctl: export: %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    uint64_t chunk_elems = m->chunk_bytes / 4, values = 0;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t nc = ps_chunk_count(t[i].numel, chunk_elems);
        for (uint32_t c = 0; c < nc; c++) {
            uint32_t shard = ps_place_shard(t[i].d.first_chunk + c, (uint32_t)m->nservers);
            uint64_t n = ps_chunk_len(t[i].numel, chunk_elems, c);
            size_t len = 0;
            ps_msg_t r;
            int rc, tries = 0;
            do {
                free(data);
                ps_msg_t q = {.type = PS_MSG_EXPORT_CHUNK, .rank = -1, .tensor = t[i].d.id,
                              .chunk = c};
                rc = ps_req_call(cl, shard, &q, &r, &data, &len, err, sizeof err);
                if (rc == 0 && (r.type != PS_MSG_EXPORT_CHUNK_REPLY || len != n * 4)) {
                    snprintf(err, sizeof err, "shard %u sent %zu bytes, want %llu", shard, len,
                             (unsigned long long)(n * 4));
                    rc = PS_EPROTO;
                }
                if (rc == 0 && ps_crc32c(0, data, len) != r.crc32c) {
                    snprintf(err, sizeof err, "shard %u: CRC-32C mismatch 6 times in a row",
                             shard);
                    rc = PS_ECRC;
                }
            } while (rc == PS_ECRC && ++tries <= 5);
            if (rc == 0 && one_step && r.step != step) {
                snprintf(err, sizeof err, "shard %u has it at step %llu, not %llu", shard,
                         (unsigned long long)r.step, (unsigned long long)step);
                rc = PS_ESTALE;
            }
            if (rc) {
                char shown[PS_NAME_MAX];
                snprintf(shown, sizeof shown, "%s", t[i].d.name);
                fprintf(stderr, "psctl: export: '%s' chunk %u: %s\n", psctl_printable(shown), c,
                        err);
                goto out;
            }
            if (fwrite(data, 1, len, f) != len) {
                fprintf(stderr, "psctl: export: %s: %s\n", tmp, strerror(errno));
                goto out;
            }
            values += n;
            const char *nap = values == n ? getenv("PS_TEST_EXPORT_NAP_MS") : NULL;
            if (nap) usleep((useconds_t)atoi(nap) * 1000); /* a test's window to signal */
        }
    }
    /* The snapshots are released when ps_req_close() closes the endpoints. */
    /* ferror: a write that failed inside stdio's buffer (a disk full for a moment) while a
     * later fwrite returned its length; before, the export then said it was made, its header
     * lost (a review, session 72). */
    if (ferror(f)) {
        fprintf(stderr, "psctl: export: %s: a write failed (is the disk full?)\n", tmp);
        goto out;
    }
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    f = NULL;
    int rrc = bad ? (errno ? -errno : -EIO) : ps_rename_durable(tmp, out);
    if (rrc) {
        fprintf(stderr, "psctl: export: %s: %s\n", out, strerror(-rrc));
        unlink(tmp);
        goto out;
    }
    printf("psctl: exported %u tensors (%llu values) at step %llu to %s\n", k,
           (unsigned long long)values, (unsigned long long)step, out);
    ret = 0;
out:
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    if (g_export_named) {
        export_tmp_catch(false);
        g_export_named = 0;
    }
    free(data);
    free(hdr);
    free(t);
    ps_req_close(cl);
    return ret;
}

/* The tensor table's names, by id (from shard 0), for verify's messages. names[id] is "" for
 * an id that does not exist. @return the count, or -1 (message printed). */
int psctl_tensor_names(ps_req_t *cl, char (**names)[PS_NAME_MAX])
{
    char err[512];
    ps_msg_t q = {.type = PS_MSG_EXPORT_BEGIN, .rank = -1}, r;
    if (ps_req_call(cl, 0, &q, &r, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "psctl: verify: %s\n", err);
        return -1;
    }
    uint32_t nt = (uint32_t)r.count;
    *names = calloc(nt ? nt : 1, PS_NAME_MAX);
    if (*names == NULL) return -1;
    for (uint32_t id = 0; id < nt; id++) {
        ps_msg_t tq = {.type = PS_MSG_EXPORT_TENSOR, .rank = -1, .tensor = id};
        if (ps_req_call(cl, 0, &tq, &r, NULL, NULL, err, sizeof err) == 0 && r.has_decl) {
            snprintf((*names)[id], PS_NAME_MAX, "%s", r.decl.name);
            psctl_printable((*names)[id]); /* the table is for messages only */
        }
    }
    return (int)nt;
}

char *psctl_printable(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
    return s;
}

const char *psctl_tensor_name(char (*names)[PS_NAME_MAX], int nt, unsigned t)
{
    return names && nt > 0 && t < (unsigned)nt && names[t][0] ? names[t] : "?";
}

int psctl_verify_shard(ps_req_t *cl, int shard, psctl_mismatch_fn *each, void *ctx,
                       uint64_t *checked, char *err, size_t errlen)
{
    ps_msg_t q = {.type = PS_MSG_VERIFY, .rank = -1}, r;
    void *data = NULL;
    size_t len = 0;
    if (ps_req_call(cl, (uint32_t)shard, &q, &r, &data, &len, err, errlen)) return -1;
    if (r.type != PS_MSG_VERIFY_REPLY) {
        snprintf(err, errlen, "shard %d answered verify with a message of type %d", shard,
                 (int)r.type);
        free(data);
        return -1;
    }
    *checked += r.count;
    /* One line per mismatch: "T C version V stored H bytes H" or "T C malformed ...". */
    const char *end = data ? (const char *)data + len : NULL; /* none: NULL, not NULL + 0 */
    for (const char *line = data; line && line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t n = (size_t)((nl ? nl : end) - line);
        char one[1024]; /* NUL-terminated, however the reply ends; a longer line is cut */
        snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), line);
        unsigned t, c;
        int at = 0;
        if (sscanf(one, "%u %u %n", &t, &c, &at) == 2) each(ctx, shard, t, c, one + at);
        line = nl ? nl + 1 : NULL;
    }
    free(data);
    return 0;
}

typedef struct {
    char (*names)[PS_NAME_MAX];
    int nt;
    uint64_t bad;
} verify_ctx_t;

static void verify_print(void *ctx, int shard, unsigned t, unsigned c, const char *rest)
{
    verify_ctx_t *v = ctx;
    v->bad++;
    printf("psctl: verify: shard %d: tensor '%s' chunk %u: %s\n", shard,
           psctl_tensor_name(v->names, v->nt, t), c, rest);
}

int psctl_verify(const ps_manifest_t *m, double timeout_s)
{
    ps_req_t *cl;
    char err[512];
    /* A secret_file this host refuses is the manifest's (exit 2, as check and status say it). */
    int orc = ps_req_open(m, timeout_s, &cl, err, sizeof err);
    if (orc) {
        fprintf(stderr, "psctl: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    verify_ctx_t v = {0};
    int failed = 0;
    uint64_t checked = 0;
    v.nt = psctl_tensor_names(cl, &v.names);
    for (int i = 0; v.nt >= 0 && i < m->nservers; i++)
        if (psctl_verify_shard(cl, i, verify_print, &v, &checked, err, sizeof err)) {
            fprintf(stderr, "psctl: verify: %s\n", err);
            failed = 1;
        }
    if (v.nt >= 0 && !failed)
        printf("psctl: verify: %llu chunks checked on %d shards, %llu %s\n",
               (unsigned long long)checked, m->nservers, (unsigned long long)v.bad,
               v.bad == 1 ? "mismatch" : "mismatches");
    free(v.names);
    ps_req_close(cl);
    return v.nt < 0 || failed || v.bad ? 1 : 0;
}
