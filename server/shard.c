/* shard.c: the tensor table, chunk aggregation, store jobs and pull snapshots. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "crc32c.h"
#include "init.h"
#include "rechash.h"
#include "integrity.h"
#include "optim_conf.h"
#include "place.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "server.h"
#include "tcpguard.h"

static void job_start_next(psd_server_t *srv);
static size_t job_bytes(const psd_server_t *srv, const psd_job_t *job);
static void drop_slot(psd_chunk_t *ch, uint32_t r);
static uint32_t local_chunks(const psd_tensor_t *t);
static uint32_t held_chunks(const psd_server_t *srv);

/* ---- tensor table ------------------------------------------------------ */

static int table_reserve(psd_server_t *srv, uint32_t id)
{
    if (id < srv->cap_tensors) return 0;
    uint32_t cap = srv->cap_tensors ? srv->cap_tensors : 16;
    while (cap <= id) cap *= 2;
    psd_tensor_t *t = realloc(srv->tensors, cap * sizeof *t);
    if (t == NULL) return PS_ENOMEM;
    memset(t + srv->cap_tensors, 0, (cap - srv->cap_tensors) * sizeof *t);
    srv->tensors = t;
    srv->cap_tensors = cap;
    return 0;
}

static psd_chunk_t *chunk_new(psd_server_t *srv, uint32_t t, uint32_t c, uint32_t n)
{
    psd_chunk_t *ch = calloc(1, sizeof *ch);
    if (ch == NULL) return NULL;
    ch->tensor = t;
    ch->chunk = c;
    ch->n = n;
    if (srv->m.job.consistency != PS_CONSIST_BSP &&
        (ch->applied = calloc(1, sizeof *ch->applied)) == NULL) {
        free(ch);
        return NULL;
    }
    return ch;
}

/* Rank @p r's slot of @p ch, or NULL when no rank of its group pushed to the chunk yet. */
static inline psd_slot_t *slot_at(const psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *g = ch->slot_group[r / PSD_SLOT_GROUP];
    return g ? &g[r % PSD_SLOT_GROUP] : NULL;
}

/* Rank @p r's slot of @p ch, its group allocated (empty slots) when it has none yet; NULL:
 * out of memory. Loop thread. */
static psd_slot_t *slot_get(psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t **g = &ch->slot_group[r / PSD_SLOT_GROUP];
    if (*g == NULL) {
        psd_slot_t *n = calloc(PSD_SLOT_GROUP, sizeof *n);
        if (n == NULL) return NULL;
        for (uint32_t k = 0; k < PSD_SLOT_GROUP; k++)
            n[k] = (psd_slot_t){.chunk = ch, .rank = r / PSD_SLOT_GROUP * PSD_SLOT_GROUP + k};
        *g = n;
    }
    return &(*g)[r % PSD_SLOT_GROUP];
}

/* The first allocated slot of @p ch from rank @p r on, or NULL: with SLOTS_FOR, every slot
 * that ever held a push (the others are empty). */
static inline psd_slot_t *slot_from(const psd_chunk_t *ch, uint32_t r)
{
    for (; r < PS_MAX_RANKS; r = (r / PSD_SLOT_GROUP + 1) * PSD_SLOT_GROUP)
        if (ch->slot_group[r / PSD_SLOT_GROUP]) return slot_at(ch, r);
    return NULL;
}

#define SLOTS_FOR(ch, s) for (psd_slot_t *s = slot_from(ch, 0); s; s = slot_from(ch, s->rank + 1))

static void chunk_free(psd_chunk_t *ch)
{
    if (ch == NULL) return;
    free(ch->agg);
    free(ch->applied);
    SLOTS_FOR(ch, s) {
        psd_area_unref(s->ext.area);
        free(s->buf); /* its memh: unmapped by psd_shard_unregister, or never mapped */
    }
    for (uint32_t g = 0; g < PS_MAX_RANKS / PSD_SLOT_GROUP; g++) free(ch->slot_group[g]);
    free(ch);
}

/* Slot @p r's data: a direct push's place in its area, or the slot's own buffer. */
static inline const uint8_t *slot_data(const psd_chunk_t *ch, uint32_t r)
{
    const psd_slot_t *s = slot_at(ch, r);
    return s->ext.data ? s->ext.data : s->buf;
}

/* Slot @p r is free again; a direct push's area reference is dropped. */
static void slot_empty(psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    s->state = SLOT_EMPTY;
    if (s->ext.area) psd_area_unref(s->ext.area);
    s->ext = (psd_slot_ext_t){NULL, NULL};
}

static uint64_t records_bytes(const psd_server_t *srv, const ps_decl_t *d, uint32_t shard);

/* Count (@p sign 1) or uncount (-1) tensor @p d's records in every shard's decl_bytes. */
static void count_decl_bytes(psd_server_t *srv, const ps_decl_t *d, int sign)
{
    for (uint32_t k = 0; k < srv->nshards && k < PS_MAX_SERVERS; k++)
        srv->decl_bytes[k] += (uint64_t)(int64_t)sign * records_bytes(srv, d, k);
}

/* ---- the name index ------------------------------------------------------------------------
 * Declarations find their tensor by name; one strcmp per held tensor made them quadratic (at
 * 20,000 tensors a third of a declaration's time). XXH3 of the name, linear probing, kept
 * under half full; entries are never removed one by one: one whose tensor was forgotten (a
 * failed creation) or whose id was given to another name is skipped, and the index is laid
 * out again from the present tensors when it grows. */

static uint64_t name_hash(const char *s) { return XXH3_64bits(s, strlen(s)); }

static void name_put(uint32_t *names, uint32_t cap, const char *name, uint32_t id)
{
    uint32_t i = (uint32_t)name_hash(name) & (cap - 1);
    while (names[i]) i = (i + 1) & (cap - 1);
    names[i] = id + 1;
}

/* Index tensor @p id (present) by its name. @return 0 or PS_ENOMEM (the index as it was). */
static int name_index_add(psd_server_t *srv, uint32_t id)
{
    if (2 * (srv->names_used + 1) > srv->names_cap) {
        uint32_t cap = srv->names_cap ? srv->names_cap : 64, used = 0;
        while (cap < 4 * (srv->ntensors + 1)) cap *= 2;
        uint32_t *n = calloc(cap, sizeof *n);
        if (n == NULL) return PS_ENOMEM;
        for (uint32_t i = 0; i < srv->ntensors; i++)
            if (i != id && srv->tensors[i].present) {
                name_put(n, cap, srv->tensors[i].decl.name, i);
                used++;
            }
        free(srv->names);
        srv->names = n;
        srv->names_cap = cap;
        srv->names_used = used;
    }
    name_put(srv->names, srv->names_cap, srv->tensors[id].decl.name, id);
    srv->names_used++;
    return 0;
}

/* The present tensor named @p name, or NULL. */
static psd_tensor_t *tensor_named(psd_server_t *srv, const char *name)
{
    if (srv->names_cap == 0) return NULL;
    for (uint32_t i = (uint32_t)name_hash(name) & (srv->names_cap - 1); srv->names[i];
         i = (i + 1) & (srv->names_cap - 1)) {
        psd_tensor_t *t = &srv->tensors[srv->names[i] - 1];
        if (t->present && strcmp(t->decl.name, name) == 0) return t;
    }
    return NULL;
}

psd_tensor_t *psd_shard_tensor_named(psd_server_t *srv, const char *name)
{
    return tensor_named(srv, name);
}

/* Enter tensor @p d into the table with chunk states for the chunks this shard owns. */
static int tensor_add(psd_server_t *srv, const ps_decl_t *d, bool ready)
{
    int rc = table_reserve(srv, d->id);
    if (rc) return rc;
    psd_tensor_t *t = &srv->tensors[d->id];
    t->decl = *d;
    t->numel = ps_decl_numel(d);
    t->nchunks = ps_chunk_count(t->numel, srv->chunk_elems);
    t->chunks = calloc(t->nchunks ? t->nchunks : 1, sizeof *t->chunks);
    if (t->chunks == NULL) return PS_ENOMEM;
    for (uint32_t c = 0; c < t->nchunks; c++) {
        if (ps_place_shard(d->first_chunk + c, srv->nshards) != srv->shard) continue;
        t->chunks[c] = chunk_new(srv, d->id, c, (uint32_t)ps_chunk_len(t->numel, srv->chunk_elems, c));
        if (t->chunks[c] == NULL) return PS_ENOMEM;
        srv->area_need += ps_area_place_bytes((uint64_t)t->chunks[c]->n * 4);
        t->chunks[c]->total_steps = d->total_steps;
        t->chunks[c]->mean = ps_decl_mean(d);
    }
    if ((rc = name_index_add(srv, d->id)) != 0) return rc;
    t->present = true;
    t->ready = ready;
    count_decl_bytes(srv, d, 1);
    if (d->id >= srv->ntensors) srv->ntensors = d->id + 1;
    uint64_t end = d->first_chunk + t->nchunks;
    if (end > srv->next_chunk) srv->next_chunk = end;
    return 0;
}

/* Tensor @p id was not created (its create job failed, or its declaration failed after
 * tensor_add; @p reuse: shard 0 hands its id out again when it is the last), or was dropped
 * (JOB_DROP: not, since another shard may still hold it): forget it, so that a later
 * declaration tries again. Its waiters stay for the caller to answer. */
static void values_free(psd_tensor_t *t);

static void tensor_forget(psd_server_t *srv, uint32_t id, bool reuse)
{
    psd_tensor_t *t = &srv->tensors[id];
    values_free(t);
    if (t->present) count_decl_bytes(srv, &t->decl, -1);
    t->present = false;
    for (uint32_t c = 0; t->chunks && c < t->nchunks; c++) {
        if (t->chunks[c]) srv->area_need -= ps_area_place_bytes((uint64_t)t->chunks[c]->n * 4);
        chunk_free(t->chunks[c]);
    }
    free(t->chunks);
    t->chunks = NULL;
    t->nchunks = 0;
    t->declared_ranks = 0;
    t->dropping = false;
    if (reuse && srv->shard == 0 && id + 1 == srv->ntensors) {
        srv->ntensors--; /* the id and its chunk ordinals are handed out again */
        srv->next_chunk = t->decl.first_chunk;
    }
    psd_integrity_stale(srv); /* a status read since may have laid its leaves out */
}

static void on_load_tensor(void *arg, const ps_decl_t *d)
{
    psd_server_t *srv = arg;
    if (tensor_add(srv, d, true))
        PS_LOG(PS_LOG_ERROR, "shard", "cannot load tensor '%s'", d->name);
    else /* who declared it before the restart is not known: no give-up drops it (forget.c) */
        srv->tensors[d->id].declared_ranks = ~0ull;
}

static void on_load_chunk(void *arg, uint32_t t, uint32_t c, const psd_chunk_hdr_t *h)
{
    psd_server_t *srv = arg;
    if (t < srv->ntensors && srv->tensors[t].present && c < srv->tensors[t].nchunks &&
        srv->tensors[t].chunks[c]) {
        srv->tensors[t].chunks[c]->version = h->version;
        srv->tensors[t].chunks[c]->summed_from = h->version; /* earlier steps: not known */
        srv->tensors[t].chunks[c]->hash = h->hash;
    } else {
        PS_LOG(PS_LOG_WARN, "shard", "stored chunk %u/%u belongs to no tensor of this shard", t, c);
    }
}

/* bsp: a chunk's apply members (its summed ring), stored (key 'D', as asp's applied-push record)
 * by an apply whose members differ from the step before's: every apply after @c step had the
 * same members as it, so that a restarted shard still knows whose batches its chunks have
 * (replay_had, stale_push_had) for as many steps back as one that ran all along. */
typedef struct {
    uint64_t step;                     /* the apply that wrote it */
    uint64_t from;                     /* the first step known then */
    uint64_t members[PSD_SUMMED_RING]; /* at [s % ring] for s in [from, step], the last ring */
    uint64_t skipped;                  /* the chunk's skipped steps up to and with @c step */
} summed_rec_t;

/* Written before session 35: no count of skipped steps (taken as 0, the optimizer's update
 * number as those psd counted it: the version). */
typedef struct {
    uint64_t step, from;
    uint64_t members[PSD_SUMMED_RING];
} summed_rec_v2_t;

/* Written before session 25: from @c step on, every apply had @c members (earlier steps not
 * known: a replay of a batch of one was applied again, a stale push counted as applied). */
typedef struct {
    uint64_t step, members;
} summed_rec_v1_t;

/* A bsp applied record @p val (any of the forms above) as the current one, in @p rec; false for
 * another length (asp's record, or not one psd wrote). */
static bool summed_parse(const void *val, size_t len, summed_rec_t *rec)
{
    *rec = (summed_rec_t){0};
    if (len == sizeof *rec || len == sizeof(summed_rec_v2_t)) {
        memcpy(rec, val, len);
    } else if (len == sizeof(summed_rec_v1_t)) {
        /* the form stored before session 25: a ring that knows its own step only */
        summed_rec_v1_t v1;
        memcpy(&v1, val, sizeof v1);
        rec->step = rec->from = v1.step;
        rec->members[v1.step % PSD_SUMMED_RING] = v1.members;
    } else {
        return false;
    }
    return true;
}

/* The first step @p rec tells for a chunk at @p version (its ring, then the chunk's). */
static uint64_t summed_first(const summed_rec_t *rec, uint64_t version)
{
    uint64_t from = rec->from;
    if (rec->step + 1 > PSD_SUMMED_RING && from < rec->step + 1 - PSD_SUMMED_RING)
        from = rec->step + 1 - PSD_SUMMED_RING;
    if (version > PSD_SUMMED_RING && from < version - PSD_SUMMED_RING)
        from = version - PSD_SUMMED_RING;
    return from;
}

/* Step @p s's apply members by @p rec (s in [summed_first, version)): the ring's up to
 * rec->step; the applies after it had its members, and skipped no step (one that did wrote a
 * record). */
static uint64_t summed_at(const summed_rec_t *rec, uint64_t s)
{
    return rec->members[(s <= rec->step ? s : rec->step) % PSD_SUMMED_RING];
}

bool psd_shard_summed_members(const void *val, size_t len, uint64_t version, uint64_t step,
                              uint64_t *members)
{
    summed_rec_t rec;
    if (!summed_parse(val, len, &rec) || rec.step >= version || step >= version ||
        step < summed_first(&rec, version))
        return false;
    *members = summed_at(&rec, step);
    return true;
}

static void on_load_applied(void *arg, uint32_t t, uint32_t c, const void *val, size_t len)
{
    psd_server_t *srv = arg;
    psd_chunk_t *ch = t < srv->ntensors && srv->tensors[t].present && c < srv->tensors[t].nchunks
                          ? srv->tensors[t].chunks[c]
                          : NULL;
    summed_rec_t rec;
    if (ch && len == sizeof *ch->applied) {
        if (ch->applied) memcpy(ch->applied, val, len); /* else bsp now: not needed */
    } else if (ch && len == PS_MAX_RANKS * 2 * sizeof(uint64_t)) {
        if (ch->applied == NULL) return;
        /* Written before session 23: who and request only (no batches). */
        const uint8_t *p = val;
        *ch->applied = (psd_applied_t){0};
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
            memcpy(&ch->applied->done[r].who, p + 16 * r, 8);
            memcpy(&ch->applied->done[r].req, p + 16 * r + 8, 8);
        }
    } else if (ch && summed_parse(val, len, &rec)) {
        /* bsp: the ring as the apply of rec.step left it (summed_at). */
        if (rec.step >= ch->version) return; /* written by an apply that did not commit? */
        uint64_t from = summed_first(&rec, ch->version);
        ch->skipped = rec.skipped <= ch->version ? rec.skipped : 0;
        for (uint64_t s = from; s < ch->version; s++)
            ch->summed[s % PSD_SUMMED_RING] = summed_at(&rec, s);
        ch->summed_from = from;
    } else
        PS_LOG(PS_LOG_WARN, "shard", "stored applied-push record of %u/%u (%zu bytes) fits no "
               "chunk of this shard: ignored", t, c, len);
}

int psd_shard_load(psd_server_t *srv)
{
    int rc = psd_store_load(&srv->store, on_load_tensor, on_load_chunk, on_load_applied, srv);
    if (rc) return rc;
    if ((rc = psd_integrity_rebuild(srv)) != 0) return rc;
    PS_LOG(PS_LOG_INFO, "shard", "store holds %u tensors, %u chunks here, step %llu",
           srv->ntensors, held_chunks(srv), (unsigned long long)psd_shard_step(srv));
    return 0;
}

void psd_shard_unregister(psd_server_t *srv)
{
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        for (uint32_t c = 0; t->present && c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            SLOTS_FOR(ch, s)
                if (s->memh) {
                    ucp_mem_unmap(srv->ucx.context, s->memh);
                    s->memh = NULL;
                }
        }
    }
}

void psd_shard_free(psd_server_t *srv)
{
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        for (uint32_t c = 0; t->present && c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            for (psd_wait_t *w = ch->pulls, *nx; w; w = nx) {
                nx = w->next;
                free(w);
            }
            chunk_free(ch);
        }
        for (psd_wait_t *w = t->declares, *nx; w; w = nx) {
            nx = w->next;
            free(w);
        }
        free(t->chunks);
    }
    for (psd_wait_t *w = srv->free_waits, *nx; w; w = nx) {
        nx = w->next;
        free(w);
    }
    for (psd_snap_t *s = srv->free_snaps, *nx; s; s = nx) {
        nx = s->next_free;
        mdb_txn_abort(s->txn);
        free(s);
    }
    srv->free_waits = NULL;
    srv->free_snaps = NULL;
    free(srv->tensors);
    free(srv->names);
    srv->names = NULL;
    srv->names_cap = srv->names_used = 0;
    free(srv->create_queue);
    free(srv->job.items);
    free(srv->job.coord_state);
    free(srv->job.coord_rec);
    free(srv->job.hashes);
    free(srv->job.bad);
    free(srv->job.nonfinite);
    free(srv->job.params_odd);
    free(srv->job.olds);
    free(srv->job.recs);
    free(srv->job.deferred);
    psd_integrity_free(srv);
    srv->tensors = NULL;
}

