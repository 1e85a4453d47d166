/* psctl.c: the operator's command line.
 *   psctl --manifest M status [--json]  asks every shard for its state and prints the job
 *                                       (coordinator), the shards and the members
 *   psctl --manifest M scale N          sets the job's desired number of workers
 *   psctl --manifest M checkpoint | restore D | repair --from D | verify --against D
 *                                       checkpoints (psctl_checkpoint.c)
 *   psctl --manifest M checkpoint --follow  the manifest's periodic checkpoints until the job
 *                                       is finished (psctl_follow.c; psd shard 0 runs it) */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jsonfield.h"
#include "manifest.h"
#include "durable.h"
#include "jsonstr.h"
#include "psctl_client.h"
#include "stalltimer.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "tcpguard.h"
#include "ucx_loop.h"
#include "authmsg.h"
#include "wire.h"

typedef struct {
    ucp_ep_h ep;
    int failed;
    int lost;              /* its connection failed before the reply came: ask again */
    int got;               /* the reply is here whole (reply, len) */
    int tries;             /* connections made so far */
    double retry_at;       /* psctl_mono_s() of the next try; 0: none due */
    char *reply;           /* the shard's JSON, NUL-terminated */
    size_t len;
    uint8_t hdr[128];
    ps_ucx_token_t tok;    /* the endpoint's session token (authmsg.h) */
    int unsealed;          /* replies dropped for their session token (on_am) */
    char why[256];
} shard_t;

typedef struct {
    ps_manifest_t m;
    ps_auth_t auth;
    ps_ucx_t ucx;
    uv_loop_t loop;
    shard_t *shards;
    int pending;
    uv_timer_t timeout;
    uv_timer_t check; /* status(): polls for every answer; closed in main's last uv_run, so
                         not on status()'s stack (a debug build aborted in uv__finish_close) */
    ps_stalltimer_t due; /* status(): timeout, not counting psctl's own stops (on_check) */
    const char *manifest_path; /* as given (status names it in the commands it suggests) */
} ctl_t;

/* Connections a status request makes to one shard, at most: a shard whose transport was
 * started again (psd's transport_restart) closes the connection a request came on, and
 * answers the next one. Six, 0.2 s apart: a restart on a loaded host (its listener drained,
 * a new UCP worker) outlasted four once (a test's psctl refused, session 66); a shard that is
 * not running is named after 1 s. */
#define STATUS_TRIES 6
#define STATUS_RETRY_S 0.2

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    shard_t *s = arg;
    if (!s->failed && !s->got) {
        s->lost = 1; /* on_check closes the endpoint and tries again, or gives up */
        snprintf(s->why, sizeof s->why, "%s%s", ucs_status_string(status),
                 ps_ucx_down_hint(status));
    }
}

static void on_recv(void *request, ucs_status_t status, size_t length, void *user_data)
{
    shard_t *s = user_data;
    ps_tcpguard_done(s->reply);
    if (status == UCS_OK) {
        s->got = 1;
    } else { /* (its connection failed under it) asked again, like a lost connection */
        free(s->reply);
        s->reply = NULL;
        if (!s->failed) s->lost = 1;
        snprintf(s->why, sizeof s->why, "%s", ucs_status_string(status));
    }
    if (request) ucp_request_free(request);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ctl_t *ctl = arg;
    ps_msg_t m;
    char err[256];
    /* The reply is the asked slot's (req_id i + 1: ask), whatever shard number it says. */
    if (ps_msg_decode(&m, header, header_length, err, sizeof err) || m.req_id == 0 ||
        m.req_id > (uint64_t)ctl->m.nservers)
        return UCS_OK;
    uint32_t slot = (uint32_t)(m.req_id - 1);
    shard_t *s = &ctl->shards[slot];
    if (s->reply || s->failed) return UCS_OK;
    /* With a secret_file, only a reply sealed with the connection's session token is the
     * shard's (as libps and reqclient check): a peer without the secret that reached this host
     * could otherwise answer with a status of its own. A PS_EAUTH error without a token is the
     * refusal of the proof, shown. Dropped unread; the shard shows as not answering, saying so. */
    if (!ps_auth_from_shard(&ctl->auth, &s->tok, &m)) {
        s->unsealed++;
        return UCS_OK;
    }
    if (m.type == PS_MSG_ERROR) { /* refused (authentication): asking again changes nothing */
        s->failed = 1;
        snprintf(s->why, sizeof s->why, "%s", m.error[0] ? m.error : ps_strerror(m.status));
        return UCS_OK;
    }
    if (m.type != PS_MSG_STATUS_REPLY || m.length != length || length > (1u << 24))
        return UCS_OK;
    if (m.shard != slot) {
        s->failed = 1;
        snprintf(s->why, sizeof s->why, "answered as shard %u: this manifest lists the "
                 "cluster's servers in another order", m.shard);
        return UCS_OK;
    }
    s->reply = calloc(1, length + 1);
    if (s->reply == NULL) return UCS_OK;
    s->len = length;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(s->reply, data, length);
        s->got = 1;
        return UCS_OK;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = on_recv, .user_data = s};
    ps_tcpguard_expect(s->reply, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(ctl->ucx.worker, data, s->reply, length, &p);
    if (req == NULL) /* done at once: no callback comes */
        on_recv(NULL, UCS_OK, length, s);
    else if (UCS_PTR_IS_ERR(req))
        on_recv(NULL, UCS_PTR_STATUS(req), 0, s);
    return UCS_OK;
}

