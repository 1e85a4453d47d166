/* proc.h: psbench's child processes, temp directory and clean-up.
 *
 * psbench starts psd shards, its own client processes and ucx_perftest. Every child is
 * recorded here; pb_proc_cleanup() (registered with atexit, and run by pb_die) kills and
 * reaps them and removes the temp directory. SIGINT, SIGTERM and SIGHUP SIGKILL every child
 * from the handler and set pb_interrupted; the next blocking wait notices it and dies through
 * the same clean-up. Children get PR_SET_PDEATHSIG(SIGKILL), so they also die with psbench
 * when it is killed outright. */
#ifndef PB_PROC_H
#define PB_PROC_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PB_PATH 1024

typedef struct {
    char name[32];          /* "psd0", "client1", "perftest-srv": names its log file */
    pid_t pid;              /* 0 once reaped */
    int in_fd;              /* write end of its stdin, or -1 */
    int out_fd;             /* read end of its stdout, or -1 */
    char log[PB_PATH + 64]; /* its stderr (and stdout when not piped) */
    int status;             /* once reaped: exit code, or 128 + signal */
    char buf[262144];       /* pb_proc_readline's buffer */
    size_t blen;
} pb_proc_t;

extern volatile sig_atomic_t pb_interrupted;

/** @brief Install the signal handlers and the atexit clean-up; make the temp directory
 *  under @p root (e.g. /dev/shm). Dies on failure. */
void pb_proc_init(const char *root);
/** @brief The temp directory (every data_dir, manifest and log lives in it). */
const char *pb_tmpdir(void);
/** @brief Kill and reap every child, remove the temp directory (unless PSBENCH_KEEP is set). */
void pb_proc_cleanup(void);
/** @brief Print "psbench: MSG" to stderr, clean up and exit(1) (or 128 + signal when
 *  interrupted). */
void pb_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/** @brief Seconds of CLOCK_MONOTONIC (the same clock in every process on the host). */
double pb_now(void);
/** @brief Nanoseconds of CLOCK_MONOTONIC. */
uint64_t pb_now_ns(void);

/**
 * @brief Start argv[0] (a path) with @p env_set ("NAME=VALUE", NULL-terminated, may be NULL)
 *  added to the environment. stdin and stdout are pipes when asked, else /dev/null and the log.
 * @return the process (owned by this module; never NULL: failure dies).
 */
pb_proc_t *pb_spawn(const char *name, char *const argv[], char *const env_set[], bool pipe_in,
                    bool pipe_out);

/**
 * @brief Read one line of @p p's stdout into @p line (without the newline).
 * @return 0, or -1 when the process closed its stdout or @p timeout_s passed (*timed_out says
 *  which, may be NULL). Dies when interrupted.
 */
int pb_proc_readline(pb_proc_t *p, char *line, size_t len, double timeout_s, bool *timed_out);
/** @brief Write @p s to @p p's stdin; -1 when it is gone. */
int pb_proc_write(pb_proc_t *p, const char *s);
/** @brief Wait up to @p timeout_s for @p p to exit. @return its status, or -1 (still running). */
int pb_proc_wait(pb_proc_t *p, double timeout_s);
/** @brief SIGKILL @p p (unless reaped) and reap it. */
void pb_proc_kill(pb_proc_t *p);
/** @brief pb_proc_kill, close its pipes and forget it (the log stays). NULL is a no-op. */
void pb_proc_free(pb_proc_t *p);
/** @brief The last @p max bytes of @p p's log (static storage, valid until the next call). */
const char *pb_proc_tail(const pb_proc_t *p, size_t max);

/** @brief A free TCP port on 127.0.0.1 (checked by binding it, below the ephemeral range). */
uint16_t pb_pick_port(void);
/** @brief True when something listens on TCP @p port (read from /proc/net/tcp). */
bool pb_port_listening(uint16_t port);

/** @brief rm -rf @p dir (best effort). */
void pb_rm_rf(const char *dir);

#endif