uint64_t psd_shard_step(psd_server_t *srv)
{
    uint64_t step = UINT64_MAX;
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++)
            if (srv->tensors[i].chunks[c] && srv->tensors[i].chunks[c]->version < step)
                step = srv->tensors[i].chunks[c]->version;
    return step == UINT64_MAX ? 0 : step;
}

uint32_t psd_shard_tensors(const psd_server_t *srv)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++) n += srv->tensors[i].present;
    return n;
}

uint64_t psd_shard_step_max(psd_server_t *srv)
{
    uint64_t step = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++)
            if (srv->tensors[i].chunks[c] && srv->tensors[i].chunks[c]->version > step)
                step = srv->tensors[i].chunks[c]->version;
    return step;
}

void psd_shard_totals(const psd_server_t *srv, psd_shard_totals_t *t)
{
    memset(t, 0, sizeof *t);
    uint64_t vmin = UINT64_MAX;
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        t->tensors += srv->tensors[i].present; /* the cluster's table, which every shard holds */
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++) {
            const psd_chunk_t *ch = srv->tensors[i].chunks[c];
            if (ch == NULL) continue;
            t->chunks++;
            t->state_bytes += psd_chunk_bytes(ch->n, srv->nstate);
            if (ch->version < vmin) vmin = ch->version;
            if (ch->version > t->version_max) t->version_max = ch->version;
            if (ch->params_odd && t->odd_chunks++ == 0) t->odd_first = i;
        }
    }
    t->version_min = t->chunks ? vmin : 0;
    if (srv->m.job.consistency != PS_CONSIST_BSP || t->version_max < 2) return;
    char why[96];
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        const psd_tensor_t *x = &srv->tensors[i];
        if (!x->present || !x->ready || local_chunks(x) == 0 ||
            psd_shard_tensor_used(srv, x, why, sizeof why))
            continue;
        if (t->untrained++ == 0) t->untrained_first = i;
    }
}

/* Appends `, "KEY": "NAME"` to out: tensor @p id's name as a JSON string (a quote, a backslash
 * or a control byte escaped; "" for a tensor no longer held). */
static void status_name(const psd_server_t *srv, const char *key, uint32_t id, char *out,
                        size_t cap, size_t *len)
{
    char name[6 * PS_NAME_MAX + 64];
    size_t k = (size_t)snprintf(name, sizeof name, ", \"%s\": \"", key);
    const char *s = id < srv->ntensors && srv->tensors[id].present ? srv->tensors[id].decl.name
                                                                   : "";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        k += (size_t)(*p == '"' || *p == '\\' ? snprintf(name + k, sizeof name - k, "\\%c", *p)
                      : *p < 0x20 ? snprintf(name + k, sizeof name - k, "\\u%04x", *p)
                                  : snprintf(name + k, sizeof name - k, "%c", *p));
    int n = snprintf(out + *len, cap - *len, "%s\"", name);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
}

void psd_shard_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len)
{
    psd_shard_totals_t t;
    psd_shard_totals(srv, &t);
    int n = snprintf(out + *len, cap - *len,
                     "\"tensors\": %u, \"chunks\": %llu, \"state_bytes\": %llu, "
                     "\"version_min\": %llu, \"version_max\": %llu, \"untrained_tensors\": %u, "
                     "\"nonfinite_pushes\": %llu, \"nonfinite_param_chunks\": %llu",
                     t.tensors, (unsigned long long)t.chunks, (unsigned long long)t.state_bytes,
                     (unsigned long long)t.version_min, (unsigned long long)t.version_max,
                     t.untrained, (unsigned long long)srv->nonfinite_pushes,
                     (unsigned long long)t.odd_chunks);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    if (t.untrained) status_name(srv, "untrained_first", t.untrained_first, out, cap, len);
    if (t.odd_chunks) status_name(srv, "nonfinite_param_first", t.odd_first, out, cap, len);
    if (srv->nonfinite_pushes == 0) return;
    n = snprintf(out + *len, cap - *len, ", \"nonfinite_last_rank\": %u", srv->nonfinite_rank);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    status_name(srv, "nonfinite_last_tensor", srv->nonfinite_tensor, out, cap, len);
}

/* ---- membership views --------------------------------------------------- */

static const psd_view_t *view_of(const psd_server_t *srv, uint64_t step)
{
    return psd_views_of(&srv->views, step);
}

uint64_t psd_shard_members(const psd_server_t *srv, uint64_t step, uint64_t *epoch)
{
    const psd_view_t *best = view_of(srv, step);
    if (epoch) *epoch = best ? best->epoch : 0;
    return best ? best->members : 0;
}

/* bsp: whether step @p step was closed by the coordinator with no member left: its view is a
 * closed one (PS_FLAG_CLOSED; restore_closed_lost in coord.c: a step this shard's restart of
 * the coordinator closed, whose members all left before any showed it applied everywhere)
 * with no members. A chunk still at it passes it as it is (run_apply: no member summed); its
 * members' batches went out again, tagged. An open step every member left has an ordinary
 * view with no members: it waits to go out again. */
static bool step_closed_empty(const psd_server_t *srv, uint64_t step)
{
    const psd_view_t *v = view_of(srv, step);
    return v && v->closed && v->members == 0;
}

uint64_t psd_shard_epoch(const psd_server_t *srv)
{
    return psd_views_epoch(&srv->views);
}

static void chunk_maybe_ready(psd_server_t *srv, psd_chunk_t *ch);

void psd_shard_learn_view(psd_server_t *srv, uint64_t epoch, uint64_t from_step, uint64_t members,
                          bool closed)
{
    psd_view_t *v = psd_views_find(&srv->views, epoch);
    if (v) {
        /* nothing new (an epoch is either a closed step's or an ordinary one) */
        if (v->closed || closed || v->from_step <= from_step) return;
        v->from_step = from_step;
    } else {
        bool full = srv->views.n == PSD_VIEWS;
        /* No view is looked up below the lowest chunk's step (a push for an earlier step is
         * acknowledged as stale before its view is). */
        uint64_t low = full ? psd_shard_step(srv) : 0;
        psd_view_t nv = {epoch, from_step, members, closed};
        v = psd_views_slot(&srv->views, &nv, low);
        if (v == NULL) { /* every view known still needed, and this one older or covered */
            PS_LOG(closed && from_step >= low ? PS_LOG_WARN : PS_LOG_DEBUG, "shard",
                   "epoch %llu (%s step %llu) not kept: the %d views known are newer and still "
                   "needed", (unsigned long long)epoch, closed ? "closed" : "from",
                   (unsigned long long)from_step, PSD_VIEWS);
            return;
        }
        if (full)
            PS_LOG(PS_LOG_DEBUG, "shard", "epoch %llu forgotten for epoch %llu",
                   (unsigned long long)v->epoch, (unsigned long long)epoch);
        *v = (psd_view_t){epoch, from_step, members, closed};
        PS_LOG(PS_LOG_DEBUG, "shard", "epoch %llu %s step %llu: members %#llx",
               (unsigned long long)epoch, closed ? "closed" : "from", (unsigned long long)from_step,
               (unsigned long long)members);
    }
    /* A step waiting for a member that left may be complete now. */
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++)
            if (srv->tensors[i].chunks[c]) chunk_maybe_ready(srv, srv->tensors[i].chunks[c]);
}

bool psd_shard_idle(psd_server_t *srv)
{
    return !srv->job_running && !srv->slot_running && srv->slot_head == NULL &&
           srv->ready_head == NULL && srv->ncreate == 0;
}

/* ---- waiting requests ---------------------------------------------------- */

/* Waiting requests come from a free list: a BSP pull waits every step. */
static void wait_put(psd_server_t *srv, psd_wait_t *w)
{
    w->next = srv->free_waits;
    srv->free_waits = w;
}

static int wait_add(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn, uint64_t req_id,
                    uint64_t min_version, uint32_t codec, uint32_t flags, uint64_t asked_ns)
{
    psd_wait_t *w = srv->free_waits;
    if (w)
        srv->free_waits = w->next;
    else if ((w = malloc(sizeof *w)) == NULL)
        return PS_ENOMEM;
    *w = (psd_wait_t){conn, req_id, min_version, codec, *list, flags, asked_ns};
    *list = w;
    psd_conn_ref(conn);
    return 0;
}

static void drop_from(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn)
{
    while (*list) {
        psd_wait_t *w = *list;
        if (w->conn == conn) {
            *list = w->next;
            psd_conn_unref(conn);
            wait_put(srv, w);
        } else {
            list = &w->next;
        }
    }
}

static void values_giver_gone(psd_server_t *srv, uint32_t id);

void psd_shard_drop_conn(psd_server_t *srv, psd_conn_t *conn)
{
    psd_direct_reap(srv);
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        if (!t->present) continue;
        drop_from(srv, &t->declares, conn);
        drop_from(srv, &t->forgets, conn);
        for (uint32_t c = 0; c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            drop_from(srv, &ch->pulls, conn);
            /* Its pushes already received stay: each is a whole gradient for its step and
             * is applied with it. Only the acknowledgement has nowhere to go. */
            SLOTS_FOR(ch, s)
                if (s->conn == conn && s->state == SLOT_FULL) {
                    s->conn = NULL;
                    psd_conn_unref(conn);
                }
        }
        if (t->values && t->values->giver == conn) values_giver_gone(srv, i);
    }
}

/* ---- declare ------------------------------------------------------------ */

static void reply_declare(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_tensor_t *t)
{
    ps_msg_t r = {.type = PS_MSG_DECLARE_REPLY, .req_id = req_id, .shard = srv->shard,
                  .has_decl = 1, .decl = t->decl};
    r.step = UINT64_MAX;
    for (uint32_t c = 0; c < t->nchunks; c++)
        if (t->chunks[c] && t->chunks[c]->version < r.step) r.step = t->chunks[c]->version;
    if (r.step == UINT64_MAX) r.step = 0;
    psd_send_msg(srv, conn, &r);
}

static bool same_shape(const ps_decl_t *a, const ps_decl_t *b)
{
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(uint32_t) * (size_t)a->ndim) == 0;
}

static int queue_create(psd_server_t *srv, uint32_t id)
{
    if (srv->ncreate == srv->cap_create) {
        uint32_t cap = srv->cap_create ? 2 * srv->cap_create : 16;
        uint32_t *q = realloc(srv->create_queue, cap * sizeof *q);
        if (q == NULL) return PS_ENOMEM;
        srv->create_queue = q;
        srv->cap_create = cap;
    }
    srv->create_queue[srv->ncreate++] = id;
    job_start_next(srv);
    return 0;
}

/* ---- values sent by the declarer (PSK_INIT_VALUES) ---------------------------------------
 * A model's own weights (a pretrained one, psd.torch): the declaration that creates the tensor
 * here is answered with PS_FLAG_VALUES, its worker sends the values of this shard's chunks
 * (PS_MSG_VALUES) and declares again; once all came, the create job writes them instead of an
 * initializer's, and every declaration waiting is answered. Other declarers wait meanwhile, as
 * for any creation. When the sending worker goes first, the next declarer waiting is asked in
 * its place (its values, not a mix: those received are dropped); with none, the tensor is
 * forgotten and a later declaration creates it again. */

/* This shard's chunks of @p t. */
static uint32_t local_chunks(const psd_tensor_t *t)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < t->nchunks; c++) n += t->chunks[c] != NULL;
    return n;
}

/* The chunks this shard holds, of every tensor present. */
static uint32_t held_chunks(const psd_server_t *srv)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < srv->ntensors; t++)
        if (srv->tensors[t].present) n += local_chunks(&srv->tensors[t]);
    return n;
}

static void values_free(psd_tensor_t *t)
{
    psd_values_t *v = t->values;
    if (v == NULL) return;
    for (uint32_t c = 0; c < t->nchunks; c++) free(v->buf[c]);
    free(v->buf);
    if (v->giver) psd_conn_unref(v->giver);
    free(v);
    t->values = NULL;
}

/* @p t (not ready) waits for the values of its chunks here from @p conn. 0 or PS_ENOMEM. */
static int values_begin(psd_server_t *srv, psd_tensor_t *t, psd_conn_t *conn)
{
    psd_values_t *v = calloc(1, sizeof *v);
    if (v == NULL || (v->buf = calloc(t->nchunks, sizeof *v->buf)) == NULL) {
        free(v);
        return PS_ENOMEM;
    }
    psd_conn_ref(conn);
    v->giver = conn;
    v->gen = ++srv->values_gen; /* unique in this psd: a late receive is told from any other */
    v->missing = local_chunks(t);
    v->last_ms = psd_now_ms();
    t->values = v;
    return 0;
}

/* Answer declaration @p req_id of @p conn: it creates @p t here; send its values. */
static void values_ask(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, const psd_tensor_t *t)
{
    psd_send_msg(srv, conn, &(ps_msg_t){.type = PS_MSG_DECLARE_REPLY, .req_id = req_id,
                                         .shard = srv->shard, .has_decl = 1, .decl = t->decl,
                                         .flags = PS_FLAG_VALUES});
}

/* Tensor @p id's creation failed (@p rc: its create job, or no memory to queue one): the
 * declarations waiting fail, and it is forgotten (a later declaration tries again). */
static void create_failed(psd_server_t *srv, uint32_t id, int rc)
{
    psd_tensor_t *t = &srv->tensors[id];
    for (psd_wait_t *w = t->declares, *nx; w; w = nx) {
        nx = w->next;
        psd_send_error(srv, w->conn, w->req_id, rc, "cannot create tensor '%s': %s",
                       t->decl.name, ps_strerror(rc));
        psd_conn_unref(w->conn);
        wait_put(srv, w);
    }
    t->declares = NULL;
    tensor_forget(srv, id, true);
}

/* The worker sending tensor @p id's values went before all came. The next declarer waiting
 * that has values of its own is asked for them; with none, a declarer waiting without values
 * (psworker's initializer, say) gets the tensor initialized as psd.torch's init="shards" would
 * (xavier for 2 or more dimensions, else zeros); with no declarer left, it is forgotten. */
static void values_giver_gone(psd_server_t *srv, uint32_t id)
{
    psd_tensor_t *t = &srv->tensors[id];
    psd_values_t *v = t->values;
    psd_conn_unref(v->giver);
    v->giver = NULL;
    for (uint32_t c = 0; c < t->nchunks; c++) {
        free(v->buf[c]);
        v->buf[c] = NULL;
    }
    v->missing = local_chunks(t);
    v->gen = ++srv->values_gen; /* a receive of the one gone still landing is dropped */
    psd_wait_t **pp = &t->declares;
    while (*pp && !((*pp)->flags & PS_FLAG_VALUES)) pp = &(*pp)->next;
    if (*pp) {
        psd_wait_t *w = *pp;
        *pp = w->next;
        v->giver = w->conn; /* its reference moves */
        v->last_ms = psd_now_ms();
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': the worker creating it left before its "
               "values came; rank %d's declaration sends them", id, t->decl.name, w->conn->rank);
        values_ask(srv, w->conn, w->req_id, t);
        wait_put(srv, w);
        return;
    }
    if (t->declares) {
        values_free(t);
        t->decl.init = (t->decl.init & PS_DECL_MEAN) |
                       (t->decl.ndim >= 2 ? PSK_INIT_XAVIER : PSK_INIT_ZEROS);
        t->decl.init_arg = 0;
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': the worker creating it left before its "
               "values came; the declarations waiting send none: initialized by psd (%s)", id,
               t->decl.name, t->decl.ndim >= 2 ? "xavier" : "zeros");
        int rc = queue_create(srv, id);
        if (rc) create_failed(srv, id, rc);
        return;
    }
    PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s' not created: the worker declaring it left "
           "before its values came", id, t->decl.name);
    tensor_forget(srv, id, true);
}

void psd_shard_values_cron(psd_server_t *srv, uint64_t now_ms)
{
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        psd_values_t *v = t->present ? t->values : NULL;
        if (v == NULL || v->giver == NULL || v->missing == 0 || now_ms - v->last_ms <= limit)
            continue;
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': rank %d sent none of its values for %llu "
               "ms (job.heartbeat_timeout_ms %llu): passed over", i, t->decl.name,
               v->giver->rank, (unsigned long long)(now_ms - v->last_ms),
               (unsigned long long)limit);
        values_giver_gone(srv, i); /* its later values are refused: not the creator now */
    }
}

/* A PS_MSG_VALUES being received into a buffer of its own. */
typedef struct {
    psd_server_t *srv;
    psd_conn_t *conn; /* a reference */
    uint64_t req_id, gen;
    uint32_t tensor, chunk, crc;
    float *buf;
} values_recv_t;