static void on_timeout(uv_timer_t *h) { uv_stop(h->loop); }

/* Connect to shard @p i and send it MSG_STATUS; the reply comes to on_am. */
static void ask(ctl_t *ctl, int i)
{
    shard_t *s = &ctl->shards[i];
    s->tries++;
    s->retry_at = 0;
    int rc = ps_ucx_connect(&ctl->ucx, ctl->m.servers[i].host, ctl->m.servers[i].port,
                            on_ep_error, s, &s->ep, &s->tok);
    if (rc) {
        s->failed = 1;
        snprintf(s->why, sizeof s->why, rc == PS_ECONFIG ? "cannot resolve %s"
                                                         : "cannot create an endpoint to %s",
                 ctl->m.servers[i].host);
        return;
    }
    ps_msg_t m = {.type = PS_MSG_STATUS, .req_id = (uint64_t)i + 1, .rank = -1};
    size_t hlen;
    ps_msg_encode_sealed(&m, s->tok.b, s->tok.len, s->hdr, sizeof s->hdr, &hlen);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_REPLY};
    void *req = ucp_am_send_nbx(s->ep, PS_AM_CTRL, s->hdr, hlen, NULL, 0, &p);
    if (req && !UCS_PTR_IS_ERR(req)) ucp_request_free(req); /* the header is ours */
}

/* Asks again where a connection was lost (STATUS_TRIES at most); stops the loop once every
 * shard answered or failed. */
static void on_check(uv_timer_t *h)
{
    ctl_t *ctl = h->data;
    ps_stalltimer_tick(&ctl->due); /* a stop of psctl is not the shards' time */
    double now = psctl_mono_s();
    int waiting = 0;
    for (int i = 0; i < ctl->m.nservers; i++) {
        shard_t *s = &ctl->shards[i];
        if (s->lost) {
            s->lost = 0;
            ps_ucx_ep_close(&ctl->ucx, &s->ep, 1);
            if (s->tries >= STATUS_TRIES)
                s->failed = 1;
            else
                s->retry_at = now + STATUS_RETRY_S;
        }
        if (s->retry_at && now >= s->retry_at) ask(ctl, i);
        waiting |= !s->failed && !s->got;
    }
    if (!waiting) uv_stop(h->loop);
}

/* Pull "key": value (number or string) out of a flat JSON object; good enough for our own. */
static const char *field(const char *json, const char *key, char *buf, size_t len)
{
    const char *v = ps_json_field(json, key, buf, len);
    return v ? v : "-";
}

/* A string "key": "value" (a tensor's name) for showing: escapes undone, control bytes as
 * \xXX (ps_json_str_field). */
static const char *str_field(const char *json, const char *key, char *buf, size_t len)
{
    const char *v = ps_json_str_field(json, key, buf, len);
    return v ? v : "-";
}

/* The applied count of the last pass listed in "passes". */
static const char *last_pass_applied(const char *json, char *buf, size_t len)
{
    const char *p = strstr(json, "\"passes\": ["), *last = NULL;
    while (p && (p = strstr(p, "\"applied\": ")) != NULL && strchr("0123456789", p[11])) {
        last = p;
        p++;
    }
    return last ? field(last, "applied", buf, len) : "-";
}

