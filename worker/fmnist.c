/* fmnist.c: Fashion-MNIST reader (gzip IDX files via zlib) and the per-epoch shuffle. */
#include "fmnist.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dscache.h"
#include "ps/ps_client.h"
#include "regfile.h"
#include "ps/ps_error.h"

#define IDX_IMAGES_MAGIC 2051u /* 0x00000803: unsigned bytes, 3 dimensions */
#define IDX_LABELS_MAGIC 2049u /* 0x00000801: unsigned bytes, 1 dimension */
#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f
#define READ_CHUNK (1u << 20) /* bytes per gzread call */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Opens @p path for gzread: a regular file only. Opened without blocking and checked first: a
 * FIFO in its place hung psworker in gzopen for good (a directory or device failed later with
 * a less clear message). */
static int open_gz(gzFile *out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    int fd = ps_open_regular(path, 0, &st);
    if (fd == -EINVAL) {
        set_err(err, errlen, "%s: not a regular file (%s)", path, ps_file_kind(&st));
        return PS_EDATA;
    }
    if (fd < 0) errno = -fd;
    if (fd >= 0) {
        errno = 0;
        *out = gzdopen(fd, "rb");
        if (*out == NULL) close(fd);
    }
    if (*out != NULL)
        return 0;
    if (errno == ENOENT) {
        set_err(err, errlen,
                "%s: not found (job.dataset names the directory of Fashion-MNIST's gzip IDX "
                "files; Debian's package dataset-fashion-mnist puts them in "
                "/usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)",
                path);
        return PS_ENOENT;
    }
    if (errno == 0) { /* zlib could not allocate its state */
        set_err(err, errlen, "%s: out of memory", path);
        return PS_ENOMEM;
    }
    int e = errno;
    set_err(err, errlen, "%s: %s", path, strerror(e));
    return -e;
}

/* Reads up to n bytes. Returns the count read (short only at end of data), or a
 * negative PS_E* code with err set when the file or its gzip stream is bad. */
static long long read_bytes(gzFile f, const char *path, void *buf, size_t n, char *err,
                            size_t errlen)
{
    size_t got = 0;
    while (got < n) {
        size_t want = n - got < READ_CHUNK ? n - got : READ_CHUNK;
        int r = gzread(f, (unsigned char *)buf + got, (unsigned)want);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            if (zerr == Z_ERRNO) {
                int e = errno != 0 ? errno : EIO;
                set_err(err, errlen, "%s: %s", path, strerror(e));
                return -e;
            }
            if (zerr == Z_MEM_ERROR) {
                set_err(err, errlen, "%s: out of memory", path);
                return PS_ENOMEM;
            }
            set_err(err, errlen, "%s: corrupt gzip data (%s)", path, msg);
            return PS_EDATA;
        }
        if (r == 0) {
            /* The end of the data, or of a stream cut short (its trailer with the CRC gone:
             * zlib says so only here, and a cut file's damage went unseen). */
            int zerr;
            const char *msg = gzerror(f, &zerr);
            if (zerr != Z_OK) {
                set_err(err, errlen, "%s: corrupt gzip data (%s)", path, msg);
                return PS_EDATA;
            }
            break;
        }
        got += (size_t)r;
    }
    return (long long)got;
}

/* Fails with PS_EDATA when anything follows the last item. */
static int expect_eof(gzFile f, const char *path, const char *what, char *err, size_t errlen)
{
    unsigned char extra;
    long long r = read_bytes(f, path, &extra, 1, err, errlen);
    if (r < 0)
        return (int)r;
    if (r > 0) {
        set_err(err, errlen, "%s: unexpected data after the last %s", path, what);
        return PS_EDATA;
    }
    return 0;
}

/* An IDX1 label file's 8-byte header, read from @p f (of @p path): its count into *@p count.
 * @return 0, or a PS_E* code with @p err set (short, or not a label file's magic). */
static int label_header(gzFile f, const char *path, uint32_t *count, char *err, size_t errlen)
{
    unsigned char hdr[8];
    long long r = read_bytes(f, path, hdr, sizeof hdr, err, errlen);
    if (r < 0) return (int)r;
    if (r < (long long)sizeof hdr) {
        set_err(err, errlen, "%s: truncated IDX header (%lld of 8 bytes)", path, r);
        return PS_EDATA;
    }
    if (be32(hdr) != IDX_LABELS_MAGIC) {
        set_err(err, errlen, "%s: bad magic number %u (an IDX label file has %u)", path,
                be32(hdr), IDX_LABELS_MAGIC);
        return PS_EDATA;
    }
    *count = be32(hdr + 4);
    return 0;
}