static void values_landed(void *request, ucs_status_t status, size_t length, void *user_data)
{
    values_recv_t *r = user_data;
    psd_server_t *srv = r->srv;
    if (request) ucp_request_free(request);
    ps_tcpguard_done(r->buf);
    psd_tensor_t *t = r->tensor < srv->ntensors && srv->tensors[r->tensor].present
                          ? &srv->tensors[r->tensor]
                          : NULL;
    psd_values_t *v = t ? t->values : NULL;
    int rc = 0;
    const char *why = "";
    if (status != UCS_OK)
        rc = ps_ucx_err(status), why = "their receive failed";
    else if (v == NULL || v->gen != r->gen || v->giver != r->conn || r->chunk >= t->nchunks ||
             t->chunks[r->chunk] == NULL || length != (size_t)t->chunks[r->chunk]->n * 4)
        rc = PS_ECONFLICT, why = "this worker no longer creates it (it was slow to send them)";
    else if (ps_crc32c(0, r->buf, length) != r->crc)
        rc = PS_ECRC, why = "their CRC-32C does not match";
    else if (!psk_all_finite(r->buf, length / sizeof(float)))
        rc = PS_EINVAL, why = "they hold a NaN or an infinity";
    if (rc == 0) {
        bool again = v->buf[r->chunk] != NULL; /* sent again (a CRC mismatch): the newer */
        free(v->buf[r->chunk]);
        v->buf[r->chunk] = r->buf;
        r->buf = NULL;
        v->last_ms = psd_now_ms();
        psd_send_msg(srv, r->conn, &(ps_msg_t){.type = PS_MSG_VALUES_REPLY, .req_id = r->req_id,
                                                .shard = srv->shard, .tensor = r->tensor,
                                                .chunk = r->chunk});
        if (!again && --v->missing == 0) {
            psd_conn_unref(v->giver); /* nothing more to come: its leaving changes nothing */
            v->giver = NULL;
            if ((rc = queue_create(srv, r->tensor)) != 0) create_failed(srv, r->tensor, rc);
        }
    } else if (!r->conn->dead) {
        psd_send_error(srv, r->conn, r->req_id, rc, "values of tensor %u chunk %u: %s",
                       r->tensor, r->chunk, why);
    }
    free(r->buf);
    psd_conn_unref(r->conn);
    free(r);
}

ucs_status_t psd_shard_on_values(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    psd_tensor_t *t = msg->tensor < srv->ntensors && srv->tensors[msg->tensor].present
                          ? &srv->tensors[msg->tensor]
                          : NULL;
    psd_values_t *v = t ? t->values : NULL;
    const psd_chunk_t *ch = v && msg->chunk < t->nchunks ? t->chunks[msg->chunk] : NULL;
    if (v == NULL || v->giver != conn) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "values of tensor %u: this worker "
                       "does not create it on shard %u (no declaration of its asked for them, or "
                       "it was passed over: it sent none for job.heartbeat_timeout_ms)",
                       msg->tensor, srv->shard);
        return UCS_OK;
    }
    if (ch == NULL || length != (size_t)ch->n * sizeof(float)) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "values of '%s' chunk %u: %zu bytes, "
                       "but shard %u holds %s", t->decl.name, msg->chunk, length, srv->shard,
                       ch ? "another number of values" : "no such chunk");
        return UCS_OK;
    }
    values_recv_t *r = malloc(sizeof *r);
    float *buf = malloc(length ? length : 1);
    if (r == NULL || buf == NULL) {
        free(r);
        free(buf);
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return UCS_OK;
    }
    psd_conn_ref(conn);
    *r = (values_recv_t){srv, conn, msg->req_id, v->gen, msg->tensor, msg->chunk, msg->crc32c, buf};
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(buf, data, length);
        values_landed(NULL, UCS_OK, length, r);
        return UCS_OK;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = values_landed, .user_data = r};
    ps_tcpguard_expect(buf, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(srv->ucx.worker, data, buf, length, &p);
    if (req == NULL)
        values_landed(NULL, UCS_OK, length, r);
    else if (UCS_PTR_IS_ERR(req))
        values_landed(NULL, UCS_PTR_STATUS(req), 0, r);
    return UCS_OK;
}

bool psd_shard_tensor_used(const psd_server_t *srv, const psd_tensor_t *t, char *why, size_t len)
{
    for (uint32_t c = 0; c < t->nchunks; c++) {
        const psd_chunk_t *ch = t->chunks[c];
        if (ch == NULL) continue;
        bool slots = false;
        for (uint32_t g = 0; g < PS_MAX_RANKS / PSD_SLOT_GROUP; g++)
            slots |= ch->slot_group[g] != NULL;
        if (ch->version == 0 && !slots && !ch->queued && !ch->applying && ch->pulls == NULL)
            continue;
        snprintf(why, len, "its chunk %u on shard %u %s", c, srv->shard,
                 ch->version                   ? "took updates"
                 : slots || ch->queued || ch->applying ? "took pushes"
                                               : "has a pull waiting");
        return true;
    }
    return false;
}

int psd_shard_drop(psd_server_t *srv, uint32_t id, psd_conn_t *conn, uint64_t req_id)
{
    psd_tensor_t *t = &srv->tensors[id];
    if (wait_add(srv, &t->forgets, conn, req_id, 0, 0, 0, 0)) return PS_ENOMEM;
    if (t->dropping) return 0; /* asked twice: both answered by the one job */
    int rc = queue_create(srv, id | PSD_QUEUE_DROP);
    if (rc) {
        drop_from(srv, &t->forgets, conn);
        return rc;
    }
    t->dropping = true;
    t->ready = false;
    return 0;
}

/* The map bytes (a lower bound, psd_store_record_footprint) of the records of a tensor's
 * @p nchunks @p chunks here (NULL: another shard's). */
static uint64_t chunks_footprint(const psd_server_t *srv, psd_chunk_t *const *chunks,
                                 uint32_t nchunks)
{
    uint64_t b = 0;
    for (uint32_t c = 0; c < nchunks; c++)
        if (chunks[c]) b += psd_store_record_footprint(&srv->store, chunks[c]->n, srv->nstate);
    return b;
}

/* A lower bound of the map bytes the records of tensor @p d take on shard @p shard: each of
 * its chunks there once (parameters and the optimizer's state, in whole overflow pages where
 * LMDB puts them there: psd_store_record_footprint). Chunk c is on shard
 * (first_chunk + c) mod nshards (place.h); only the last chunk may be shorter. */
static uint64_t records_bytes(const psd_server_t *srv, const ps_decl_t *d, uint32_t shard)
{
    uint64_t numel = ps_decl_numel(d), S = srv->nshards;
    uint32_t n = ps_chunk_count(numel, srv->chunk_elems), last = n ? n - 1 : 0;
    uint64_t here = n / S + ((shard + S - d->first_chunk % S) % S < n % S);
    if (here == 0) return 0;
    bool last_here = ps_place_shard(d->first_chunk + last, srv->nshards) == shard;
    uint64_t full =
        psd_store_record_footprint(&srv->store, (uint32_t)srv->chunk_elems, srv->nstate);
    uint32_t tail = (uint32_t)ps_chunk_len(numel, srv->chunk_elems, last);
    return (here - last_here) * full +
           (last_here ? psd_store_record_footprint(&srv->store, tail, srv->nstate) : 0);
}

/* Whether new tensor @p d cannot fit in the stores, refused then (PS_ESTOREFULL, naming the
 * sizes): its records on a shard, with those of the tensors there, take more than map_size_mb.
 * Before, the create filled the map first, holding the store's writes up for as long (about a
 * minute for tens of GiB). Shard 0, where every declaration starts and which holds every
 * tensor, checks every shard's share with what it holds (decl_bytes), so that no other shard
 * refuses one it took: before, it did not count the others' tensors, a shard that was fuller
 * refused, and shard 0 kept the tensor (psctl export then failed on it). Each shard checks its
 * own again. Counted as tensors are added, not summed over every chunk at each declaration
 * (which made many declarations quadratic). A lower bound (leaf
 * pages, the tree's branch pages and the free list not counted), and an update writes a
 * chunk's new record before the old one's pages are free (copy-on-write), so a tensor near
 * the limit still fails at its first update ("the shard store is full"). */
static bool declare_too_big(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id,
                            const ps_decl_t *d)
{
    uint64_t map = srv->m.map_size_mb << 20;
    for (uint32_t k = 0; k < srv->nshards && k < PS_MAX_SERVERS; k++) {
        if (srv->shard != 0 && k != srv->shard) continue;
        uint64_t need = records_bytes(srv, d, k), have = srv->decl_bytes[k];
        if (have + need <= map) continue;
        char shape[64], was[96] = "";
        ps_shape_str(d->shape, d->ndim, shape, sizeof shape);
        if (have * 10 >= 1 << 20) /* 0.1 MiB or more */
            snprintf(was, sizeof was, ", and its tensors hold %.1f MiB already",
                     (double)have / (1 << 20));
        PS_LOG(PS_LOG_WARN, "shard", "refused declaration of '%s' %s: %.1f MiB on shard %u%s, "
               "map_size_mb %llu", d->name, shape, (double)need / (1 << 20), k, was,
               (unsigned long long)srv->m.map_size_mb);
        psd_send_error(srv, conn, req_id, PS_ESTOREFULL,
                       "cannot declare '%s' %s: its records need %.1f MiB on shard %u (the "
                       "parameters%s%s)%s, more than map_size_mb %llu: raise map_size_mb in "
                       "the manifest or add shards", d->name, shape, (double)need / (1 << 20),
                       k, srv->nstate ? " and the state of " : "",
                       srv->nstate ? ps_optim_name(srv->m.job.optimizer.name) : "", was,
                       (unsigned long long)srv->m.map_size_mb);
        return true;
    }
    return false;
}

void psd_shard_on_declare(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (srv->stopping) return; /* the endpoint closes next; the worker sees that */
    if (!msg->has_decl) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "declare without a tensor");
        return;
    }
    ps_decl_t d = msg->decl;
    char want[64], have[64];
    /* Find the tensor by name: the name is the identity users see. */
    psd_tensor_t *t = tensor_named(srv, d.name);
    if (t && t->dropping) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "tensor '%s' is being dropped (the "
                       "workers that declared it gave it up, or psctl forget): declare it again "
                       "in a moment", d.name);
        return;
    }
    if (t) {
        if (ps_decl_mean(&d) != ps_decl_mean(&t->decl)) {
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor '%s' declared as %s, "
                           "but it exists as %s", d.name,
                           ps_decl_mean(&d) ? "a mean of the pushes" : "the optimizer's",
                           ps_decl_mean(&t->decl) ? "a mean of the pushes" : "the optimizer's");
            return;
        }
        if (!same_shape(&t->decl, &d)) {
            ps_shape_str(d.shape, d.ndim, want, sizeof want);
            ps_shape_str(t->decl.shape, t->decl.ndim, have, sizeof have);
            PS_LOG(PS_LOG_WARN, "shard", "refused declaration of '%s' as %s from rank %d: it exists as %s",
                   d.name, want, conn->rank, have);
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                           "tensor '%s' declared with shape %s, but it exists with shape %s",
                           d.name, want, have);
            return;
        }
        if (d.assigned && (d.id != t->decl.id || d.first_chunk != t->decl.first_chunk)) {
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                           "tensor '%s' declared as id %u at chunk %llu, but it is id %u at chunk %llu",
                           d.name, d.id, (unsigned long long)d.first_chunk, t->decl.id,
                           (unsigned long long)t->decl.first_chunk);
            return;
        }
        if (srv->shard == 0 && conn->rank >= 0 && conn->rank < PS_MAX_RANKS)
            t->declared_ranks |= 1ull << conn->rank;
        if (t->values && t->values->giver == conn && t->values->missing > 0)
            values_ask(srv, conn, msg->req_id, t); /* some did not come (a CRC mismatch) */
        else if (t->ready)
            reply_declare(srv, conn, msg->req_id, t);
        else if (wait_add(srv, &t->declares, conn, msg->req_id, 0, 0,
                          ps_decl_init_kind(&d) == PSK_INIT_VALUES ? PS_FLAG_VALUES : 0, 0))
            psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    if (srv->shard == 0 && srv->ntensors >= PSD_MAX_TENSORS) {
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL,
                       "cannot declare '%s': the cluster already holds %u tensors", d.name,
                       PSD_MAX_TENSORS);
        return;
    }
    if (srv->shard == 0 && psd_coord_bsp_step(srv) > 0) {
        /* Its chunks would start at step 0, and under bsp a chunk takes only the pushes of the
         * step it is at: every member's push of the job's step would be refused as ahead of
         * it, and the shards' step (the lowest chunk's) would read 0 for good. Before, it was
         * created and left so, as by a worker of another model that the coordinator then
         * refused (psd.torch on a store holding another job). */
        PS_LOG(PS_LOG_WARN, "shard", "refused declaration of new tensor '%s' from rank %d: the "
               "bsp job is at step %llu", d.name, conn->rank,
               (unsigned long long)psd_coord_bsp_step(srv));
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                       "cannot declare '%s': this cluster's bsp job is at step %llu and holds "
                       "its tensors already; one declared now could not take part in its steps "
                       "(declare every tensor before the first step; another model's job needs "
                       "its own data_dirs)", d.name, (unsigned long long)psd_coord_bsp_step(srv));
        return;
    }
    if (srv->shard == 0) {
        /* The coordinator numbers tensors and their chunks in declaration order. */
        d.id = srv->ntensors;
        d.first_chunk = srv->next_chunk;
        d.assigned = 1;
    } else if (!d.assigned) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO,
                       "tensor '%s' must be declared to shard 0 first", d.name);
        return;
    } else if (d.id < srv->ntensors && srv->tensors[d.id].present) {
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor id %u is '%s', not '%s'",
                       d.id, srv->tensors[d.id].decl.name, d.name);
        return;
    } else if (d.id >= PSD_MAX_TENSORS) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "tensor id %u out of range", d.id);
        return;
    }
    if (declare_too_big(srv, conn, msg->req_id, &d)) return;
    int rc = tensor_add(srv, &d, false);
    if (rc == 0 && srv->shard == 0 && conn->rank >= 0 && conn->rank < PS_MAX_RANKS)
        srv->tensors[d.id].declared_ranks = 1ull << conn->rank;
    /* Values sent by the declarer: asked for first, created once they all came. */
    bool ask = rc == 0 && ps_decl_init_kind(&d) == PSK_INIT_VALUES &&
               local_chunks(&srv->tensors[d.id]) > 0;
    if (ask)
        rc = values_begin(srv, &srv->tensors[d.id], conn);
    else if (rc == 0)
        rc = wait_add(srv, &srv->tensors[d.id].declares, conn, msg->req_id, 0, 0, 0, 0);
    if (rc == 0 && !ask) rc = queue_create(srv, d.id);
    if (rc) {
        /* Nothing half-made stays: a present tensor never created would hold every later
         * declaration of its name waiting, and its records counted in decl_bytes. */
        if (d.id < srv->cap_tensors) { /* not when the table could not grow to it */
            psd_tensor_t *t = &srv->tensors[d.id];
            for (psd_wait_t *w = t->declares, *nx; w; w = nx) {
                nx = w->next;
                psd_conn_unref(w->conn);
                wait_put(srv, w);
            }
            t->declares = NULL;
            tensor_forget(srv, d.id, true);
        }
        psd_send_error(srv, conn, msg->req_id, rc, "cannot create tensor '%s': %s", d.name,
                       ps_strerror(rc));
        return;
    }
    if (ask) values_ask(srv, conn, msg->req_id, &srv->tensors[d.id]);
    ps_shape_str(d.shape, d.ndim, want, sizeof want);
    PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' %s: %u chunks from ordinal %llu%s", d.id, d.name,
           want, srv->tensors[d.id].nchunks, (unsigned long long)d.first_chunk,
           ask ? ", values asked for" : "");
}

/* ---- pull --------------------------------------------------------------- */

/* A retired snapshot's read transaction is reset, not freed, and renewed for the next one. */
static void snap_retire(psd_server_t *srv, psd_snap_t *s)
{
    mdb_txn_reset(s->txn);
    s->next_free = srv->free_snaps;
    srv->free_snaps = s;
}

static void snap_release(psd_server_t *srv, psd_snap_t *s)
{
    if (--s->refs == 0 && s->stale) snap_retire(srv, s);
}

static psd_snap_t *snap_current(psd_server_t *srv)
{
    if (srv->snap) return srv->snap;
    psd_snap_t *s = srv->free_snaps;
    if (s) {
        srv->free_snaps = s->next_free;
        if (psd_store_snapshot_renew(s->txn)) {
            mdb_txn_abort(s->txn);
            free(s);
            s = NULL;
        }
    }
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || psd_store_snapshot(&srv->store, &s->txn)) {
            free(s);
            return NULL;
        }
    }
    s->refs = 0;
    s->stale = false;
    srv->snap = s;
    return s;
}

static void on_pull_sent(void *request, ucs_status_t status, void *user_data)
{
    psd_send_t *s = user_data;
    psd_server_t *srv = s->srv;
    if (status != UCS_OK && !s->conn->dead)
        PS_LOG(PS_LOG_WARN, "shard", "pull reply to %s failed: %s", s->conn->peer,
               ucs_status_string(status));
    if (srv->trace) /* every reply counted in srv->pulls, failed or not */
        psd_trace_pull(srv->trace, s->tensor, s->chunk, s->version, s->asked_ns, s->answered_ns,
                       ps_trace_now(), false, status == UCS_OK);
    snap_release(srv, s->snap);
    psd_conn_unref(s->conn);
    s->next_free = srv->free_sends;
    srv->free_sends = s;
    if (request) ucp_request_free(request);
}

/* The PS_TEST_CORRUPT_PULL hook: a copy of the reply's data with one byte flipped, in the
 * send's own buffer (the snapshot is never written). NULL when out of memory. */