static int status(ctl_t *ctl, int json, double timeout_s)
{
    int n = ctl->m.nservers;
    for (int i = 0; i < n; i++) ask(ctl, i);
    uv_timer_init(&ctl->loop, &ctl->check);
    ctl->check.data = ctl;
    uv_timer_start(&ctl->check, on_check, 10, 10);
    uv_timer_init(&ctl->loop, &ctl->timeout);
    ps_stalltimer_start(&ctl->due, &ctl->timeout, on_timeout, (uint64_t)(timeout_s * 1000));
    uv_run(&ctl->loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&ctl->check, NULL);
    uv_close((uv_handle_t *)&ctl->timeout, NULL);
    /* A shard of another cluster (a manifest that names its address by mistake) is not one of
     * this job's: refused as scale refuses it, not shown as if it were. */
    for (int i = 0; i < n; i++) {
        shard_t *s = &ctl->shards[i];
        char cl[sizeof ctl->m.cluster];
        if (s->got && ps_json_field(s->reply, "cluster", cl, sizeof cl) &&
            strcmp(cl, ctl->m.cluster) != 0) {
            s->got = 0;
            s->failed = 1;
            snprintf(s->why, sizeof s->why, "this shard serves cluster '%.100s', not '%.100s'",
                     cl, ctl->m.cluster);
        }
    }

    int bad = 0, header = 0;
    if (json) printf("[");
    for (int i = 0; i < n; i++) {
        shard_t *s = &ctl->shards[i];
        const ps_server_conf_t *sc = &ctl->m.servers[i];
        if (!s->got) {
            bad = 1;
            if (!s->failed && s->unsealed) {
                s->failed = 1;
                snprintf(s->why, sizeof s->why, "no answer (%d dropped: not sealed with this "
                         "connection's session token)", s->unsealed);
            }
            if (json) { /* an error text may hold quotes */
                char host[6 * sizeof sc->host], why[6 * sizeof s->why];
                ps_json_str(host, sizeof host, sc->host);
                ps_json_str(why, sizeof why, s->failed ? s->why : "no answer");
                printf("%s{\"shard\": %d, \"address\": \"%s:%u\", \"error\": \"%s\"}",
                       i ? ", " : "", i, host, sc->port, why);
            }
            else
                fprintf(stderr, "psctl: shard %d (%s:%u): %s\n", i, sc->host, sc->port,
                        s->failed ? s->why : "no answer");
            continue;
        }
        if (json) {
            printf("%s%s", i ? ", " : "", s->reply);
            continue;
        }
        char b[8][64];
        if (!header++) /* before the first shard that answered (shard 0 may not have) */
            printf("%-5s %-21s %-8s %-7s %-7s %-11s %-8s %s\n", "shard", "address", "step",
                   "tensors", "chunks", "state_MiB", "updates", "merkle_root");
        double mib = atof(field(s->reply, "state_bytes", b[0], sizeof b[0])) / (1 << 20);
        printf("%-5d %-21s %-8s %-7s %-7s %-11.1f %-8s %s\n", i,
               field(s->reply, "address", b[1], 64), field(s->reply, "step", b[2], 64),
               field(s->reply, "tensors", b[3], 64), field(s->reply, "chunks", b[4], 64), mib,
               field(s->reply, "updates_applied", b[5], 64),
               field(s->reply, "merkle_root", b[6], 64));
    }
    for (int i = 0; i < n && !json; i++) {
        const char *r = ctl->shards[i].reply;
        char cnt[32], name[PS_NAME_MAX * 4], step[32];
        if (!ctl->shards[i].got || atoi(field(r, "untrained_tensors", cnt, sizeof cnt)) == 0)
            continue;
        str_field(r, "untrained_first", name, sizeof name);
        printf("shard %d: %s tensor%s that no push reached (the first: '%s') while its chunks "
               "went to step %s: no member has %s, and the shard's step stays 0 (so does every "
               "bsp checkpoint): psctl --manifest %s forget NAME drops one\n", i, cnt,
               strcmp(cnt, "1") ? "s" : "", name, field(r, "version_max", step, sizeof step),
               strcmp(cnt, "1") ? "them" : "it", ctl->manifest_path);
    }
    for (int i = 0; i < n && !json; i++) {
        const char *r = ctl->shards[i].reply;
        char cnt[32], name[PS_NAME_MAX * 4], at[32];
        if (!ctl->shards[i].got || atoi(field(r, "behind_tensors", cnt, sizeof cnt)) == 0)
            continue;
        str_field(r, "behind_first", name, sizeof name);
        printf("shard %d: %s trained tensor%s stay%s behind the job's step (the first: '%s', at "
               "step %s): no member pushes %s (a model that no longer has %s?), and under bsp "
               "%s the shard's step, every checkpoint and export back: with the workers stopped, "
               "psctl --manifest %s forget NAME --trained drops one\n", i, cnt,
               strcmp(cnt, "1") ? "s" : "", strcmp(cnt, "1") ? "" : "s", name,
               field(r, "behind_first_step", at, sizeof at), strcmp(cnt, "1") ? "them" : "it",
               strcmp(cnt, "1") ? "them" : "it", strcmp(cnt, "1") ? "they hold" : "it holds",
               ctl->manifest_path);
    }
    for (int i = 0; i < n && !json; i++) {
        const char *r = ctl->shards[i].reply;
        char cnt[32], name[PS_NAME_MAX * 4], rank[32];
        if (!ctl->shards[i].got) continue;
        int one;
        if (atoll(field(r, "nonfinite_pushes", cnt, sizeof cnt)) != 0) {
            one = strcmp(cnt, "1") == 0;
            printf("shard %d: %s push%s held a NaN or an infinity and %s left out of %s update "
                   "(the last: rank %s, tensor '%s')\n", i, cnt, one ? "" : "es",
                   one ? "was" : "were", one ? "its" : "their",
                   field(r, "nonfinite_last_rank", rank, sizeof rank),
                   str_field(r, "nonfinite_last_tensor", name, sizeof name));
        }
        if (atoll(field(r, "nonfinite_param_chunks", cnt, sizeof cnt)) == 0) continue;
        one = strcmp(cnt, "1") == 0;
        printf("shard %d: %s chunk%s hold%s a parameter that is a NaN or an infinity after an "
               "update with finite gradients (the first tensor: '%s'): the optimizer "
               "overflowed, a learning rate too high?\n", i, cnt, one ? "" : "s",
               one ? "s" : "", str_field(r, "nonfinite_param_first", name, sizeof name));
    }
    const char *j = ctl->shards[0].got ? ctl->shards[0].reply : NULL;
    if (!json && j) {
        char b[8][64];
        printf("\njob: membership epoch %s, open step %s, workers %s desired / %s actual, %s of "
               "%s samples applied in the current pass%s\n",
               field(j, "epoch", b[0], 64), field(j, "open_step", b[1], 64),
               field(j, "desired_workers", b[2], 64), field(j, "actual_workers", b[3], 64),
               last_pass_applied(j, b[4], 64), field(j, "samples", b[5], 64),
               strcmp(field(j, "finished", b[6], 64), "true") == 0 ? " (finished)" : "");
        printf("%-5s %-24s %-8s %-8s %-9s %s\n", "rank", "host", "pid", "steps", "steps/s",
               "last_heard_ms");
        const char *p = strstr(j, "\"members\": [");
        while (p && (p = strstr(p, "{\"rank\": ")) != NULL) {
            char m[6][64];
            printf("%-5s %-24s %-8s %-8s %-9s %s\n", field(p, "rank", m[0], 64),
                   field(p, "host", m[1], 64), field(p, "pid", m[2], 64),
                   field(p, "steps", m[3], 64), field(p, "steps_per_s", m[4], 64),
                   field(p, "last_heard_ms", m[5], 64));
            p++;
        }
    }
    if (json) printf("]\n");
    return bad;
}

