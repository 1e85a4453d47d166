/* declare.c: libps's declarations (ps_client_declare, ps_client_declare_values): a tensor
 * numbered by shard 0 and created or matched on every shard, its values sent where a shard
 * asks for them, and the client's record of it (ctensor_t). Caller's thread. */
#include "client_internal.h"

/* Send the values of tensor @p req's chunks placed on shard @p shard, which its declaration
 * there creates (the reply's PS_FLAG_VALUES), one chunk at a time, each answered on receipt. */
static int send_values(ps_client_t *c, uint32_t shard, const ps_decl_t *d, const float *values)
{
    uint64_t numel = ps_decl_numel(d);
    uint32_t nchunks = ps_chunk_count(numel, c->chunk_elems);
    for (uint32_t ch = 0; ch < nchunks; ch++) {
        if (ps_place_shard(d->first_chunk + ch, c->nshards) != shard) continue;
        const float *v = values + (uint64_t)ch * c->chunk_elems;
        size_t bytes = (size_t)ps_chunk_len(numel, c->chunk_elems, ch) * sizeof(float);
        ps_op_t *op = ps__op_reuse(c, &c->ctrl_spare, OP_VALUES, 1);
        if (op == NULL) return PS_ENOMEM;
        op->parts[0].shard = shard;
        op->buf = (float *)v; /* only read: sent as it is */
        op->req = (ps_msg_t){.type = PS_MSG_VALUES, .req_id = op->req_id, .rank = c->rank,
                             .tensor = d->id, .chunk = ch, .length = bytes,
                             .crc32c = ps_crc32c(0, v, bytes)};
        ps__submit(c, op);
        int rc = ps_op_wait(op, NULL);
        if (rc) return rc;
    }
    return 0;
}

/* Test hooks when a shard asks for values (tests only): PS_TEST_VALUES_MARK=path creates the
 * file, then PS_TEST_VALUES_STOP stops this process, PS_TEST_VALUES_SLEEP=ms sleeps. */
static void test_values_asked(void)
{
    const char *mark = getenv("PS_TEST_VALUES_MARK"), *nap = getenv("PS_TEST_VALUES_SLEEP");
    if (mark) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
    }
    if (getenv("PS_TEST_VALUES_STOP")) raise(SIGSTOP);
    if (nap) usleep((useconds_t)atoi(nap) * 1000);
}

/* Declare @p req on shard @p shard into @p rep; with @p values, send them where the
 * declaration creates the tensor and declare again (answered once it is created). A worker
 * that took over from one gone is asked again: bounded, as each ask is a creation's. */
/* How long a declaration waits for a shard that is dropping the tensor (a forget between its
 * check and its drop, or the drop's commit). */
#define DECLARE_DROP_WAIT_MS 10000

static int declare_on(ps_client_t *c, uint32_t shard, ps_msg_t *req, ps_msg_t *rep,
                      const float *values, int *asked)
{
    int rc = ps__ctrl_call(c, OP_DECLARE, shard, req, rep);
    /* Being dropped: declared again once gone, as new (before session 63 the caller got
     * PS_EBUSY, and a declaration in the forget's window was taken half-way). */
    for (uint64_t t0 = now_ms(); rc == PS_EBUSY && strstr(c->err, "is being dropped") &&
                                 now_ms() - t0 < DECLARE_DROP_WAIT_MS;) {
        usleep(20 * 1000);
        rc = ps__ctrl_call(c, OP_DECLARE, shard, req, rep);
    }
    *asked = rc == 0 && (rep->flags & PS_FLAG_VALUES);
    for (int asks = 0; rc == 0 && (rep->flags & PS_FLAG_VALUES); asks++) {
        if (values == NULL || !rep->has_decl || !rep->decl.assigned || asks == 8) {
            snprintf(c->err, sizeof c->err, "shard %u asked for the values of tensor '%s' %s",
                     shard, req->decl.name, values ? "again and again" : "it was not sent");
            return PS_EPROTO;
        }
        test_values_asked();
        req->decl.id = rep->decl.id; /* shard 0 numbered it */
        req->decl.first_chunk = rep->decl.first_chunk;
        req->decl.assigned = 1;
        rc = send_values(c, shard, &req->decl, values);
        if (rc == PS_ECRC) rc = 0; /* corrupted on the way: the shard asks again, and gets all */
        if (rc == 0) rc = ps__ctrl_call(c, OP_DECLARE, shard, req, rep);
    }
    return rc;
}

