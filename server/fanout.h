/* fanout.h: run the independent items of one batch on a fixed set of threads.
 *
 * An apply job updates several chunk records that share nothing but the transaction they are
 * written in: once every record is reserved, their optimizer passes (each with its CRC-32C and
 * XXH3 fold) can run at once on every core. A fan-out owns nthreads - 1 helper threads; the
 * thread that calls psd_fanout_run() works on the batch too, so nthreads == 1 runs everything on
 * the caller with no hand-off at all. Items are taken in index order from a shared counter, so
 * a batch of unequal items balances by itself. */
#ifndef PSD_FANOUT_H
#define PSD_FANOUT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PSD_FANOUT_MAX_THREADS 64

/** @brief One item of a batch, run on some thread of the fan-out; @p i in [0, nitems). */
typedef void (*psd_fanout_item_cb)(void *arg, size_t i);

typedef struct psd_fanout_s {
    unsigned nthreads;        /* helpers + the caller */
    pthread_t helpers[PSD_FANOUT_MAX_THREADS - 1];
    unsigned nhelpers;        /* started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;  /* helpers wait on go; the caller on done */
    uint64_t gen;             /* batches handed out (under mu) */
    unsigned busy;            /* helpers inside the current batch (under mu) */
    int quit;                 /* under mu */
    /* The batch in progress (written under mu before gen moves). */
    psd_fanout_item_cb fn;
    void *arg;
    size_t nitems;
    size_t next;              /* the next item to take (atomic) */
} psd_fanout_t;

/**
 * @brief Start @p nthreads - 1 helper threads (@p nthreads in 1..PSD_FANOUT_MAX_THREADS; 0 means
 * the online CPUs, at most 8).
 * @return 0, or PS_EINVAL / -errno (nothing to release then).
 * @note The caller owns @p f; end it with psd_fanout_close().
 */
int psd_fanout_init(psd_fanout_t *f, unsigned nthreads);

/**
 * @brief Run fn(arg, i) once for every i in [0, nitems), on the caller and the helpers, and
 * return when every call has returned.
 * @note One batch at a time per fan-out (the caller must serialize); @p arg is borrowed for the
 *       call. fn must not call psd_fanout_run() on the same fan-out.
 */
void psd_fanout_run(psd_fanout_t *f, size_t nitems, psd_fanout_item_cb fn, void *arg);

/** @brief Stop and join the helpers (none may be running a batch). NULL-safe; idempotent. */
void psd_fanout_close(psd_fanout_t *f);

/** @brief The thread count @p want resolves to: want itself, or for 0 the online CPUs capped
 *  at 8 (1 when they cannot be counted). */
unsigned psd_fanout_threads(unsigned want);

/** @brief The thread count psd uses given the manifest's @p conf: PS_APPLY_THREADS when set (a
 *  number in [0, PSD_FANOUT_MAX_THREADS]), else @p conf; 0 stays 0 (the online CPUs).
 *  @return 0, or PS_ECONFIG with one line in @p err naming the bad value. */
int psd_fanout_threads_env(unsigned conf, unsigned *out, char *err, size_t errlen);

#endif
