/* shard.c: a shard's tensor table: its chunks and push slots, the name index, loading it from
 * the store, status and totals, membership views, waiting requests (shard_internal.h lists the
 * data path's other modules). */
#include <stdlib.h>
#include <string.h>

#include "integrity.h"
#include "place.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "jsonstr.h"
#include "shard_internal.h"
#include "xxhash.h"

/* ---- tensor table ------------------------------------------------------ */

static int table_reserve(psd_server_t *srv, uint32_t id)
{
    if (id < srv->cap_tensors) return 0;
    if (id >= PSD_MAX_TENSORS) return PS_EINVAL; /* the doubling below would wrap past 2^31 */
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

/* Rank @p r's slot of @p ch, its group allocated (empty slots) when it has none yet; NULL:
 * out of memory. Loop thread. */
psd_slot_t *psd__slot_get(psd_chunk_t *ch, uint32_t r)
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

/* Chunk @p ch's slot buffers' UCX registrations go (its pushes' buffers are freed next, or the
 * context is cleaned up); with @p conns, the connection references of pushes left in them too
 * (a chunk dropped with them: psctl forget --trained). */
static void slots_release(psd_server_t *srv, psd_chunk_t *ch, bool conns)
{
    SLOTS_FOR(ch, s) {
        if (s->memh) ucp_mem_unmap(srv->ucx.context, s->memh);
        s->memh = NULL;
        if (conns && s->conn) psd_conn_unref(s->conn);
        if (conns) s->conn = NULL;
    }
}

/* Slot @p r is free again; a direct push's area reference is dropped. */
void psd__slot_empty(psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    s->state = SLOT_EMPTY;
    if (s->ext.area) psd_area_unref(s->ext.area);
    s->ext = (psd_slot_ext_t){NULL, NULL};
}

/* Count (@p sign 1) or uncount (-1) tensor @p d's records in every shard's decl_bytes. */
static void count_decl_bytes(psd_server_t *srv, const ps_decl_t *d, int sign)
{
    for (uint32_t k = 0; k < srv->nshards && k < PS_MAX_SERVERS; k++)
        srv->decl_bytes[k] += (uint64_t)(int64_t)sign * psd__records_bytes(srv, d, k);
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
psd_tensor_t *psd_shard_tensor_named(psd_server_t *srv, const char *name)
{
    if (srv->names_cap == 0) return NULL;
    for (uint32_t i = (uint32_t)name_hash(name) & (srv->names_cap - 1); srv->names[i];
         i = (i + 1) & (srv->names_cap - 1)) {
        psd_tensor_t *t = &srv->tensors[srv->names[i] - 1];
        if (t->present && strcmp(t->decl.name, name) == 0) return t;
    }
    return NULL;
}

/* Enter tensor @p d into the table with chunk states for the chunks this shard owns. */
int psd__tensor_add(psd_server_t *srv, const ps_decl_t *d, bool ready)
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
 * psd__tensor_add; @p reuse: shard 0 hands its id out again when it is the last), or was dropped
 * (JOB_DROP: not, since another shard may still hold it): forget it, so that a later
 * declaration tries again. Its waiters stay for the caller to answer. */
void psd__tensor_forget(psd_server_t *srv, uint32_t id, bool reuse)
{
    psd_tensor_t *t = &srv->tensors[id];
    psd__values_free(t);
    if (t->present) count_decl_bytes(srv, &t->decl, -1);
    t->present = false;
    for (uint32_t c = 0; t->chunks && c < t->nchunks; c++) {
        psd_chunk_t *ch = t->chunks[c];
        if (ch == NULL) continue;
        srv->area_need -= ps_area_place_bytes((uint64_t)ch->n * 4);
        slots_release(srv, ch, true); /* pushes of ranks that left: psctl forget --trained */
        chunk_free(ch);
    }
    free(t->chunks);
    t->chunks = NULL;
    t->nchunks = 0;
    t->declared_ranks = 0;
    t->dropping = t->dropping_trained = false;
    if (reuse && srv->shard == 0 && id + 1 == srv->ntensors) {
        srv->ntensors--; /* the id and its chunk ordinals are handed out again */
        srv->next_chunk = t->decl.first_chunk;
    }
    psd_integrity_stale(srv); /* a status read since may have laid its leaves out */
}

/* A tensor record of the store, checked as a restore checks a checkpoint's (restore.c) before
 * its shape sizes anything: one damaged on disk or written by another build killed psd at its
 * start (ndim 0x10000000: SIGSEGV in ps_decl_numel) or hung it (an id of 2^31: table_reserve
 * doubled its capacity round to 0 for good; a helper's static analysis, session 61); the name
 * rules only psctl export needs are left out (older psds stored names they refuse). Such a
 * store, or one this psd cannot load whole (out of memory), is refused: serving without the
 * tensor would have the workers create it again from its initial values. */
static int on_load_tensor(void *arg, uint32_t key_id, const ps_decl_t *d)
{
    psd_server_t *srv = arg;
    char why[PS_NAME_MAX + 96] = "";
    if (d->id != key_id || d->id >= PSD_MAX_TENSORS)
        snprintf(why, sizeof why, "it says tensor %u", d->id);
    else
        ps_decl_check_stored(d, why, sizeof why);
    if (why[0]) {
        PS_LOG(PS_LOG_ERROR, "shard", "tensor record %u of the store is malformed: %s ("
               PSD_STORE_DAMAGED_REMEDY ")", key_id, why);
        return PS_ESTORE;
    }
    int rc = psd__tensor_add(srv, d, true);
    if (rc) {
        PS_LOG(PS_LOG_ERROR, "shard", "cannot load tensor '%s': %s", d->name, ps_strerror(rc));
        if (d->id < srv->cap_tensors) psd__tensor_forget(srv, d->id, false);
        return rc;
    }
    /* who declared it before the restart is not known: no give-up drops it (forget.c) */
    srv->tensors[d->id].declared_ranks = ~0ull;
    return 0;
}

/* No job makes this many steps: a version at or past it was damaged (a helper's probe of
 * damaged stores, session 61: UINT64_MAX made asp's next update number 0, an assertion in the
 * optimizer, at every start; 2^62 made a bsp chunk skip every push as applied already). */
#define VERSION_DAMAGED (1ull << 62)

/* A chunk record of the store, its header checked against its tensor as a restore checks a
 * checkpoint's (restore.c) before psd serves it: another size, state count or format, or a
 * version no job reaches, stops the start naming it (before, the first update of it failed
 * "shard store error", or the version was taken as it was). */
static int on_load_chunk(void *arg, uint32_t t, uint32_t c, const psd_chunk_hdr_t *h)
{
    psd_server_t *srv = arg;
    if (!(t < srv->ntensors && srv->tensors[t].present && c < srv->tensors[t].nchunks &&
          srv->tensors[t].chunks[c])) {
        PS_LOG(PS_LOG_WARN, "shard", "stored chunk %u/%u belongs to no tensor of this shard", t, c);
        return 0;
    }
    psd_chunk_t *ch = srv->tensors[t].chunks[c];
    char why[96] = "";
    if (h->format != PSD_CHUNK_FORMAT)
        snprintf(why, sizeof why, "record format %u, not %u", h->format, PSD_CHUNK_FORMAT);
    else if (h->n != ch->n || h->nstate != srv->nstate)
        snprintf(why, sizeof why, "%u values and %u state arrays, not %u and %u", h->n, h->nstate,
                 ch->n, srv->nstate);
    else if (h->version >= VERSION_DAMAGED)
        snprintf(why, sizeof why, "version %llu", (unsigned long long)h->version);
    if (why[0]) {
        PS_LOG(PS_LOG_ERROR, "shard", "chunk %u of tensor '%s' in the store is malformed: %s ("
               PSD_STORE_DAMAGED_REMEDY ")", c, srv->tensors[t].decl.name, why);
        return PS_ESTORE;
    }
    ch->version = h->version;
    ch->summed_from = h->version; /* earlier steps: not known */
    ch->hash = h->hash;
    return 0;
}

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

/* A bsp applied record @p val (psd_summed_rec_t or one of the forms above) as the current one,
 * in @p rec; false for another length (asp's record, or not one psd wrote). */
static bool summed_parse(const void *val, size_t len, psd_summed_rec_t *rec)
{
    *rec = (psd_summed_rec_t){0};
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
static uint64_t summed_first(const psd_summed_rec_t *rec, uint64_t version)
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
static uint64_t summed_at(const psd_summed_rec_t *rec, uint64_t s)
{
    return rec->members[(s <= rec->step ? s : rec->step) % PSD_SUMMED_RING];
}

bool psd_shard_summed_members(const void *val, size_t len, uint64_t version, uint64_t step,
                              uint64_t *members)
{
    psd_summed_rec_t rec;
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
    psd_summed_rec_t rec;
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
           psd_shard_tensors(srv), psd__held_chunks(srv), (unsigned long long)psd_shard_step(srv));
    return 0;
}

void psd_shard_unregister(psd_server_t *srv)
{
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        for (uint32_t c = 0; t->present && c < t->nchunks; c++)
            if (t->chunks[c]) slots_release(srv, t->chunks[c], false);
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


uint64_t psd_shard_step_from(psd_server_t *srv, uint64_t from)
{
    uint64_t step = UINT64_MAX;
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++) {
            const psd_chunk_t *ch = srv->tensors[i].chunks[c];
            if (ch && ch->version >= from && ch->version < step) step = ch->version;
        }
    return step == UINT64_MAX ? from : step;
}

uint64_t psd_shard_step(psd_server_t *srv)
{
    return psd_shard_step_from(srv, 0);
}

uint32_t psd_shard_tensors(const psd_server_t *srv)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++) n += srv->tensors[i].present;
    return n;
}

