"""psd's Python binding: libps (worker/include/ps/ps_client.h) through ctypes.

    import psd
    with psd.Client("cluster.yaml") as c:
        tid = c.declare("w", (256, 784), init="xavier")
        ...

`psd.torch` trains a torch.nn.Module's parameters on the shards. The library is found as
$PSD_LIBPS, else build/worker/libps.so of the checkout this file is in, else the system's
libps.so (after `meson install`).
"""
import ctypes
import errno
import ctypes.util
import operator
import os
import signal
import threading
from array import array

__all__ = ["PsError", "Client", "Batch", "batch_order", "library"]

_INITS = {"zeros": 0, "normal": 1, "uniform": 2, "xavier": 3, "constant": 4}
CONSISTENCY = ("bsp", "asp", "ssp")


class PsError(RuntimeError):
    """A libps call failed: `code` is its PS_E* value, `name` its symbol, the text its reason."""

    def __init__(self, code, name, text):
        super().__init__(f"{name}: {text}")
        self.code = code
        self.name = name


class _Opts(ctypes.Structure):
    _fields_ = [("field_mask", ctypes.c_uint64), ("connect_timeout_ms", ctypes.c_uint32),
                ("cancel", ctypes.c_void_p)]


class _Desc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("shape", ctypes.c_uint32 * 4), ("ndim", ctypes.c_int),
                ("init", ctypes.c_int), ("init_arg", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("total_steps", ctypes.c_uint64)]


class _BatchInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("pass_", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("members", ctypes.c_uint32), ("epoch", ctypes.c_uint64),
                ("finished", ctypes.c_int)]


