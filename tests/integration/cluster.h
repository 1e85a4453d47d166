/* cluster.h: a harness for the integration tests: a temporary directory, free ports, a
 * manifest, and the real psd / psworker processes started from it.
 *
 * Everything a test starts is cleaned up even when the test fails. Each child gets
 * PR_SET_PDEATHSIG(SIGKILL), so it dies with the test process however that ends (Check ends a
 * failed test with _exit(), and a timed-out one with SIGKILL). The unchecked fixture
 * cl_base_setup() / cl_base_teardown(), which runs in Check's parent process, makes and removes
 * the base temp dir every cluster dir lives in. cl_cluster_create() registers an atexit()
 * handler in the test process for the exits that do run it (a test that returns without
 * cl_cluster_destroy(), the end of a CK_FORK=no run), and first destroys any cluster a failed
 * test left in this process (CK_FORK=no).
 *
 * The binaries come from the environment: PSD, PSWORKER, EVIL_PEER (set by
 * tests/integration/meson.build). For a post-mortem: PS_INTEG_KEEP=1 keeps every cluster's
 * directory (logs, stores), and PS_LOG_LEVEL=debug makes psd (its --log-level) and the test
 * clients that read it log each push, apply, report and resend.
 * The helpers fail fast through Check's assertions where a test could do nothing useful on error
 * (no temp dir, no port, cannot fork). Names use the cl_ prefix: test code, not part of psd. */
#ifndef PS_TEST_CLUSTER_H
#define PS_TEST_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CL_MAX_SHARDS 8
#define CL_MAX_PROCS 128
#define CL_PATH 1024

/* How long one test may wait in all, in seconds (PS_INTEG_BUDGET_S overrides it). Every wait
 * below also stops at this deadline, so that one hung process fails its own test instead of
 * running the whole suite into meson's timeout. A normal test needs a few seconds; 90 (was 50)
 * since the suites run two at a time, each test sharing the CPUs with another suite's. */
#define CL_BUDGET_S 90.0

typedef struct cl_cluster_s cl_cluster_t;

/* What goes into a manifest; zero fields take the defaults in brackets. */
typedef struct {
    int shards;              /* [1] servers, 1..CL_MAX_SHARDS */
    uint32_t workers;        /* [1] job.workers */
    const char *consistency; /* ["bsp"] job.consistency */
    const char *optimizer;   /* ["{name: sgd, lr: 0.05}"] job.optimizer, a YAML flow mapping */
    uint64_t max_steps;      /* [0 = no limit] job.max_steps */
    const char *layers;      /* ["[784, 256, 128, 10]"] job.layers, a YAML flow sequence */
    uint32_t batch_size;     /* [64] job.batch_size */
    uint32_t epochs;         /* [1] job.epochs */
    uint64_t seed;           /* [1] job.seed (0: 1) */
    uint64_t chunk_bytes;    /* [65536] chunk_bytes */
    uint64_t map_size_mb;    /* [64] map_size_mb */
    const char *job_extra;   /* [none] more lines inside job:, each "  key: value\n" */
    const char *top_extra;   /* [none] more top-level lines, each "key: value\n" */
    bool metrics;            /* [false] every server gets a free metrics_port (c->metrics_port) */
    uint32_t start_wait_ms;  /* [0: not written] job.start_wait_ms; CL_TOGETHER_MS where the
                                workers start together and a result needs all from step 0 */
} cl_conf_t;

/* job.start_wait_ms for workers started together: two such joined 2 s apart under CI's load,
 * past the heartbeat timeout the job's first step waits by default, so the first ran steps
 * alone and no reference matched. */
#define CL_TOGETHER_MS 20000

/* One child process. */
typedef struct {
    cl_cluster_t *c;
    char name[32]; /* "psd0", "worker2": names its log file */
    pid_t pid;
    char log[CL_PATH];    /* its stderr (and, for workers, stdout) */
    char params[CL_PATH]; /* the worker's --params-out file, or "" */
    int out_fd;           /* psd: read end of its stdout pipe, else -1 */
    bool reaped;
    int status; /* once reaped: exit code, or 128 + signal number */
} cl_proc_t;

struct cl_cluster_s {
    char dir[CL_PATH];      /* the temp dir; everything below lives in it */
    char manifest[CL_PATH]; /* dir/manifest.yaml, written from conf */
    char data_dir[CL_MAX_SHARDS][CL_PATH];
    uint16_t port[CL_MAX_SHARDS];
    uint16_t metrics_port[CL_MAX_SHARDS]; /* conf.metrics: each shard's HTTP port */
    char cluster_name[64]; /* unique per cluster, so a stray psd refuses workers */
    cl_conf_t conf;        /* with defaults filled in */
    double deadline;       /* CLOCK_MONOTONIC seconds: see CL_BUDGET_S */
    cl_proc_t procs[CL_MAX_PROCS];
    int nprocs;
    int nworkers_started;
};