/* The count an IDX1 label file's header announces, into *@p n. Read first, so that an image
 * file announcing another count is refused before its images are allocated; a label file
 * whose header cannot be read is refused here too (before, it counted as "not known" and a
 * 762 KB image file could make the worker allocate and fill gigabytes first; a review,
 * session 71). @return 0, or a PS_E* code with @p err set. */
static int labels_announced(const char *path, uint32_t *n, char *err, size_t errlen)
{
    gzFile f;
    int rc = open_gz(&f, path, err, errlen);
    if (rc < 0) return rc;
    rc = label_header(f, path, n, err, errlen);
    gzclose(f);
    return rc;
}

/* Reads an IDX3 image file into d->pixels and sets n and dim; the count of label file
 * @p lpath is checked against it before anything is allocated. */
static int load_images(ps_dataset_t *d, const char *path, const char *lpath, char *err,
                       size_t errlen)
{
    gzFile f;
    int rc = open_gz(&f, path, err, errlen);
    if (rc < 0)
        return rc;

    unsigned char hdr[16];
    size_t total = 0; /* bytes in d->pixels, once allocated */
    long long r = read_bytes(f, path, hdr, sizeof(hdr), err, errlen);
    if (r < 0) {
        rc = (int)r;
        goto out;
    }
    if (r < (long long)sizeof(hdr)) {
        set_err(err, errlen, "%s: truncated IDX header (%lld of 16 bytes)", path, r);
        rc = PS_EDATA;
        goto out;
    }
    uint32_t magic = be32(hdr), n = be32(hdr + 4), rows = be32(hdr + 8), cols = be32(hdr + 12);
    if (magic != IDX_IMAGES_MAGIC) {
        set_err(err, errlen, "%s: bad magic number %u (an IDX image file has %u)", path, magic,
                IDX_IMAGES_MAGIC);
        rc = PS_EDATA;
        goto out;
    }
    if (n == 0) { /* an empty set trained nothing, and its job's schedule took 0 steps */
        set_err(err, errlen, "%s: holds no images", path);
        rc = PS_EDATA;
        goto out;
    }
    uint64_t dim = (uint64_t)rows * cols;
    if (dim == 0 || dim > UINT32_MAX || (uint64_t)n * dim > SIZE_MAX / sizeof(float)) {
        set_err(err, errlen, "%s: implausible dimensions %u x %u x %u", path, n, rows, cols);
        rc = PS_EDATA;
        goto out;
    }
    /* What a header announces is checked before it is allocated: a small compressed file (a
     * gzip bomb, or a damaged header) made the worker allocate and fill gigabytes (3 GB from
     * 762 KB, found by a review) before the counts were compared. */
    uint32_t want_n = 0;
    rc = labels_announced(lpath, &want_n, err, errlen);
    if (rc < 0)
        goto out;
    if (n != want_n) {
        set_err(err, errlen, "%s: %u images, but %s announces %u labels", path, n, lpath,
                want_n);
        rc = PS_EDATA;
        goto out;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double need = (double)n * (double)dim;
    if (pages > 0 && psz > 0 && need > (double)pages * (double)psz / 2) {
        set_err(err, errlen, "%s: %u images of %llu pixels need %.1f GiB, more than half of this "
                "machine's memory", path, n, (unsigned long long)dim, need / (1 << 30));
        rc = PS_EDATA;
        goto out;
    }

    total = (size_t)n * dim;
    d->pixels = ps_buffer_alloc(total); /* 2 MiB pages: see dscache.h */
    if (d->pixels == NULL) {
        set_err(err, errlen, "%s: out of memory for %u images", path, n);
        rc = PS_ENOMEM;
        goto out;
    }
    r = read_bytes(f, path, d->pixels, total, err, errlen);
    if (r < 0) {
        rc = (int)r;
        goto out;
    }
    if ((size_t)r < total) {
        set_err(err, errlen, "%s: truncated: %u images of %ux%u need %zu bytes of pixels, "
                "found %lld", path, n, rows, cols, total, r);
        rc = PS_EDATA;
        goto out;
    }
    rc = expect_eof(f, path, "image", err, errlen);
    if (rc < 0)
        goto out;
    d->n = n;
    d->dim = (uint32_t)dim;
    d->pixels_bytes = total;

out:
    if (rc < 0) {
        ps_buffer_free(d->pixels, total);
        d->pixels = NULL;
    }
    gzclose(f);
    return rc;
}

/* Reads an IDX1 label file into *labels (each checked < 10); its count must be *n. */
static int load_labels(uint8_t **labels, uint32_t *n, const char *path, char *err,
                       size_t errlen)
{
    gzFile f;
    int rc = open_gz(&f, path, err, errlen);
    if (rc < 0)
        return rc;

    uint8_t *lab = NULL;
    uint32_t count = 0;
    long long r;
    if ((rc = label_header(f, path, &count, err, errlen)) < 0)
        goto out;
    if (count != *n) { /* the images' count (load_images read them first): before the malloc */
        set_err(err, errlen, "%s: %u labels, but the image file has %u images", path, count, *n);
        rc = PS_EDATA;
        goto out;
    }
    lab = malloc(count > 0 ? count : 1);
    if (lab == NULL) {
        set_err(err, errlen, "%s: out of memory for %u labels", path, count);
        rc = PS_ENOMEM;
        goto out;
    }
    r = read_bytes(f, path, lab, count, err, errlen);
    if (r < 0) {
        rc = (int)r;
        goto out;
    }
    if (r < (long long)count) {
        set_err(err, errlen, "%s: truncated: %u labels announced, %lld found", path, count, r);
        rc = PS_EDATA;
        goto out;
    }
    for (uint32_t i = 0; i < count; i++) {
        if (lab[i] >= PS_FMNIST_CLASSES) {
            set_err(err, errlen, "%s: label %u of sample %u is not below %d", path, lab[i], i,
                    PS_FMNIST_CLASSES);
            rc = PS_EDATA;
            goto out;
        }
    }
    rc = expect_eof(f, path, "label", err, errlen);
    if (rc < 0)
        goto out;
    *labels = lab;
    *n = count;
    lab = NULL;

out:
    free(lab);
    gzclose(f);
    return rc;
}

/* Loads one split: <prefix>-images-idx3-ubyte.gz and <prefix>-labels-idx1-ubyte.gz. */
static int load_split(ps_dataset_t *d, const char *dir, const char *prefix, char *err,
                      size_t errlen)
{
    char ipath[4096], lpath[4096];
    int ni = snprintf(ipath, sizeof(ipath), "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    int nl = snprintf(lpath, sizeof(lpath), "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (ni < 0 || nl < 0 || (size_t)ni >= sizeof(ipath) || (size_t)nl >= sizeof(lpath)) {
        set_err(err, errlen, "%s: directory name too long", dir);
        return PS_EINVAL;
    }

    char cpath[4200];
    int cached = ps_dscache_path(ipath, lpath, cpath, sizeof cpath) == 0;
    if (cached && ps_dscache_load(d, cpath) == 0)
        return 0; /* checked when it was written, and its CRC-32C just now */
    int rc = load_images(d, ipath, lpath, err, errlen);
    if (rc < 0)
        return rc;
    uint32_t nlabels = d->n;
    rc = load_labels(&d->labels, &nlabels, lpath, err, errlen);
    if (rc < 0)
        ps_dataset_free(d);
    else if (cached && ps_dscache_save(d, cpath) == 0) /* best effort: the next worker reads it */
        ps_dscache_drop_old(ipath, lpath);
    else if (cached) {
        /* Said once per process: every worker on this host decompresses the dataset then (a
         * directory that is not there, or not writable, was silent; a review, session 71). */
        static int said;
        int e = errno;
        if (!said++)
            fprintf(stderr, "psworker: the dataset's decoded copy could not be written to %s "
                    "(%s): each worker decompresses it (PS_DATASET_CACHE names the directory, "
                    "off turns the copy off)\n", cpath, strerror(e));
    }
    return rc;
}

int ps_fmnist_load(ps_dataset_t *train, ps_dataset_t *test, const char *dir, char *err,
                   size_t errlen)
{
    memset(train, 0, sizeof(*train));
    memset(test, 0, sizeof(*test));
    set_err(err, errlen, "%s", "");

    int rc = load_split(train, dir, "train", err, errlen);
    if (rc < 0)
        return rc;
    rc = load_split(test, dir, "t10k", err, errlen);
    if (rc == 0 && test->dim != train->dim) {
        set_err(err, errlen, "%s/t10k-images-idx3-ubyte.gz: %u pixels per image, but the "
                "training images have %u", dir, test->dim, train->dim);
        rc = PS_EDATA;
    }
    if (rc < 0) {
        ps_dataset_free(test);
        ps_dataset_free(train);
    }
    return rc;
}

void ps_dataset_free(ps_dataset_t *d)
{
    if (d == NULL)
        return;
    ps_buffer_free(d->pixels, d->pixels_bytes);
    free(d->labels);
    memset(d, 0, sizeof(*d));
}

/* A pixel byte p standardized: p * SCALE + SHIFT, i.e. (p / 255 - mean) / std with the
 * division folded into one multiplication (within 2.4e-7 of the per-pixel division the floats
 * were stored with before session 56: an ulp of the largest values; more ulps only near 0,
 * where the subtraction cancels). */
#define FMNIST_SCALE (1.0f / (255.0f * FMNIST_STD))
#define FMNIST_SHIFT (-FMNIST_MEAN / FMNIST_STD)

static float g_lut[256]; /* every byte's value, as the SSE2 lanes give it (lut_init) */
static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;

/* 16 pixels at a time in SSE2 lanes (a multiply, then an add: two roundings), @return how many
 * of @p n (a multiple of 16) were done; 0 without SSE2. */
static size_t standardize_lanes(float *restrict x, const uint8_t *restrict px, size_t n)
{
    size_t j = 0;
#if defined(__SSE2__)
    const __m128 scale = _mm_set1_ps(FMNIST_SCALE), shift = _mm_set1_ps(FMNIST_SHIFT);
    const __m128i zero = _mm_setzero_si128();
    for (; j + 16 <= n; j += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(px + j));
        __m128i lo = _mm_unpacklo_epi8(b, zero), hi = _mm_unpackhi_epi8(b, zero);
        __m128i w[4] = {_mm_unpacklo_epi16(lo, zero), _mm_unpackhi_epi16(lo, zero),
                        _mm_unpacklo_epi16(hi, zero), _mm_unpackhi_epi16(hi, zero)};
        for (int q = 0; q < 4; q++)
            _mm_storeu_ps(x + j + 4 * (size_t)q,
                          _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(w[q]), scale), shift));
    }
