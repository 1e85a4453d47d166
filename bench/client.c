/* client.c: psbench's client role (see client.h). */
#include "client.h"

#include <getopt.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_client.h"
#include "ps/ps_log.h"

#define MAX_SIZES 32
#define MANY 32 /* the many_* ops: this many tensors of the case's size, as one step */

typedef struct {
    ps_client_t *c;
    uint64_t size[MAX_SIZES];
    uint32_t id[MAX_SIZES];
    int nsizes;
    float *grad, *dst; /* sized for the largest tensor used so far */
    uint64_t cap;
    uint64_t version; /* round: the tensor's current step */
    uint32_t many_id[MANY];
    uint64_t many_size; /* the size the many tensors were declared with (0: none yet) */
    ps_op_t *many_ops[2 * MANY];
} client_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The protocol's stream: the original stdout. Anything else that writes to stdout (UCX prints
 * its warnings there) goes to stderr instead. */
static FILE *g_out;

static void fail(client_t *k, const char *what, int rc)
{
    fprintf(g_out, "error %s: %s (%s)\n", what, k->c ? ps_client_error(k->c) : "", ps_strerror(rc));
    fflush(g_out);
    exit(1); /* the shards see the connection drop; psbench stops everything */
}

static int tensor_index(client_t *k, uint64_t size)
{
    for (int i = 0; i < k->nsizes; i++)
        if (k->size[i] == size) return i;
    return -1;
}

static void ensure_buffers(client_t *k, uint64_t size)
{
    if (size <= k->cap) return;
    ps_buffer_free(k->grad, k->cap);
    ps_buffer_free(k->dst, k->cap);
    size_t n = size / 4;
    k->grad = ps_buffer_alloc(size); /* 2 MiB pages: cheaper same-host transfers */
    k->dst = ps_buffer_alloc(size);
    if (k->grad == NULL || k->dst == NULL) fail(k, "buffers", PS_ENOMEM);
    for (size_t i = 0; i < n; i++) {
        k->grad[i] = 1e-3f;
        k->dst[i] = 0.0f; /* touched now, not inside the timed loop */
    }
    k->cap = size;
}

/* The many_* ops' tensors: MANY of @p size bytes (declared on first use of the size). */
static void ensure_many(client_t *k, uint64_t size)
{
    if (k->many_size == size) return;
    for (int i = 0; i < MANY; i++) {
        char name[64];
        snprintf(name, sizeof name, "psbench.many.%" PRIu64 ".%d", size, i);
        ps_tensor_desc_t d = {.name = name, .shape = {(uint32_t)(size / 4)}, .ndim = 1,
                              .seed = 1, .total_steps = 1000000};
        int rc = ps_client_declare(k->c, &d, &k->many_id[i]);
        if (rc) fail(k, "declare", rc);
    }
    k->many_size = size;
}

/* A BSP step of MANY small tensors: every push and the next version's pull, started as one
 * group (fused per shard) for round_many, or one message each for round_many_single. */
static void many(client_t *k, const char *op)
{
    int rc;
    ps_client_set_fusion(k->c, strcmp(op, "round_many") == 0 ? 65536 : 0);
    ps_client_group_begin(k->c);
    for (int i = 0; i < MANY; i++) {
        if ((rc = ps_client_push(k->c, k->many_id[i], k->grad, k->version, &k->many_ops[i])))
            fail(k, "many push", rc);
        if ((rc = ps_client_pull(k->c, k->many_id[i], k->dst + (size_t)i * (k->many_size / 4),
                                 k->version + 1, &k->many_ops[MANY + i])))
            fail(k, "many pull", rc);
    }
    ps_client_group_end(k->c);
    for (int i = 0; i < 2 * MANY; i++)
        if ((rc = ps_op_wait(k->many_ops[i], NULL))) fail(k, "many wait", rc);
    k->version++;
}

/* One iteration of @p op on tensor @p id. */
static void one(client_t *k, const char *op, uint32_t id)
{
    ps_op_t *a, *b;
    int rc;
    if (strncmp(op, "round_many", 10) == 0) {
        many(k, op);
    } else if (strcmp(op, "push") == 0) {
        if ((rc = ps_client_push(k->c, id, k->grad, k->version, &a)) != 0) fail(k, "push", rc);
        if ((rc = ps_op_wait(a, NULL)) != 0) fail(k, "push", rc);
        k->version++; /* bsp: the ack means the step is committed; asp ignores the step */
    } else if (strcmp(op, "pull") == 0) {
        if ((rc = ps_client_pull(k->c, id, k->dst, 0, &a)) != 0) fail(k, "pull", rc);
        if ((rc = ps_op_wait(a, NULL)) != 0) fail(k, "pull", rc);
    } else {
        if ((rc = ps_client_push(k->c, id, k->grad, k->version, &a)) != 0)
            fail(k, "round push", rc);
        if ((rc = ps_client_pull(k->c, id, k->dst, k->version + 1, &b)) != 0) {
            ps_op_wait(a, NULL);
            fail(k, "round pull", rc);
        }
        int ra = ps_op_wait(a, NULL), rb = ps_op_wait(b, NULL);
        if (ra) fail(k, "round push", ra);
        if (rb) fail(k, "round pull", rb);
        k->version++;
    }
}

