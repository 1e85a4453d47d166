/* resolve.c: libps's lookups of the shards' names, each on a detached thread of its own, so
 * that the comm thread never waits for DNS (connect_shard, client.c, uses the address known). */
#include "client_internal.h"

/* A shard's name lookup, on a detached thread of its own. It was libuv's thread pool: a
 * process forked from a worker (python's os.fork) kept libuv's count of the pool's threads,
 * which only the parent has, and its exit joined them (uv_library_shutdown: SIGSEGV; a helper's
 * probe, session 58). The job is the comm thread's until the lookup is done, or the thread's
 * to free once the client abandons it (its end while the lookup runs: DNS may take seconds). */
typedef struct resolve_job_s {
    pthread_mutex_t mu;
    int done, abandoned, status; /* status: getaddrinfo's */
    struct sockaddr_storage addr;
    socklen_t addrlen;           /* 0: no address that fits */
    char host[PS_HOST_MAX], port[8];
    uv_async_t *resolved;        /* the client's: sent to unless abandoned */
} resolve_job_t;

static void *resolve_main(void *arg)
{
    resolve_job_t *j = arg;
    /* IPv4 only, as psd listens (ps_sockaddr_resolve: UCX 1.13's TCP fails on IPv6). */
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(j->host, j->port, &hints, &res);
    pthread_mutex_lock(&j->mu);
    j->status = rc;
    if (rc == 0 && res && res->ai_addrlen <= sizeof j->addr) {
        memcpy(&j->addr, res->ai_addr, res->ai_addrlen);
        j->addrlen = res->ai_addrlen;
    }
    j->done = 1;
    int abandoned = j->abandoned;
    if (!abandoned) uv_async_send(j->resolved);
    pthread_mutex_unlock(&j->mu); /* the comm thread's from here, unless abandoned */
    if (res) freeaddrinfo(res);
    if (abandoned) {
        pthread_mutex_destroy(&j->mu);
        free(j);
    }
    return NULL;
}

/* c->resolved: keep what each finished lookup found. */
void ps__on_resolved(uv_async_t *h)
{
    ps_client_t *c = h->data;
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        resolve_job_t *j = s->job;
        if (j == NULL) continue;
        pthread_mutex_lock(&j->mu);
        int done = j->done;
        pthread_mutex_unlock(&j->mu);
        if (!done) continue;
        s->job = NULL;
        if (j->status == 0 && j->addrlen) {
            if (s->addrlen && (s->addrlen != j->addrlen ||
                               memcmp(&s->addr, &j->addr, j->addrlen) != 0)) {
                PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) is at another address now", i,
                       c->m.servers[i].host, c->m.servers[i].port);
                s->moved = 1; /* hello_overdue: a hello to the old one fails, no transport
                                 restart */
            }
            memcpy(&s->addr, &j->addr, j->addrlen);
            s->addrlen = j->addrlen;
            s->gai_status = 0;
        } else if (j->status != 0) {
            s->gai_status = j->status;
            PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: cannot resolve %s: %s", i,
                   c->m.servers[i].host, gai_strerror(j->status));
        }
        pthread_mutex_destroy(&j->mu);
        free(j);
    }
}

/* Hand every lookup still running to its thread (the comm thread's end). */
void ps__resolve_abandon(ps_client_t *c)
{
    for (uint32_t i = 0; i < c->nshards; i++) {
        resolve_job_t *j = c->shards[i].job;
        if (j == NULL) continue;
        c->shards[i].job = NULL;
        pthread_mutex_lock(&j->mu);
        int done = j->done;
        j->abandoned = !done;
        pthread_mutex_unlock(&j->mu);
        if (done) { /* its thread is past its last use of it */
            pthread_mutex_destroy(&j->mu);
            free(j);
        }
    }
}

/* Look shard @p s's name up in the background; ps__on_resolved keeps what it finds. */
void ps__resolve_start(ps_client_t *c, cshard_t *s)
{
    if (s->job || __atomic_load_n(&c->loop_stop, __ATOMIC_ACQUIRE)) return; /* abandoned */
    const ps_server_conf_t *sc = &c->m.servers[s->index];
    resolve_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) return; /* the next attempt tries again */
    pthread_mutex_init(&j->mu, NULL);
    snprintf(j->host, sizeof j->host, "%s", sc->host);
    snprintf(j->port, sizeof j->port, "%u", sc->port);
    j->resolved = &c->resolved;
    /* Its thread blocks the signals the comm thread blocks: a caller driving the worker may
     * run this, and the program's handlers run on its own threads. */
    sigset_t block, was;
    ps__client_signals(&block);
    pthread_sigmask(SIG_BLOCK, &block, &was);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, resolve_main, j);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (rc != 0) {
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: no thread to look %s up (%s): its address "
               "stays the one known", s->index, sc->host, strerror(rc));
        pthread_mutex_destroy(&j->mu);
        free(j);
        return;
    }
    s->job = j;
}