#else
    (void)x, (void)px, (void)n;
#endif
    return j;
}

/* The table comes from the lanes themselves, so that a row's tail (the table) and its body
 * (the lanes) agree to the bit whatever the compiler does with a scalar p * SCALE + SHIFT (a
 * build for a CPU with FMA may fuse it: one rounding instead of two). */
static void lut_init(void)
{
    uint8_t all[256];
    for (int p = 0; p < 256; p++) all[p] = (uint8_t)p;
    size_t done = standardize_lanes(g_lut, all, 256);
    for (size_t p = done; p < 256; p++) /* no SSE2: every path is this one */
        g_lut[p] = (float)p * FMNIST_SCALE + FMNIST_SHIFT;
}

float ps_fmnist_value(uint8_t p)
{
    pthread_once(&g_lut_once, lut_init);
    return g_lut[p];
}

/* x[j] = the standardized px[j]: the lanes, then the table for the rest. The table's lookups
 * alone do not vectorize (64 rows of 784 took ~1.6x the floats' memcpy the rows were before,
 * and the exact division in SSE2 lanes ~1.6x as well, on the development VM); the lanes run
 * as fast as that memcpy. */
static void standardize(float *restrict x, const uint8_t *restrict px, size_t n)
{
    for (size_t j = standardize_lanes(x, px, n); j < n; j++)
        x[j] = g_lut[px[j]];
}

void ps_dataset_gather(const ps_dataset_t *d, const uint32_t *idx, uint32_t B, float *x,
                       uint8_t *y)
{
    pthread_once(&g_lut_once, lut_init);
    for (uint32_t i = 0; i < B; i++) {
        standardize(x + (size_t)i * d->dim, d->pixels + (size_t)idx[i] * d->dim, d->dim);
        y[i] = d->labels[idx[i]];
    }
}

void ps_dataset_rows(const ps_dataset_t *d, uint32_t first, uint32_t count, float *x)
{
    pthread_once(&g_lut_once, lut_init);
    standardize(x, d->pixels + (size_t)first * d->dim, (size_t)count * d->dim);
}