int pb_client_main(int argc, char **argv)
{
    static const struct option opts[] = {{"client", no_argument, 0, 'c'},
                                         {"manifest", required_argument, 0, 'm'},
                                         {"sizes", required_argument, 0, 's'},
                                         {0, 0, 0, 0}};
    client_t k = {0};
    const char *manifest = NULL;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'm') manifest = optarg;
        if (o == 's') {
            char *save = NULL, *list = strdup(optarg);
            for (char *t = strtok_r(list, ",", &save); t && k.nsizes < MAX_SIZES;
                 t = strtok_r(NULL, ",", &save))
                k.size[k.nsizes++] = strtoull(t, NULL, 10);
            free(list);
        }
        if (o == '?') return 2;
    }
    if (manifest == NULL || k.nsizes == 0) {
        fprintf(stderr, "psbench --client: --manifest and --sizes are required\n");
        return 2;
    }
    int proto = dup(1);
    if (proto < 0 || dup2(2, 1) < 0 || (g_out = fdopen(proto, "w")) == NULL) {
        perror("psbench --client: stdout");
        return 1;
    }
    if (getenv("PS_LOG_LEVEL") == NULL) ps_log_set_level("warn");
    char err[1024];
    int rc = ps_client_create(manifest, NULL, &k.c, err, sizeof err); /* job.reconnect_timeout_ms */
    if (rc) {
        fprintf(g_out, "error cannot join: %s\n", err);
        return 1;
    }
    for (int i = 0; i < k.nsizes; i++) {
        char name[64];
        snprintf(name, sizeof name, "psbench.%" PRIu64, k.size[i]);
        ps_tensor_desc_t d = {.name = name,
                              .shape = {(uint32_t)(k.size[i] / 4)},
                              .ndim = 1,
                              .init = 0,
                              .seed = 1,
                              .total_steps = 1000000};
        if ((rc = ps_client_declare(k.c, &d, &k.id[i])) != 0) fail(&k, "declare", rc);
    }
    /* Become a member of the coordinator's step: from it on, the shards wait for this
     * client's pushes (the benchmark then pushes steps on its own, without batches). */
    ps_batch_info_t batch;
    if ((rc = ps_client_next_batch(k.c, PB_CLIENT_SAMPLES, NULL, &batch)) != 0)
        fail(&k, "join the step", rc);
    /* Which transports each shard's connection uses, and the direct paths (psbench shows
     * them: a cluster that fell back to tcp is seen at once). */
    fprintf(g_out, "ready %d lanes:", ps_client_rank(k.c));
    for (uint32_t s = 0; s < ps_client_shards(k.c); s++) {
        char lanes[64];
        ps_client_lanes(k.c, s, lanes, sizeof lanes);
        int d = ps_client_direct(k.c, s);
        fprintf(g_out, "%s shard %u over %s%s", s ? ";" : "", s, lanes[0] ? lanes : "?",
                d == (PS_DIRECT_PULLS | PS_DIRECT_PUSHES) ? " + direct pulls and pushes"
                : d == PS_DIRECT_PULLS                    ? " + direct pulls"
                : d == PS_DIRECT_PUSHES                   ? " + direct pushes"
                                                          : "");
    }
    fputc('\n', g_out);
    fflush(g_out);

    char line[256], op[24] = "";
    int cur = -1;
    while (fgets(line, sizeof line, stdin)) {
        uint64_t size, warm, iters;
        if (sscanf(line, "case %23s %" SCNu64 " %" SCNu64, op, &size, &warm) == 3) {
            bool is_many = strcmp(op, "round_many") == 0 || strcmp(op, "round_many_single") == 0;
            cur = is_many ? 0 : tensor_index(&k, size);
            if (cur < 0 || (strcmp(op, "push") && strcmp(op, "pull") && strcmp(op, "round") &&
                            !is_many)) {
                fprintf(g_out, "error bad case: %s", line);
                fflush(g_out);
                break;
            }
            ensure_buffers(&k, is_many ? size * MANY : size);
            if (is_many) {
                ensure_many(&k, size);
                ps_op_t *a;
                if ((rc = ps_client_pull(k.c, k.many_id[0], k.dst, 0, &a)) != 0 ||
                    (rc = ps_op_wait(a, &k.version)) != 0)
                    fail(&k, "pull for the version", rc);
            } else if (strcmp(op, "pull") != 0) {
                ps_op_t *a;
                if ((rc = ps_client_pull(k.c, k.id[cur], k.dst, 0, &a)) != 0 ||
                    (rc = ps_op_wait(a, &k.version)) != 0)
                    fail(&k, "pull for the version", rc);
            }
            /* The mean of the second half: the first iterations fault pages in. */
            uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < warm; i++) {
                if (i == warm / 2) t0 = now_ns();
                one(&k, op, k.id[cur]);
            }
            uint64_t half = warm - warm / 2;
            fprintf(g_out, "warm %" PRIu64 "\n", half ? (now_ns() - t0) / half : 0);
            fflush(g_out);
        } else if (sscanf(line, "run %" SCNu64, &iters) == 1 && cur >= 0) {
            uint64_t *lat = malloc((iters ? iters : 1) * sizeof *lat);
            if (lat == NULL) fail(&k, "latencies", PS_ENOMEM);
            uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < iters; i++) {
                uint64_t s = now_ns();
                one(&k, op, k.id[cur]);
                lat[i] = now_ns() - s;
            }
            uint64_t t1 = now_ns();
            for (uint64_t i = 0; i < iters; i += 500) {
                fputs("lat", g_out);
                for (uint64_t j = i; j < iters && j < i + 500; j++)
                    fprintf(g_out, " %" PRIu64, lat[j]);
                fputc('\n', g_out);
            }
            fprintf(g_out, "res %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", t0, t1, iters);
            fflush(g_out);
            free(lat);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            fprintf(g_out, "error unknown command: %s", line);
            fflush(g_out);
            break;
        }
    }
    ps_client_destroy(k.c);
    ps_buffer_free(k.grad, k.cap);
    ps_buffer_free(k.dst, k.cap);
    return 0;
}