static int declare(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                   uint32_t *id, int *own);
_Static_assert(PS_TENSOR_MEAN == PS_DECL_MEAN, "the public flag is the wire's");

int ps_client_declare(ps_client_t *c, const ps_tensor_desc_t *desc, uint32_t *id)
{
    return declare(c, desc, NULL, id, NULL);
}

int ps_client_declare_values(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                             uint32_t *id, int *own)
{
    if (own) *own = 0;
    if (c == NULL) return PS_EINVAL;
    if (values == NULL) {
        snprintf(c->err, sizeof c->err, "declare: the values are NULL");
        return PS_EINVAL;
    }
    if (!__atomic_load_n(&c->shards[0].knows_values, __ATOMIC_ACQUIRE)) {
        if (!c->said_no_values)
            PS_LOG(PS_LOG_WARN, "libps", "shard 0 is a psd older than session 36: it takes no "
                   "values with a declaration; tensors it creates start from the shards' "
                   "initializer");
        c->said_no_values = 1;
        return declare(c, desc, NULL, id, NULL);
    }
    return declare(c, desc, values, id, own);
}

static int declare(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                   uint32_t *id, int *own)
{
    if (c == NULL) return PS_EINVAL;
    if (desc == NULL || id == NULL || desc->name == NULL) {
        snprintf(c->err, sizeof c->err, "declare: %s is NULL",
                 desc == NULL ? "the description" : id == NULL ? "id" : "the name");
        return PS_EINVAL;
    }
    if (strlen(desc->name) >= PS_NAME_MAX) {
        snprintf(c->err, sizeof c->err, "declare: tensor name longer than %d bytes",
                 PS_NAME_MAX - 1);
        return PS_EINVAL;
    }
    ps_msg_t req = {.type = PS_MSG_DECLARE, .rank = c->rank, .has_decl = 1}, rep;
    snprintf(req.decl.name, sizeof req.decl.name, "%s", desc->name);
    memcpy(req.decl.shape, desc->shape, sizeof req.decl.shape);
    req.decl.ndim = desc->ndim;
    req.decl.init = (uint32_t)desc->init;
    req.decl.init_arg = desc->init_arg;
    req.decl.seed = desc->seed;
    req.decl.total_steps = desc->total_steps;
    /* The values initializer only with values (ps_client_declare_values): asked for them, a
     * caller without any left the declaration refused and its name held for the others'
     * declarations until heartbeat_timeout_ms (a review, session 73). */
    if (values == NULL && ps_decl_init_kind(&req.decl) == PSK_INIT_VALUES) {
        snprintf(c->err, sizeof c->err, "declare: tensor '%s': initializer %u takes values "
                 "(ps_client_declare_values)", desc->name, (unsigned)PSK_INIT_VALUES);
        return PS_EINVAL;
    }
    /* With values, the initializer is "the values sent" (the mean flag kept). */
    uint32_t init = values ? PSK_INIT_VALUES | (req.decl.init & PS_DECL_MEAN) : req.decl.init;
    float init_arg = values ? 0.0f : desc->init_arg;
    req.decl.init = init;
    req.decl.init_arg = init_arg;
    /* The shards refuse what this refuses; checked here, the caller learns why at once. */
    char why[256];
    if (ps_decl_check(&req.decl, why, sizeof why)) {
        snprintf(c->err, sizeof c->err, "declare: %s", why);
        return PS_EINVAL;
    }
    if (!isfinite(req.decl.init_arg)) { /* its initializer would make every value NaN or inf */
        snprintf(c->err, sizeof c->err, "declare: tensor '%s' has a non-finite init_arg",
                 desc->name);
        return PS_EINVAL;
    }
    if (values && !psk_all_finite(values, ps_decl_numel(&req.decl))) {
        snprintf(c->err, sizeof c->err, "declare: the values of tensor '%s' hold a NaN or an "
                 "infinity", desc->name);
        return PS_EINVAL;
    }
    /* Shard 0 numbers the tensor; the others create their chunks with that numbering. */
    int asked, parts = 0, mine = 0; /* shards holding chunks of it; those that asked */
    int rc = declare_on(c, 0, &req, &rep, values, &asked);
    if (rc) return rc;
    if (!rep.has_decl || !rep.decl.assigned) {
        snprintf(c->err, sizeof c->err, "shard 0 answered a declaration without an id");
        return PS_EPROTO;
    }
    if (strcmp(rep.decl.name, req.decl.name) != 0 || rep.decl.ndim != req.decl.ndim ||
        memcmp(rep.decl.shape, req.decl.shape, (size_t)req.decl.ndim * sizeof *req.decl.shape)) {
        /* psd refuses another shape for a tensor it holds: an answer for another tensor, or
         * of another shape, is not psd's. Taken, pulls wrote past the caller's buffer, sized
         * by its own shape (a review, session 64: SIGSEGV), and values were read past its
         * array. */
        char want[64], got[64];
        ps_shape_str(req.decl.shape, req.decl.ndim, want, sizeof want);
        ps_shape_str(rep.decl.shape, rep.decl.ndim, got, sizeof got);
        snprintf(c->err, sizeof c->err, "shard 0 answered the declaration of '%s' %s with "
                 "'%.*s' %s", req.decl.name, want, PS_NAME_MAX - 1, rep.decl.name, got);
        return PS_EPROTO;
    }
    /* Tests only: this process dies here, its declaration of that tensor made on shard 0 only
     * (a worker killed between the shards: the checkpoint follower's drop_part_declared). */
    const char *die = getenv("PS_TEST_DIE_DECLARING");
    if (die && strcmp(die, req.decl.name) == 0) raise(SIGKILL);
    req.decl = rep.decl;
    /* A part another shard lacks is created as this caller asks: from its values, or its
     * initializer where shard 0's creator sent values (else shard 0's initializer). */
    if (values || ps_decl_init_kind(&req.decl) == PSK_INIT_VALUES) {
        req.decl.init = init;
        req.decl.init_arg = init_arg;
    }
    uint64_t numel = ps_decl_numel(&req.decl);
    uint32_t nchunks = ps_chunk_count(numel, c->chunk_elems);
    for (uint32_t i = 0; i < c->nshards; i++) {
        ps_msg_t r2;
        if (i > 0 && (rc = declare_on(c, i, &req, &r2, values, &asked)) != 0) return rc;
        bool holds = false;
        for (uint32_t ch = 0; ch < nchunks && !holds; ch++)
            holds = ps_place_shard(req.decl.first_chunk + ch, c->nshards) == i;
        parts += holds;
        mine += holds && asked;
    }
    if (own) *own = parts > 0 && mine == parts;
    uint32_t tid = rep.decl.id;
    if (tid >= PS_CLIENT_MAX_TENSORS) {
        snprintf(c->err, sizeof c->err, "tensor id %u out of range", tid);
        return PS_EPROTO;
    }
    if (c->tensors[tid] == NULL && (c->tensors[tid] = calloc(1, sizeof(ctensor_t))) == NULL)
        return PS_ENOMEM;
    ctensor_t *t = c->tensors[tid];
    /* The comm thread reads places and nchunks at every push acknowledgement, also a late one
     * for an op waited for already: they change under its lock (a review). */
    pthread_mutex_lock(&c->loop_mu);
    if (t->nchunks && (t->numel != ps_decl_numel(&rep.decl) ||
                       t->first_chunk != rep.decl.first_chunk)) {
        /* The id was handed out again for another tensor (tensors this client gave up,
         * ps_client_give_up, and dropped, then others declared): its buffers, spare ops and
         * direct push places were the old shape's (a review, session 58), and its residual
         * and codec the old tensor's, also for one of the same size (its first chunk tells
         * them apart: a review, session 59). */
        if (t->busy[0] || t->busy[1]) {
            pthread_mutex_unlock(&c->loop_mu);
            snprintf(c->err, sizeof c->err, "tensor %u: declared again as another tensor while "
                     "its operations are in flight", tid);
            return PS_EBUSY;
        }
        c->tensor_set -= psk_mix64(tid + 1);
        c->ntensor_set--;
        ps__ctensor_free_bufs(t); /* as new below; compression none until set again */
    }
    if (t->nchunks == 0) { /* new to this client (declared again: counted once) */
        c->tensor_set += psk_mix64(tid + 1); /* a sum: the order of declarations is free */
        c->ntensor_set++;
    }
    t->id = tid;
    t->seed_key = psk_codec_tensor_key(rep.decl.name);
    t->numel = ps_decl_numel(&rep.decl);
    t->nchunks = ps_chunk_count(t->numel, c->chunk_elems);
    t->first_chunk = rep.decl.first_chunk;
    t->mean = ps_decl_mean(&rep.decl);
    if (t->places == NULL && t->nchunks) /* NULL when out of memory: no direct pushes */
        t->places = calloc(t->nchunks, sizeof *t->places);
    pthread_mutex_unlock(&c->loop_mu);
    *id = tid;
    return 0;
}
