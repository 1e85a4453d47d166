/* fanout.c: a batch of independent items on a fixed set of threads (fanout.h).
 *
 * A batch is published under the mutex with a new generation number and broadcast; each helper
 * that sees a generation it has not worked on joins in, takes items from the shared counter until
 * none is left, and reports back. The caller takes items too, then waits until every helper that
 * joined has left, so fn's writes are visible to it when psd_fanout_run() returns (the mutex
 * orders them). A helper that wakes late finds the counter exhausted and does nothing; the next
 * batch waits for it to leave before it resets the counter. */
#include "fanout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ps/ps_error.h"

unsigned psd_fanout_threads(unsigned want)
{
    if (want) return want;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    return n > 8 ? 8 : (unsigned)n;
}

int psd_fanout_threads_env(unsigned conf, unsigned *out, char *err, size_t errlen)
{
    const char *at = getenv("PS_APPLY_THREADS");
    *out = conf;
    if (at == NULL || *at == '\0') return 0;
    char *end;
    unsigned long v = strtoul(at, &end, 10);
    if (*end || v > PSD_FANOUT_MAX_THREADS) {
        snprintf(err, errlen, "PS_APPLY_THREADS: must be a number in [0, %d], got '%s'",
                 PSD_FANOUT_MAX_THREADS, at);
        return PS_ECONFIG;
    }
    *out = (unsigned)v;
    return 0;
}

/* Take and run items until the batch has none left. */
static void drain(psd_fanout_t *f, psd_fanout_item_cb fn, void *arg, size_t nitems)
{
    for (;;) {
        size_t i = __atomic_fetch_add(&f->next, 1, __ATOMIC_RELAXED);
        if (i >= nitems) return;
        fn(arg, i);
    }
}

static void *helper_main(void *p)
{
    psd_fanout_t *f = p;
    uint64_t seen = 0;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && f->gen == seen) pthread_cond_wait(&f->go, &f->mu);
        if (f->quit) break;
        seen = f->gen;
        psd_fanout_item_cb fn = f->fn;
        void *arg = f->arg;
        size_t nitems = f->nitems;
        f->busy++;
        pthread_mutex_unlock(&f->mu);
        drain(f, fn, arg, nitems);
        pthread_mutex_lock(&f->mu);
        if (--f->busy == 0) pthread_cond_signal(&f->done);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int psd_fanout_init(psd_fanout_t *f, unsigned nthreads)
{
    nthreads = psd_fanout_threads(nthreads);
    if (nthreads > PSD_FANOUT_MAX_THREADS) return PS_EINVAL;
    *f = (psd_fanout_t){.nthreads = nthreads};
    int rc = pthread_mutex_init(&f->mu, NULL);
    if (rc) return -rc;
    if ((rc = pthread_cond_init(&f->go, NULL)) != 0) goto fail_mu;
    if ((rc = pthread_cond_init(&f->done, NULL)) != 0) goto fail_go;
    for (unsigned i = 0; i + 1 < nthreads; i++) {
        if ((rc = pthread_create(&f->helpers[i], NULL, helper_main, f)) != 0) break;
        f->nhelpers++;
    }
    if (rc == 0) return 0;
    psd_fanout_close(f); /* joins the helpers started so far and frees the sync objects */
    return -rc;
fail_go:
    pthread_cond_destroy(&f->go);
fail_mu:
    pthread_mutex_destroy(&f->mu);
    f->nthreads = 0;
    return -rc;
}

void psd_fanout_run(psd_fanout_t *f, size_t nitems, psd_fanout_item_cb fn, void *arg)
{
    if (nitems == 0) return;
    if (f->nhelpers == 0 || nitems == 1) { /* no hand-off for work one thread does anyway */
        for (size_t i = 0; i < nitems; i++) fn(arg, i);
        return;
    }
    pthread_mutex_lock(&f->mu);
    /* A helper that woke too late for the last batch may still be in it (finding no items):
     * let it leave before the counter and the batch are replaced under it. */
    while (f->busy) pthread_cond_wait(&f->done, &f->mu);
    f->fn = fn;
    f->arg = arg;
    f->nitems = nitems;
    __atomic_store_n(&f->next, 0, __ATOMIC_RELAXED);
    f->gen++;
    pthread_cond_broadcast(&f->go);
    pthread_mutex_unlock(&f->mu);
    drain(f, fn, arg, nitems);
    pthread_mutex_lock(&f->mu);
    /* Helpers that joined this batch are counted in busy; one that has not woken yet finds the
     * counter past the end whenever it does (the next batch waits for it first). */
    while (f->busy) pthread_cond_wait(&f->done, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

void psd_fanout_close(psd_fanout_t *f)
{
    if (f == NULL || f->nthreads == 0) return;
    pthread_mutex_lock(&f->mu);
    f->quit = 1;
    pthread_cond_broadcast(&f->go);
    pthread_mutex_unlock(&f->mu);
    for (unsigned i = 0; i < f->nhelpers; i++) pthread_join(f->helpers[i], NULL);
    pthread_cond_destroy(&f->done);
    pthread_cond_destroy(&f->go);
    pthread_mutex_destroy(&f->mu);
    f->nthreads = 0;
    f->nhelpers = 0;
}