/* ---- fixture (Check's parent process) ---------------------------------------------------- */

/** @brief Unchecked setup: make the base temp dir (mkdtemp under $TMPDIR or /tmp) that clusters
 *  are made in. */
void cl_base_setup(void);
/** @brief Unchecked teardown: remove the base temp dir and everything in it. */
void cl_base_teardown(void);

/* ---- cluster (the test process) ---------------------------------------------------------- */

/**
 * @brief Make a temp dir, pick a free port per shard and write dir/manifest.yaml from @p conf.
 * @return the cluster (never NULL: failures abort the test).
 * @note Release it with cl_cluster_destroy(); the atexit() handler does it if the test fails.
 */
cl_cluster_t *cl_cluster_create(const cl_conf_t *conf);

/** @brief SIGKILL every child still running, reap them all, close their pipes, remove the
 *  temp dir and free @p c. NULL is a no-op. */
void cl_cluster_destroy(cl_cluster_t *c);

/**
 * @brief Write another manifest into the cluster's dir: @p conf with this cluster's ports,
 *  data_dirs and name (so it names the same servers), e.g. one that differs only in layers.
 * @param[out] path  the file's full path.
 */
void cl_manifest_write(cl_cluster_t *c, const char *file, const cl_conf_t *conf, char *path,
                       size_t len);

/** @brief Seconds left of the test's budget (0 when spent). */
double cl_left(const cl_cluster_t *c);

/* ---- processes --------------------------------------------------------------------------- */

/**
 * @brief Start `psd --manifest M --shard N --log-level info` (M = the cluster's manifest when
 *  @p manifest is NULL), stdout on a pipe, stderr to dir/psdN[.K].log. Does not wait.
 */
cl_proc_t *cl_psd_spawn(cl_cluster_t *c, int shard, const char *manifest);

/** @brief cl_psd_spawn with more arguments: @p extra, a NULL-terminated list (at most 8) that
 *  goes after psd's usual ones (NULL: none). The strings must live until the call returns. */
cl_proc_t *cl_psd_spawn_with(cl_cluster_t *c, int shard, const char *manifest,
                             const char *const *extra);

/**
 * @brief Read @p p's stdout until its "psd shard N listening on HOST:PORT" line.
 * @return 0 when it came and names the manifest's port; -1 when the process closed its stdout
 *  (it exited: see cl_wait()), printed something else, or @p timeout_s passed.
 */
int cl_psd_wait_ready(cl_proc_t *p, double timeout_s);

/** @brief cl_psd_spawn() + cl_psd_wait_ready(); fails the test (with the log's tail) unless the
 *  shard becomes ready within @p timeout_s. */
cl_proc_t *cl_psd_start(cl_cluster_t *c, int shard, const char *manifest, double timeout_s);

/** @brief One shard (a 16 MB map, heartbeat_timeout_ms 500, 2 epochs of 12000 samples in
 *  batches of 16) and two workers, the second of which stops itself (SIGSTOP) inside its 300th
 *  direct read of the store (PS_TEST_DIRECT_STOP), holding its snapshot: the tests of a store
 *  pinned by a stopped reader. @p metrics: the shard gets a metrics port. */
cl_cluster_t *cl_stopped_reader_start(bool metrics, cl_proc_t **psd, cl_proc_t *w[2]);

/** @brief cl_psd_start() with the cluster's manifest and environment variable @p name set to
 *  @p value for that psd alone (a test hook such as PS_TEST_CRASH_AFTER_APPLY); @p value NULL:
 *  nothing set. */
cl_proc_t *cl_psd_start_env(cl_cluster_t *c, int shard, double timeout_s, const char *name,
                            const char *value);

/**
 * @brief Start shards 0..n-1 of @p manifest with `--restore @p dir` (named restoredN-I) into
 *  @p psd[0..n-1], and wait up to @p timeout_s for each to listen (fails the test if one does
 *  not). Their data_dirs must be empty or missing (cl_data_dirs_aside).
 */
void cl_restore_start(cl_cluster_t *c, const char *manifest, int n, const char *dir,
                      cl_proc_t **psd, double timeout_s);

/** @brief Rename the cluster's data_dirs to DATA_DIR.@p tag, so that they are empty for a
 *  restore (the old stores stay there for a post-mortem). */
