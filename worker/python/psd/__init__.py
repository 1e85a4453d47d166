"""psd's Python binding: libps (worker/include/ps/ps_client.h) through ctypes.

    import psd
    with psd.Client("cluster.yaml") as c:
        tid = c.declare("w", (256, 784), init="xavier")
        ...

`psd.torch` trains a torch.nn.Module's parameters on the shards. The library is found as
$PSD_LIBPS, else build/worker/libps.so of the checkout this file is in, else the system's
libps.so (after `meson install`).
"""
import contextlib
import ctypes
import errno
import ctypes.util
import operator
import os
import signal
import threading
import weakref
from array import array

__all__ = ["PsError", "Client", "Batch", "batch_order", "library", "catch_ctrl_c",
           "manifest_cluster"]

_INITS = {"zeros": 0, "normal": 1, "uniform": 2, "xavier": 3, "constant": 4}
_TENSOR_MEAN = 0x100  # ps_client.h PS_TENSOR_MEAN
CONSISTENCY = ("bsp", "asp", "ssp")
ECONFIG = -10005  # PS_ECONFIG (ps_error.h): a manifest or setting refused


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


class _Compression(ctypes.Structure):
    _fields_ = [("field_mask", ctypes.c_uint64), ("codec", ctypes.c_char_p),
                ("error_feedback", ctypes.c_int), ("pull", ctypes.c_char_p),
                ("block", ctypes.c_uint32), ("stochastic", ctypes.c_int),
                ("fp16_values", ctypes.c_int)]


class _BatchInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("pass_", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("members", ctypes.c_uint32), ("epoch", ctypes.c_uint64),
                ("finished", ctypes.c_int)]