class _JobInfo(ctypes.Structure):
    _fields_ = [("consistency", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("batch_size", ctypes.c_uint32), ("epochs", ctypes.c_uint32),
                ("max_steps", ctypes.c_uint64), ("workers", ctypes.c_uint32)]


_lib = None


def library():
    """The loaded libps (ctypes.CDLL), loaded on first use."""
    global _lib
    if _lib is not None:
        return _lib
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("PSD_LIBPS"),
                  os.path.join(here, "..", "..", "..", "build", "worker", "libps.so"),
                  ctypes.util.find_library("ps")]
    tried = []
    for path in candidates:
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    else:
        raise OSError("cannot load libps (set PSD_LIBPS to build/worker/libps.so): "
                      + "; ".join(tried))
    P, U32, U64, I = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    sig = {
        "ps_client_create": (I, [ctypes.c_char_p, ctypes.POINTER(_Opts), ctypes.POINTER(P),
                                 ctypes.c_char_p, ctypes.c_size_t]),
        "ps_client_destroy": (None, [P]),
        "ps_client_interrupt": (None, [P]),
        "ps_client_rank": (I, [P]),
        "ps_client_workers": (U32, [P]),
        "ps_client_shards": (U32, [P]),
        "ps_client_join_step": (U64, [P]),
        "ps_client_job": (None, [P, ctypes.POINTER(_JobInfo)]),
        "ps_client_declare": (I, [P, ctypes.POINTER(_Desc), ctypes.POINTER(U32)]),
        "ps_client_push": (I, [P, U32, P, U64, ctypes.POINTER(P)]),
        "ps_client_push_none": (I, [P, U32, U64, ctypes.POINTER(P)]),
        "ps_client_pull": (I, [P, U32, P, U64, ctypes.POINTER(P)]),
        "ps_op_wait": (I, [P, ctypes.POINTER(U64)]),
        "ps_client_error": (ctypes.c_char_p, [P]),
        "ps_client_group_begin": (None, [P]),
        "ps_client_group_end": (None, [P]),
        "ps_client_next_batch": (I, [P, U64, ctypes.POINTER(_BatchInfo),
                                     ctypes.POINTER(_BatchInfo)]),
        "ps_client_batch_done": (None, [P, ctypes.POINTER(_BatchInfo)]),
        "ps_batch_order": (None, [P, U32, U64, U32]),
        "ps_err_name": (ctypes.c_char_p, [I]),
        "ps_strerror": (ctypes.c_char_p, [I]),
        "ps_log_set_level": (I, [ctypes.c_char_p]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    lib.ps_log_set_level(None)  # PS_LOG_LEVEL, as the C tools read it
    _lib = lib
    return lib


def _check(rc, text):
    if rc != 0:
        lib = library()
        raise PsError(rc, lib.ps_err_name(rc).decode(), text or lib.ps_strerror(rc).decode())


def batch_order(n, seed, pass_):
    """The training set's order in pass `pass_` (ps_batch_order): an array of n indices."""
    perm = array("I", bytes(4 * n))
    if n:
        addr, _ = perm.buffer_info()
        library().ps_batch_order(addr, n, seed, pass_)
    return perm


class Batch:
    """A batch as the coordinator hands it out: samples `indices` (positions offset .. offset +
    count - 1 of pass `pass_`'s order), to compute as step `step`."""

    __slots__ = ("step", "pass_", "offset", "count", "members", "epoch", "indices", "_info")

    def __init__(self, info, indices):
        self._info = info
        self.step, self.pass_, self.offset = info.step, info.pass_, info.offset
        self.count, self.members, self.epoch = info.count, info.members, info.epoch
        self.indices = indices


class Op:
    """A push or pull in flight: wait() once. Keeps the buffer it reads or writes alive."""

    __slots__ = ("_client", "_op", "_keep", "done")

    def __init__(self, client, op, keep):
        self._client, self._op, self._keep, self.done = client, op, keep, False

    def wait(self):
        """Wait for it; returns the lowest chunk version (pulls). Raises PsError on failure."""
        if self.done:
            raise ValueError("this operation was waited for already")
        self._client._live()  # its client closed: the operation went with it
        self.done = True
        v = ctypes.c_uint64(0)
        rc = library().ps_op_wait(self._op, ctypes.byref(v))
        self._keep = None
        _check(rc, self._client.error())
        return v.value


class _CtrlC:
    """Ctrl-C while a libps call blocks. Python runs its SIGINT handler only between bytecodes,
    never inside a C call, so a worker waiting on a stalled cluster would not stop. Python's own
    C-level handler writes the signal's number to the wakeup fd at once: a thread reading it
    sets the join's cancel flag and calls ps_client_interrupt (safe at any time), the blocked
    call returns, and Python raises KeyboardInterrupt. Only in the main thread with Python's
    default SIGINT handler and no wakeup fd of someone else's (asyncio's): otherwise nothing."""

    def __init__(self):
        self.flag = ctypes.c_int(0)  # ps_client_opts_t.cancel (a sig_atomic_t)
        self.handle = None  # the client, once made
        self.lock = threading.Lock()  # the thread's interrupt against close()'s destroy
        self._r = self._w = None
        if (threading.current_thread() is not threading.main_thread() or
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            old = None
        if old != -1:  # not allowed here, or someone else's: theirs stays
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._r, self._w = r, w
        threading.Thread(target=self._run, name="psd-ctrl-c", daemon=True).start()

    def _run(self):
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                data = b""
            if not data:  # stop() closed the other end
                os.close(self._r)
                return
            if signal.SIGINT in data:
                self.flag.value = 1
                with self.lock:
                    if self.handle:
                        library().ps_client_interrupt(self.handle)

    def stop(self):
        """Give the wakeup fd back (main thread only: elsewhere it stays until exit)."""
        if self._w is None or threading.current_thread() is not threading.main_thread():
            return
        cur = signal.set_wakeup_fd(-1)
        if cur != self._w:  # someone set theirs since: theirs stays
            signal.set_wakeup_fd(cur)
        os.close(self._w)  # the thread reads the end of the pipe and ends
        self._w = None


class Client:
    """One libps client: joins the cluster of `manifest` (blocking; retries unreachable shards
    for `connect_timeout_ms`), leaves at close(). Ctrl-C stops a call that blocks (_CtrlC):
    KeyboardInterrupt, and the client is then good only for close()."""

    def __init__(self, manifest, connect_timeout_ms=None):
        lib = library()
        opts = _Opts()
        if connect_timeout_ms is not None:
            ms = operator.index(connect_timeout_ms)
            if not 0 <= ms < 2**32:
                raise ValueError(f"connect_timeout_ms must be 0 to 2^32 - 1, got {ms}")
            opts.field_mask, opts.connect_timeout_ms = 1, ms
        self._h = None
        self._ctrl_c = _CtrlC()
        opts.field_mask |= 2  # PS_CLIENT_OPT_CANCEL
        opts.cancel = ctypes.addressof(self._ctrl_c.flag)
        err = ctypes.create_string_buffer(1024)
        h = ctypes.c_void_p()
        try:  # a Ctrl-C lands as the call returns: the wakeup fd goes back whatever happens
            rc = lib.ps_client_create(os.fsencode(manifest), ctypes.byref(opts), ctypes.byref(h),
                                      err, len(err))
            _check(rc, err.value.decode(errors="replace"))
        except BaseException:
            if h:
                lib.ps_client_destroy(h)
            self._ctrl_c.stop()
            raise
        self._h = h
        self._ctrl_c.handle = h
        job = _JobInfo()
        lib.ps_client_job(h, ctypes.byref(job))
        self.consistency = CONSISTENCY[job.consistency]
        self.seed, self.batch_size = job.seed, job.batch_size
        self.epochs, self.max_steps = job.epochs, job.max_steps
        self.workers_wanted = job.workers

    def _live(self):
        """The libps handle; PsError EINVAL once close()d (libps takes its pointers as given)."""
        if not self._h:
            raise PsError(-errno.EINVAL, "EINVAL", "the client is closed")
        return self._h

    def error(self):
        return library().ps_client_error(self._live()).decode(errors="replace")

    @property
    def rank(self):
        return library().ps_client_rank(self._live())

    @property
    def workers(self):
        return library().ps_client_workers(self._live())

    @property
    def shards(self):
        return library().ps_client_shards(self._live())

    def declare(self, name, shape, init="zeros", init_arg=0.0, seed=0, total_steps=0):
        """Declare tensor `name` of `shape` (1 to 4 dimensions) on the shards, initialized there
        (init: zeros, normal (std init_arg), uniform (a = init_arg), xavier, constant (every
        value init_arg)); returns its id."""
        shape = tuple(int(s) for s in shape) or (1,)
        if not 1 <= len(shape) <= 4:
            raise ValueError(f"tensor {name}: {len(shape)} dimensions (psd holds 1 to 4)")
        if init not in _INITS:
            raise ValueError(f"tensor {name}: init {init!r} is not one of {sorted(_INITS)}")
        d = _Desc(name=name.encode(), ndim=len(shape), init=_INITS[init], init_arg=init_arg,
                  seed=seed, total_steps=total_steps)
        for i, s in enumerate(shape):
            d.shape[i] = s
        tid = ctypes.c_uint32()
        _check(library().ps_client_declare(self._live(), ctypes.byref(d), ctypes.byref(tid)),
               self.error())
        return tid.value

    def push(self, tid, addr, step, keep=None):
        """Push the gradient at address `addr` (the tensor's numel float32s) for `step`; `keep`
        (the object owning that memory) is held until the returned Op is waited for."""
        op = ctypes.c_void_p()
        _check(library().ps_client_push(self._live(), tid, addr, step, ctypes.byref(op)),
               self.error())
        return Op(self, op, keep)

    def push_none(self, tid, step):
        """bsp: this worker has no gradient of `tid` for `step` (ps_client_push_none): counted
        as its push, a zero in the mean; a step in which no member had one leaves the tensor's
        parameters and optimizer state as they are. Returns an Op."""
        op = ctypes.c_void_p()
        _check(library().ps_client_push_none(self._live(), tid, step, ctypes.byref(op)),
               self.error())
        return Op(self, op, None)

    def pull(self, tid, addr, min_version, keep=None):
        """Pull the parameters into address `addr` once every chunk reached `min_version`."""
        op = ctypes.c_void_p()
        _check(library().ps_client_pull(self._live(), tid, addr, min_version, ctypes.byref(op)),
               self.error())
        return Op(self, op, keep)

    def group_begin(self):
        library().ps_client_group_begin(self._live())

    def group_end(self):
        library().ps_client_group_end(self._live())

    def next_batch(self, samples, done=None):
        """The next batch for a training set of `samples` (blocking until this worker's turn),
        reporting `done` (the previous Batch, all its pushes acknowledged). None when the job is
        finished (`final_step` then holds its step)."""
        out = _BatchInfo()
        d = ctypes.byref(done._info) if done is not None else None
        _check(library().ps_client_next_batch(self._live(), samples, d, ctypes.byref(out)),
               self.error())
        if out.finished:
            self.final_step = out.step
            return None
        return Batch(out, None)

    def batch_done(self, b):
        library().ps_client_batch_done(self._live(), ctypes.byref(b._info))

    def close(self):
        """Leave the cluster and free the client (every Op must have been waited for)."""
        if self._h:
            with self._ctrl_c.lock:
                h, self._h, self._ctrl_c.handle = self._h, None, None
            try:
                library().ps_client_destroy(h)
            finally:
                self._ctrl_c.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()