void cl_data_dirs_aside(cl_cluster_t *c, const char *tag);

/**
 * @brief Start `psworker --manifest M [--params-out dir/PARAMS] [--local]`, stdout and stderr
 *  to dir/workerK.log. Does not wait.
 * @param manifest  NULL for the cluster's manifest.
 * @param params    a file name inside the cluster's dir, or NULL for no --params-out.
 */
cl_proc_t *cl_worker_start(cl_cluster_t *c, const char *manifest, const char *params, bool local);

/**
 * @brief cl_worker_start() with more arguments: @p extra, a NULL-terminated list (NULL for
 *  none), goes after the others, e.g. {"--codec", "int8", NULL}. At most 16 of them.
 */
cl_proc_t *cl_worker_spawn(cl_cluster_t *c, const char *manifest, const char *params, bool local,
                           const char *const *extra);

/**
 * @brief Start any program: @p argv (argv[0] its path, NULL-terminated), named @p name, stdin
 *  from /dev/null, stdout and stderr to dir/NAME.log. Does not wait.
 */
cl_proc_t *cl_spawn(cl_cluster_t *c, const char *name, char *const argv[]);

/** @brief The path of a test binary from environment variable @p var (PSD, PSWORKER,
 *  EVIL_PEER, ...); fails the test when it is not set. */
const char *cl_binary(const char *var);

/** @brief @p file inside the cluster's dir, into @p out. */
void cl_path(const cl_cluster_t *c, const char *file, char *out, size_t len);

/** @brief Wait up to @p timeout_s for @p p to exit and reap it.
 *  @return its exit code, 128 + the signal that killed it, or -1 on timeout. */
int cl_wait(cl_proc_t *p, double timeout_s);

/** @brief Whether @p p is still running (reaps it if it has exited). */
bool cl_alive(cl_proc_t *p);

/** @brief kill(2) @p p unless it was reaped. @return 0 or -errno. */
int cl_signal(cl_proc_t *p, int sig);

/**
 * @brief Wait until @p p's log contains @p needle.
 * @return 0 when it does; -1 when @p timeout_s passed, or @p p exited without writing it.
 */
int cl_wait_log(cl_proc_t *p, const char *needle, double timeout_s);

/* ---- sockets ----------------------------------------------------------------------------- */

/** @brief A TCP socket connected to 127.0.0.1:@p port (the caller closes it); fails the test
 *  otherwise. */
int cl_tcp_connect(uint16_t port);

/** @brief Bind 127.0.0.1:@p port, as another program holding it would (the caller closes the
 *  fd); fails the test otherwise. */
int cl_hold_port(uint16_t port);

/* ---- files ------------------------------------------------------------------------------- */

/** @brief The whole file, NUL-terminated (malloc'd; the caller frees it), or NULL with errno. */
char *cl_read_file(const char *path, size_t *len);
/** @brief A copy of @p c's manifest whose cluster is named "other-" + its own, written to
 *  CLUSTER/other.yaml; its path into @p out[CL_PATH] (the same shards: another cluster's
 *  manifest that names these addresses). */
void cl_manifest_other_cluster(cl_cluster_t *c, char *out);

/** @brief The whole of @p p's log (malloc'd, "" when it is missing). */
char *cl_log(const cl_proc_t *p);

/** @brief The last ~1200 bytes of @p p's log on one line (newlines shown as " | "), for
 *  failure messages. @note static storage, rotating over 4 buffers: valid until the 4th next
 *  call. */
const char *cl_tail(const cl_proc_t *p);

/** @brief The 1-based number of the first line of @p path that contains @p needle, or 0. */
int cl_line_of(const char *path, const char *needle);

/* ---- PSPARAM1 files (see write_params() in worker/psworker.c) ---------------------------- */

typedef struct {
    char name[128];
    uint64_t numel;
    float *v;
} cl_tensor_t;

typedef struct {
    uint64_t step;
    uint32_t ntensors;
    cl_tensor_t *t;
} cl_params_t;

/** @brief Read a PSPARAM1 file. @return 0, or -1 with a message in @p err. */
int cl_params_read(cl_params_t *p, const char *path, char *err, size_t errlen);
void cl_params_free(cl_params_t *p);

/**
 * @brief Compare two parameter sets: same step, same tensors (names, sizes, order), and every
 *  value within |a - b| <= atol + rtol * max(|a|, |b|) (NaN never matches).
 * @return 0 when they match; 1 when not, -1 when a file cannot be read; @p why says what.
 */
int cl_params_compare_files(const char *a, const char *b, double rtol, double atol, char *why,
                            size_t len);

#endif