class _JobInfo(ctypes.Structure):
    _fields_ = [("consistency", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("batch_size", ctypes.c_uint32), ("epochs", ctypes.c_uint32),
                ("max_steps", ctypes.c_uint64), ("workers", ctypes.c_uint32)]


_lib = None


def _load(path):
    """ctypes.CDLL(path), keeping this process's SIGHUP disposition: UCX, loaded with libps,
    installs a handler of its own for SIGHUP (UCX_DEBUG_SIGNO, default HUP) that switches its
    debug logging on, so a hangup no longer ended the program (or ran its handler). libps gives
    it back itself since (common/ucx_loop.c); kept for a libps older than that, and for a
    Python handler, which Python's own disposition records."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGHUP) if main else None
    lib = ctypes.CDLL(path)
    if before is not None:
        signal.signal(signal.SIGHUP, before)
    return lib


def library():
    """The loaded libps (ctypes.CDLL), loaded on first use."""
    global _lib
    if _lib is not None:
        return _lib
    named = os.environ.get("PSD_LIBPS")
    if named:
        # The one the user named, or an error: a mistyped path fell back to the checkout's
        # build without a word, and another libps ran than the one asked for (a probe found it).
        try:
            lib = _load(named)
        except OSError as e:
            raise OSError(f"PSD_LIBPS={named}: cannot load it ({e}); unset PSD_LIBPS to use "
                          "the checkout's build/worker/libps.so or the installed one") from None
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        candidates = [os.path.join(here, "..", "..", "..", "build", "worker", "libps.so"),
                      ctypes.util.find_library("ps")]
        tried = []
        for path in candidates:
            if not path:
                continue
            try:
                lib = _load(path)
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
        "ps_manifest_cluster": (I, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                    ctypes.c_char_p, ctypes.c_size_t]),
        "ps_manifest_optimizer": (I, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_char_p, ctypes.c_size_t]),
        "ps_client_declare": (I, [P, ctypes.POINTER(_Desc), ctypes.POINTER(U32)]),
        "ps_client_declare_values": (I, [P, ctypes.POINTER(_Desc), P, ctypes.POINTER(U32),
                                         ctypes.POINTER(I)]),
        "ps_client_give_up": (None, [P]),
        "ps_client_nonfinite_pushes": (U64, [P]),
        "ps_client_set_compression": (I, [P, U32, ctypes.POINTER(_Compression)]),
        "ps_client_use_job_compression": (I, [P, U32, ctypes.c_char_p]),
        "ps_client_push": (I, [P, U32, P, U64, ctypes.POINTER(P)]),
        "ps_client_push_none": (I, [P, U32, U64, ctypes.POINTER(P)]),
        "ps_client_pull": (I, [P, U32, P, U64, ctypes.POINTER(P)]),
        "ps_op_wait": (I, [P, ctypes.POINTER(U64)]),
        "ps_client_push_many": (I, [P, U32, ctypes.POINTER(U32), ctypes.POINTER(P), U64,
                                    ctypes.POINTER(P)]),
        "ps_client_pull_many": (I, [P, U32, ctypes.POINTER(U32), ctypes.POINTER(P), U64,
                                    ctypes.POINTER(P)]),
        "ps_op_wait_many": (I, [U32, ctypes.POINTER(P), ctypes.POINTER(U64), ctypes.POINTER(I)]),
        "ps_client_error": (ctypes.c_char_p, [P]),
        "ps_client_group_begin": (None, [P]),
        "ps_client_group_end": (None, [P]),
        "ps_client_next_batch": (I, [P, U64, ctypes.POINTER(_BatchInfo),
                                     ctypes.POINTER(_BatchInfo)]),
        "ps_client_batch_done": (None, [P, ctypes.POINTER(_BatchInfo)]),
        "ps_client_report_done": (I, [P, U64, ctypes.POINTER(_BatchInfo)]),
        "ps_batch_order": (None, [P, U32, U64, U32]),
        "ps_err_name": (ctypes.c_char_p, [I]),
        "ps_strerror": (ctypes.c_char_p, [I]),
        "ps_log_set_level": (I, [ctypes.c_char_p]),
    }
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            # A libps older than this package (PSD_LIBPS naming another build's): said as a
            # load failure is, not as a bare AttributeError (a compatibility probe, session 64).
            raise OSError(f"{lib._name}: this libps has no {name}: it is older than the psd package "
                          f"in {os.path.dirname(os.path.abspath(__file__))}: use the libps.so "
                          "built with it" + (" (unset PSD_LIBPS for the checkout's "
                                             "build/worker/libps.so)"
                                             if os.environ.get("PSD_LIBPS") else "")) from None
        f.restype, f.argtypes = res, args
    lib.ps_log_set_level(None)  # PS_LOG_LEVEL, as the C tools read it
    _lib = lib
    return lib


def _check(rc, text):
    if rc != 0:
        lib = library()
        raise PsError(rc, lib.ps_err_name(rc).decode(), text or lib.ps_strerror(rc).decode())


def batch_order(n, seed, pass_):
    """The training set's order in pass `pass_` (ps_batch_order): an array of n indices
    (32-bit: n below 2^32)."""
    n = _uint("n", n, 32)
    seed = _uint("seed", seed, 64)
    pass_ = _uint("pass_", pass_, 32)
    perm = array("I", bytes(4 * n))
    if n:
        addr, _ = perm.buffer_info()
        library().ps_batch_order(addr, n, seed, pass_)
    return perm


def _manifest_name(fn, manifest):
    out, err = ctypes.create_string_buffer(128), ctypes.create_string_buffer(512)
    rc = fn(os.fsencode(manifest), out, len(out), err, len(err))
    _check(rc, err.value.decode(errors="replace"))
    return out.value.decode()


def manifest_cluster(manifest):
    """The cluster name of `manifest` (ps_manifest_cluster: read and checked as a join reads
    it, no shard contacted). Raises PsError with the reason for one libps refuses (ECONFIG) or
    cannot read (ENOENT, ...)."""
    return _manifest_name(library().ps_manifest_cluster, manifest)


def manifest_optimizer(manifest):
    """The optimizer `manifest`'s job runs on its shards (ps_manifest_optimizer: "sgd",
    "momentum", "adam", "adamw", "adagrad", or "mean": the shards keep each step's mean
    gradient, no model, and a client runs its own optimizer). Raises as manifest_cluster."""
    return _manifest_name(library().ps_manifest_optimizer, manifest)


class Batch:
    """A batch as the coordinator hands it out: samples `indices` (positions offset .. offset +
    count - 1 of pass `pass_`'s order), to compute as step `step`."""

    __slots__ = ("step", "pass_", "offset", "count", "members", "epoch", "indices", "_info")

    def __init__(self, info, indices):
        self._info = info
        self.step, self.pass_, self.offset = info.step, info.pass_, info.offset
        self.count, self.members, self.epoch = info.count, info.members, info.epoch
        self.indices = indices

    def __iter__(self):
        """Its sample indices: a batch is what a DataLoader's batch_sampler yields."""
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer (Include/pybuffer.h), for _buffer_address."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _buffer_address(mv):
    """The address of memoryview `mv`'s first byte, writable or not (ctypes' from_buffer takes
    only writable ones)."""
    api = ctypes.pythonapi
    api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    api.PyObject_GetBuffer.restype = ctypes.c_int
    api.PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
    api.PyBuffer_Release.restype = None
    b = _PyBuffer()
    if api.PyObject_GetBuffer(mv, ctypes.byref(b), 0) != 0:  # PyBUF_SIMPLE
        raise ValueError("the buffer's address cannot be had")
    try:
        return b.buf or 0
    finally:
        api.PyBuffer_Release(ctypes.byref(b))


def _uint(what, v, bits, low=0):
    """`v` as an int in [low, 2^bits - 1]: ctypes would wrap a negative or larger one silently
    (a shape of 2^32 + 3 declared as 3, a step of -1 as 2^64 - 1)."""
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an integer, not a bool")
    try:
        n = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(v).__name__}") from None
    if not low <= n < 2 ** bits:
        raise ValueError(f"{what} must be {low} to 2^{bits} - 1, got {n}")
    return n