uint64_t psd_shard_step_max(const psd_server_t *srv)
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
    if (srv->m.job.consistency != PS_CONSIST_BSP) return;
    /* The job's step where it is known (shard 0's coordinator), else the chunks' here. */
    uint64_t job = psd_coord_bsp_step(srv);
    if (job < t->version_max) job = t->version_max;
    if (job < 2) return;
    char why[96];
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        const psd_tensor_t *x = &srv->tensors[i];
        if (!x->present || !x->ready || psd__local_chunks(x) == 0) continue;
        if (psd_shard_tensor_used(srv, x, why, sizeof why)) {
            uint64_t top = 0, low = UINT64_MAX; /* its chunks here */
            for (uint32_t c = 0; c < x->nchunks; c++) {
                const psd_chunk_t *ch = x->chunks[c];
                if (ch == NULL) continue;
                if (ch->version > top) top = ch->version;
                if (ch->version < low) low = ch->version;
            }
            if (top + PSD_BEHIND_STEPS <= job && t->behind++ == 0) {
                t->behind_first = i;
                t->behind_first_step = low;
            }
            continue;
        }
        if (t->version_max >= 2 && t->untrained++ == 0) t->untrained_first = i;
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
    /* ps_json_str: a byte that is not UTF-8 (a name loaded from a damaged or hand-made store:
     * declarations are checked, stored ones are not) as U+FFFD (a review, session 71). */
    ps_json_str(name + k, sizeof name - k, s);
    int n = snprintf(out + *len, cap - *len, "%s\"", name);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
}