static const void *test_corrupt(psd_send_t *s, const void *data, size_t dlen)
{
    if (dlen == 0) return data;
    if (data != s->payload) {
        if (dlen > s->payload_cap) {
            uint8_t *b = realloc(s->payload, dlen);
            if (b == NULL) return NULL;
            s->payload = b;
            s->payload_cap = dlen;
        }
        memcpy(s->payload, data, dlen);
    }
    s->payload[dlen / 2] ^= 0x10;
    return s->payload;
}

/* The first pull of a chunk since this psd loaded its store checks the parameters of record
 * @p h against their stored CRC-32C (what the worker checks them with), so that parameters
 * damaged at rest are refused with the reason rather than sent: the worker would take the
 * mismatch for the transport's, pull again and give up saying "corrupted in transit". A CRC of
 * the params only, on the loop thread (the record's full hash, state included, is the first
 * update's, on the apply threads: run_apply); once per chunk per run while it matches, at every
 * pull while it does not. Returns true (and says so once per chunk) for damaged parameters. */
static bool params_damaged(psd_server_t *srv, psd_chunk_t *ch, const psd_chunk_hdr_t *h)
{
    if (ch->params_checked) return false;
    if (ps_crc32c(0, psd_chunk_params((psd_chunk_hdr_t *)h), (size_t)h->n * 4) == h->crc32c) {
        ch->params_checked = true;
        return false;
    }
    if (!ch->damage_logged)
        PS_LOG(PS_LOG_ERROR, "shard", "chunk %u of tensor '%s' (version %llu) in this shard's "
               "store: its parameters do not match their CRC-32C (corrupted at rest); refused "
               "to every pull; psctl verify names the damaged chunks, psctl repair --from "
               "CHECKPOINT rewrites them", ch->chunk, srv->tensors[ch->tensor].decl.name,
               (unsigned long long)h->version);
    ch->damage_logged = true;
    return true;
}

static void send_pull_reply(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_chunk_t *ch,
                            uint32_t codec, uint32_t flags, uint64_t asked_ns)
{
    if (conn->dead) return;
    if (snap_current(srv) == NULL) {
        psd_send_error(srv, conn, req_id, PS_ESTORE, "cannot open a store snapshot");
        return;
    }
    const psd_chunk_hdr_t *h;
    int rc = psd_store_chunk_get(&srv->store, srv->snap->txn, ch->tensor, ch->chunk, &h);
    if (rc) {
        psd_send_error(srv, conn, req_id, rc, "chunk %u/%u unreadable: %s", ch->tensor, ch->chunk,
                       ps_strerror(rc));
        return;
    }
    if (params_damaged(srv, ch, h)) {
        psd_send_error(srv, conn, req_id, PS_ECORRUPT, "pull of chunk %u of tensor '%s': %s on "
                       "shard %u (psctl verify; psctl repair --from CHECKPOINT)", ch->chunk,
                       srv->tensors[ch->tensor].decl.name, ps_strerror(PS_ECORRUPT), srv->shard);
        return;
    }
    /* Relaxed: an apply job on the pool may read it meanwhile; either value is correct. */
    __atomic_store_n(&ch->pulled_direct, (flags & PS_FLAG_DIRECT) != 0, __ATOMIC_RELAXED);
    if (flags & PS_FLAG_DIRECT) {
        /* The committed version and its CRC; the worker reads that record or a later one. */
        ps_msg_t r = {.type = PS_MSG_PULL_REPLY, .req_id = req_id, .tensor = ch->tensor,
                      .chunk = ch->chunk, .step = h->version, .shard = srv->shard,
                      .crc32c = h->crc32c, .flags = PS_FLAG_DIRECT};
        if (psd_outbox_add(srv, conn, &r, NULL, 0) != 0) psd_send_msg(srv, conn, &r);
        srv->pulls++;
        srv->direct_pulls++;
        if (srv->trace) {
            uint64_t now = ps_trace_now();
            psd_trace_pull(srv->trace, ch->tensor, ch->chunk, h->version, asked_ns, now, now,
                           true, true);
        }
        return;
    }
    psd_send_t *s = srv->free_sends;
    if (s)
        srv->free_sends = s->next_free;
    else if ((s = calloc(1, sizeof *s)) == NULL)
        return;
    const float *params = psd_chunk_params((psd_chunk_hdr_t *)h);
    const void *data = params;
    size_t dlen = (size_t)h->n * 4;
    psk_codec_t c = {.kind = (psk_codec_kind_t)codec};
    if (codec != PSK_CODEC_NONE) {
        /* Compressed pull: encode from the snapshot into this send's own buffer. */
        dlen = psk_codec_max_bytes(&c, h->n);
        if (dlen > s->payload_cap) {
            uint8_t *b = realloc(s->payload, dlen);
            if (b == NULL) {
                s->next_free = srv->free_sends;
                srv->free_sends = s;
                psd_send_error(srv, conn, req_id, PS_ENOMEM, "out of memory");
                return;
            }
            s->payload = b;
            s->payload_cap = dlen;
        }
        psk_codec_encode_cpu(s->payload, s->payload_cap, &dlen, params, h->n, &c, NULL);
        data = s->payload;
    }
    ps_msg_t r = {.type = PS_MSG_PULL_REPLY, .req_id = req_id, .tensor = ch->tensor,
                  .chunk = ch->chunk, .step = h->version, .length = dlen,
                  .codec = codec, .shard = srv->shard,
                  .crc32c = data == params ? h->crc32c : ps_crc32c(0, data, dlen)};
    if (srv->test_corrupt_pull && ++srv->test_pull_count % srv->test_corrupt_pull == 0 &&
        (data = test_corrupt(s, data, dlen)) == NULL) {
        s->next_free = srv->free_sends;
        srv->free_sends = s;
        psd_send_error(srv, conn, req_id, PS_ENOMEM, "out of memory");
        return;
    }
    if (psd_outbox_add(srv, conn, &r, data, dlen) == 0) { /* copied into the bundle */
        s->next_free = srv->free_sends;
        srv->free_sends = s;
        srv->pulls++;
        if (srv->trace) {
            uint64_t now = ps_trace_now();
            psd_trace_pull(srv->trace, ch->tensor, ch->chunk, h->version, asked_ns, now, now,
                           false, true);
        }
        return;
    }
    psd_outbox_flush(srv, conn);
    s->srv = srv;
    s->conn = conn;
    s->snap = srv->snap;
    s->snap->refs++;
    psd_conn_ref(conn);
    if (srv->trace) {
        s->tensor = ch->tensor;
        s->chunk = ch->chunk;
        s->version = h->version;
        s->asked_ns = asked_ns;
        s->answered_ns = ps_trace_now();
    }
    size_t len;
    psd_encode(srv, conn, &r, s->hdr, sizeof s->hdr, &len);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = ps_ucx_eager_flag(conn->eager_below, dlen),
                             .cb.send = on_pull_sent, .user_data = s};
    /* The data is the committed record in the snapshot: immutable until released. */
    void *req = ucp_am_send_nbx(conn->ep, PS_AM_DATA, s->hdr, len, data, dlen, &p);
    if (req == NULL)
        on_pull_sent(NULL, UCS_OK, s);
    else if (UCS_PTR_IS_ERR(req))
        on_pull_sent(NULL, UCS_PTR_STATUS(req), s);
    srv->pulls++;
}

/* The chunk @p msg names, or NULL after refusing it. The refusal names the chunk the message
 * named (PS_FLAG_CHUNK): nothing of the message is held, so a push's place in the sender's
 * push area is free again. */
static psd_chunk_t *find_chunk(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (msg->tensor >= srv->ntensors || !srv->tensors[msg->tensor].present ||
        !srv->tensors[msg->tensor].ready) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_ENOENT,
                             "no tensor with id %u", msg->tensor);
        return NULL;
    }
    psd_tensor_t *t = &srv->tensors[msg->tensor];
    if (msg->chunk >= t->nchunks || t->chunks[msg->chunk] == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_EPROTO,
                             "tensor '%s' has no chunk %u on shard %u", t->decl.name,
                             msg->chunk, srv->shard);
        return NULL;
    }
    return t->chunks[msg->chunk];
}

void psd_shard_on_pull(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    psd_chunk_t *ch = find_chunk(srv, conn, msg);
    if (ch == NULL) return;
    uint64_t asked = srv->trace ? ps_trace_now() : 0;
    if (msg->codec != PSK_CODEC_NONE && msg->codec != PSK_CODEC_FP16 &&
        msg->codec != PSK_CODEC_BF16) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO,
                       "pull of %u/%u: parameters travel as none, fp16 or bf16, not codec %u",
                       ch->tensor, ch->chunk, msg->codec);
        return;
    }
    /* A raw pull from a worker that opened this shard's store (PS_FLAG_DIRECT) is answered
     * with the version alone: the worker copies the record itself (storeview.h). */
    uint32_t direct = srv->store_path[0] && msg->codec == PSK_CODEC_NONE
                          ? msg->flags & PS_FLAG_DIRECT : 0;
    if (ch->version >= msg->step || srv->m.job.consistency != PS_CONSIST_BSP) {
        send_pull_reply(srv, conn, msg->req_id, ch, msg->codec, direct, asked);
        return;
    }
    if (msg->step > ch->version + 1) {
        psd_send_error(srv, conn, msg->req_id, PS_ESTALE,
                       "pull of %u/%u at version %llu, but the chunk is at %llu", ch->tensor,
                       ch->chunk, (unsigned long long)msg->step, (unsigned long long)ch->version);
        return;
    }
    if (wait_add(srv, &ch->pulls, conn, msg->req_id, msg->step, msg->codec, direct, asked))
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
}

/* ---- push --------------------------------------------------------------- */

/* Whether @p ch can be applied now: asp / ssp, a push is there; bsp, every member of its step
 * (*@p members) pushed, or the coordinator closed that step with none (step_closed_empty). */
static bool chunk_ready(const psd_server_t *srv, const psd_chunk_t *ch, uint64_t *members)
{
    if (srv->m.job.consistency != PS_CONSIST_BSP) {
        *members = ~0ull;
        return ch->nfull > 0;
    }
    *members = psd_shard_members(srv, ch->version, NULL);
    return *members != 0 ? (ch->full_mask & *members) == *members
                         : step_closed_empty(srv, ch->version);
}

static void chunk_maybe_ready(psd_server_t *srv, psd_chunk_t *ch)
{
    uint64_t members;
    if (!chunk_ready(srv, ch, &members) || ch->queued) return;
    ch->queued = true;
    ch->next_ready = NULL;
    if (srv->ready_tail)
        srv->ready_tail->next_ready = ch;
    else
        srv->ready_head = ch;
    srv->ready_tail = ch;
    /* Inside a bundle or a job's end, more chunks may become ready: they go in one job
     * (one transaction) started at the end (psd_shard_kick). */
    if (srv->bundling == 0) job_start_next(srv);
}

void psd_shard_kick(psd_server_t *srv) { job_start_next(srv); }

static void stale_slot_done(psd_server_t *srv, psd_chunk_t *ch, uint32_t r);

/* Push slot @p s's data landed (or did not: @p status). */
static void push_received(psd_slot_t *s, ucs_status_t status)
{
    psd_chunk_t *ch = s->chunk;
    uint32_t rank = s->rank;
    psd_server_t *srv = s->conn->srv;
    if (status != UCS_OK) {
        PS_LOG(PS_LOG_WARN, "shard", "push of %u/%u from rank %u lost: %s", ch->tensor, ch->chunk,
               rank, ucs_status_string(status));
        drop_slot(ch, rank);
        return;
    }
    if (srv->m.job.consistency == PS_CONSIST_BSP && s->step != ch->version) {
        /* The step was applied while this push was landing, without its rank: stale. */
        stale_slot_done(srv, ch, rank);
        return;
    }
    /* A raw push's CRC-32C is checked in the apply pass, block by block while the sum reads it
     * (run_apply): one pass over the gradient less. A codec's payload is checked here. */
    if (s->codec.kind != PSK_CODEC_NONE && ps_crc32c(0, s->buf, s->len) != s->crc) {
        /* Corrupted in transit: never applied; the sender sends it again. */
        srv->crc_errors++;
        PS_LOG(PS_LOG_WARN, "shard", "checksum mismatch on the %u/%u push from rank %u: rejected",
               ch->tensor, ch->chunk, rank);
        psd_send_crc_error(srv, s->conn, s->req, ch->tensor, ch->chunk, "push");
        drop_slot(ch, rank);
        return;
    }
    if (s->codec.kind != PSK_CODEC_NONE && psk_codec_check(s->buf, s->len, ch->n, &s->codec)) {
        /* Never applied: the sender hears why, the step waits for a good push. */
        PS_LOG(PS_LOG_WARN, "shard", "rejected a malformed %u/%u payload from rank %u",
               ch->tensor, ch->chunk, rank);
        psd_send_chunk_error(srv, s->conn, s->req, ch->tensor, ch->chunk, PS_EPROTO,
                             "push of %u/%u: malformed payload (length, indices or scales)",
                             ch->tensor, ch->chunk);
        drop_slot(ch, rank);
        return;
    }
    s->state = SLOT_FULL;
    ch->nfull++;
    ch->full_mask |= 1ull << rank;
    srv->pushes++;
    if (srv->trace)
        psd_trace_push(srv->trace, ch->tensor, ch->chunk, rank, s->step, s->arrived_ns,
                       ps_trace_now(), s->ext.data != NULL);
    chunk_maybe_ready(srv, ch);
}

/* bsp: whether chunk @p ch applied step @p s with the batch of one of the ranks @p ranks (a
 * member of that apply: its push summed, or itself skipped as a replay of a batch the chunk
 * had): 1, 0, or -1 when the chunk does not remember that step (too old, or from before this
 * psd loaded the store). A step not applied here yet: 0. */
static int step_had_ranks(const psd_chunk_t *ch, uint64_t s, uint64_t ranks)
{
    if (s >= ch->version) return 0;
    if (s < ch->summed_from || ch->version - s > PSD_SUMMED_RING) return -1;
    return (ch->summed[s % PSD_SUMMED_RING] & ranks) != 0;
}

/* bsp: whether rank @p rank's push @p msg, of a batch handed out again (its replay tags: the
 * steps and ranks that had it before and left mid-step), brings a batch chunk @p ch has
 * already (step_had_ranks for a tag). A tagged step not applied here yet does not count (that
 * rank's push, no longer a member's, is dropped); one not remembered is logged and counted as
 * not applied here, as before replay tags. */
static bool replay_had(psd_server_t *srv, const psd_chunk_t *ch, uint32_t rank,
                       const ps_msg_t *msg)
{
    uint64_t s, ranks;
    for (uint32_t i = 0, at = 0; i < msg->nreplay; at = i) {
        ps_replay_next(msg->replay, msg->nreplay, &i, &s, &ranks);
        int had = step_had_ranks(ch, s, ranks);
        if (had < 0) {
            if (srv->replay_warned != msg->replay[at] + 1) /* once per tag, not per chunk */
                PS_LOG(PS_LOG_WARN, "shard", "push of %u/%u from rank %u replays the batch ranks "
                       "%#llx had at step %llu, which this shard does not remember (at step "
                       "%llu): applied", ch->tensor, ch->chunk, rank, (unsigned long long)ranks,
                       (unsigned long long)s, (unsigned long long)ch->version);
            srv->replay_warned = msg->replay[at] + 1;
        } else if (had) {
            PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u replays the batch ranks "
                   "%#llx had at step %llu, applied here then: not applied again", ch->tensor,
                   ch->chunk, rank, (unsigned long long)ranks, (unsigned long long)s);
            return true;
        }
    }
    return false;
}

/* bsp: whether an apply of step msg->step with members @p members (whose batches it has) has
 * the batch of rank @p rank's push @p msg: the push's own rank is one of them (a resend), or a
 * replay tag names one of them or a member of an earlier apply here (step_had_ranks; a step not
 * remembered counts as had: nothing to tell). */
static bool apply_had_batch(const psd_chunk_t *ch, uint32_t rank, const ps_msg_t *msg,
                            uint64_t members)
{
    if (members >> rank & 1) return true;
    uint64_t s, ranks;
    for (uint32_t i = 0; ps_replay_next(msg->replay, msg->nreplay, &i, &s, &ranks);)
        if (s == msg->step ? (members & ranks) != 0 : step_had_ranks(ch, s, ranks) != 0)
            return true;
    return false;
}

/* bsp: whether chunk @p ch, past step msg->step, applied that step with the batch of rank
 * @p rank's push @p msg (apply_had_batch with summed[]). A step it does not remember counts as
 * had (as before stale acknowledgements). False only for a batch that apply did not have:
 * pushed by a member of the step handed out again after every member left it (or by a rank
 * removed before this chunk's apply, whose batch went back already). */
static bool stale_push_had(const psd_chunk_t *ch, uint32_t rank, const ps_msg_t *msg)
{
    uint64_t s = msg->step;
    if (s < ch->summed_from || ch->version - s > PSD_SUMMED_RING) return true;
    return apply_had_batch(ch, rank, msg, ch->summed[s % PSD_SUMMED_RING]);
}

/* Acknowledge push @p req of @p conn (rank @p rank, for @p step) of chunk @p ch without applying
 * it: applied before, or (bsp) of a step the chunk passed, with PS_FLAG_STALE when that step's
 * apply did not have its batch (@p lacks), so that its worker reports it and the coordinator
 * hands the batch out again. */
