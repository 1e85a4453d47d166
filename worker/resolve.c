/* resolve.c: libps's lookups of the shards' names, each on a detached thread of its own, so
 * that the comm thread never waits for DNS (connect_shard, client.c, uses the address known). */
#include "client_internal.h"
#include "lookup.h"

/* uv_async_send is safe from any thread: the lookup's end wakes the comm thread. */
static void notify_resolved(void *arg)
{
    uv_async_send(arg);
}

/* c->resolved: keep what each finished lookup found. */
void ps__on_resolved(uv_async_t *h)
{
    ps_client_t *c = h->data;
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        if (s->job == NULL || !ps_lookup_wait(s->job, 0)) continue;
        struct sockaddr_storage addr;
        socklen_t addrlen;
        int status = ps_lookup_take(s->job, &addr, &addrlen);
        s->job = NULL;
        if (status == 0 && addrlen) {
            if (s->addrlen && (s->addrlen != addrlen || memcmp(&s->addr, &addr, addrlen) != 0)) {
                PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) is at another address now", i,
                       c->m.servers[i].host, c->m.servers[i].port);
                s->moved = 1; /* hello_overdue: a hello to the old one fails, no transport
                                 restart */
            }
            memcpy(&s->addr, &addr, addrlen);
            s->addrlen = addrlen;
            s->gai_status = 0;
        } else if (status != 0) {
            s->gai_status = status;
            PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: cannot resolve %s: %s", i,
                   c->m.servers[i].host, gai_strerror(status));
        }
    }
}

/* Hand every lookup still running to its thread (the comm thread's end). */
void ps__resolve_abandon(ps_client_t *c)
{
    for (uint32_t i = 0; i < c->nshards; i++) {
        ps_lookup_abandon(c->shards[i].job);
        c->shards[i].job = NULL;
    }
}

/* Look shard @p s's name up in the background; ps__on_resolved keeps what it finds. */
void ps__resolve_start(ps_client_t *c, cshard_t *s)
{
    if (s->job || __atomic_load_n(&c->loop_stop, __ATOMIC_ACQUIRE)) return; /* abandoned */
    const ps_server_conf_t *sc = &c->m.servers[s->index];
    /* Its thread blocks the signals the comm thread blocks: a caller driving the worker may
     * run this, and the program's handlers run on its own threads. */
    sigset_t block;
    ps__client_signals(&block);
    s->job = ps_lookup_start(sc->host, sc->port, &block, notify_resolved, &c->resolved);
    if (s->job == NULL) /* the next attempt tries again */
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: no thread to look %s up (%s): its address "
               "stays the one known", s->index, sc->host, strerror(errno));
}