void psd_shard_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len)
{
    psd_shard_totals_t t;
    psd_shard_totals(srv, &t);
    int n = snprintf(out + *len, cap - *len,
                     "\"tensors\": %u, \"tensor_ids\": %u, \"chunks\": %llu, "
                     "\"state_bytes\": %llu, "
                     "\"version_min\": %llu, \"version_max\": %llu, \"untrained_tensors\": %u, "
                     "\"behind_tensors\": %u, "
                     "\"nonfinite_pushes\": %llu, \"nonfinite_param_chunks\": %llu",
                     t.tensors, srv->ntensors, (unsigned long long)t.chunks,
                     (unsigned long long)t.state_bytes,
                     (unsigned long long)t.version_min, (unsigned long long)t.version_max,
                     t.untrained, t.behind, (unsigned long long)srv->nonfinite_pushes,
                     (unsigned long long)t.odd_chunks);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    if (srv->floor.run) { /* floor.h: a joiner refuses that shard's store below it (flat: psctl
                             and the tests find a shard's fields by their names) */
        n = snprintf(out + *len, cap - *len,
                     ", \"next_floor_shard\": %u, \"next_floor_step\": %llu",
                     (srv->shard + 1) % srv->nshards, (unsigned long long)srv->floor.floor);
        if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    }
    if (t.untrained) status_name(srv, "untrained_first", t.untrained_first, out, cap, len);
    if (t.behind) {
        status_name(srv, "behind_first", t.behind_first, out, cap, len);
        n = snprintf(out + *len, cap - *len, ", \"behind_first_step\": %llu",
                     (unsigned long long)t.behind_first_step);
        if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    }
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
 * closed one (PS_FLAG_CLOSED; restore_closed_lost in coord_steps.c: a step this shard's restart of
 * the coordinator closed, whose members all left before any showed it applied everywhere)
 * with no members. A chunk still at it passes it as it is (run_apply: no member summed); its
 * members' batches went out again, tagged. An open step every member left has an ordinary
 * view with no members: it waits to go out again. */
bool psd__step_closed_empty(const psd_server_t *srv, uint64_t step)
{
    const psd_view_t *v = view_of(srv, step);
    return v && v->closed && v->members == 0;
}

uint64_t psd_shard_epoch(const psd_server_t *srv)
{
    return psd_views_epoch(&srv->views);
}

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
            if (srv->tensors[i].chunks[c]) psd__chunk_maybe_ready(srv, srv->tensors[i].chunks[c]);
}