static void send_push_ack(psd_server_t *srv, psd_conn_t *conn, uint64_t req, psd_chunk_t *ch,
                          uint32_t rank, uint64_t step, bool lacks)
{
    ps_msg_t a = {.type = PS_MSG_PUSH_ACK, .req_id = req, .tensor = ch->tensor,
                  .chunk = ch->chunk, .step = ch->version, .shard = srv->shard};
    if (lacks) {
        a.flags = PS_FLAG_STALE;
        srv->stale_acks++;
        PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u for step %llu: the chunk "
               "applied that step without its batch (it is at step %llu): not applied, and "
               "acknowledged as such", ch->tensor, ch->chunk, rank, (unsigned long long)step,
               (unsigned long long)ch->version);
    }
    if (conn && !conn->dead) psd_send_msg(srv, conn, &a);
}

/* bsp: slot @p r of @p ch holds a push of a step the chunk passed while it landed or waited
 * (a job applied the step without its rank): acknowledged as stale (stale_lack) and dropped. */
static void stale_slot_done(psd_server_t *srv, psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u for step %llu came while the "
           "chunk applied that step without it (now at %llu)", ch->tensor, ch->chunk, r,
           (unsigned long long)s->step, (unsigned long long)ch->version);
    send_push_ack(srv, s->conn, s->req, ch, r, s->step, ch->stale_lack >> r & 1);
    drop_slot(ch, r);
}

/* Record @p a (a chunk's, or the copy an apply job stores) after the push in slot @p r of @p ch
 * committed: that push's sender, request and batch. When another process pushed before on this
 * rank, its last batch goes into the ring: a replay of a dead worker's batch is still known
 * after its rank changed hands. */
static void applied_commit(psd_applied_t *a, const psd_chunk_t *ch, uint32_t r)
{
    psd_done_t *d = &a->done[r];
    const psd_slot_t *s = slot_at(ch, r);
    if (d->who != s->who && d->batch != 0)
        a->orphan[a->orphan_next++ % PSD_ORPHAN_RING] = d->batch;
    *d = (psd_done_t){s->who, s->req, s->batch};
}

/* The ranks push @p msg's replay tags name, whatever their steps. */
static uint64_t tagged_ranks(const ps_msg_t *msg)
{
    uint64_t tagged = 0, step, ranks;
    for (uint32_t i = 0; ps_replay_next(msg->replay, msg->nreplay, &i, &step, &ranks);)
        tagged |= ranks;
    return tagged;
}

/* asp / ssp: the other half of batch_applied_here. A tagged push (a batch handed out again: its
 * tags name the ranks that had it and left) is remembered when this chunk takes it. A push of
 * that batch from a rank named there, whose own tags do not name its rank, is the late push of
 * a worker that held the batch before (stopped or cut off past the heartbeat timeout, then
 * continued while its connection here was still up): acknowledged, not applied a second time.
 * That is the first holder (its push is untagged) or a later one that left too (its tags name
 * only the ranks before it). A new process on a departed rank that is handed the batch pushes
 * it with that rank among its tags, so it is not turned away. True when @p msg is such a late
 * push; else, if it is tagged, it is remembered. @p tagged: the ranks its tags name
 * (tagged_ranks). */
static bool batch_taken_again(psd_server_t *srv, psd_chunk_t *ch, uint32_t rank,
                              const ps_msg_t *msg, uint64_t key, uint64_t tagged)
{
    if (!(tagged >> rank & 1))
        for (uint32_t k = 0; k < PSD_AGAIN_RING; k++)
            if (ch->again_key[k] == key && (ch->again_ranks[k] >> rank & 1)) {
                PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u brings the batch of pass "
                       "%llu at %llu, which this chunk took from the worker it was handed to "
                       "again: acknowledged, not applied twice", ch->tensor, ch->chunk, rank,
                       (unsigned long long)msg->data_epoch, (unsigned long long)msg->batch_offset);
                srv->replays_skipped++;
                return true;
            }
    if (tagged) {
        uint32_t k = ch->again_next++ % PSD_AGAIN_RING;
        ch->again_key[k] = key;
        ch->again_ranks[k] = tagged;
    }
    return false;
}

/* asp / ssp: whether push @p msg from rank @p rank, of a batch handed out again (its replay tags
 * name the ranks that had it and left), brings a batch chunk @p ch applied already: a tagged
 * rank's record of the pushes it applied here holds the batch (or its slot, the push waiting to
 * be applied or being applied), or another process that held a rank here applied it last
 * (the orphan ring). Pushes are applied on arrival, so there is no step to tell; the batch's
 * key is. A worker's pushes of one batch end before it asks for the next, so a dead rank's
 * last push here is of its last batch. @p who: the pusher's (psd_conn_who); @p tagged: the
 * ranks its tags name (tagged_ranks). */
static bool batch_applied_here(psd_server_t *srv, const psd_chunk_t *ch, uint32_t rank,
                               uint64_t who, const ps_msg_t *msg, uint64_t key, uint64_t tagged)
{
    const psd_applied_t *a = ch->applied;
    bool orphaned = false; /* a process whose rank changed hands applied it here last */
    for (uint32_t o = 0; o < PSD_ORPHAN_RING; o++) orphaned |= a->orphan[o] == key;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(tagged >> r & 1)) continue;
        /* The pusher's own record does not count (a second push of the batch is the caller's
         * choice); the tagged rank may be its own, held before by the process that died. */
        const psd_slot_t *s = slot_at(ch, r); /* NULL: rank r never pushed here */
        bool in_slot = s && (s->state == SLOT_FULL || s->state == SLOT_APPLYING) &&
                       s->batch == key && s->who != who; /* being applied */
        if (!orphaned && !in_slot && (a->done[r].who == who || a->done[r].batch != key))
            continue;
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u replays the batch of pass %llu "
               "at %llu, which rank %u applied here already: acknowledged, not applied again",
               ch->tensor, ch->chunk, rank, (unsigned long long)msg->data_epoch,
               (unsigned long long)msg->batch_offset, r);
        srv->replays_skipped++;
        return true;
    }
    return false;
}

/* asp / ssp: whether chunk @p ch has the batch of push @p msg (PS_FLAG_BATCH) from rank @p rank
 * already: applied from an earlier holder, when the batch was handed out again (its tags:
 * batch_applied_here), or taken from a later holder, when this is an earlier holder's late
 * push (batch_taken_again, which also remembers a tagged push). @p who: psd_conn_who. */
static bool batch_had(psd_server_t *srv, psd_chunk_t *ch, uint32_t rank, uint64_t who,
                      const ps_msg_t *msg)
{
    uint64_t key = ps_batch_key(msg->data_epoch, msg->batch_offset);
    if (key == 0) return false; /* no key to tell batches by */
    uint64_t tagged = tagged_ranks(msg); /* 0: an untagged push */
    if (tagged && batch_applied_here(srv, ch, rank, who, msg, key, tagged)) return true;
    return batch_taken_again(srv, ch, rank, msg, key, tagged);
}

static void on_push_recv(void *request, ucs_status_t status, size_t length, void *user_data)
{
    psd_slot_t *slot = user_data;
    psd_server_t *srv = slot->conn->srv;
    if (request) ucp_request_free(request);
    ps_tcpguard_done(slot->buf);
    if (slot == srv->test_late_ref) { /* PS_TEST_LATE_RNDV: seen only later (psd_shard_test_tick) */
        srv->test_late_status = status;
        srv->test_late_due_ms = psd_now_ms() + 3000;
        return;
    }
    push_received(slot, status);
}

void psd_shard_test_tick(psd_server_t *srv)
{
    psd_slot_t *ref = srv->test_late_ref;
    if (ref == NULL || srv->test_late_due_ms == 0 || psd_now_ms() < srv->test_late_due_ms) return;
    srv->test_late_ref = NULL;
    if (ref->state != SLOT_RECEIVING ||        /* receives_lost took it */
        ref->req != srv->test_late_req)         /* and another landed since */
        return;
    PS_LOG(PS_LOG_WARN, "shard", "the receive of %u/%u from rank %u completes now (%s), 3 s "
           "late (PS_TEST_LATE_RNDV)", ref->chunk->tensor, ref->chunk->chunk, ref->rank,
           ucs_status_string(srv->test_late_status));
    push_received(ref, srv->test_late_status);
}

void psd_shard_receives_lost(psd_server_t *srv)
{
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        if (!t->present) continue;
        for (uint32_t c = 0; c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            SLOTS_FOR(ch, s)
                if (s->state == SLOT_RECEIVING) push_received(s, UCS_ERR_CANCELED);
        }
    }
}

/* bsp: rank @p r pushed a chunk here for step @p step. Shard 0's coordinator drops a member
 * whose push of the open step has not come job.step_timeout_ms after the first one did
 * (coord.c, late_members). */
static void step_pushed(psd_server_t *srv, uint32_t r, uint64_t step)
{
    if (step > srv->sp_step || srv->sp_mask == 0) {
        srv->sp_step = step;
        srv->sp_mask = 0;
        srv->sp_first_ms = uv_now(srv->loop);
    }
    if (step == srv->sp_step) srv->sp_mask |= 1ull << r;
}

ucs_status_t psd_shard_on_push(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                               void *data, size_t length, const ucp_am_recv_param_t *param)
{
    if (srv->stopping) return UCS_OK; /* not received, not acked: sent again after a restart */
    if (srv->test_crash_armed) {
        PS_LOG(PS_LOG_WARN, "shard", "killed at a push after a batch was handed out "
               "(PS_TEST_CRASH_AFTER_BATCH)");
        raise(SIGKILL);
    }
    if (conn->rank < 0 || msg->rank != conn->rank) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_EPROTO,
                             "push from rank %d, but this peer is rank %d", msg->rank,
                             conn->rank);
        return UCS_OK;
    }
    psd_chunk_t *ch = find_chunk(srv, conn, msg);
    if (ch == NULL) return UCS_OK;
    uint32_t rank = (uint32_t)conn->rank;
    psk_codec_t codec = {.kind = (psk_codec_kind_t)msg->codec, .fraction = msg->codec_fraction,
                         .block = msg->codec_block, .fp16_values = msg->codec_flags & 1};
    bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
    /* A push without a gradient (bsp): headers only, summed as nothing (apply_item). */
    bool nograd = (msg->flags & PS_FLAG_NOGRAD) != 0;
    if (nograd && (!bsp || msg->codec != PSK_CODEC_NONE || (msg->flags & PS_FLAG_DIRECT) ||
                   msg->length || length)) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u without a gradient: %s", ch->tensor, ch->chunk,
                       !bsp ? "only under bsp (asp / ssp: push nothing)"
                            : "it carries no data, codec or push area");
        return UCS_OK;
    }
    /* Raw fp32 travels without a codec header; every codec's size follows from (codec, n). */
    uint64_t want = nograd ? 0
                    : msg->codec == PSK_CODEC_NONE ? (uint64_t)ch->n * 4
                                                   : psk_codec_max_bytes(&codec, ch->n);
    if ((want == 0 && !nograd) || msg->codec > PSK_CODEC_SIGN) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u: unknown or invalid codec %u (fraction %g, block %u)",
                       ch->tensor, ch->chunk, msg->codec, (double)msg->codec_fraction,
                       msg->codec_block);
        return UCS_OK;
    }
    /* A direct push carries no data: the gradient is at area_offset of the sender's area. */
    bool direct = (msg->flags & PS_FLAG_DIRECT) != 0;
    const uint8_t *ext = NULL;
    psd_area_t *area = NULL;
    const char *why = NULL;
    if (direct && msg->codec != PSK_CODEC_NONE)
        why = "only raw fp32 pushes may be direct";
    else if (direct && length != 0)
        why = "a direct push carries no data";
    else if (direct)
        ext = psd_area_data(conn, msg->area_offset, want, srv->area_need, &area, &why);
    if (direct && ext == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "direct push of %u/%u (%llu bytes at offset %llu): %s", ch->tensor,
                       ch->chunk, (unsigned long long)want,
                       (unsigned long long)msg->area_offset, why);
        return UCS_OK;
    }
    if (msg->length != want || (!direct && length != msg->length)) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u carries %zu bytes (header says %llu), expected %llu",
                       ch->tensor, ch->chunk, length, (unsigned long long)msg->length,
                       (unsigned long long)want);
        return UCS_OK;
    }
    if (bsp && msg->step < ch->version) {
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u (pid %u) for step %llu: the "
               "chunk is at step %llu", ch->tensor, ch->chunk, rank, conn->pid,
               (unsigned long long)msg->step, (unsigned long long)ch->version);
        /* The step was applied already (this is a resend after a reconnect, the push of a
         * rank removed mid-step, or one of a step handed out again after every member left
         * it): acknowledge and drop it. When that apply did not have its batch, the ack says
         * so: the worker reports it, and the coordinator hands the batch out again. */
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step,
                       !stale_push_had(ch, rank, msg));
        step_pushed(srv, rank, msg->step); /* a step handed out again: its member is here */
        return UCS_OK;
    }
    if (bsp && msg->step != ch->version) {
        /* One step ahead: the chunk lags (a step a restarted shard 0 closed, passed as soon as
         * its members' pushes or its view come): the worker sends it again (PS_FLAG_BEHIND). */
        ps_msg_t e = {.type = PS_MSG_ERROR, .req_id = msg->req_id, .status = PS_ESTALE,
                      .shard = srv->shard, .tensor = ch->tensor, .chunk = ch->chunk,
                      .step = ch->version,
                      .flags = PS_FLAG_CHUNK | (msg->step == ch->version + 1 ? PS_FLAG_BEHIND : 0)};
        snprintf(e.error, sizeof e.error, "push of %u/%u for step %llu, but the chunk is at step "
                 "%llu", ch->tensor, ch->chunk, (unsigned long long)msg->step,
                 (unsigned long long)ch->version);
        psd_send_msg(srv, conn, &e);
        return UCS_OK;
    }
    if (bsp) {
        /* The push says which members its step has, as the coordinator told its sender. */
        if (msg->epoch && msg->members) psd_shard_learn_view(srv, msg->epoch, msg->step, msg->members, false);
        uint64_t epoch, members = psd_shard_members(srv, msg->step, &epoch);
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u (pid %u) for step %llu, its "
               "view %llu (%#llx), this shard's %llu (%#llx), %u replay tags", ch->tensor,
               ch->chunk, rank, conn->pid, (unsigned long long)msg->step,
               (unsigned long long)msg->epoch, (unsigned long long)msg->members,
               (unsigned long long)epoch, (unsigned long long)members, msg->nreplay);
        if (!(members >> rank & 1)) {
            psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOTMEMBER,
                           "push of %u/%u for step %llu: rank %u is not a member of that step "
                           "(epoch %llu)", ch->tensor, ch->chunk, (unsigned long long)msg->step,
                           rank, (unsigned long long)epoch);
            return UCS_OK;
        }
        step_pushed(srv, rank, msg->step);
    }
    bool replay = bsp && msg->nreplay > 0 && replay_had(srv, ch, rank, msg);
    if (replay) srv->replays_skipped++;
    if (!bsp && msg->req_id != 0 && msg->req_id == ch->applied->done[rank].req &&
        psd_conn_who(conn) == ch->applied->done[rank].who) {
        /* asp / ssp: this push's update committed, but its acknowledgement was lost with the
         * connection and the worker sent it again. bsp needs no record of it: the step check
         * above acknowledges any push of a step the chunk passed. */
        PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u (pid %u, request %llu) was "
               "applied already: acknowledged again, not applied twice", ch->tensor, ch->chunk,
               rank, conn->pid, (unsigned long long)msg->req_id);
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step, false);
        return UCS_OK;
    }
    if (!bsp && (msg->flags & PS_FLAG_BATCH) && batch_had(srv, ch, rank, psd_conn_who(conn), msg)) {
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step, false);
        return UCS_OK;
    }
    psd_slot_t *slot = slot_get(ch, rank); /* its group allocated at its first push here */
    if (slot == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM,
                             "out of memory");
        return UCS_OK;
    }
    bool orphan = (slot->state == SLOT_FULL || slot->state == SLOT_APPLYING) &&
                  (slot->conn == NULL || slot->conn->dead);
    if (orphan && slot->state == SLOT_FULL &&
        (slot->who != psd_conn_who(conn) || slot->step != msg->step)) {
        /* Left by another process that held this rank (it is gone): not this push's data. */
        ch->nfull--;
        ch->full_mask &= ~(1ull << rank);
        drop_slot(ch, rank);
        orphan = false;
    }
    if (orphan && slot->who == psd_conn_who(conn) && slot->step == msg->step) {
        /* The same rank's push of this step is here already (maybe being applied): its
         * connection broke and it sent the push again. The same process (who) on the same
         * rank and step: the same gradient; acknowledge this copy when the step is applied. */
        if (slot->conn) psd_conn_unref(slot->conn);
        slot->conn = conn;
        /* libps sends an op's every copy with its one request id: written only when another
         * client's differs, since a job applying the slot reads it (applied_commit). */
        if (slot->req != msg->req_id) slot->req = msg->req_id;
        psd_conn_ref(conn);
        return UCS_OK;
    }
    if (slot->state == SLOT_RECEIVING && slot->conn != conn &&
        slot->who == psd_conn_who(conn) && slot->step == msg->step) {
        /* The same push is still landing from a connection of its sender that broke (UCX has
         * not called that receive back yet): the sender tries again shortly (PS_FLAG_BEHIND),
         * and by then that copy has landed (this one is then acknowledged with it, above) or
         * is lost (this one lands). Before, this copy was refused as a second push. */
        ps_msg_t e = {.type = PS_MSG_ERROR, .req_id = msg->req_id, .status = PS_ESTALE,
                      .shard = srv->shard, .tensor = ch->tensor, .chunk = ch->chunk,
                      .step = ch->version, .flags = PS_FLAG_CHUNK | PS_FLAG_BEHIND};
        snprintf(e.error, sizeof e.error, "push of %u/%u from rank %u for step %llu: its copy "
                 "from a broken connection is still landing", ch->tensor, ch->chunk, rank,
                 (unsigned long long)msg->step);
        psd_send_msg(srv, conn, &e);
        return UCS_OK;
    }
    if (slot->state != SLOT_EMPTY) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "second push of %u/%u from rank %u for step %llu", ch->tensor, ch->chunk,
                       rank, (unsigned long long)msg->step);
        return UCS_OK;
    }
    if (replay)
        ch->skip_mask |= 1ull << rank;
    else
        ch->skip_mask &= ~(1ull << rank);
    ch->nograd_mask = (ch->nograd_mask & ~(1ull << rank)) | (uint64_t)nograd << rank;
    /* A job applying this step without this rank (its member left, and the step went out
     * again): if it passes the step, this push is stale; whether that apply has its batch is
     * known now, from the push's tags (stale_slot_done). */
    bool lacks = bsp && ch->applying && !apply_had_batch(ch, rank, msg, ch->step_members);
    ch->stale_lack = (ch->stale_lack & ~(1ull << rank)) | (uint64_t)lacks << rank;
    if (direct) {
        psd_area_ref(area);
        slot->ext = (psd_slot_ext_t){ext, area};
        length = (size_t)want;
    } else if (slot->cap < length) {
        /* Sized for raw fp32 (or a larger codec payload) once; reused every step. */
        size_t cap = length > (size_t)ch->n * 4 ? length : (size_t)ch->n * 4;
        if (slot->memh) {
            ucp_mem_unmap(srv->ucx.context, slot->memh);
            slot->memh = NULL;
        }
        uint8_t *b = realloc(slot->buf, cap);
        if (b == NULL) {
            psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM, "out of memory");
            return UCS_OK;
        }
        slot->buf = b;
        slot->cap = cap;
        slot->map_failed = false; /* registered at its first rendezvous receive */
    }
    if (codec.kind != PSK_CODEC_NONE && ch->agg == NULL &&
        (ch->agg = malloc((size_t)ch->n * 4)) == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM, "out of memory");
        return UCS_OK;
    }
    slot->codec = codec;
    slot->len = length;
    if (!ch->applying) { /* every member's push of a step says the same; a job reads them */
        ch->has_progress = (msg->flags & PS_FLAG_PROGRESS) != 0;
        ch->progress = msg->samples;
    }
    slot->state = SLOT_RECEIVING;
    slot->req = msg->req_id;
    slot->crc = msg->crc32c;
    slot->step = msg->step;
    slot->who = psd_conn_who(conn);
    slot->batch = !bsp && (msg->flags & PS_FLAG_BATCH)
                      ? ps_batch_key(msg->data_epoch, msg->batch_offset)
                      : 0;
    slot->progress = msg->flags & PS_FLAG_PROGRESS ? msg->samples : UINT64_MAX;
    slot->conn = conn;
    psd_conn_ref(conn);
    if (srv->trace) /* a rendezvous receive's span starts now; any other push is an instant */
        slot->arrived_ns = !direct && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
                               ? ps_trace_now()
                               : 0;
    if (direct) { /* written by the sender before it sent the header */
        srv->direct_pushes++;
        push_received(slot, UCS_OK);
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        if (length) memcpy(slot->buf, data, length); /* small chunk sent eagerly */
        push_received(slot, UCS_OK);
        return UCS_OK;
    }
    /* Rendezvous: the gradient lands directly in the rank's slot, registered once, at its
     * first: every later rendezvous into it reuses the registration (RDMA lands without a
     * registration-cache lookup; without one UCX registers on the fly). A slot only eager
     * pushes fill (shared memory and tcp below the senders' eager limit) is never registered:
     * a registration costs ~0.5 KB of psd's memory. Decided per receive, not by the lanes of
     * the connection that sized it: another process may hold the rank later, over RDMA. */
    if (slot->memh == NULL && !slot->map_failed) {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = slot->buf, .length = slot->cap};
        if (ucp_mem_map(srv->ucx.context, &mp, &slot->memh) != UCS_OK) {
            slot->memh = NULL;
            slot->map_failed = true;
        }
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = on_push_recv, .user_data = slot};
    if (slot->memh) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = slot->memh;
    }
    if (srv->test_late_rndv && --srv->test_late_rndv == 0) {
        /* Its connection breaks while the data lands, and the receive's end is seen only
         * 3 s later: the window in which the sender, connected again, sends it again. */
        PS_LOG(PS_LOG_WARN, "shard", "rendezvous push of %u/%u from rank %u: its connection "
               "closed while it lands (PS_TEST_LATE_RNDV)", ch->tensor, ch->chunk, rank);
        srv->test_late_ref = slot;
        srv->test_late_req = msg->req_id;
        conn->dead = true;
        conn->close_queued = true;
    }
    ps_tcpguard_expect(slot->buf, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(srv->ucx.worker, data, slot->buf, length, &p);
    if (req == NULL)
        on_push_recv(NULL, UCS_OK, length, slot);
    else if (UCS_PTR_IS_ERR(req))
        on_push_recv(NULL, UCS_PTR_STATUS(req), length, slot);
    return UCS_OK;
}

