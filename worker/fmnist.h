/* fmnist.h: Fashion-MNIST (gzip IDX files) reader and the per-epoch shuffle. */
#ifndef PS_FMNIST_H
#define PS_FMNIST_H

#include <stddef.h>
#include <stdint.h>

#define PS_FMNIST_CLASSES 10 /* labels are 0..9 */

typedef struct {
    uint32_t n;          /* samples */
    uint32_t dim;        /* rows * cols (784) */
    uint8_t *pixels;     /* [n, dim], the IDX file's bytes (0..255): a quarter of the floats
                            training reads (ps_dataset_gather standardizes each row as it copies
                            it); from ps_buffer_alloc (2 MiB pages), released by ps_dataset_free */
    uint8_t *labels;     /* [n], each < 10 */
    size_t pixels_bytes; /* what pixels was allocated with (n may be lowered after loading,
                            e.g. job.train_samples; this stays) */
} ps_dataset_t;

/** @brief The standardized value of pixel byte @p p: (p / 255 - 0.2860) / 0.3530, the
 *  training set's mean and standard deviation, as p * (1 / (255 * 0.3530)) - 0.2860 / 0.3530
 *  (within 2.4e-7 of the division's; the same float ps_dataset_gather writes for it). */
float ps_fmnist_value(uint8_t p);

/**
 * @brief Load train-{images,labels}-idx*-ubyte.gz and t10k-* from @p dir.
 * Checks magic numbers (2051 images, 2049 labels), that the files hold exactly the
 * announced items, that image and label counts agree, that train and test images have
 * the same size, and that every label is < 10.
 * @param[out] err  one line (no newline), or "" on success; on failure it names the file
 *                  and what is wrong; when a file is missing it says that job.dataset names
 *                  the directory, and that Debian's package dataset-fashion-mnist provides
 *                  it. May be NULL when errlen is 0.
 * @return 0, PS_ENOENT (missing), PS_EDATA (bad content or corrupt gzip), PS_ENOMEM,
 *         PS_EINVAL (@p dir too long for a path), or another -errno when a file cannot be
 *         read (e.g. -EACCES).
 * @note Both datasets own their arrays; free with ps_dataset_free (a no-op on NULL). On
 *       failure both are zeroed and own nothing. A previous load on the host may have left a
 *       decoded copy in the dataset cache (dscache.h): then this one reads that instead of
 *       the gzip files (checking its CRC-32C).
 */
int ps_fmnist_load(ps_dataset_t *train, ps_dataset_t *test, const char *dir, char *err,
                   size_t errlen);
void ps_dataset_free(ps_dataset_t *d);

/** @brief Gather samples idx[0..B-1] into x [B, dim] (standardized floats) and y [B]. */
void ps_dataset_gather(const ps_dataset_t *d, const uint32_t *idx, uint32_t B, float *x,
                       uint8_t *y);

/** @brief Rows [first, first + count) of @p d, standardized, into x [count, dim]
 *  (first + count <= d->n): a slice for an evaluation. */
void ps_dataset_rows(const ps_dataset_t *d, uint32_t first, uint32_t count, float *x);

#endif