bool psd_shard_idle(psd_server_t *srv)
{
    return !srv->job_running && !srv->slot_running && srv->slot_head == NULL &&
           srv->ready_head == NULL && srv->ncreate == 0;
}

/* ---- waiting requests ---------------------------------------------------- */

/* Waiting requests come from a free list: a BSP pull waits every step. */
void psd__wait_put(psd_server_t *srv, psd_wait_t *w)
{
    w->next = srv->free_waits;
    srv->free_waits = w;
}

int psd__wait_add(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn, uint64_t req_id,
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

void psd__waits_drop_conn(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn)
{
    while (*list) {
        psd_wait_t *w = *list;
        if (w->conn == conn) {
            *list = w->next;
            psd_conn_unref(conn);
            psd__wait_put(srv, w);
        } else {
            list = &w->next;
        }
    }
}

void psd_shard_drop_conn(psd_server_t *srv, psd_conn_t *conn)
{
    psd_direct_reap(srv);
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        if (!t->present) continue;
        psd__waits_drop_conn(srv, &t->declares, conn);
        psd__waits_drop_conn(srv, &t->forgets, conn);
        if (t->forget_holder == conn) t->forget_holder = NULL; /* its drop will not come */
        for (uint32_t c = 0; c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            psd__waits_drop_conn(srv, &ch->pulls, conn);
            /* Its pushes already received stay: each is a whole gradient for its step and
             * is applied with it. Only the acknowledgement has nowhere to go. */
            SLOTS_FOR(ch, s)
                if (s->conn == conn && s->state == SLOT_FULL) {
                    s->conn = NULL;
                    psd_conn_unref(conn);
                }
        }
        if (t->values && t->values->giver == conn) psd__values_giver_gone(srv, i);
    }
}

/* ---- what the tensors take ------------------------------------------------------------- */

/* This shard's chunks of @p t. */
uint32_t psd__local_chunks(const psd_tensor_t *t)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < t->nchunks; c++) n += t->chunks[c] != NULL;
    return n;
}

/* The chunks this shard holds, of every tensor present. */
uint32_t psd__held_chunks(const psd_server_t *srv)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < srv->ntensors; t++)
        if (srv->tensors[t].present) n += psd__local_chunks(&srv->tensors[t]);
    return n;
}

/* The map bytes (a lower bound, psd_store_record_footprint) of the records of a tensor's
 * @p nchunks @p chunks here (NULL: another shard's). */
uint64_t psd__chunks_footprint(const psd_server_t *srv, psd_chunk_t *const *chunks,
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
uint64_t psd__records_bytes(const psd_server_t *srv, const ps_decl_t *d, uint32_t shard)
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