/* ---- store jobs --------------------------------------------------------- */

/* The update of chunk @p ch at @p step: the job's optimizer at its schedule's rate, or the
 * mean of the pushes for a tensor declared so (PS_DECL_MEAN). */
static psk_optim_t optim_at(psd_server_t *srv, const psd_chunk_t *ch, uint64_t step,
                            uint64_t total_steps)
{
    const ps_optim_conf_t *o = &srv->m.job.optimizer;
    uint64_t decay = o->decay_steps ? o->decay_steps : total_steps;
    psk_optim_t k = ps_optim_kernel_conf(o, psk_lr_at(o->schedule == PS_SCHED_COSINE, o->lr,
                                                      o->min_lr, o->warmup_steps, decay, step));
    if (ch->mean) k.kind = PSK_MEAN; /* its state arrays are carried through unchanged */
    return k;
}

/* Whether item @p i's reserved record @p h (of @p n params) waits for the job's fan-out: only
 * in a pooled job, and only a record on overflow pages (psd_store_record_stable), which later
 * reserves in the transaction do not move; the caller fills any other at once. */
static bool job_defer(psd_job_t *job, uint32_t i, uint32_t n, psd_chunk_hdr_t *h,
                      uint32_t *ndeferred)
{
    if (!job->pooled || !psd_store_record_stable(&job->srv->store, n, job->srv->nstate))
        return false;
    job->recs[i] = h;
    job->deferred[(*ndeferred)++] = i;
    return true;
}

/* Chunk @p c's first record into @p h: initialized parameters, the optimizer's initial state
 * (zeros; adagrad's initial_accumulator_value). */
static void create_item(psd_job_t *job, uint32_t c, psd_chunk_hdr_t *h)
{
    const psd_server_t *srv = job->srv;
    uint32_t n = job->chunks[c]->n;
    *h = (psd_chunk_hdr_t){.version = 0, .n = n, .nstate = srv->nstate};
    if (job->values)
        memcpy(psd_chunk_params(h), job->values[c], (size_t)n * sizeof(float));
    else
        psk_init_cpu(psd_chunk_params(h), n, (uint64_t)c * srv->chunk_elems, &job->init);
    psk_optim_t o = ps_optim_kernel_conf(&srv->m.job.optimizer, srv->m.job.optimizer.lr);
    psk_optim_state_init_cpu(psd_chunk_state(h), n, &o);
    psd_store_chunk_seal(h);
    job->hashes[c] = h->hash;
}

static void create_deferred(void *arg, size_t d)
{
    psd_job_t *job = arg;
    uint32_t c = job->deferred[d];
    create_item(job, c, job->recs[c]);
}

/* Every chunk's record is reserved first and filled on the fan-out when it sits on overflow
 * pages (stable), as run_apply does; the initializer is counter-based (the chunk's offset),
 * so the order does not matter. */
static int run_create(psd_job_t *job, psd_wtxn_t *tx)
{
    psd_server_t *srv = job->srv;
    const ps_decl_t *d = &job->decl;
    if (srv->test_fail_create && --srv->test_fail_create == 0) return PS_EIO; /* a test hook */
    int rc = psd_store_put_tensor(tx, d);
    uint64_t dims1 = 1; /* at most PS_MAX_TENSOR_VALUES: a uint32 wrapped (xavier's bound) */
    for (int i = 1; i < d->ndim; i++) dims1 *= d->shape[i];
    job->init = (psk_init_t){.kind = (psk_init_kind_t)ps_decl_init_kind(d), .arg = d->init_arg,
                             .seed = psk_init_seed(d->name, d->seed), .fan_in = d->shape[0],
                             .fan_out = d->ndim > 1 ? dims1 : 1};
    uint32_t ndeferred = 0;
    for (uint32_t c = 0; rc == 0 && c < job->nchunks; c++) {
        psd_chunk_t *ch = job->chunks[c];
        if (ch == NULL) continue;
        psd_chunk_hdr_t *h;
        rc = psd_store_chunk_reserve(tx, d->id, c, ch->n, srv->nstate, &h);
        if (rc) break;
        if (!job_defer(job, c, ch->n, h, &ndeferred)) create_item(job, c, h);
    }
    if (rc == 0) psd_fanout_run(&srv->fanout, ndeferred, create_deferred, job);
    return rc;
}

/* The ranks among @p mask whose raw push's CRC-32C does not match (a separate pass). */
static uint64_t raw_crc_bad(const psd_chunk_t *ch, uint64_t mask)
{
    uint64_t bad = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        const psd_slot_t *s = (mask >> r & 1) ? slot_at(ch, r) : NULL;
        if (s && s->codec.kind == PSK_CODEC_NONE &&
            ps_crc32c(0, slot_data(ch, r), s->len) != s->crc)
            bad |= 1ull << r;
    }
    return bad;
}

/* The sum of a BSP step's pushes, in rank order, when a member's push is compressed: every
 * push decoded or added straight into the chunk's one aggregation buffer (sparse adds for top-k
 * and random-k; payloads were validated on receipt). NULL when all are raw: sum_block sums them
 * span by span in the update's pass. */
static const float *slot_sum(psd_server_t *srv, psd_chunk_t *ch)
{
    uint64_t mem = ch->sum_members;
    bool raw = true;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1) raw &= slot_at(ch, r)->codec.kind == PSK_CODEC_NONE;
    if (raw) {
        /* Summed span by span in sum_block, right before each span is applied. */
        return NULL;
    }
    memset(ch->agg, 0, (size_t)ch->n * 4);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(mem >> r & 1)) continue;
        const psd_slot_t *s = slot_at(ch, r);
        if (s->codec.kind == PSK_CODEC_NONE)
            psk_add_cpu(ch->agg, (const float *)slot_data(ch, r), ch->n);
        else
            psk_codec_decode_add_cpu(ch->agg, ch->n, s->buf, s->len, &s->codec, 1.0f);
    }
    return ch->agg;
}

/* Before each span is applied: fold the members' raw pushes of the span into their CRC-32Cs
 * and sum them in rank order into a buffer of this thread's that stays in cache: neither a
 * push area (never written) nor a slot is written, and the sum is never written to memory. */
typedef struct {
    psd_chunk_t *ch;
    uint32_t first;
    uint32_t crc[PS_MAX_RANKS];
} blocksum_t;

static __thread float span_sum[PSD_APPLY_SPAN] __attribute__((aligned(64)));

static const float *sum_block(void *arg, size_t off, size_t len)
{
    blocksum_t *b = arg;
    uint64_t mem = b->ch->sum_members;
    const float *first = (const float *)slot_data(b->ch, b->first) + off;
    if (mem == 1ull << b->first) { /* one member: its push is the sum */
        b->crc[b->first] = ps_crc32c(b->crc[b->first], first, len * 4);
        return first;
    }
    b->crc[b->first] = ps_crc32c_copy(b->crc[b->first], span_sum, first, len * 4);
    for (uint32_t r = b->first + 1; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1)
            b->crc[r] = ps_crc32c(b->crc[r], (const float *)slot_data(b->ch, r) + off, len * 4);
    for (uint32_t r = b->first + 1; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1) psk_add_cpu(span_sum, (const float *)slot_data(b->ch, r) + off, len);
    return span_sum;
}

/* The ranks among @p mask whose push holds a NaN or an infinity (compressed ones decoded into
 * ch->agg first): the slow path, after an update wrote a parameter that is not finite. */
static uint64_t nonfinite_pushes(psd_chunk_t *ch, uint64_t mask)
{
    uint64_t odd = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(mask >> r & 1)) continue;
        const psd_slot_t *s = slot_at(ch, r);
        const float *g = (const float *)slot_data(ch, r);
        if (s->codec.kind != PSK_CODEC_NONE) {
            memset(ch->agg, 0, (size_t)ch->n * 4);
            psk_codec_decode_add_cpu(ch->agg, ch->n, s->buf, s->len, &s->codec, 1.0f);
            g = ch->agg;
        }
        if (!psk_all_finite(g, ch->n)) odd |= 1ull << r;
    }
    return odd;
}

/* A bsp step of item @p i: the members' pushes (ch->sum_members) summed and applied to @p old
 * into @p h (its header a copy of old's). @return whether every parameter written is finite;
 * job->bad[i]: the ranks whose push failed its CRC (then @p h is old's record again). */
static bool bsp_update(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    const float *p_in = psd_chunk_params((psd_chunk_hdr_t *)old);
    const float *s_in = psd_chunk_state((psd_chunk_hdr_t *)old);
    /* Sum in rank order, so the result does not depend on arrival order. */
    const float *sum = slot_sum(srv, ch);
    /* The schedule follows the data: the position is the samples applied before this step over
     * a planned step's samples (job.workers x batch_size), so a run with fewer workers (more,
     * smaller steps) decays its rate over the same data. */
    uint64_t pos = ch->has_progress
                       ? psk_lr_pos(ch->progress, srv->m.job.workers, srv->m.job.batch_size)
                       : h->version;
    psk_optim_t o = optim_at(srv, ch, pos, ch->total_steps);
    /* The mean over the members with a gradient and those without (zeros), as torch's DDP
     * averages a parameter some ranks did not use (mean_of: counted when the job was formed;
     * the loop thread changes skip_mask for other ranks' pushes meanwhile). */
    float scale = 1.0f / (float)ch->mean_of;
    blocksum_t bs = {.ch = ch, .first = (uint32_t)__builtin_ctzll(ch->sum_members)};
    bool raw = sum == NULL, finite = true; /* raw pushes: summed span by span in the pass */
    if (!raw) job->bad[i] = raw_crc_bad(ch, ch->sum_members);
    if (job->bad[i] == 0)
        finite = psd_store_chunk_update(h, p_in, s_in, sum, scale, &o,
                                        h->version + 1 - ch->skipped, raw ? sum_block : NULL,
                                        &bs, __atomic_load_n(&ch->pulled_direct, __ATOMIC_RELAXED));
    for (uint32_t r = 0; raw && r < PS_MAX_RANKS; r++)
        if ((ch->sum_members >> r & 1) && bs.crc[r] != slot_at(ch, r)->crc)
            job->bad[i] |= 1ull << r;
    if (job->bad[i]) /* not applied: the new record is the old one again */
        memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
    return finite;
}

/* The asp / ssp pushes of item @p i (ch->applying_mask) but those in @p skip, in rank order,
 * from @p old into @p h (its header a copy of old's); those in @p odd (of skip) count as updates
 * that changed nothing, each in its place (the record's version moves past it, so the updates
 * after it have the number they would have had). @return whether every parameter the last
 * update wrote is finite. */
static bool asp_update(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h,
                       uint64_t skip, uint64_t odd)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    const float *p_in = psd_chunk_params((psd_chunk_hdr_t *)old);
    const float *s_in = psd_chunk_state((psd_chunk_hdr_t *)old);
    float *p = psd_chunk_params(h), *s = psd_chunk_state(h);
    uint64_t applying = ch->applying_mask; /* not slot_state: the loop thread writes others' */
    uint32_t left = (uint32_t)__builtin_popcountll(applying & ~skip);
    bool finite = true;
    if (left == 0) /* nothing to apply (every push refused): the old record again */
        memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(applying >> r & 1)) continue;
        if (odd >> r & 1) h->version++;
        if ((skip >> r & 1) || left == 0) continue;
        /* The schedule follows the data here too: each push at the samples applied before its
         * batch was handed out (W workers' pushes of one planned step share a position), or
         * at the chunk's update count where no batch said it (a plain libps client). */
        const psd_slot_t *sl = slot_at(ch, r);
        uint64_t pos = sl->progress != UINT64_MAX
                           ? psk_lr_pos(sl->progress, srv->m.job.workers, srv->m.job.batch_size)
                           : h->version;
        psk_optim_t o = optim_at(srv, ch, pos, ch->total_steps);
        const float *g = (const float *)slot_data(ch, r);
        if (sl->codec.kind != PSK_CODEC_NONE) {
            memset(ch->agg, 0, (size_t)ch->n * 4);
            psk_codec_decode_add_cpu(ch->agg, ch->n, sl->buf, sl->len, &sl->codec, 1.0f);
            g = ch->agg;
        }
        if (--left == 0) { /* the last one seals the record in its pass */
            finite = psd_store_chunk_update(h, p_in, s_in, g, 1.0f, &o, h->version + 1, NULL,
                                            NULL,
                                            __atomic_load_n(&ch->pulled_direct, __ATOMIC_RELAXED));
            continue; /* later ranks in odd still count */
        }
        psk_optim_apply_cpu(p, s, p_in, s_in, g, 1.0f, ch->n, h->version + 1, &o);
        if (o.kind == PSK_MEAN && s != s_in) /* it writes no state: carried through */
            memcpy(s, s_in, (size_t)ch->n * srv->nstate * sizeof(float));
        p_in = p; /* later updates of this batch go in place on the new record */
        s_in = s;
        h->version++;
    }
    return finite;
}