/* psctl forget NAME [--trained] (psctl_forget). Exit 0 when some shard dropped it and none
 * refused. */
static int forget_tensor(const ps_manifest_t *m, const char *name, bool trained, double timeout)
{
    char err[512];
    ps_req_t *cl;
    /* A secret_file this host refuses is the manifest's (exit 2, as check and status say it). */
    int orc = ps_req_open(m, timeout, &cl, err, sizeof err);
    if (orc) {
        fprintf(stderr, "psctl: forget: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    int dropped = 0, rc = psctl_forget(cl, m, name, trained, &dropped, err, sizeof err);
    ps_req_close(cl);
    if (rc) {
        fprintf(stderr, "psctl: forget: %s\n", err);
        if (rc != PS_ENOENT && dropped)
            fprintf(stderr, "psctl: forget: '%s' was dropped from %d shard%s before; shard 0 "
                    "keeps it\n", name, dropped, dropped == 1 ? "" : "s");
        return 1;
    }
    printf("tensor '%s' dropped from %d shard%s%s\n", name, dropped, dropped == 1 ? "" : "s",
           trained ? " (with any values it was trained to)" : "");
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: psctl --manifest FILE status [--json] [--timeout S]\n"
               "       psctl --manifest FILE scale N [--timeout S]\n"
               "       psctl --manifest FILE export --out FILE [--wait S | --any-step] [--timeout S]\n"
               "       psctl --manifest FILE verify [--against DIR] [--timeout S]\n"
               "       psctl --manifest FILE checkpoint [--dir DIR] [--wait S] [--timeout S]\n"
               "       psctl --manifest FILE checkpoint --follow [--wait S] [--timeout S]\n"
               "       psctl --manifest FILE repair --from DIR [--rollback] [--timeout S]\n"
               "       psctl --manifest FILE restore DIR\n"
               "       psctl --manifest FILE forget NAME [--trained] [--timeout S]\n"
               "       psctl --manifest FILE check\n"
               "  status   the job (membership epoch, step, desired and actual workers, members)\n"
               "           and every shard's step, tensors, chunks, state size and Merkle root\n"
               "  scale    set the desired number of workers (0..%d); pslaunch instances\n"
               "           started with --follow start or stop workers to match\n"
               "  export   every tensor's parameters at one step as a safetensors file;\n"
               "           --any-step (bsp): do not wait for one step, take each chunk as it\n"
               "           is (metadata step and step_max, as under asp): a job whose last\n"
               "           worker died mid-step, whose step waits for pushes; --wait (bsp):\n"
               "           how long to wait for one step (default 10 s)\n"
               "  verify   every shard rechecks its stored chunks against their hashes; with\n"
               "           --against DIR, the checkpoint's files are rechecked here instead\n"
               "  checkpoint  every shard copies its store at one step into DIR/shard-K\n"
               "           (default DIR: <shard 0's data_dir>/../checkpoints/step-S) while\n"
               "           training goes on; --wait: how long to wait for it (default 600 s);\n"
               "           --follow: the manifest's periodic checkpoints (checkpoint: section)\n"
               "           until the job is finished, keeping the newest `keep` (psd shard 0\n"
               "           starts this itself)\n"
               "  repair   rewrite the chunks verify names from checkpoint DIR where it holds\n"
               "           their version; --rollback prints the commands that restore all\n"
               "  restore  print the commands that start every shard from checkpoint DIR\n"
               "  forget   drop tensor NAME, which no push ever reached, from every shard: one\n"
               "           a worker declared but never trained (a crash before its first\n"
               "           batch), which keeps the shards' step and bsp checkpoints at 0;\n"
               "           bsp: once the job's step 1 closed; asp / ssp: with no member;\n"
               "           --trained: also one a push reached (a model that dropped a\n"
               "           tensor: under bsp the job's steps wait for it), its values lost,\n"
               "           while the job has no member\n"
               "  check    parse and validate the manifest only (exit 2 with FILE:LINE: KEY:\n"
               "           what is wrong), print what it sets up; contacts no shard\n"
               "  --timeout S: give up on a shard that has not answered within S seconds\n"
               "           (default 5)\n",
            PS_MAX_RANKS);
}

/* Option @p name's value @p arg as seconds into *@p out: a finite number from 0.001 (a
 * millisecond: waits count whole ones; 1e-5 was taken and no shard ever answered in time, a
 * review, session 71) to a day, or 0 where @p zero_ok; else says what is wrong and returns -1. */
static int seconds_arg(const char *name, const char *arg, bool zero_ok, double *out)
{
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end != '\0' || !isfinite(v) || (v < 0.001 && !(zero_ok && v == 0)) ||
        v > 86400) {
        fprintf(stderr, "psctl: %s %s: expected seconds in [0.001, 86400]%s\n", name, arg,
                zero_ok ? ", or 0" : "");
        return -1;
    }
    *out = v;
    return 0;
}

