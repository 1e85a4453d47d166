/* manifest.h: the cluster manifest (YAML), parsed and validated once.
 *
 * Every command reads the same file. An unknown key, a missing required key,
 * a wrong type or an out-of-range value is refused with one message naming
 * the file, the line and the key, e.g.
 *   "demo.yaml:12: job.batch_size: must be an integer in [1, 1048576], got 'x'". */
#ifndef PS_MANIFEST_H
#define PS_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_MAX_SERVERS 64
#define PS_MAX_LAYERS 16
#define PS_MAX_EPOCHS 100000 /* job.epochs: a stored job of more passes is damaged */
#define PS_HOST_MAX 256
#define PS_PATH_MAX 1024

typedef enum { PS_CONSIST_BSP = 0, PS_CONSIST_ASP = 1, PS_CONSIST_SSP = 2 } ps_consistency_t;
typedef enum {
    PS_OPT_SGD = 0,
    PS_OPT_MOMENTUM,
    PS_OPT_ADAM,
    PS_OPT_ADAMW,
    PS_OPT_ADAGRAD,
    PS_OPT_MEAN /* no optimizer: psd keeps each step's mean gradient (job.consistency bsp only) */
} ps_optim_kind_t;
typedef enum { PS_SCHED_CONSTANT = 0, PS_SCHED_COSINE = 1 } ps_sched_kind_t;

typedef struct {
    char host[PS_HOST_MAX];    /* required */
    uint16_t port;             /* required, 1..65535 */
    char data_dir[PS_PATH_MAX]; /* required */
    uint16_t metrics_port;     /* default 0: no HTTP endpoint; else /metrics, /healthz, /status */
    char metrics_host[PS_HOST_MAX]; /* default 127.0.0.1 (loopback only); 0.0.0.0: every address */
} ps_server_conf_t;

typedef struct {
    ps_optim_kind_t name;    /* required: sgd | momentum | adam | adamw | adagrad | mean */
    float lr;                /* required (but for mean, which ignores it), > 0 */
    float beta1, beta2, eps; /* defaults 0.9, 0.999, 1e-8 (adagrad: 1e-10); betas in [0,1),
                                eps > 0 */
    float momentum;          /* default 0.9, in [0,1) */
    bool nesterov;           /* default false */
    float weight_decay;      /* default 0, >= 0 */
    float lr_decay;          /* adagrad: default 0, >= 0 (lr / (1 + (t - 1) * lr_decay)) */
    float initial_accumulator_value; /* adagrad: default 0, >= 0 */
    ps_sched_kind_t schedule; /* constant (default) | cosine ("linear warm-up then cosine") */
    uint64_t warmup_steps;   /* default 0 */
    uint64_t decay_steps;    /* default 0: the workers' epochs x steps per epoch */
    float min_lr;            /* default 0: where cosine ends, >= 0 */
} ps_optim_conf_t;

#define PS_MAX_CODEC_RULES 16

typedef struct {
    char match[128];               /* fnmatch(3) pattern on the tensor name, e.g. "*.bias" */
    char codec[32];                /* required */
} ps_codec_rule_t;

/* Gradient compression (job.compression). Codec names: none | fp16 | bf16 | int8 |
 * sign | topk:F | randomk:F with F in (0, 1]. */
typedef struct {
    char codec[32];                /* default "none" */
    bool error_feedback;           /* default true */
    uint64_t min_bytes;            /* default 16384: smaller tensors travel uncompressed */
    ps_codec_rule_t rules[PS_MAX_CODEC_RULES]; /* first match wins over codec */
    int nrules;
    char pull[8];                  /* none (default) | fp16 | bf16: parameters on the way back */
    uint32_t block;                /* int8, sign: values per scale, default 256, 1..1048576 */
    bool stochastic;               /* int8: stochastic rounding, default false */
    bool fp16_values;              /* topk, randomk: values travel as fp16, default false */
} ps_compression_conf_t;

typedef struct {
    char model[32];                /* required: "mlp" */
    uint32_t layers[PS_MAX_LAYERS]; /* default 784,256,128,10 */
    int nlayers;                   /* 2..PS_MAX_LAYERS */
    char dataset[PS_PATH_MAX];     /* default /usr/share/datasets/fashion-mnist */
    uint64_t train_samples;        /* default 0 = all: train on the first N samples only */
    uint32_t batch_size;           /* required, 1..1048576 */
    uint32_t epochs;               /* required, 1..100000 */
    uint64_t seed;                 /* default 1 */
    uint32_t workers;              /* required, 1..64: the initial desired number of workers */
    ps_consistency_t consistency;  /* default bsp | asp | ssp */
    uint32_t staleness;            /* ssp: steps a worker may run ahead of the slowest, default 4 */
    uint64_t max_steps;            /* default 0 = no limit; stops the run early */
    uint32_t heartbeat_timeout_ms; /* default 3000, 100..3600000: a silent worker is dropped */
    uint32_t reconnect_timeout_ms; /* default 30000, 1000..86400000: how long a worker tries a
                                      shard it lost (or waits for one at its join) before it
                                      gives up (libps; ps_client_opts_t overrides it) */
    uint32_t start_wait_ms;        /* default 0 = heartbeat_timeout_ms, else 100..86400000: how
                                      long a step with no members (the job's first, or one all
                                      members left) waits for the desired number of workers
                                      after the first joined, before it starts with fewer */
    uint32_t step_timeout_ms;      /* bsp / ssp, default 0 = off, else 100..86400000: a member
                                      that holds the others this long is dropped as a silent
                                      one is (a worker hung while its heartbeats go on): bsp,
                                      no push of the open step reached shard 0 after the first
                                      member's; ssp, the slowest reported no batch while one
                                      waits staleness batches ahead */
    ps_optim_conf_t optimizer;     /* required */
    ps_compression_conf_t compression; /* optional */
} ps_job_conf_t;