/*
 * Apply item @p i of @p job: the old record @p old -> the reserved @p h. Touches only that chunk
 * and the job's entries i, so items run on any thread of the fan-out at once.
 * A push holding a NaN or an infinity is left out (job->nonfinite[i]), as one without a gradient
 * would be: the update writes the record, the CRC pass finds a parameter that is not finite, the
 * pushes are looked at (only then) and the update runs again from @p old without those. One
 * worker's exploding gradient does not reach everyone's parameters. A parameter that is not
 * finite with no such push (the optimizer overflowed, or it was so already) stays as written.
 */
static void apply_item(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    job->bad[i] = job->nonfinite[i] = 0;
    *h = *old;
    if (srv->m.job.consistency == PS_CONSIST_BSP) {
        bool finite = ch->sum_members == 0 || bsp_update(job, i, old, h);
        uint64_t odd = finite || job->bad[i] ? 0 : nonfinite_pushes(ch, ch->sum_members);
        if (odd) {
            /* Counted as zeros in the mean, as a push without a gradient (of a mean tensor:
             * not counted); the loop thread reads sum_members after the job. */
            job->nonfinite[i] = odd;
            ch->sum_members &= ~odd;
            if (ch->mean) ch->mean_of = (uint32_t)__builtin_popcountll(ch->sum_members);
            *h = *old;
            finite = ch->sum_members == 0 || bsp_update(job, i, old, h);
        }
        if (ch->sum_members == 0) {
            /* Every push of the step replays a batch applied here before, has no gradient
             * (PS_FLAG_NOGRAD) or was left out: the step passes with the record as it was. */
            memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
            h->version++;
        }
        job->params_odd[i] = ch->sum_members == 0 || job->bad[i] ? PSD_PARAMS_KEPT
                             : finite                           ? PSD_PARAMS_FINITE
                                                                : PSD_PARAMS_ODD;
        job->hashes[i] = h->hash;
        return;
    }
    job->bad[i] = raw_crc_bad(ch, ch->applying_mask); /* those are skipped */
    uint64_t live = ch->applying_mask & ~job->bad[i];
    /* A mean tensor's update only takes the push's values (PSK_MEAN; optimizer mean is bsp
     * only), so the job's next push would overwrite an earlier one's NaN unseen: its pushes
     * are looked at first. */
    bool overwrites = ch->mean;
    uint64_t odd = overwrites ? nonfinite_pushes(ch, live) : 0;
    bool finite = asp_update(job, i, old, h, job->bad[i] | odd, odd);
    if (!finite && !overwrites && (odd = nonfinite_pushes(ch, live)) != 0) {
        *h = *old; /* updates that changed nothing */
        finite = asp_update(job, i, old, h, job->bad[i] | odd, odd);
    }
    job->nonfinite[i] = odd;
    job->params_odd[i] = (live & ~odd) == 0 ? PSD_PARAMS_KEPT
                         : finite            ? PSD_PARAMS_FINITE
                                             : PSD_PARAMS_ODD;
    job->hashes[i] = h->hash;
}

/* The fan-out's item: the deferred record d of the job. */
static void apply_deferred(void *arg, size_t d)
{
    psd_job_t *job = arg;
    uint32_t i = job->deferred[d];
    apply_item(job, i, job->olds[i], job->recs[i]);
}

/*
 * Every record of the job is reserved first (LMDB has one writer: this thread). A record on
 * overflow pages keeps its address while later records are reserved (PLATFORM-NOTES.md
 * section 4; psd_store_chunk_reserve), so those updates wait and then run at once on the
 * fan-out's threads; a small record, which later puts may move within its leaf page, is
 * updated right away. An inline job (small, on the loop thread) runs everything here.
 */
static int run_apply(psd_job_t *job, psd_wtxn_t *tx)
{
    psd_server_t *srv = job->srv;
    uint32_t ndeferred = 0;
    for (uint32_t i = 0; i < job->nitems; i++) {
        psd_chunk_t *ch = job->items[i];
        const psd_chunk_hdr_t *old;
        int rc = psd_store_chunk_get(&srv->store, tx->r, ch->tensor, ch->chunk, &old);
        if (rc) return rc;
        if (old->n != ch->n || old->nstate != srv->nstate) return PS_ESTORE;
        if (!__atomic_load_n(&ch->hash_checked, __ATOMIC_RELAXED)) {
            /* The first update since psd loaded the store: an update reads the old record and
             * seals the new one with a fresh hash, so bytes damaged at rest (on disk, before a
             * restart) would pass every later check. One hash per chunk per run. */
            if (psd_store_chunk_hash(old) != old->hash) {
                snprintf(job->err, sizeof job->err, "chunk %u/%u (version %llu)", ch->tensor,
                         ch->chunk, (unsigned long long)old->version);
                return PS_ECORRUPT;
            }
            __atomic_store_n(&ch->hash_checked, true, __ATOMIC_RELAXED);
        }
        psd_chunk_hdr_t *h;
        rc = psd_store_chunk_reserve(tx, ch->tensor, ch->chunk, ch->n, srv->nstate, &h);
        if (rc) return rc;
        job->olds[i] = old;
        if (!job_defer(job, i, ch->n, h, &ndeferred)) apply_item(job, i, old, h);
    }
    psd_fanout_run(&srv->fanout, ndeferred, apply_deferred, job);
    if (srv->m.job.consistency == PS_CONSIST_BSP) {
        /* The summed ring with this step's apply in it, where its members differ from the step
         * before's (or that is not known), or where the step is skipped (no update: the count
         * changes): nothing is written while the membership stays and steps update. The loop
         * thread writes ch->summed and ch->skipped only in job_done, after this job. */
        for (uint32_t i = 0; i < job->nitems; i++) {
            psd_chunk_t *ch = job->items[i];
            uint64_t v = ch->version;
            bool known = v > ch->summed_from, skip = ch->sum_members == 0;
            if (job->bad[i] ||
                (known && !skip && ch->summed[(v - 1) % PSD_SUMMED_RING] == ch->step_members))
                continue;
            summed_rec_t rec = {.step = v, .from = ch->summed_from < v ? ch->summed_from : v,
                                .skipped = ch->skipped + skip};
            memcpy(rec.members, ch->summed, sizeof rec.members);
            rec.members[v % PSD_SUMMED_RING] = ch->step_members;
            int rc = psd_store_put_applied(tx, ch->tensor, ch->chunk, &rec, sizeof rec);
            if (rc) return rc;
        }
        return 0;
    }
    /* asp / ssp: which push each rank last applied goes into the same transaction, so that a
     * resend after a crash between this commit and the acknowledgement is still known (a bsp
     * resend is known by its step). ack_slot makes ch->applied the same after the commit (in
     * the same rank order; only the loop thread writes it, and not while this job runs). */
    for (uint32_t i = 0; i < job->nitems; i++) {
        psd_chunk_t *ch = job->items[i];
        psd_applied_t a = *ch->applied;
        bool any = false;
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
            if ((ch->applying_mask >> r & 1) && !(job->bad[i] >> r & 1)) {
                applied_commit(&a, ch, r);
                any = true;
            }
        int rc = any ? psd_store_put_applied(tx, ch->tensor, ch->chunk, &a, sizeof a) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* PS_TEST_SLOW_APPLY's wait, on the pool thread: while @p hold exists (up to 60 s), or 2 s
 * without one. */
static void slow_apply_wait(const char *hold)
{
    if (hold == NULL) {
        uv_sleep(2000);
        return;
    }
    for (int t = 0; t < 6000 && access(hold, F_OK) == 0; t++) uv_sleep(10);
}

static void job_work(uv_work_t *w)
{
    psd_job_t *job = w->data;
    psd_wtxn_t tx;
    job->begin_ns = job->srv->trace ? ps_trace_now() : 0; /* read by job_done, after us */
    /* Its disk blocks first (a full disk: PS_ENOSPC, not a fault): its records, and as much
     * again for the pages LMDB cannot reuse while readers hold the old ones. psd_store_begin
     * allocates PSD_STORE_AHEAD itself, more than an apply job of a few threads writes. */
    uint64_t need = 2 * (uint64_t)job_bytes(job->srv, job);
    job->rc = need > PSD_STORE_AHEAD ? psd_store_ahead(&job->srv->store, need) : 0;
    if (job->rc == 0) job->rc = psd_store_begin(&job->srv->store, &tx);
    if (job->rc == 0) {
        job->rc = job->kind == JOB_CREATE ? run_create(job, &tx)
                  : job->kind == JOB_DROP ? psd_store_del_tensor(&tx, job->tensor, job->nchunks)
                                          : run_apply(job, &tx);
        if (job->slow) slow_apply_wait(job->srv->test_slow_apply_hold);
        if (job->rc == 0 && job->kind == JOB_APPLY && job->coord_len)
            job->rc = psd_store_put_blob(&tx, "job", job->coord_state, job->coord_len);
        if (job->rc == 0 && job->kind == JOB_APPLY && job->coord_rec_len)
            job->rc = psd_store_put_blob(&tx, "jobrec", job->coord_rec, job->coord_rec_len);
        if (job->rc)
            psd_store_abort(&tx);
        else
            job->rc = psd_store_commit(&tx);
    }
    job->end_ns = job->begin_ns ? ps_trace_now() : 0;
    /* From the pool, job_done comes next through an uv_async: stop the loop's busy-poll. */
    if (job->pooled) ps_ucx_spin_stop(&job->srv->ucx);
}

static void answer_pulls(psd_server_t *srv, psd_chunk_t *ch)
{
    psd_wait_t **pp = &ch->pulls;
    while (*pp) {
        psd_wait_t *w = *pp;
        if (w->min_version <= ch->version) {
            *pp = w->next;
            send_pull_reply(srv, w->conn, w->req_id, ch, w->codec, w->flags, w->asked_ns);
            psd_conn_unref(w->conn);
            wait_put(srv, w);
        } else {
            pp = &w->next;
        }
    }
}

static void snapshot_stale(psd_server_t *srv)
{
    psd_snap_t *s = srv->snap;
    if (s == NULL) return;
    srv->snap = NULL;
    s->stale = true;
    if (s->refs == 0) snap_retire(srv, s);
}

/* Pushes of @p ch by the ranks in @p odd held a NaN or an infinity and were left out: counted
 * (psd_nonfinite_pushes_total, psctl status) and logged, the 1st, 2nd, 4th, 8th ... time. */
static void nonfinite_report(psd_server_t *srv, psd_chunk_t *ch, uint64_t odd)
{
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(odd >> r & 1)) continue;
        uint64_t n = ++srv->nonfinite_pushes;
        srv->nonfinite_rank = r;
        srv->nonfinite_tensor = ch->tensor;
        if (n & (n - 1)) continue;
        PS_LOG(PS_LOG_WARN, "shard", "rank %u pushed a gradient of tensor %u '%s' (chunk %u) "
               "holding a NaN or an infinity: left out of its update%s (%llu so far; "
               "the worker is told)", r, ch->tensor, srv->tensors[ch->tensor].decl.name,
               ch->chunk, srv->m.job.consistency == PS_CONSIST_BSP
                              ? " as a push without a gradient" : "",
               (unsigned long long)n);
    }
}

/* An update of @p ch wrote its parameters (@p odd: one is a NaN or an infinity, though every
 * push it applied was finite). Becoming so is counted and logged, the 1st, 2nd, 4th ... time;
 * psctl status and psd_nonfinite_param_chunks show the chunks still so. */
static void params_odd_report(psd_server_t *srv, psd_chunk_t *ch, bool odd)
{
    bool was = ch->params_odd;
    ch->params_odd = odd;
    if (!odd || was) return;
    uint64_t n = ++srv->nonfinite_params;
    if (n & (n - 1)) return;
    PS_LOG(PS_LOG_WARN, "shard", "an update of tensor %u '%s' (chunk %u, step %llu) with finite "
           "gradients left a parameter that is a NaN or an infinity: the optimizer overflowed (a "
           "learning rate too high?) or it was so already; such a chunk stays so (%llu so far)",
           ch->tensor, srv->tensors[ch->tensor].decl.name, ch->chunk,
           (unsigned long long)ch->version, (unsigned long long)n);
}

static void ack_slot(psd_server_t *srv, psd_chunk_t *ch, uint32_t r, int rc, uint64_t version,
                     uint32_t flags)
{
    psd_slot_t *s = slot_at(ch, r);
    psd_conn_t *conn = s->conn;
    if (rc == 0 && ch->applied) applied_commit(ch->applied, ch, r); /* asp / ssp */
    if (conn && rc == 0 && srv->test_lose_ack && --srv->test_lose_ack == 0) {
        PS_LOG(PS_LOG_WARN, "shard", "acknowledgement of %u/%u to rank %u lost and its "
               "connection closed (PS_TEST_LOSE_ACK)", ch->tensor, ch->chunk, r);
        conn->dead = true;
        conn->close_queued = true;
    }
    if (conn == NULL || conn->dead) { /* its sender died or is cut off; the update stands */
    } else if (rc) {
        psd_send_chunk_error(srv, conn, s->req, ch->tensor, ch->chunk, rc,
                             "update of %u/%u failed: %s", ch->tensor, ch->chunk, ps_strerror(rc));
    } else {
        ps_msg_t a = {.type = PS_MSG_PUSH_ACK, .req_id = s->req, .tensor = ch->tensor,
                      .chunk = ch->chunk, .step = version, .shard = srv->shard,
                      .flags = flags};
        psd_send_msg(srv, conn, &a);
    }
    if (conn) psd_conn_unref(conn);
    s->conn = NULL;
    slot_empty(ch, r);
}

/* A JOB_DROP ended: the tensor leaves the table (or, the delete failed, stays as it was), and
 * its forget requests are answered. */
static void drop_done(psd_server_t *srv, psd_job_t *job)
{
    psd_tensor_t *t = &srv->tensors[job->tensor];
    psd_wait_t *forgets = t->forgets;
    t->forgets = NULL;
    if (job->rc == 0) {
        PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' dropped (%u chunks, never pushed)",
               job->tensor, job->decl.name, job->nchunks);
        tensor_forget(srv, job->tensor, false);
    } else {
        t->dropping = false;
        t->ready = true;
    }
    for (psd_wait_t *w = forgets, *nx; w; w = nx) {
        nx = w->next;
        if (job->rc)
            psd_send_error(srv, w->conn, w->req_id, job->rc, "cannot drop tensor '%s': %s",
                           job->decl.name, ps_strerror(job->rc));
        else
            psd_send_msg(srv, w->conn, &(ps_msg_t){.type = PS_MSG_FORGET_REPLY,
                                                    .req_id = w->req_id, .shard = srv->shard,
                                                    .tensor = job->tensor,
                                                    .flags = PS_FLAG_DONE});
        psd_conn_unref(w->conn);
        wait_put(srv, w);
    }
}

/* After store job @p job: a failure is logged, counted and remembered with its reason
 * (srv->store_failing, /healthz's) and what it was for; it is forgotten once a job of that
 * kind for that tensor (and chunk, for an update) commits. Not at the first commit of any
 * job: a full map fails the large chunks' updates and takes the small ones' (a probe, session
 * 48: 200 ok while every large update failed). */
static void store_health(psd_server_t *srv, const psd_job_t *job)
{
    bool apply = job->kind == JOB_APPLY;
    uint32_t tensor = apply ? (job->nitems ? job->items[0]->tensor : UINT32_MAX) : job->tensor;
    if (job->rc == PS_ESTOREFULL)
        snprintf(srv->store_failing, sizeof srv->store_failing, "store job failed: %s "
                 "(map_size_mb is %llu)", ps_strerror(job->rc),
                 (unsigned long long)srv->m.map_size_mb);
    else if (job->rc)
        snprintf(srv->store_failing, sizeof srv->store_failing, "store job failed: %.128s%s%s",
                 job->err[0] ? job->err : "", job->err[0] ? ": " : "", ps_strerror(job->rc));
    if (job->rc) {
        PS_LOG(PS_LOG_ERROR, "shard", "%s", srv->store_failing);
        srv->store_failures++;
        srv->failing_kind = (uint32_t)job->kind;
        srv->failing_tensor = tensor;
        srv->failing_chunk = apply && job->nitems ? job->items[0]->chunk : 0;
        return;
    }
    if (srv->store_failing[0] == '\0' || (uint32_t)job->kind != srv->failing_kind) return;
    bool same = !apply && tensor == srv->failing_tensor;
    for (uint32_t i = 0; apply && i < job->nitems && !same; i++)
        same = job->items[i]->tensor == srv->failing_tensor &&
               job->items[i]->chunk == srv->failing_chunk;
    if (same) srv->store_failing[0] = '\0';
}