def _check_tensor_like(what, tid, n, addr, keep, write):
    """A `keep` without the buffer protocol that says what it holds as a torch tensor does
    (numel, dtype, is_contiguous, device, data_ptr): checked to be a contiguous float32 CPU
    tensor holding the tensor's `n` values at `addr` (a probe, session 45: a 10-value torch
    tensor pulled a million values into freed memory, SIGSEGV; float64 and strided views were
    written as if float32 and contiguous). Anything else stays the caller's to check."""
    need = ("numel", "dtype", "is_contiguous", "device", "data_ptr", "element_size")
    if not all(hasattr(keep, a) for a in need):
        return
    where = f"{what} of tensor {tid}"
    if str(keep.dtype) not in ("torch.float32", "float32"):
        raise ValueError(f"{where}: the tensor must be float32, not {keep.dtype}")
    if getattr(keep.device, "type", str(keep.device)) != "cpu":
        raise ValueError(f"{where}: the tensor must be in CPU memory, not on {keep.device}")
    if not keep.is_contiguous():
        raise ValueError(f"{where}: the tensor must be contiguous (a strided view would be "
                         "read or written as if it were not)")
    base, size = keep.data_ptr(), keep.numel() * keep.element_size()
    if not base <= addr <= base + size - 4 * n:
        raise ValueError(f"{where}: {n} float32s at {addr:#x} do not fit the tensor "
                         f"({keep.numel()} values at {base:#x})")


class Op:
    """A push or pull in flight: wait() once. Keeps the buffer it reads or writes alive (and,
    for an object with the buffer protocol, unresizable) until then. One dropped without a
    wait keeps them until the client's next push of that tensor waits for it (a push
    dropped so), or until close()."""

    __slots__ = ("_client", "_op", "_keep", "_tid", "_push", "done")

    def __init__(self, client, op, keep, tid, push):
        self._client, self._op, self._keep, self.done = client, op, keep, False
        self._tid, self._push = tid, push

    def wait(self):
        """Wait for it; returns the lowest chunk version (pulls). Raises PsError on failure."""
        if self.done:
            raise ValueError("this operation was waited for already")
        v = ctypes.c_uint64(0)
        wait, ref = library().ps_op_wait, ctypes.byref(v)  # nothing to interrupt in between

        def call(h):
            self.done = True
            return wait(self._op, ref)
        try:
            self._client._do(call)  # its client closed: the operation went with it
        finally:
            if self.done:  # else not waited (an exception before the call): kept for __del__
                self._keep = None
        return v.value

    def __del__(self):
        c = getattr(self, "_client", None)
        if c is not None and not self.done:
            self.done = True
            c._orphan(self._op, self._keep, self._tid, self._push)


_NOT_WAITED = -(1 << 30)  # an Ops status libps never writes


class Ops:
    """The pushes or pulls of one push_many / pull_many call: wait() once for all of them.
    Keeps their buffers alive until then; dropped unwaited, each is kept as an Op would be."""

    __slots__ = ("_client", "_ops", "_keep", "_tids", "_push", "done", "_st")

    def __init__(self, client, ops, keep, tids, push):
        self._client, self._ops, self._keep, self.done = client, ops, keep, False
        self._tids, self._push = tids, push
        # Each op's status as libps wrote it: set before an exception a signal handler raises
        # on the call's return could reach the caller (acked).
        self._st = (ctypes.c_int * len(tids))(*([_NOT_WAITED] * len(tids)))

    @property
    def acked(self):
        """Whether every operation was waited for and succeeded, also when wait() raised
        afterwards (a KeyboardInterrupt on its return)."""
        return self.done and all(s == 0 for s in self._st)

    def wait(self):
        """Wait for every one; returns their lowest chunk versions (a list, pulls). Raises
        PsError with the first failure, after every one was waited for."""
        if self.done:
            raise ValueError("these operations were waited for already")
        n = len(self._tids)
        v = (ctypes.c_uint64 * n)()
        wait = library().ps_op_wait_many

        def call(h):
            self.done = True
            return wait(n, self._ops, v, self._st)
        try:
            self._client._do(call)
        finally:
            if self.done:  # as Op.wait
                self._keep = None
        return list(v)

    def __del__(self):
        c = getattr(self, "_client", None)
        if c is not None and not self.done:
            self.done = True
            for i, op in enumerate(self._ops):
                if op:
                    c._orphan(op, self._keep, self._tids[i], self._push)


class _Entry:
    """A client as _CtrlC knows it: the cancel flag of its join, its handle once made."""

    __slots__ = ("flag", "handle", "busy")

    def __init__(self, busy):
        self.flag = ctypes.c_int(0)  # ps_client_opts_t.cancel (a sig_atomic_t)
        self.handle = None
        self.busy = busy  # whether a call of it is running (the join counts)


