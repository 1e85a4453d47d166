/* lookup.c: getaddrinfo on a detached thread per job (lookup.h). Not libuv's thread pool: a
 * process forked from a libps user (python's os.fork) kept libuv's count of the pool's threads,
 * which only the parent has, and its exit joined them (uv_library_shutdown: SIGSEGV; a helper's
 * probe, session 58). The job is the caller's until it takes the result or abandons it, then the
 * thread's to free once the lookup ends (DNS may take seconds). */
#include "lookup.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

struct ps_lookup_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned, status; /* status: getaddrinfo's */
    struct sockaddr_storage addr;
    socklen_t addrlen; /* 0: no address that fits */
    char host[256], port[8];
    void (*notify)(void *);
    void *arg;
};

static void job_free(ps_lookup_t *l)
{
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static void *lookup_main(void *arg)
{
    ps_lookup_t *l = arg;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(l->host, l->port, &hints, &res);
    pthread_mutex_lock(&l->mu);
    l->status = rc;
    if (rc == 0 && res && res->ai_addrlen <= sizeof l->addr) {
        memcpy(&l->addr, res->ai_addr, res->ai_addrlen);
        l->addrlen = res->ai_addrlen;
    }
    l->done = 1;
    int abandoned = l->abandoned;
    if (!abandoned && l->notify) l->notify(l->arg);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu); /* the caller's from here, unless abandoned */
    if (res) freeaddrinfo(res);
    if (abandoned) job_free(l);
    return NULL;
}

ps_lookup_t *ps_lookup_start(const char *host, uint16_t port, const sigset_t *block,
                             void (*notify)(void *), void *arg)
{
    ps_lookup_t *l = calloc(1, sizeof *l);
    if (l == NULL) return NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(l->host, sizeof l->host, "%s", host);
    snprintf(l->port, sizeof l->port, "%u", port);
    l->notify = notify;
    l->arg = arg;
    /* The thread inherits the mask: block what the caller wants kept off it for its start. */
    sigset_t was;
    if (block) pthread_sigmask(SIG_BLOCK, block, &was);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, lookup_main, l);
    pthread_attr_destroy(&attr);
    if (block) pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (rc != 0) {
        job_free(l);
        errno = rc;
        return NULL;
    }
    return l;
}

bool ps_lookup_wait(ps_lookup_t *l, unsigned ms)
{
    struct timespec due;
    clock_gettime(CLOCK_MONOTONIC, &due);
    due.tv_sec += ms / 1000;
    due.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (due.tv_nsec >= 1000000000L) due.tv_sec++, due.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&l->mu);
    while (!l->done && ms > 0 && pthread_cond_timedwait(&l->cv, &l->mu, &due) == 0) {
    }
    int done = l->done;
    pthread_mutex_unlock(&l->mu);
    return done;
}

int ps_lookup_take(ps_lookup_t *l, struct sockaddr_storage *ss, socklen_t *len)
{
    int status = l->status;
    *len = 0;
    if (status == 0 && l->addrlen) {
        memcpy(ss, &l->addr, l->addrlen);
        *len = l->addrlen;
    }
    job_free(l);
    return status;
}

void ps_lookup_abandon(ps_lookup_t *l)
{
    if (l == NULL) return;
    pthread_mutex_lock(&l->mu);
    int done = l->done;
    l->abandoned = !done;
    pthread_mutex_unlock(&l->mu);
    if (done) job_free(l); /* its thread is past its last use of it */
}
