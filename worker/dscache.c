/* dscache.c: see dscache.h. File layout: a 4096-byte header, then n*dim floats (the images as
 * training reads them), then n label bytes. */
#include "dscache.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"

#define DSC_MAGIC "PSDSC001"
#define DSC_HDR 4096

typedef struct {
    char magic[8];
    uint32_t n, dim;
    uint64_t bytes; /* payload after the header */
    uint32_t crc;   /* CRC-32C of the payload */
    uint32_t pad;
} dsc_hdr_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int ps_dscache_path(const char *ipath, const char *lpath, char *out, size_t len)
{
    const char *dir = getenv("PS_DATASET_CACHE");
    if (dir && strcmp(dir, "off") == 0) return -1;
    if (dir == NULL || *dir == '\0') dir = getenv("TMPDIR");
    if (dir == NULL || *dir == '\0') dir = "/tmp";
    uint64_t h = 0xcbf29ce484222325ull;
    const char *src[2] = {ipath, lpath};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (stat(src[i], &st) != 0) return -1;
        int64_t meta[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                           (int64_t)st.st_mtim.tv_nsec};
        h = fnv(h, src[i], strlen(src[i]) + 1);
        h = fnv(h, meta, sizeof meta);
    }
    int n = snprintf(out, len, "%s/psd-dataset-%016llx.bin", dir, (unsigned long long)h);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

int ps_dscache_load(ps_dataset_t *d, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > DSC_HDR)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return -1;
    const dsc_hdr_t *h = map;
    const uint8_t *payload = (const uint8_t *)map + DSC_HDR;
    uint64_t want = (uint64_t)h->n * h->dim * sizeof(float) + h->n;
    if (memcmp(h->magic, DSC_MAGIC, 8) != 0 || h->n == 0 || h->dim == 0 || h->bytes != want ||
        (uint64_t)st.st_size != DSC_HDR + want || ps_crc32c(0, payload, h->bytes) != h->crc) {
        munmap(map, (size_t)st.st_size);
        return -1;
    }
    /* Copied out of the page cache (see dscache.h). */
    size_t img = (size_t)h->n * h->dim * sizeof(float);
    float *images = malloc(img);
    uint8_t *labels = malloc(h->n);
    if (images == NULL || labels == NULL) {
        free(images);
        free(labels);
        munmap(map, (size_t)st.st_size);
        return -1;
    }
    memcpy(images, payload, img);
    memcpy(labels, payload + img, h->n);
    d->n = h->n;
    d->dim = h->dim;
    d->images = images;
    d->labels = labels;
    munmap(map, (size_t)st.st_size);
    return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int ps_dscache_save(const ps_dataset_t *d, const char *path)
{
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    size_t img = (size_t)d->n * d->dim * sizeof(float);
    uint8_t hdr[DSC_HDR] = {0};
    dsc_hdr_t h = {.n = d->n, .dim = d->dim, .bytes = img + d->n};
    memcpy(h.magic, DSC_MAGIC, 8);
    h.crc = ps_crc32c(ps_crc32c(0, d->images, img), d->labels, d->n);
    memcpy(hdr, &h, sizeof h);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int rc = write_all(fd, hdr, sizeof hdr) || write_all(fd, d->images, img) ||
             write_all(fd, d->labels, d->n);
    rc |= close(fd);
    if (rc == 0) rc = rename(tmp, path);
    if (rc != 0) unlink(tmp);
    return rc ? -1 : 0;
}