static void job_done(uv_work_t *w, int status)
{
    psd_job_t *job = w->data;
    psd_server_t *srv = job->srv;
    if (job->pooled) ps_ucx_spin_resume(&srv->ucx); /* job_work stopped it */
    /* job_running stays set until the end: chunk_maybe_ready below must not start the
     * next job in this struct while its items are still being finished. */
    store_health(srv, job);
    job->err[0] = '\0';
    if (job->rc && job->coord_rec_len) psd_coord_rec_unsaved(srv); /* not committed */
    if (srv->trace && job->kind == JOB_APPLY && job->nitems > 0)
        psd_trace_apply(srv->trace, job->begin_ns, job->end_ns, job->nitems,
                        job->items[0]->tensor, job->items[0]->chunk, job_bytes(srv, job),
                        job->pooled, job->rc == 0);
    if (job->kind == JOB_APPLY && job->rc == 0 && srv->test_crash_after_apply &&
        --srv->test_crash_after_apply == 0) {
        PS_LOG(PS_LOG_WARN, "shard", "killed after an apply committed, before its "
               "acknowledgements (PS_TEST_CRASH_AFTER_APPLY)");
        raise(SIGKILL);
    }
    psd_outbox_begin(srv); /* the acks and pull replies of this job leave bundled */
    snapshot_stale(srv);
    if (job->kind == JOB_CREATE) {
        psd_tensor_t *t = &srv->tensors[job->tensor];
        values_free(t); /* written (or not: then forgotten below) */
        job->values = NULL;
        t->ready = job->rc == 0;
        if (job->rc) {
            create_failed(srv, job->tensor, job->rc); /* a later declaration tries again */
        } else {
            uint64_t here = 0;
            for (uint32_t c = 0; c < t->nchunks; c++)
                if (t->chunks[c]) {
                    t->chunks[c]->hash = job->hashes[c];
                    here += t->chunks[c]->n;
                }
            psd_integrity_stale(srv);
            PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' initialized: %.1f MiB of parameters here "
                   "in %.1f ms", job->tensor, t->decl.name, (double)here * 4 / (1 << 20),
                   (double)(uv_hrtime() - job->start_ns) / 1e6);
            for (psd_wait_t *d = t->declares, *nx; d; d = nx) {
                nx = d->next;
                reply_declare(srv, d->conn, d->req_id, t);
                psd_conn_unref(d->conn);
                wait_put(srv, d);
            }
            t->declares = NULL;
        }
    } else if (job->kind == JOB_DROP) {
        drop_done(srv, job);
    } else {
        bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
        for (uint32_t i = 0; i < job->nitems; i++) {
            psd_chunk_t *ch = job->items[i];
            uint64_t bad = job->rc == 0 ? job->bad[i] : 0;
            if (bad) {
                /* Corrupted in transit: never applied; only its sender sends it again. Under
                 * bsp the step's other pushes of the chunk were not applied either (the step
                 * is applied whole): they are full again, unacknowledged (neither a slot nor a
                 * push area was written by the sum), and the chunk is applied when the
                 * corrupted ones are back. */
                srv->crc_errors += (uint64_t)__builtin_popcountll(bad);
                SLOTS_FOR(ch, s) {
                    uint32_t r = s->rank;
                    if (s->state != SLOT_APPLYING) continue;
                    if (!(bad >> r & 1)) {
                        if (bsp) {
                            s->state = SLOT_FULL;
                            ch->nfull++;
                            ch->full_mask |= 1ull << r;
                        }
                        continue;
                    }
                    PS_LOG(PS_LOG_WARN, "shard", "checksum mismatch on the %u/%u push from "
                           "rank %u: rejected", ch->tensor, ch->chunk, r);
                    if (s->conn)
                        psd_send_crc_error(srv, s->conn, s->req, ch->tensor, ch->chunk, "push");
                    drop_slot(ch, r);
                }
            }
            uint32_t applied = 0;
            SLOTS_FOR(ch, s) applied += s->state == SLOT_APPLYING;
            if (job->rc == 0 && !(bsp && bad)) {
                if (bsp) ch->summed[ch->version % PSD_SUMMED_RING] = ch->step_members;
                if (bsp) ch->skipped += ch->sum_members == 0; /* the step made no update */
                ch->version += bsp ? 1 : applied;
                psd_integrity_chunk_hashed(srv, ch, job->hashes[i]);
            }
            uint64_t odd = job->rc == 0 && !(bsp && bad) ? job->nonfinite[i] : 0;
            if (odd) nonfinite_report(srv, ch, odd);
            if (job->rc == 0 && job->params_odd[i] != PSD_PARAMS_KEPT)
                params_odd_report(srv, ch, job->params_odd[i] == PSD_PARAMS_ODD);
            SLOTS_FOR(ch, s)
                if (s->state == SLOT_APPLYING)
                    ack_slot(srv, ch, s->rank, job->rc, ch->version,
                             (odd >> s->rank & 1) ? PS_FLAG_NONFINITE : 0);
            SLOTS_FOR(ch, s)
                if (bsp && s->state == SLOT_FULL && s->step < ch->version) {
                    /* Landed during the apply for the step just applied without it: dropped,
                     * like any stale push. */
                    ch->nfull--;
                    ch->full_mask &= ~(1ull << s->rank);
                    stale_slot_done(srv, ch, s->rank);
                }
            ch->queued = false;
            ch->applying = false;
            /* Updates the optimizer applied: under bsp one per step (of all its pushes) that
             * had a gradient, under asp / ssp one per push; none when the job failed. */
            if (job->rc == 0 && !(bsp && bad))
                srv->applied_updates += bsp ? ch->sum_members != 0 /* a step with no gradient
                                                                    passes: no update */
                                            : applied - (uint32_t)__builtin_popcountll(odd);
            if (job->rc) {
                for (psd_wait_t *w = ch->pulls, *nx; w; w = nx) {
                    nx = w->next;
                    psd_send_error(srv, w->conn, w->req_id, job->rc,
                                   "update of %u/%u failed: %s", ch->tensor, ch->chunk,
                                   ps_strerror(job->rc));
                    psd_conn_unref(w->conn);
                    wait_put(srv, w);
                }
                ch->pulls = NULL;
            }
            answer_pulls(srv, ch);
            chunk_maybe_ready(srv, ch);
        }
    }
    psd_ckpt_after_job(srv); /* a checkpoint waiting for this step takes its snapshot next */
    psd_outbox_end(srv);
    srv->job_running = false;
    job_start_next(srv);
    if (!srv->job_running && !srv->slot_running) psd_server_maybe_stop(srv);
}

static void drop_slot(psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    if (s->conn) psd_conn_unref(s->conn);
    s->conn = NULL;
    slot_empty(ch, r);
}

/* Room for @p n hashes in the job (grows only: steady training allocates nothing). */
static int job_hashes_reserve(psd_job_t *job, uint32_t n)
{
    if (n <= job->cap_hashes) return 0;
    uint64_t *h = realloc(job->hashes, n * sizeof *h);
    if (h == NULL) return PS_ENOMEM;
    job->hashes = h;
    uint64_t *b = realloc(job->bad, n * sizeof *b);
    if (b == NULL) return PS_ENOMEM;
    job->bad = b;
    b = realloc(job->nonfinite, n * sizeof *b);
    if (b == NULL) return PS_ENOMEM;
    job->nonfinite = b;
    uint8_t *po = realloc(job->params_odd, n * sizeof *po);
    if (po == NULL) return PS_ENOMEM;
    job->params_odd = po;
    const psd_chunk_hdr_t **o = realloc(job->olds, n * sizeof *o);
    if (o == NULL) return PS_ENOMEM;
    job->olds = o;
    psd_chunk_hdr_t **r = realloc(job->recs, n * sizeof *r);
    if (r == NULL) return PS_ENOMEM;
    job->recs = r;
    uint32_t *d = realloc(job->deferred, n * sizeof *d);
    if (d == NULL) return PS_ENOMEM;
    job->deferred = d;
    job->cap_hashes = n;
    return 0;
}

/* ---- the slot for other exclusive work ------------------------------------ */

static void slot_work(uv_work_t *w)
{
    psd_slot_work_t *s = w->data;
    s->run(s);
    ps_ucx_spin_stop(&s->srv->ucx);
}

static void slot_done(uv_work_t *w, int status)
{
    psd_slot_work_t *s = w->data;
    psd_server_t *srv = s->srv;
    ps_ucx_spin_resume(&srv->ucx); /* slot_work stopped it */
    srv->slot_running = false;
    s->done(s); /* may free s */
    job_start_next(srv);
    if (!srv->job_running && !srv->slot_running) psd_server_maybe_stop(srv);
}

void psd_shard_slot_queue(psd_server_t *srv, psd_slot_work_t *w)
{
    w->next = NULL;
    if (srv->slot_tail)
        srv->slot_tail->next = w;
    else
        srv->slot_head = w;
    srv->slot_tail = w;
    job_start_next(srv);
}

/* Run the first queued slot work if the slot is free. @return true when it started. */
static bool slot_start(psd_server_t *srv)
{
    psd_slot_work_t *s = srv->slot_head;
    if (s == NULL) return false;
    srv->slot_head = s->next;
    if (srv->slot_head == NULL) srv->slot_tail = NULL;
    s->work.data = s;
    srv->slot_running = true;
    int rc = uv_queue_work(srv->loop, &s->work, slot_work, slot_done);
    if (rc) { /* run it here rather than lose it: the slot is ours anyway */
        PS_LOG(PS_LOG_ERROR, "shard", "uv_queue_work: %s", uv_strerror(rc));
        s->run(s);
        srv->slot_running = false;
        s->done(s);
        return false;
    }
    return true;
}

/* The record bytes an apply job reads and writes (its items' params and state). */
static size_t job_bytes(const psd_server_t *srv, const psd_job_t *job)
{
    size_t b = 0;
    if (job->kind == JOB_CREATE) /* its own copy of the chunks: srv->tensors may move */
        return chunks_footprint(srv, job->chunks, job->nchunks);
    if (job->kind == JOB_DROP) return 0; /* deletes only */
    for (uint32_t i = 0; i < job->nitems; i++)
        b += psd_chunk_bytes(job->items[i]->n, srv->nstate);
    return b;
}

static void job_start_next(psd_server_t *srv)
{
    if (srv->job_running || srv->slot_running) return;
    if (slot_start(srv)) return;
    psd_job_t *job = &srv->job;
    job->srv = srv;
    job->rc = 0;
    job->work.data = job;
    if (srv->ncreate > 0 && (srv->create_queue[0] & PSD_QUEUE_DROP)) {
        job->kind = JOB_DROP;
        job->tensor = srv->create_queue[0] & ~PSD_QUEUE_DROP;
        memmove(srv->create_queue, srv->create_queue + 1, (srv->ncreate - 1) * sizeof(uint32_t));
        srv->ncreate--;
        job->decl = srv->tensors[job->tensor].decl;
        job->nchunks = srv->tensors[job->tensor].nchunks;
    } else if (srv->ncreate > 0) {
        job->kind = JOB_CREATE;
        job->start_ns = uv_hrtime();
        job->tensor = srv->create_queue[0];
        memmove(srv->create_queue, srv->create_queue + 1, (srv->ncreate - 1) * sizeof(uint32_t));
        srv->ncreate--;
        job->decl = srv->tensors[job->tensor].decl;
        job->chunks = srv->tensors[job->tensor].chunks;
        job->nchunks = srv->tensors[job->tensor].nchunks;
        job->values = srv->tensors[job->tensor].values ? srv->tensors[job->tensor].values->buf
                                                       : NULL;
        if (job_hashes_reserve(job, job->nchunks)) {
            srv->create_queue[srv->ncreate++] = job->tensor; /* tried again after the next job */
            return;
        }
    } else if (srv->ready_head) {
        job->kind = JOB_APPLY;
        job->nitems = 0;
        /* Take the ready chunks (up to max_bytes): one transaction, one commit. */
        uint32_t cap = 0;
        for (psd_chunk_t *c = srv->ready_head; c; c = c->next_ready) cap++;
        if (cap > srv->cap_items) {
            /* Room for every chunk this shard holds, the most one job can take: grown by the
             * first steps, not later, when more chunks happen to be ready at once (seen in a
             * CI run, session 50: hot_path_allocations_tcp, one realloc here in 200 steps). */
            uint32_t all = held_chunks(srv);
            if (all < cap) all = cap;
            psd_chunk_t **items = realloc(job->items, all * sizeof *items);
            if (items == NULL) return;
            job->items = items;
            srv->cap_items = all;
        }
        if (job_hashes_reserve(job, srv->cap_items)) return;
        bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
        size_t bytes = 0, max_bytes = (size_t)PSD_JOB_MAX_BYTES * srv->fanout.nthreads;
        psd_chunk_t *c = srv->ready_head;
        for (; c; c = c->next_ready) {
            /* At most PSD_JOB_MAX_BYTES of records per job and thread: its acks and the pulls
             * waiting for its chunks go out at its commit, while the rest is applied in the
             * next one. */
            if (job->nitems > 0 && bytes >= max_bytes) break;
            uint64_t members;
            if (!chunk_ready(srv, c, &members)) {
                c->queued = false; /* no longer ready; queued again when it is */
                continue;
            }
            if (bsp && members == 0)
                PS_LOG(PS_LOG_INFO, "shard", "step %llu of %u/%u: the coordinator closed it with "
                       "no member left; passed as it is", (unsigned long long)c->version,
                       c->tensor, c->chunk);
            PS_LOG(PS_LOG_DEBUG, "shard", "applies step %llu of %u/%u: members %#llx, pushed "
                   "%#llx, replays skipped %#llx", (unsigned long long)c->version, c->tensor,
                   c->chunk, (unsigned long long)members, (unsigned long long)c->full_mask,
                   (unsigned long long)(c->skip_mask & members));
            job->items[job->nitems++] = c;
            bytes += psd_chunk_bytes(c->n, srv->nstate);
            c->step_members = members;
            c->applying = true;
            c->sum_members = members & ~c->skip_mask & ~c->nograd_mask;
            /* A mean tensor's values: the mean of those pushed (no "zero" from a member
             * without one). */
            c->mean_of = (uint32_t)__builtin_popcountll(c->mean ? c->sum_members
                                                                : members & ~c->skip_mask);
            c->applying_mask = 0;
            SLOTS_FOR(c, s) {
                uint32_t r = s->rank;
                if (s->state != SLOT_FULL) continue;
                c->nfull--;
                c->full_mask &= ~(1ull << r);
                if (members >> r & 1) {
                    s->state = SLOT_APPLYING;
                    c->applying_mask |= 1ull << r;
                } else {
                    /* Pushed by a rank that left the step (removed mid-step): never applied. */
                    if (s->conn)
                        psd_send_error(srv, s->conn, s->req, PS_ENOTMEMBER,
                                       "push of %u/%u for step %llu: rank %u is not a member of "
                                       "that step any more", c->tensor, c->chunk,
                                       (unsigned long long)c->version, r);
                    drop_slot(c, r);
                }
            }
        }
        srv->ready_head = c; /* the chunks left for the next job, still queued */
        if (c == NULL) srv->ready_tail = NULL;
        if (job->nitems == 0) return;
        if (srv->coord) {
            /* The coordinator's step, members and cursor commit with the updates. */
            size_t len;
            if (job->coord_state == NULL) job->coord_state = malloc(PSD_COORD_STATE_MAX);
            if (job->coord_state) job->coord_len = psd_coord_state_pack(srv, job->coord_state);
            job->coord_rec_len = 0;
            const void *rec = psd_coord_rec(srv, &len); /* only when it changed */
            if (rec && job->coord_rec == NULL) job->coord_rec = malloc(PSD_COORD_REC_MAX);
            if (rec && job->coord_rec) {
                memcpy(job->coord_rec, rec, len);
                job->coord_rec_len = len;
            } else if (rec) {
                psd_coord_rec_unsaved(srv); /* no memory now: the next job takes it */
            }
        }
    } else {
        return;
    }
    srv->job_running = true;
    /* Run an update on the loop thread when the pool buys nothing: a small one costs less than
     * the pool's two thread hand-offs (~45 us each on a 2-vCPU VM), and one of a single record
     * cannot be spread over the fan-out anyway. On that VM the single-record rule made psbench's
     * 1x1 rounds 15-30 % faster at 4 and 16 MiB on shm and tcp (1 MiB sgd chunks: ~60 us of
     * apply against ~90 us of hand-offs); records of several chunks still go to the pool, where
     * the fan-out applies them in parallel. Not nested: a job that becomes ready while this one
     * finishes goes to the pool. */
    size_t bytes = job->kind == JOB_APPLY ? job_bytes(srv, job) : SIZE_MAX;
    job->slow = job->kind == JOB_APPLY && srv->test_slow_apply &&
                job->items[0]->version + 1 == srv->test_slow_apply;
    if (job->slow) {
        srv->test_slow_apply = 0; /* once; on the pool, so the loop goes on */
        if (srv->test_slow_apply_hold)
            PS_LOG(PS_LOG_WARN, "shard", "the apply of step %llu waits while %s exists "
                   "(PS_TEST_SLOW_APPLY_HOLD)", (unsigned long long)job->items[0]->version,
                   srv->test_slow_apply_hold);
        else
            PS_LOG(PS_LOG_WARN, "shard", "the apply of step %llu takes 2 s longer "
                   "(PS_TEST_SLOW_APPLY)", (unsigned long long)job->items[0]->version);
    }
    if (!srv->job_inline && !job->slow && (bytes <= PSD_INLINE_APPLY_BYTES ||
                             (job->nitems == 1 && bytes <= PSD_INLINE_RECORD_BYTES))) {
        srv->job_inline = true;
        job->pooled = false;
        job_work(&job->work);
        job_done(&job->work, 0);
        srv->job_inline = false;
        return;
    }
    job->pooled = true; /* read by job_work on the pool thread: set before it is queued */
    int rc = uv_queue_work(srv->loop, &job->work, job_work, job_done);
    if (rc) {
        PS_LOG(PS_LOG_ERROR, "shard", "uv_queue_work: %s", uv_strerror(rc));
        srv->job_running = false;
        if (job->coord_rec_len) psd_coord_rec_unsaved(srv); /* its copy is not written */
    }
}