/* Periodic checkpoints (top-level `checkpoint:`): shard 0 runs `psctl checkpoint --follow`,
 * which checkpoints into dir/step-S every every_steps steps (bsp: S a multiple of it) and/or
 * every every_s seconds, and keeps the newest `keep` of them. */
typedef struct {
    bool present;             /* the manifest has a checkpoint section */
    uint64_t every_steps;     /* default 0; at least one of every_steps, every_s is > 0 */
    uint64_t every_s;         /* default 0 */
    char dir[PS_PATH_MAX];    /* default "": <parent of servers[0].data_dir>/checkpoints */
    uint32_t keep;            /* default 3, 1..1000000 */
    uint32_t drain_s;         /* default 30, 1..86400: asp / ssp, how long a periodic checkpoint
                                 waits for the batches in flight before it is skipped */
} ps_checkpoint_conf_t;

/* A checkpoint's directory is carried in wire messages (checkpoint, repair): at most this many
 * bytes less one. */
#define PS_CKPT_DIR_MAX 200

#define PS_SPIN_US_DEFAULT 500

typedef struct {
    char path[PS_PATH_MAX];   /* the file it came from */
    char cluster[128];        /* required, [A-Za-z0-9_.-]+ */
    uint64_t chunk_bytes;     /* default 1048576; multiple of 4 in [1024, 1 GiB] */
    uint64_t map_size_mb;     /* default 4096: LMDB map size per shard, 16..1048576 */
    uint64_t sync_interval_s; /* default 0: fsync the store only at a clean shutdown; N in
                                 1..86400: also every N seconds (power-loss safety) */
    uint64_t fusion_bytes;    /* default 65536: small pushes, pulls and their replies to one
                                 peer travel fused in bundles of at most this many bytes
                                 (proto/bundle.h); 0 turns fusion off; else 4096..1 MiB */
    uint32_t spin_us;         /* default 500, 0..10000: psd's loop, libps's comm thread and a
                                 waiting caller busy-poll this long after activity before
                                 they sleep (PS_SPIN_US overrides; 0: never) */
    uint32_t apply_threads;   /* default 0 = the online CPUs, at most 8; 1..64: threads each psd
                                 updates an apply job's records on at once (PS_APPLY_THREADS
                                 overrides; 1: the job's one pool thread alone) */
    ps_server_conf_t servers[PS_MAX_SERVERS];
    int nservers;             /* 1..PS_MAX_SERVERS */
    ps_job_conf_t job;        /* required */
    ps_checkpoint_conf_t checkpoint; /* optional */
    char secret_file[PS_PATH_MAX]; /* default "": no authentication; else every peer proves it
                                      holds this file's bytes (common/auth.h) */
} ps_manifest_t;

/**
 * @brief Parse and validate the manifest file at @p path.
 * @param[out] m    filled on success; untouched fields keep their defaults.
 * @param[out] err  on failure, one line "FILE:LINE: KEY: what is wrong" (NUL-terminated).
 *                  Problems with no key (YAML syntax, empty file, top level not a mapping)
 *                  read "FILE:LINE: what is wrong"; an unreadable file "FILE: cannot read: why".
 *                  May be NULL when errlen is 0.
 * @return 0, PS_ECONFIG (bad content) or -errno (file unreadable; err says which).
 * @note No allocation survives the call; @p m is plain data the caller owns. On failure @p m
 *       is left as it was. Only the first problem found is reported.
 */
int ps_manifest_load(ps_manifest_t *m, const char *path, char *err, size_t errlen);

/** @brief Same as ps_manifest_load, from a string; @p name stands for the file in messages
 *  and is copied into m->path. */
int ps_manifest_parse(ps_manifest_t *m, const char *name, const char *text, size_t len, char *err,
                      size_t errlen);

/** @brief Name of an optimizer / consistency mode, for logs (static storage). */
const char *ps_optim_name(ps_optim_kind_t k);
const char *ps_consistency_name(ps_consistency_t c);

/** @brief True if @p text names a codec (none, fp16, bf16, int8, sign, topk:F, randomk:F with
 *  F a decimal in (0, 1]). The kernels parse it; this only checks the spelling. */
bool ps_codec_name_valid(const char *text);

/** @brief The codec for tensor @p name of @p bytes fp32 bytes under @p cc: the first rule
 *  whose pattern matches, else "none" below min_bytes, else cc->codec (static or cc's storage). */
const char *ps_compression_codec_for(const ps_compression_conf_t *cc, const char *name,
                                     uint64_t bytes);

#endif