class _CtrlC:
    """Ctrl-C while a libps call blocks. Python runs its SIGINT handler only between bytecodes,
    never inside a C call, so a worker waiting on a stalled cluster would not stop. Python's own
    C-level handler writes the signal's number to the wakeup fd at once: a thread reading it
    sets the cancel flag of every client of this process that is joining and interrupts every
    one with a call running (ps_client_interrupt, safe at any time); the blocked calls return,
    and Python raises KeyboardInterrupt. A client not inside a call is left alone (a
    KeyboardInterrupt caught in Python code leaves it usable), and so is everything while the
    program has a SIGINT handler of its own ("finish this batch first"). One reader per process,
    installed by the first client made in the main thread under Python's default SIGINT handler
    and no wakeup fd of someone else's (asyncio's), given back when the last client closes."""

    lock = threading.RLock()  # the entries, and an interrupt against close()'s destroy (a
    # client collected while the reader holds it closes in that thread: reentrant)
    entries = set()
    _r = _w = None
    pinned = False  # catch_ctrl_c(): installed for the process's life

    @classmethod
    def register(cls, busy):
        e = _Entry(busy)
        with cls.lock:
            cls.entries.add(e)
        cls._install()
        return e

    @classmethod
    def unregister(cls, e):
        with cls.lock:
            cls.entries.discard(e)
            e.handle = None
            last = not cls.entries
        if last:
            cls._uninstall()

    @classmethod
    def _install(cls):
        if (cls._w is not None or threading.current_thread() is not threading.main_thread() or
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
        cls._r, cls._w = r, w
        threading.Thread(target=cls._run, args=(r,), name="psd-ctrl-c", daemon=True).start()

    @classmethod
    def _run(cls, r):
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                data = b""
            if not data:  # _uninstall closed the other end
                os.close(r)
                return
            if signal.SIGINT not in data or \
                    signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                continue
            with cls.lock:
                for e in tuple(cls.entries):
                    if e.busy():
                        e.flag.value = 1
                        if e.handle:
                            library().ps_client_interrupt(e.handle)

    @classmethod
    def after_fork_in_child(cls):
        """A forked child's SIGINT must not reach the parent's reader through the inherited
        wakeup fd, and the parent's clients are not the child's: forget both."""
        cls.lock = threading.RLock()
        cls.entries = set()
        cls.pinned = False
        if cls._w is None:
            return
        try:
            cur = signal.set_wakeup_fd(-1)
            if cur != cls._w:  # not ours (set since): theirs stays
                signal.set_wakeup_fd(cur)
        except ValueError:  # not the main thread
            pass
        for fd in (cls._r, cls._w):
            try:
                os.close(fd)
            except OSError:
                pass
        cls._r = cls._w = None

    @classmethod
    def _uninstall(cls):
        """Give the wakeup fd back (main thread only: elsewhere it stays until exit)."""
        if cls._w is None or cls.pinned or \
                threading.current_thread() is not threading.main_thread():
            return
        cur = signal.set_wakeup_fd(-1)
        if cur != cls._w:  # someone set theirs since: theirs stays
            signal.set_wakeup_fd(cur)
        os.close(cls._w)  # the thread reads the end of the pipe and ends
        cls._w = None


os.register_at_fork(after_in_child=_CtrlC.after_fork_in_child)


def catch_ctrl_c():
    """Make Ctrl-C stop the blocked calls of every client of this process from now on, also
    those made in other threads (a thread per ParameterServer). Python lets only the main
    thread set up what reads the signal, so a client made in the main thread does it for
    itself, and one made in another thread cannot: call this from the main thread before the
    threads make theirs. Their interrupted calls raise PsError ECANCELED, the main thread gets
    KeyboardInterrupt, and the process can end (before, it waited on the blocked threads).
    Does nothing while the program has a SIGINT handler of its own, or another wakeup fd (an
    asyncio loop's). Returns whether Ctrl-C is caught."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("psd.catch_ctrl_c() belongs to the main thread")
    _CtrlC.pinned = True
    _CtrlC._install()
    return _CtrlC._w is not None

# This process's id, as _call compares it with a client's on every call (os.getpid() is a
# system call each time: ~7% of a small push's time in Python).
_my_pid = os.getpid()


def _forked():
    global _my_pid
    _my_pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class Client:
    """One libps client: joins the cluster of `manifest` (blocking; retries unreachable shards
    for `connect_timeout_ms`, by default the manifest's job.reconnect_timeout_ms), leaves at
    close(). Ctrl-C stops a call that blocks (_CtrlC):
    KeyboardInterrupt, and the client is then good only for close(); so does interrupt(), from
    any thread. Other calls come from one thread at a time (libps's rule, ps_client.h), except
    close(), which may come from another one: it interrupts the calls running first and waits
    for them. A process forked from the one that made it cannot use it (its thread stayed in
    the parent): there close() only forgets it."""

    def __init__(self, manifest, connect_timeout_ms=None):
        lib = library()
        opts = _Opts()
        if connect_timeout_ms is not None:
            ms = _uint("connect_timeout_ms", connect_timeout_ms, 32)
            opts.field_mask, opts.connect_timeout_ms = 1, ms
        self._h = None
        self._pid = os.getpid()
        self._cv = threading.Condition()
        self._calls = 1  # the join: Ctrl-C cancels it
        self._holders = {}  # thread id -> calls it runs (close() must not wait for its own)
        self._driver = None  # the thread inside a call that libps takes from one at a time
        self._driven = 0  # and how many such calls it runs (nested)
        self._destroy_at_exit = False  # close() came inside a call: the last call's end destroys
        self._closing = False
        self._orphans = []  # (op, keep, tid, push) of Ops dropped unwaited (Op.__del__)
        self._destroyed = False
        self._numel = {}  # tensor id -> values, of the declarations made here
        self._own = {}  # tensor id -> whether declare(values=) created all of it
        self._order = None  # next_batch: (samples, pass, that pass's order)
        me = weakref.ref(self)  # not self: the entry must not keep it from its __del__

        def busy():
            c = me()
            return c is not None and c._calls > 0
        self._entry = _CtrlC.register(busy)
        opts.field_mask |= 2  # PS_CLIENT_OPT_CANCEL
        opts.cancel = ctypes.addressof(self._entry.flag)
        err = ctypes.create_string_buffer(1024)
        h = ctypes.c_void_p()
        try:  # a Ctrl-C lands as the call returns: the wakeup fd goes back whatever happens
            rc = lib.ps_client_create(os.fsencode(manifest), ctypes.byref(opts), ctypes.byref(h),
                                      err, len(err))
            _check(rc, err.value.decode(errors="replace"))
        except BaseException:
            if h:
                lib.ps_client_destroy(h)
            _CtrlC.unregister(self._entry)
            raise
        finally:
            self._calls = 0
        self._h = h
        with _CtrlC.lock:
            self._entry.handle = h
        job = _JobInfo()
        lib.ps_client_job(h, ctypes.byref(job))
        self.consistency = CONSISTENCY[job.consistency]
        self.seed, self.batch_size = job.seed, job.batch_size
        self.epochs, self.max_steps = job.epochs, job.max_steps
        self.workers_wanted = job.workers

    @contextlib.contextmanager
    def _call(self, shared=False):
        """The libps handle for one call, counted while it runs (close() waits for it);
        PsError EINVAL once close()d, or in a forked child (libps takes its pointers as given).
        Unless `shared` (a read of the client's state), PsError EBUSY while another thread is
        inside such a call: libps takes one thread at a time per client (ps_client.h), and two
        at once shared its held group and its control request (a probe, session 46: a second
        thread's next_batch sent a group the first was still adding to)."""
        with self._cv:
            if not self._h or self._closing:
                raise PsError(-errno.EINVAL, "EINVAL", "the client is closed")
            if self._pid != _my_pid:
                raise PsError(-errno.EINVAL, "EINVAL", f"the client belongs to process "
                              f"{self._pid}, which this one was forked from (a client is "
                              "made here only when none was open at the fork: close them "
                              "first, or start this process with multiprocessing's 'spawn' or "
                              "'forkserver')")
            tid = threading.get_ident()
            if not shared:
                if self._driver not in (None, tid):
                    raise PsError(-errno.EBUSY, "EBUSY", "another thread is inside a call on "
                                  "this client: one thread at a time drives a client (a "
                                  "ParameterServer is driven by one thread; give each thread "
                                  "its own, or hand the calls to one); close() and interrupt() "
                                  "may come from any")
                self._driver = tid
                self._driven += 1
            # This thread's hold first: a close() from a signal handler that runs on this thread
            # between the two counts then sees the call as this thread's own (before, it waited
            # for it, on itself, for good; a review, session 71).
            self._holders[tid] = self._holders.get(tid, 0) + 1
            self._calls += 1
            h = self._h
        try:
            if not h:  # freed by such a close() before the hold was counted
                raise PsError(-errno.EINVAL, "EINVAL", "the client is closed")
            yield h
        finally:
            with self._cv:
                if not shared:
                    self._driven -= 1
                    if self._driven == 0:
                        self._driver = None
                self._calls -= 1
                if self._holders[tid] == 1:
                    del self._holders[tid]
                else:
                    self._holders[tid] -= 1
                if self._calls == 0 and self._closing:  # only close() waits on it
                    self._cv.notify_all()
                last = self._calls == 0 and self._destroy_at_exit
                if last:
                    self._h, self._destroy_at_exit = None, False
            if last:
                self._destroy(h)

    def _do(self, fn, *args):
        """fn(handle, *args) as one call; PsError with the client's reason when it fails."""
        with self._call() as h:
            rc = fn(h, *args)
            text = library().ps_client_error(h).decode(errors="replace") if rc else ""
        _check(rc, text)

    def error(self):
        with self._call() as h:  # the calling thread's last error: not beside another's call
            return library().ps_client_error(h).decode(errors="replace")

    @property
    def rank(self):
        with self._call(shared=True) as h:
            return library().ps_client_rank(h)

    @property
    def workers(self):
        with self._call(shared=True) as h:
            return library().ps_client_workers(h)

    @property
    def shards(self):
        with self._call(shared=True) as h:
            return library().ps_client_shards(h)

    @property
    def nonfinite_pushes(self):
        """Chunk pushes of this client that a shard left out of its update because the
        gradient held a NaN or an infinity (under bsp counted as a push without a gradient,
        under asp / ssp as an update that changed nothing); 0 against an older psd."""
        with self._call(shared=True) as h:
            return library().ps_client_nonfinite_pushes(h)

    def declare(self, name, shape, init="zeros", init_arg=0.0, seed=0, total_steps=0,
                compress=True, values=None, mean=False):
        """Declare tensor `name` of `shape` (1 to 4 dimensions) on the shards, initialized there
        (init: zeros, normal (std init_arg), uniform (a = init_arg), xavier, constant (every
        value init_arg)); returns its id. values: instead, the address of its float32 values
        (contiguous, all finite, read during the call only) for the shards where this
        declaration creates it: a model's own weights; a tensor that exists keeps its own
        (ps_client_declare_values; own(tid) says whether all of it came from these values).
        mean: after each step the tensor holds the mean of the members' pushes of it, no
        optimizer (PS_TENSOR_MEAN: a BatchNorm's running statistics; under asp / ssp each push
        is applied alone, so it holds the last one); its pushes are never compressed.
        total_steps: the planned steps, the length of a
        cosine schedule without optimizer.decay_steps (0: such a schedule never decays).
        compress: its pushes (and pulls) use the manifest's job.compression for its name and
        size, as psworker's do; False: float32 (set_compression changes it later)."""
        if not isinstance(name, str) or "\0" in name or not name:
            raise ValueError(f"tensor name {name!r}: a non-empty str without NUL bytes")
        shape = tuple(_uint(f"tensor {name}: dimension {i}", s, 32, 1)
                      for i, s in enumerate(shape)) or (1,)
        if not 1 <= len(shape) <= 4:
            raise ValueError(f"tensor {name}: {len(shape)} dimensions (psd holds 1 to 4)")
        if init not in _INITS:
            raise ValueError(f"tensor {name}: init {init!r} is not one of {sorted(_INITS)}")
        arg = float(init_arg)
        if not abs(arg) <= 3.4028234663852886e38:  # NaN too
            raise ValueError(f"tensor {name}: init_arg {init_arg!r} is not a finite float32")
        d = _Desc(name=name.encode(), ndim=len(shape),
                  init=_INITS[init] | (_TENSOR_MEAN if mean else 0), init_arg=arg,
                  seed=_uint(f"tensor {name}: seed", seed, 64),
                  total_steps=_uint(f"tensor {name}: total_steps", total_steps, 64))
        for i, s in enumerate(shape):
            d.shape[i] = s
        tid = ctypes.c_uint32()
        if values is None:
            self._do(library().ps_client_declare, ctypes.byref(d), ctypes.byref(tid))
        else:
            own = ctypes.c_int(0)
            self._do(library().ps_client_declare_values, ctypes.byref(d),
                     _uint(f"tensor {name}: values address", values, 64, 1), ctypes.byref(tid),
                     ctypes.byref(own))
            self._own[tid.value] = bool(own.value)
        n = 1
        for s in shape:
            n *= s
        self._numel[tid.value] = n  # declared, whatever the compression call says
        if compress and not mean:  # a mean tensor's pushes are values: never compressed
            if self._orphans:  # as set_compression: dropped pushes would hold it busy
                with self._call():
                    self._reap(tid.value)
            self._do(library().ps_client_use_job_compression, tid.value, name.encode())
        return tid.value

    def set_compression(self, tid, codec="none", error_feedback=True, pull=None, block=None,
                        stochastic=False, fp16_values=False):
        """Compress tensor `tid`'s pushes with `codec` ("none", "fp16", "bf16", "int8", "sign",
        "topk:F", "randomk:F"), keeping what it dropped for the next push with
        `error_feedback`, and its pulls with `pull` (None, "fp16" or "bf16"); `block`: int8 and
        sign values per scale (None: 256); `stochastic`: int8 rounding; `fp16_values`: topk and
        randomk values. Only between operations on the tensor (PsError EBUSY otherwise). A mean
        tensor (declare(mean=True): its pushes are values) travels raw, fp16 or bf16, without
        error feedback (PsError EINVAL otherwise)."""
        c = _Compression(field_mask=2 | 4, codec=str(codec).encode(),
                         error_feedback=int(bool(error_feedback)),
                         pull=None if pull is None else str(pull).encode(),
                         stochastic=int(bool(stochastic)), fp16_values=int(bool(fp16_values)))
        if block is not None:
            c.field_mask |= 1
            c.block = _uint("block", block, 32)
        tid = _uint("tensor id", tid, 32)
        if self._orphans:  # pushes dropped unwaited held the tensor busy (EBUSY) until the
            with self._call():  # next push (a review, session 71): waited for here
                self._reap(tid)
        self._do(library().ps_client_set_compression, tid, ctypes.byref(c))

    def _pin(self, what, tid, addr, keep, write):
        """Checks a push's or pull's tensor and buffer; returns what the Op keeps: for `keep`
        with the buffer protocol a memoryview of it (an array or numpy array cannot be
        resized or freed under the operation then), checked to hold the tensor's float32s at
        `addr`; `keep` itself otherwise."""
        tid = _uint(f"{what}: tensor id", tid, 32)
        n = self._numel.get(tid)
        if n is None:
            raise ValueError(f"{what}: tensor {tid} was not declared by this client")
        if keep is None:
            return None
        try:
            mv = memoryview(keep)
        except TypeError:
            _check_tensor_like(what, tid, n, addr, keep, write)
            return keep
        if not mv.c_contiguous or mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
            raise ValueError(f"{what} of tensor {tid}: the buffer must be contiguous float32 "
                             f"(format {mv.format!r}, itemsize {mv.itemsize})")
        if write and mv.readonly:
            raise ValueError(f"{what} of tensor {tid}: the buffer is read-only")
        # A read-only one too (bytes, a read-only numpy array): before, only its size was
        # checked, and any address passed (libps read memory `keep` does not hold; a review,
        # session 71).
        base = _buffer_address(mv) if mv.nbytes else 0
        if not base <= addr <= base + mv.nbytes - 4 * n:
            raise ValueError(f"{what} of tensor {tid}: {n} float32s at {addr:#x} do not "
                             f"fit the buffer ({mv.nbytes} bytes at {base:#x})")
        return mv

    def _orphan(self, op, keep, tid, push):
        """An Op dropped unwaited (Op.__del__, or lost to a KeyboardInterrupt): kept with its
        buffer until _reap or close(). A list append: no lock that a collection could wait on."""
        if not self._destroyed:
            self._orphans.append((op, keep, tid, push))

    def _reap(self, tid):
        """Wait for the pushes of tensor `tid` dropped unwaited: until then libps counts the
        tensor busy (EBUSY). Others stay (a pull may wait on a step this thread makes)."""
        for entry in [o for o in self._orphans if o[2] == tid and o[3]]:
            # Out of the list first: an exception between the two (a signal handler's) leaves
            # an op never waited for, not one waited for twice (which libps forbids).
            self._orphans.remove(entry)
            library().ps_op_wait(entry[0], None)

    def _data_op(self, fn, what, tid, addr, step, keep, write):
        """fn(handle, tid, [addr,] step, &op): addr is left out for push_none (what)."""
        keep = self._pin(what, tid, addr, keep, write)
        step = _uint(f"{what}: step", step, 64)
        push = what != "pull"
        op, made = ctypes.c_void_p(), None
        try:
            if push and self._orphans:
                with self._call():
                    self._reap(tid)
            self._do(fn, *((tid, step) if what == "push_none" else (tid, addr, step)),
                     ctypes.byref(op))
            made = Op(self, op, keep, tid, push)
            return made
        finally:
            if made is None and op.value:  # a KeyboardInterrupt right after the call
                self._orphan(op, keep, tid, push)

    def push(self, tid, addr, step, keep=None):
        """Push the gradient at address `addr` (the tensor's numel float32s) for `step`; `keep`
        (the object owning that memory) is held until the returned Op is waited for."""
        return self._data_op(library().ps_client_push, "push", tid, addr, step, keep, False)

    def push_none(self, tid, step):
        """bsp: this worker has no gradient of `tid` for `step` (ps_client_push_none): counted
        as its push, a zero in the mean; a step in which no member had one leaves the tensor's
        parameters and optimizer state as they are. Returns an Op."""
        return self._data_op(library().ps_client_push_none, "push_none", tid, None, step, None,
                             False)

    def pull(self, tid, addr, min_version, keep=None):
        """Pull the parameters into address `addr` once every chunk reached `min_version`."""
        return self._data_op(library().ps_client_pull, "pull", tid, addr, min_version, keep,
                             True)

    def own(self, tid):
        """Whether every chunk of tensor `tid` was created from the values this client
        declared it with (False: the shards held some or all of it: another worker's values,
        or a store's; None: declared without values)."""
        return self._own.get(tid)

    def give_up(self):
        """Give up the tensors this client declared (ps_client_give_up): each that no other
        worker declared and no push reached is dropped from the shards. For a worker that
        stops before training: what its declarations created does not stay behind."""
        with self._call() as h:
            library().ps_client_give_up(h)

    def push_many(self, items, step):
        """Push several tensors' gradients for `step` in one call (ps_client_push_many, fused
        as a group): `items` is [(tid, address or None, keep)], None a push_none (bsp). Returns
        an Ops to wait for. Checks as push() does."""
        return self._many(library().ps_client_push_many, "push", items, step, False)

    def pull_many(self, items, min_version):
        """Pull several tensors in one call (ps_client_pull_many): `items` is [(tid, address,
        keep)]. Returns an Ops to wait for. Checks as pull() does."""
        return self._many(library().ps_client_pull_many, "pull", items, min_version, True)

    def _push_many_checked(self, items, step):
        """push_many for psd.torch: `items` as push_many's, each `keep` a contiguous float32 CPU
        torch tensor holding its declared tensor's values at its `address` (or None for a
        push_none), as psd.torch checks them itself (`_checked`, `_held_buffers`, `_staged`):
        push_many's per-item checks (~6 us a tensor) are left out."""
        return self._many(library().ps_client_push_many, "push", items, step, False, True)

    def _pull_many_checked(self, items, min_version):
        """pull_many for psd.torch, on the terms of _push_many_checked."""
        return self._many(library().ps_client_pull_many, "pull", items, min_version, True, True)

    def _many(self, fn, what, items, step, write, checked=False):
        n = len(items)
        ops = (ctypes.c_void_p * n)()
        if checked:  # the caller's: ids declared here, each address inside its `keep`
            ids = (ctypes.c_uint32 * n)(*[tid for tid, _, _ in items])
            addrs = (ctypes.c_void_p * n)(*[addr for _, addr, _ in items])
            keep = [k for _, _, k in items]
        else:
            ids, addrs, keep = (ctypes.c_uint32 * n)(), (ctypes.c_void_p * n)(), []
            for i, (tid, addr, k) in enumerate(items):
                if addr is None and what != "push":
                    raise ValueError(f"{what} of tensor {tid}: the address is None")
                keep.append(self._pin(what, tid, addr or 0, k, write) if addr is not None
                            else None)
                ids[i] = _uint(f"{what}: tensor id", tid, 32)
                addrs[i] = None if addr is None else _uint(f"{what}: address", addr, 64, 1)
        step = _uint(f"{what}: step", step, 64)
        push = what == "push"
        if push and self._orphans:
            with self._call():
                for tid in set(ids):
                    self._reap(tid)
        made = None
        try:
            self._do(fn, n, ids, addrs, step, ops)
            made = Ops(self, ops, keep, list(ids), push)
            return made
        finally:
            if made is None:  # refused part-way, or a KeyboardInterrupt: those made still run
                for i in range(n):
                    if ops[i]:
                        self._orphan(ops[i], keep, ids[i], push)

    def group_begin(self):
        with self._call() as h:
            library().ps_client_group_begin(h)

    def group_end(self):
        with self._call() as h:
            library().ps_client_group_end(h)

    def next_batch(self, samples, done=None):
        """The next batch for a training set of `samples` (blocking until this worker's turn),
        reporting `done` (the previous Batch, all its pushes acknowledged). None when the job is
        finished (`final_step` then holds its step)."""
        out = _BatchInfo()
        n = _uint("samples", samples, 64, 1)
        d = ctypes.byref(done._info) if done is not None else None
        # One thread at a time (_call): a second thread's request beside the first waited
        # for good (a probe, session 45: two threads over one ParameterServer hung one run in
        # five).
        self._do(library().ps_client_next_batch, n, d, ctypes.byref(out))
        if out.finished:
            self.final_step = out.step
            return None
        # Its samples, from the pass's order (kept for the pass). Before, only psd.torch filled
        # them in: len() and iter() of a Client's batch raised TypeError (a review, session 71).
        if self._order is None or self._order[:2] != (n, out.pass_):
            self._order = (n, out.pass_, batch_order(n, self.seed, out.pass_))
        return Batch(out, self._order[2][out.offset:out.offset + out.count].tolist())

    def batch_done(self, b):
        with self._call() as h:
            library().ps_client_batch_done(h, ctypes.byref(b._info))

    def report_done(self, samples, b):
        """Tell the coordinator now that Batch `b` is done (all its pushes acknowledged), without
        asking for the next one (ps_client_report_done): under asp / ssp a checkpoint, and ssp's
        members ahead, then wait for nothing more of it while this worker does something else
        (evaluates, saves). The next next_batch(samples, b) and the leave leave it out."""
        n = _uint("samples", samples, 64, 1)
        self._do(library().ps_client_report_done, n, ctypes.byref(b._info))

    def interrupt(self):
        """Fail every call running or started later with PsError ECANCELED (ps_client_interrupt),
        from any thread, e.g. a watchdog's; the client is then good only for close()."""
        with _CtrlC.lock:
            if self._entry.handle and self._pid == os.getpid():
                library().ps_client_interrupt(self._entry.handle)

    def close(self):
        """Leave the cluster and free the client. Calls running in other threads are
        interrupted first (they raise PsError ECANCELED) and waited for; Ops not waited for
        end with it. From a signal handler that runs while this thread is inside a call (a
        SIGTERM handler that closes and exits): the calls are interrupted, and the client is
        freed as this thread's call ends (it could not be waited for here)."""
        with self._cv:
            h = self._h
            if not h or self._closing:
                return
            if self._pid != os.getpid():  # a forked child: the client is the parent's
                self._h = None
                return
            self._closing = True
            mine = self._holders.get(threading.get_ident(), 0)
            try:
                if self._calls:
                    library().ps_client_interrupt(h)
                    while self._calls > mine:
                        self._cv.wait()
            except BaseException:  # Ctrl-C meanwhile: a later close() tries again
                self._closing = False
                raise
            if mine:  # the handle is still in use below us: _call's end destroys it
                self._destroy_at_exit = True
                return
            self._h = None
        self._destroy(h)

    def _destroy(self, h):
        """Free libps's client `h` (this client's, taken out of self._h by the caller)."""
        _CtrlC.unregister(self._entry)  # no interrupt of h from here on
        try:
            library().ps_client_destroy(h)
        finally:
            self._destroyed = True  # an Op dropped from here on holds nothing libps uses
            self._orphans.clear()  # their operations ended with the client

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()