/* psctl's commands: the first COMMANDS_WITHOUT_ARG take no argument, the others one. */
static const char *const commands[] = {"status", "export", "verify",  "checkpoint", "repair",
                                       "check",  "scale",  "restore", "forget"};
enum { COMMANDS_WITHOUT_ARG = 6 };

/* The index of command @p s in commands[], or -1. */
static int command_index(const char *s)
{
    for (int i = 0; i < (int)(sizeof commands / sizeof *commands); i++)
        if (strcmp(s, commands[i]) == 0) return i;
    return -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"json", no_argument, 0, 'j'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {"out", required_argument, 0, 'o'},
                                         {"wait", required_argument, 0, 'w'},
                                         {"dir", required_argument, 0, 'd'},
                                         {"against", required_argument, 0, 'a'},
                                         {"from", required_argument, 0, 'f'},
                                         {"rollback", no_argument, 0, 'r'},
                                         {"follow", no_argument, 0, 'F'},
                                         {"any-step", no_argument, 0, 'A'},
                                         {"trained", no_argument, 0, 'T'},
                                         {0, 0, 0, 0}};
    const char *manifest = NULL, *out = NULL, *dir = NULL, *against = NULL, *from = NULL;
    double wait = -1;
    int rollback = 0, follow = 0, any_step = 0, trained = 0;
    int json = 0, o;
    double timeout = 5;
    ps_log_set_level(NULL);
    /* "scale -1" would reach getopt as an option "-1": say what scale takes instead. */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "scale") == 0 && argv[i + 1][0] == '-' &&
            isdigit((unsigned char)argv[i + 1][1])) {
            fprintf(stderr, "psctl: scale %s: expected a number of workers in [0, %d]\n",
                    argv[i + 1], PS_MAX_RANKS);
            return 2;
        }
    while ((o = getopt_long(argc, argv, "m:jt:ho:w:d:a:f:r", opts, NULL)) != -1) {
        switch (o) {
        case 'm': manifest = optarg; break;
        case 'j': json = 1; break;
        case 't':
            if (seconds_arg("--timeout", optarg, false, &timeout)) return 2;
            break;
        case 'h': usage(stdout); return 0;
        case 'o': out = optarg; break;
        case 'w':
            if (seconds_arg("--wait", optarg, true, &wait)) return 2;
            break;
        case 'd': dir = optarg; break;
        case 'a': against = optarg; break;
        case 'f': from = optarg; break;
        case 'r': rollback = 1; break;
        case 'F': follow = 1; break;
        case 'A': any_step = 1; break;
        case 'T': trained = 1; break;
        default: usage(stderr); return 2;
        }
    }
    int scale = -1;
    const char *verb = optind + 1 == argc ? argv[optind] : "", *restore = NULL, *forget = NULL;
    if (manifest && optind + 2 == argc && strcmp(argv[optind], "restore") == 0) {
        restore = argv[optind + 1];
        verb = "restore";
    } else if (manifest && optind + 2 == argc && strcmp(argv[optind], "forget") == 0) {
        forget = argv[optind + 1];
        verb = "forget";
        if (forget[0] == '\0' || strlen(forget) >= PS_NAME_MAX) {
            fprintf(stderr, "psctl: forget '%s': a tensor name is 1 to %d bytes\n", forget,
                    PS_NAME_MAX - 1);
            return 2;
        }
    } else if (manifest && optind + 2 == argc && strcmp(argv[optind], "scale") == 0) {
        const char *arg = argv[optind + 1];
        char *end;
        long n = strtol(arg, &end, 10);
        if (arg[0] < '0' || arg[0] > '9' || *end != '\0' || n < 0 || n > PS_MAX_RANKS) {
            fprintf(stderr, "psctl: scale %s: expected a number of workers in [0, %d]\n",
                    argv[optind + 1], PS_MAX_RANKS);
            return 2;
        }
        scale = (int)n;
        verb = "scale";
    } else if (manifest == NULL || command_index(verb) < 0 ||
               command_index(verb) >= COMMANDS_WITHOUT_ARG) {
        /* What is wrong first: a bare usage did not say (a typo in the command, say). */
        const char *first = optind < argc ? argv[optind] : NULL;
        if (manifest == NULL)
            fprintf(stderr, "psctl: --manifest FILE is required\n");
        else if (first == NULL)
            fprintf(stderr, "psctl: no command given\n");
        else if (command_index(first) < 0)
            fprintf(stderr, "psctl: unknown command '%s'\n", first);
        else if (strcmp(first, "scale") == 0)
            fprintf(stderr, "psctl: scale takes one argument, the number of workers\n");
        else if (strcmp(first, "restore") == 0)
            fprintf(stderr, "psctl: restore takes one argument, the checkpoint's directory\n");
        else if (strcmp(first, "forget") == 0)
            fprintf(stderr, "psctl: forget takes one argument, the tensor's name\n");
        else
            fprintf(stderr, "psctl: %s takes no argument '%s'\n", first, argv[optind + 1]);
        usage(stderr);
        return 2;
    }
    const char *misplaced = dir && strcmp(verb, "checkpoint") ? "--dir is for checkpoint only"
                          : against && strcmp(verb, "verify") ? "--against is for verify only"
                          : from && strcmp(verb, "repair") ? "--from is for repair only"
                          : rollback && strcmp(verb, "repair") ? "--rollback is for repair only"
                          : follow && strcmp(verb, "checkpoint") ? "--follow is for checkpoint only"
                          : follow && dir ? "--follow takes the directory from the manifest"
                          : any_step && strcmp(verb, "export") ? "--any-step is for export only"
                          : trained && strcmp(verb, "forget") ? "--trained is for forget only"
                          : any_step && wait >= 0 ? "--any-step waits for no step: no --wait"
                          : json && strcmp(verb, "status") ? "--json is for status only"
                          : wait >= 0 && strcmp(verb, "export") && strcmp(verb, "checkpoint")
                              ? "--wait is for export and checkpoint only"
                          : !from && strcmp(verb, "repair") == 0 ? "repair needs --from DIR"
                          : (dir && !dir[0]) || (against && !against[0]) || (from && !from[0]) ||
                                    (restore && !restore[0]) || (out && !out[0])
                              ? "an empty directory or file name (it would be the current one)"
                          : NULL;
    if (misplaced) {
        fprintf(stderr, "psctl: %s\n", misplaced);
        return 2;
    }
    if ((out != NULL) != (strcmp(verb, "export") == 0)) {
        fprintf(stderr, "psctl: %s\n", out ? "--out is for export only" : "export needs --out FILE");
        return 2;
    }
    static ctl_t ctl;
    char err[1024];
    if (ps_manifest_load(&ctl.m, manifest, err, sizeof err)) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    if (strcmp(verb, "check") == 0) {
        printf("%s: cluster '%s', %s, %s, %u worker%s at the start, %d shard%s:\n", manifest,
               ctl.m.cluster, ps_consistency_name(ctl.m.job.consistency),
               ps_optim_name(ctl.m.job.optimizer.name), ctl.m.job.workers,
               ctl.m.job.workers == 1 ? "" : "s", ctl.m.nservers, ctl.m.nservers == 1 ? "" : "s");
        for (int i = 0; i < ctl.m.nservers; i++) {
            const ps_server_conf_t *sc = &ctl.m.servers[i];
            printf("  shard %d: %s:%u, data_dir %s", i, sc->host, sc->port, sc->data_dir);
            if (sc->metrics_port)
                printf(", metrics http://%s:%u/metrics", sc->metrics_host, sc->metrics_port);
            /* Relative: psd takes it from its working directory, psctl (checkpoint's default
             * directory, <data_dir>/../checkpoints) from its own: one cluster, two places (an
             * operator probe, session 61). */
            if (sc->data_dir[0] != '/')
                printf(" (relative: each psd and psctl takes it from its own working directory, "
                       "so psctl checkpoint's default directory may not be psd's: an absolute "
                       "path is safer)");
            printf("\n");
        }
        if (ctl.m.secret_file[0] && access(ctl.m.secret_file, F_OK) != 0 && errno == ENOENT) {
            /* Checked for a deployment elsewhere (a Kubernetes ConfigMap, say): not here. */
            printf("  peers prove the secret in %s (not on this host: each host needs it)\n",
                   ctl.m.secret_file);
        } else if (ctl.m.secret_file[0]) { /* this host's copy: every host needs the same */
            static ps_auth_t a;
            if (ps_auth_load(&a, &ctl.m, err, sizeof err)) {
                fprintf(stderr, "psctl: check: %s\n", err);
                return 2;
            }
            printf("  peers prove the secret in %s (%zu bytes here)\n", ctl.m.secret_file,
                   a.key_len);
            ps_auth_wipe(&a);
        }
        /* Each process reads it from its own working directory (psd, psctl, every worker,
         * psd's checkpoint follower): a relative one found here may be missing, or another
         * file, for them (a review, session 72: it said nothing). */
        if (ctl.m.secret_file[0] && ctl.m.secret_file[0] != '/')
            printf("  (secret_file is relative: each psd, worker and psctl reads it from its own "
                   "working directory; an absolute path is safer)\n");
        return 0;
    }
    if (scale >= 0) {
        ps_req_t *cc;
        /* A secret_file this host refuses is the manifest's (exit 2, as check and status
         * say it). */
        int orc = ps_req_open(&ctl.m, timeout, &cc, err, sizeof err);
        if (orc) {
            fprintf(stderr, "psctl: %s\n", err);
            return orc == PS_ECONFIG ? 2 : 1;
        }
        ps_msg_t req = {.type = PS_MSG_SCALE, .workers = (uint32_t)scale, .rank = -1}, rep;
        snprintf(req.cluster, sizeof req.cluster, "%s", ctl.m.cluster);
        int rc = ps_req_call(cc, 0, &req, &rep, NULL, NULL, err, sizeof err);
        ps_req_close(cc);
        if (rc) {
            fprintf(stderr, "psctl: %s\n", err);
            return 1;
        }
        /* A finished job starts no worker whatever the count (a helper's probe, session 58:
         * it said only "(now 0)"), nor does an asp / ssp job one of whose members did its
         * job.max_steps (a review, session 72: it said nothing). */
        printf("desired workers: %d (now %u%s)\n", scale, rep.workers,
               rep.flags & PS_FLAG_FINISHED ? "; the job is finished: no worker will start"
               : rep.flags & PS_FLAG_DONE
                   ? "; no worker will start: a member did job.max_steps, and under asp or ssp "
                     "a new one would do as many again"
                   : "");
        return 0;
    }
    if (strcmp(verb, "export") == 0) {
        static char out_file[PATH_MAX];
        if (ps_out_file_check(out, out_file, sizeof out_file, err, sizeof err) != 0) {
            fprintf(stderr, "psctl: export: --out %s\n", err);
            return 2;
        }
        return psctl_export(&ctl.m, out_file, timeout, wait < 0 ? 10 : wait, any_step);
    }
    if (strcmp(verb, "verify") == 0)
        return against ? psctl_verify_against(&ctl.m, against) : psctl_verify(&ctl.m, timeout);
    if (strcmp(verb, "checkpoint") == 0 && wait == 0) { /* export's "do not wait" */
        fprintf(stderr, "psctl: checkpoint --wait 0: a checkpoint takes time to copy; expected "
                "seconds in [0.001, 86400]\n");
        return 2;
    }
    if (strcmp(verb, "checkpoint") == 0 && follow)
        return psctl_checkpoint_follow(&ctl.m, timeout, wait < 0 ? 600 : wait);
    if (strcmp(verb, "checkpoint") == 0)
        return psctl_checkpoint(&ctl.m, dir, timeout, wait < 0 ? 600 : wait);
    if (strcmp(verb, "repair") == 0) return psctl_repair(&ctl.m, from, rollback, timeout);
    if (strcmp(verb, "restore") == 0) return psctl_restore(&ctl.m, restore);
    if (strcmp(verb, "forget") == 0) return forget_tensor(&ctl.m, forget, trained, timeout);
    ctl.shards = calloc((size_t)ctl.m.nservers, sizeof *ctl.shards);
    if (ctl.shards == NULL || uv_loop_init(&ctl.loop) ||
        ps_ucx_init_tls(&ctl.ucx, &ctl.loop, PS_UCX_TLS_CONTROL)) {
        fprintf(stderr, "psctl: cannot start the UCX transport\n");
        return 1;
    }
    ps_ucx_set_am_handler(&ctl.ucx, on_am, &ctl);
    if (ps_auth_load(&ctl.auth, &ctl.m, err, sizeof err)) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    ps_auth_attach(&ctl.ucx, &ctl.auth);
    ctl.manifest_path = manifest;
    int bad = status(&ctl, json, timeout);
    for (int i = 0; i < ctl.m.nservers; i++) {
        shard_t *s = &ctl.shards[i];
        ps_ucx_ep_close(&ctl.ucx, &s->ep, 1);
        free(s->reply);
    }
    ps_ucx_close(&ctl.ucx);
    uv_run(&ctl.loop, UV_RUN_DEFAULT);
    uv_loop_close(&ctl.loop);
    free(ctl.shards);
    ps_auth_wipe(&ctl.auth); /* as psd, libps and reqclient do */
    return bad;
}
