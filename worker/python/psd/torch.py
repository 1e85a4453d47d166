"""Train a torch.nn.Module on psd: the shards hold its parameters and run the optimizer.

    import psd.torch
    ps = psd.torch.ParameterServer("deploy/local/demo.yaml", model, samples=len(dataset))
    for batch in ps.batches():                        # the coordinator's batches for this worker
        x, y = inputs[batch.indices], targets[batch.indices]
        model.zero_grad()
        loss_fn(model(x), y).backward()
        ps.step()                                     # push the gradients; applied on the shards
    ps.close()                                        # the final parameters are in the model

Each trainable parameter (requires_grad) becomes a tensor named as in model.named_parameters(),
declared on the shards (the first worker's declaration creates it, from the values its model
holds: a pretrained model trains on from its weights, as DistributedDataParallel broadcasts
rank 0's; a store that holds the tensor already keeps its own, so a restarted job resumes;
`init` lets the shards initialize them instead) and pulled into the model
before each batch (under bsp the parameters of that batch's step). The manifest's job says the
optimizer, the consistency, the batch size and the passes; the learning-rate schedule runs over
the steps job.workers workers take for `samples` samples (as psworker's). CPU float32
contiguous parameters are pulled into and pushed from in place; others (CUDA, other dtypes) go
through a float32 copy on the host.
"""
import errno
import math
import operator
import os
import sys
import threading
import warnings
import weakref

import torch

import psd


def _unwrapped(model):
    """The module a wrapper runs: nn.DataParallel's and DistributedDataParallel's `.module`,
    torch.compile's `._orig_mod` (told by type, not by a name's prefix: a model may have a
    submodule of its own called "module"). Its parameter names are the shards': a wrapped
    worker and a plain one hold the same tensors."""
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and \
                isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


# id(module) -> a weak reference to the ParameterServer open on it in this process: a second
# one on the same module would be a second member of the job whose steps wait for the first
# one's pushes (it hung). By id, not by the module (it may not be hashable); one dropped
# without close() stops counting when it is collected.
_open = {}
# (thread id, the job's cluster name) -> weakref of the open ParameterServer that thread
# drives: two members of one job driven by one thread wait for each other at the first step.
_driven = {}


def _check_init(name, kind, arg, p):
    """Refuse init `(kind, arg)` for parameter `name` (`p`) that the shards cannot make as asked:
    the error names the parameter (a probe, session 66: an arg of None raised a bare TypeError,
    xavier's arg was ignored, and xavier took a bias). psd's xavier takes the first dimension
    for fan_in and the product of the others for fan_out, which is torch's on 2 dimensions only
    (README)."""
    if kind not in psd._INITS:
        raise ValueError(f"init[{name!r}]: kind {kind!r} is not one of {sorted(psd._INITS)}")
    try:
        value = float(arg)  # as Client.declare takes it (a 0-dim tensor, a numpy scalar...)
    except (TypeError, ValueError):
        value = math.nan
    if not abs(value) <= 3.4028234663852886e38:  # NaN too
        raise ValueError(f"init[{name!r}]: arg {arg!r} is not a finite number")
    arg = value
    if kind in ("normal", "uniform") and arg < 0:
        raise ValueError(f"init[{name!r}]: {kind} takes a {'std' if kind == 'normal' else 'bound'}"
                         f" of 0 or more, not {arg!r}")
    if kind == "xavier" and arg not in (0, 1):
        raise ValueError(f"init[{name!r}]: xavier is xavier_uniform_ with gain 1 (pass 0 or 1), "
                         f"not {arg!r}: for another gain g, ('uniform', g * sqrt(6 / (fan_in + "
                         "fan_out)))")
    if kind == "xavier" and p.dim() < 2:
        raise ValueError(f"init[{name!r}]: xavier needs 2 or more dimensions (fans), as torch's "
                         f"does; this parameter has {p.dim()}")


def _refuse_second_driven(driver, ps, holding=False):
    """Refuse `ps` to the thread and job of `driver` when that thread drives another open
    ParameterServer of the job already (`holding`: one that holds a batch not stepped yet)."""
    ref = _driven.get(driver)
    other = ref() if ref else None
    if other is None or other is ps or not other._client_open():
        return
    if not holding or (other._batch is not None and not other._stepped):
        raise ValueError("this thread already drives an open ParameterServer of this "
                         "manifest's job: a second one would be a second member, and each "
                         "one's steps would wait for the other's in this same thread (for "
                         "several models, such as a GAN's two, make one ParameterServer of "
                         "a module holding both, e.g. nn.ModuleDict, and step it once; or "
                         "drive each member from its own thread or process)")


def _job_of(manifest):
    """The job of `manifest`: its cluster name as libps reads it, or the file's real path for
    one libps refuses (the join then says why). By path alone, a copy of the manifest made a
    second member in the same thread, and both waited for each other for good (a helper's
    probe, session 48)."""
    try:
        return "cluster " + psd.manifest_cluster(manifest)
    except psd.PsError:
        return "path " + os.path.realpath(manifest)


def _span(p):
    """(device, first byte address, end byte address) of the memory parameter `p`'s elements
    lie in."""
    size = p.element_size()
    last = sum((n - 1) * st for n, st in zip(p.shape, p.stride())) * size
    return (str(p.device), p.data_ptr(), p.data_ptr() + last + size)


def _bytes_of(mask, base, p):
    """The bytes of `mask` (one bool per byte from address `base`) that parameter `p`'s
    elements occupy, as a view of it (dimensions of one element or of stride 0 left out, so
    that no byte is in it twice)."""
    size = p.element_size()
    dims = [(n, st * size) for n, st in zip(p.shape, p.stride()) if n > 1 and st != 0]
    return mask.as_strided(tuple(n for n, _ in dims) + (size,),
                           tuple(st for _, st in dims) + (1,), p.data_ptr() - base)


_MASK_MAX = 1 << 30  # bytes: interleaved parameters spread wider than this are not looked into


def _share(p, q, base, end):
    """Whether parameters `p` and `q`, whose byte spans overlap within [base, end), have a byte
    in common: at once when both are contiguous, else through a mask of those bytes."""
    if p.is_contiguous() and q.is_contiguous():
        return True
    if end - base > _MASK_MAX:
        return False
    mask = torch.zeros(end - base, dtype=torch.bool)
    _bytes_of(mask, base, q).fill_(True)
    return bool(_bytes_of(mask, base, p).any())


def _refuse_shared_memory(named):
    """ValueError naming two parameters of `named` ((name, parameter) pairs) that have memory in
    common: two Parameters, not one, as `b.weight.data = a.weight.data` ties them. Each is a
    tensor of its own on the shards and each pull writes its values there, the last one
    winning: one of the two updates was lost at every step (a probe, session 50: 0.24 from
    torch's SGD on the same batches, without a word). One Parameter held twice
    (`b.weight = a.weight`) is one tensor and trains as torch does; views of one buffer that
    share no element (halves, column blocks, even and odd elements) are taken."""
    spans = sorted(_span(p) + (name,) for name, p in named)
    params = dict(named)
    groups = []  # [end, spans]: runs of spans on one device each overlapping the run before it
    for span in spans:
        if groups and groups[-1][1][0][0] == span[0] and span[1] < groups[-1][0]:
            groups[-1][0] = max(groups[-1][0], span[2])
            groups[-1][1].append(span)
        else:
            groups.append([span[2], [span]])
    for end, g in groups:
        base = g[0][1]
        if len(g) > 2 and end - base <= _MASK_MAX:
            # One mask for the whole run: each parameter's bytes marked in turn, one already
            # marked is shared (then the pair is found below). Pair by pair, K views of one
            # matrix took K^2 masks (400 column views: 5.2 s at the join; a probe).
            mask = torch.zeros(end - base, dtype=torch.bool)
            for _, _, _, name in g:
                view = _bytes_of(mask, base, params[name])
                if bool(view.any()):
                    break
                view.fill_(True)
            else:
                continue
        open_ = []  # (device, start, end, name) of the spans before this one not ended before it
        for dev, start, end, name in g:
            open_ = [o for o in open_ if o[2] > start]
            for _, ostart, oend, other in open_:
                if _share(params[name], params[other], min(start, ostart), max(end, oend)):
                    raise ValueError(f"parameters {other!r} and {name!r} are two Parameters "
                                     "sharing memory (as `b.weight.data = a.weight.data` makes "
                                     "them): each would be a tensor of its own on the shards, "
                                     "and one's update would overwrite the other's at every "
                                     "pull; tie them as one Parameter (`b.weight = a.weight`), "
                                     "or give each its own memory")
            open_.append((dev, start, end, name))


class _ModelChanged(RuntimeError):
    """The model is no longer the one the shards hold (a parameter or buffer changed shape or
    memory, or one was added): step() and pull refuse it; close() leaves without the pull."""


def _trained(p):
    """Whether parameter `p` is held on the shards: trainable, and with values (an empty one,
    which has nothing to train, stays this worker's)."""
    return p.requires_grad and p.numel() > 0


def _statistics(module):
    """[(name, owning module, attribute)] of the running statistics of `module`'s BatchNorm
    (and InstanceNorm with track_running_stats) layers: the buffers psd.torch holds as the
    workers' mean. Other buffers are left alone: constants (position encodings, masks, which
    may hold infinities) are the same on every worker anyway."""
    norm = torch.nn.modules.batchnorm._NormBase
    out = []
    for prefix, m in module.named_modules():
        if not isinstance(m, norm):
            continue
        for attr in ("running_mean", "running_var"):
            b = getattr(m, attr, None)
            if isinstance(b, torch.Tensor) and b.is_floating_point() and b.numel() > 0:
                out.append((f"{prefix}.{attr}" if prefix else attr, m, attr))
    return out


class ParameterServer:
    """`model`'s parameters on the shards of `manifest` for a training set of `samples`; joins
    at creation, leaves at close().

    A parameter the shards do not hold yet starts from the values this worker's model holds
    (the worker whose declaration creates it sends them; a pretrained model keeps its weights).
    init: {parameter name: (kind, arg)} for the shards' initialization (kind: zeros, normal,
    uniform, xavier, constant) of the parameters it names instead; a name the model lacks is
    an error. init="shards": the shards initialize every parameter: as the model made it when
    that is one value for all (constant), else xavier (2 or more dimensions) or zeros (no
    values are sent: a large model joins faster). Names are those of the module a wrapper runs
    (nn.DataParallel's and DistributedDataParallel's `.module`, torch.compile's `._orig_mod`);
    `init` takes either.
    Buffers (BatchNorm's running statistics), frozen parameters and empty ones stay this
    worker's own. One ParameterServer per model at a time in a process, and per job in a
    thread (two would be two members of the job, each step waiting for the other's in that
    same thread: several models, such as a GAN's two, go in one module, e.g. nn.ModuleDict)."""

    def __init__(self, manifest, model, samples, init=None, connect_timeout_ms=None,
                 sync_buffers=True):
        try:
            n = operator.index(samples)  # int, numpy integers; not 0.5 or "128"
        except TypeError:
            n = 0
        if isinstance(samples, bool) or n <= 0 or n >= 2 ** 32:
            # The order's indices are 32-bit (psd.batch_order, ps_batch_order).
            raise ValueError(f"samples must be a whole number, 1 to 2^32 - 1, got {samples!r}")
        self.samples = n
        module = _unwrapped(model)
        held = {id(p): name for name, p in module.named_parameters()}
        alias = {name: held[id(p)] for name, p in model.named_parameters() if id(p) in held}
        alias.update({name: name for name in held.values()})  # the wrapper's names or the module's
        if isinstance(init, str) and init != "shards":
            raise ValueError(f"init {init!r}: \"shards\", or {{parameter name: (kind, arg)}}")
        shards = init == "shards"
        if not shards and init is not None and not isinstance(init, dict):
            raise ValueError(f"init {init!r}: \"shards\", or {{parameter name: (kind, arg)}}")
        init = {} if shards else dict(init or {})
        for k, v in init.items():  # each a (kind, arg) pair (a probe: "too many values to unpack")
            if not (isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[0], str)):
                raise ValueError(f"init[{k!r}] = {v!r}: expected a (kind, arg) pair, e.g. "
                                 "(\"normal\", 0.02) or (\"zeros\", 0)")
        unknown = sorted(k for k in init if k not in alias)
        if unknown:
            raise ValueError(f"init names no parameter of the model: {', '.join(unknown)}")
        params = dict(model.named_parameters())
        params.update(module.named_parameters())
        for k, (kind, arg) in init.items():  # what the shards would do otherwise, unasked
            _check_init(k, kind, arg, params[k])
        if len({alias[k] for k in init}) != len(init):
            raise ValueError("init names a parameter twice (by the wrapper's name and the "
                             "module's)")
        init = "shards" if shards else {alias[k]: v for k, v in init.items()}
        ref = _open.get(id(module))
        other = ref() if ref else None
        if other is not None and other._client_open():  # it holds module: its id is module's
            raise ValueError("this model already has an open ParameterServer in this process: "
                             "a second one would be a second member of the job, whose steps "
                             "wait for both (close the first one, or give each its own model)")
        try:
            optimizer = psd.manifest_optimizer(manifest)
        except psd.PsError:
            optimizer = None  # a manifest libps refuses: the join says why
        if optimizer == "mean":
            # The pulls would return the step's mean gradient, which the model took for its
            # parameters (a probe, session 50: the weights became the last gradient, the loss
            # 5e11 after 16 steps, without a word).
            raise psd.PsError(psd.ECONFIG, "ECONFIG",
                              f"{manifest}: job.optimizer.name mean keeps no model on the "
                              "shards (each step's mean gradient only), so a ParameterServer "
                              "cannot train a model with it; use sgd, momentum, adam, adamw or "
                              "adagrad, or psd.Client with an optimizer of your own")
        self._driver = (threading.get_ident(), _job_of(manifest))
        _refuse_second_driven(self._driver, self)
        trained = []  # (name, parameter) of those held on the shards
        for name, p in module.named_parameters():  # before the join: a refusal costs none
            if not p.requires_grad:
                continue
            if isinstance(p, torch.nn.parameter.UninitializedParameter):
                raise ValueError(f"parameter {name!r} is not materialized yet (a lazy module): "
                                 "run one forward pass before making the ParameterServer")
            if p.numel() == 0:
                continue
            if p.is_complex() or "\0" in name:
                raise ValueError(f"parameter {name!r}: "
                                 + ("complex values" if p.is_complex() else "a NUL in its name")
                                 + " cannot be held on psd's float32 shards")
            if p.layout != torch.strided:  # a sparse parameter (its gradient may be)
                raise ValueError(f"parameter {name!r} is {p.layout} (sparse): psd holds dense "
                                 "parameters; make it dense (a sparse gradient is fine)")
            if any(st == 0 and sz > 1 for st, sz in zip(p.stride(), p.shape)):
                # (torch's own copy into it failed inside the join's pull, naming nothing)
                raise ValueError(f"parameter {name!r} is expanded (a stride of 0: its values "
                                 "share memory), and the shards hold each value of it: make it "
                                 "a tensor of its own (.clone())")
            if p.device.type == "meta":
                raise ValueError(f"parameter {name!r} is on the meta device (no values to "
                                 "pull into): materialize the model first (to_empty)")
            trained.append((name, p))
            if init != "shards" and name not in init and \
                    not bool(torch.isfinite(p.detach()).all()):
                raise ValueError(f"parameter {name!r} holds a NaN or an infinity, and a tensor "
                                 "the shards do not hold yet starts from the model's values: "
                                 "load finite weights first, or let the shards initialize it "
                                 f"(init={{{name!r}: {self._default_init(p, True)!r}}}, or "
                                 "init=\"shards\")")
            if init != "shards" and name not in init and p.dtype != torch.float32 and \
                    not bool(torch.isfinite(p.detach().float()).all()):
                # The shards hold float32: a float64 value past its range (1e39) became an
                # infinity there, refused after the join as "a NaN or an infinity" (a review,
                # session 71).
                raise ValueError(f"parameter {name!r} ({p.dtype}) holds a value beyond float32's "
                                 "range (about 3.4e38), which the shards hold: scale it, or let "
                                 "the shards initialize it (init=\"shards\")")
        if init != "shards":
            # A frozen or empty one stays this worker's own: its init was ignored without a
            # word (a review, session 71).
            held_names = {n for n, _ in trained}
            idle = sorted(k for k in init if k not in held_names)
            if idle:
                raise ValueError(f"init names parameters the shards do not hold (frozen: "
                                 f"requires_grad False, or empty): {', '.join(idle)}")
        if not trained and not (sync_buffers and _statistics(module)):
            # It would take batches and train nothing (a probe, session 62: a whole job ran).
            raise ValueError("the model has no parameter to train (none requires_grad, or all "
                             "are empty) and no running statistics to hold: nothing for the "
                             "shards to keep")
        _refuse_shared_memory(trained)
        self.model, self._module = model, module
        self._manifest, self._connect_timeout_ms, self._init = manifest, connect_timeout_ms, init
        self._sync_buffers = bool(sync_buffers)
        self._buffers = []  # (name, owning module, attribute, id, values) of the held buffers
        self._host = {}  # id -> float32 host copy of a tensor not pushed or pulled in place
        self._done = None  # the last batch stepped and not yet reported by a next_batch
        self._batch = None
        self._stepped = False
        self._nonfinite = 0  # self.client.nonfinite_pushes when step() last looked
        self._removed = None  # why the shards dropped this worker: batches() joins again
        self.final_step = None
        self._got_batch = False  # batches() handed out one (else a finished job is said)
        # BatchNorm's running statistics are held as the mean of the workers' values after
        # each step (sync_buffers); other buffers (constants such as position encodings, the
        # num_batches_tracked counter) and frozen parameters stay each worker's own.
        own = [n for n, p in module.named_parameters() if not p.requires_grad] + \
            ([] if sync_buffers else [n for n, _, _ in _statistics(module)])
        if own:
            warnings.warn(f"psd.torch: {len(own)} frozen parameters or statistics of the model "
                          f"({', '.join(own[:3])}{', ...' if len(own) > 3 else ''}) stay this "
                          "worker's own: the shards hold trainable parameters and BatchNorm's "
                          "running statistics (unless sync_buffers=False), so they may differ "
                          "between workers", stacklevel=2)
        _open[id(module)] = weakref.ref(self)
        _driven[self._driver] = weakref.ref(self)
        try:
            self._join()
        except BaseException:
            self._unregister()
            raise

    def _drive_here(self):
        """The thread asking for a batch drives this member from now on: refused while another
        member of the job that this thread drives holds a batch it has not stepped (its step
        and this one's would wait for each other here). Made in one thread and driven from
        another (made in a thread pool, driven from the main thread), two members escaped the
        check at their making, and the first bsp step waited for good (a probe, session 66).
        Members that take turns on pool threads, each batch stepped before the thread asks for
        another member's, are fine (a review)."""
        driver = (threading.get_ident(), self._driver[1])
        _refuse_second_driven(driver, self, holding=True)  # the one this thread asked for last
        if driver != self._driver:
            ref = _driven.get(self._driver)
            if ref is not None and ref() in (self, None):
                del _driven[self._driver]
            self._driver = driver
        _driven[driver] = weakref.ref(self)

    def _client_open(self):
        c = getattr(self, "client", None)
        return c is not None and bool(c._h)

    def _unregister(self):
        ref = _open.get(id(self._module))
        if ref is not None and ref() in (self, None):
            del _open[id(self._module)]
        ref = _driven.get(self._driver)
        if ref is not None and ref() in (self, None):
            del _driven[self._driver]

    def _join(self, again=False):
        """Join (a new client) and declare every trainable parameter; then pull them. Dropped
        by the shards meanwhile (stopped or paused past job.heartbeat_timeout_ms, or shard 0
        restarted before it saved this member), it joins again, up to 5 times, as psworker
        does (before, a soak found, it raised ENOTMEMBER)."""
        for tries in range(6):
            try:
                return self._join_once(again)
            except psd.PsError as e:
                if e.name != "ENOTMEMBER" or tries == 5:
                    raise
                print(f"psd.torch: removed from the job while joining ({e}); joining again",
                      file=sys.stderr, flush=True)

    def _join_once(self, again):
        """One try of _join."""
        self._layout_seen = None  # set once this join's parameters are declared
        self.client = c = psd.Client(self._manifest, connect_timeout_ms=self._connect_timeout_ms)
        self._nonfinite = 0
        per_step = c.batch_size * max(c.workers_wanted, 1)
        total = (c.epochs * self.samples + per_step - 1) // per_step
        if c.max_steps and c.max_steps < total:
            total = c.max_steps
        self._params = []  # (name, parameter, id, values declared)
        try:
            for name, p in self._module.named_parameters():
                if not _trained(p):
                    continue  # frozen or empty: stays this worker's, never pushed
                spec = None if self._init == "shards" else self._init.get(name)
                shape = self._held_shape(p)
                try:
                    if spec or self._init == "shards":
                        kind, arg = spec or self._default_init(p)
                        tid = c.declare(name, shape, init=kind, init_arg=arg, total_steps=total)
                    else:  # its values, where this declaration creates it
                        v = self._host_f32(p)
                        tid = c.declare(name, shape, values=v.data_ptr(), total_steps=total)
                except psd.PsError as e:  # say which parameter
                    raise psd.PsError(e.code, e.name, f"parameter {name!r}: "
                                      f"{str(e)[len(e.name) + 2:]}") from e
                except ValueError as e:
                    raise ValueError(f"parameter {name!r}: {e}") from e
                self._params.append((name, p, tid, p.numel()))
            self._held_ids = {id(p) for _, p, _, _ in self._params}
            self._where = self._where_now()
            self._layout_seen = self._layout()
            self._declare_buffers(c, total)
            # Parameters the shards held already (another worker's model created them, or the
            # store holds trained ones): said when their values differ from this model's.
            held = [] if again else \
                [(name, p, self._digest(p)) for name, p, tid, _ in self._params
                 if c.own(tid) is False]
            self.pull(0)
            held = [name for name, p, d in held if self._digest(p) != d]
            if held:
                warnings.warn(f"{len(held)} of {len(self._params)} parameters ({held[0]!r}"
                              f"{' and others' if len(held) > 1 else ''}) start from the values "
                              "the shards hold, not this model's: another worker's model "
                              "created them first, or the store holds trained ones (a job "
                              "resumes)", stacklevel=3)
        except BaseException:
            try:  # what its declarations created (with this model's values) does not stay
                c.give_up()
            finally:
                c.close()
            raise

    def _declare_buffers(self, c, total):
        """Declare the model's floating-point buffers (BatchNorm's running statistics) as
        tensors whose values are the mean of the workers' pushes after each step
        (PS_TENSOR_MEAN), from this model's values where the declaration creates them. A psd
        older than session 36 refuses such a declaration: then they stay each worker's own."""
        self._buffers = []
        if not self._sync_buffers:
            return
        for name, owner, attr in _statistics(self._module):
            b = getattr(owner, attr)
            v = self._host_f32(b)
            try:
                tid = c.declare(name, self._held_shape(b), values=v.data_ptr(), mean=True, compress=False,
                                total_steps=total)
            except psd.PsError as e:
                # An older psd; or a bsp job past its first step whose store holds no
                # statistics (made before, or with sync_buffers=False): every worker keeps
                # its own then, so the workers' tensor sets still agree.
                old = e.name == "EINVAL" and "unknown initializer" in str(e)
                if old or (e.name == "ECONFLICT" and "holds its tensors already" in str(e)):
                    warnings.warn("psd.torch: the model's running statistics stay each "
                                  "worker's own: " + ("the shards are a psd older than "
                                  "session 36" if old else "this job's store holds none of "
                                  "them (made without them)"), stacklevel=4)
                    self._buffers = []
                    return
                raise psd.PsError(e.code, e.name, f"buffer {name!r}: "
                                  f"{str(e)[len(e.name) + 2:]}") from e
            self._buffers.append((name, owner, attr, tid, b.numel()))

    def _held_buffers(self):
        """[(buffer, id)] of the buffers held: the module's current ones (an assignment replaces
        the object), each of the size declared."""
        out = []
        for name, owner, attr, tid, n in self._buffers:
            b = getattr(owner, attr, None)
            if not isinstance(b, torch.Tensor) or b.numel() != n:
                raise _ModelChanged(f"buffer {name!r} is not the {n} values it was declared "
                                    "with any more: its shape cannot change on psd")
            out.append((b, tid))
        return out

    def _rejoin(self, why):
        """The shards dropped this worker (it was silent past job.heartbeat_timeout_ms: a
        stop, a long pause): join again as a new member, as psworker does. The batch it held
        went to another worker."""
        print(f"psd.torch: rank {self._rank_seen} was removed from the job ({why}); joining "
              "again", file=sys.stderr, flush=True)
        self.client.close()
        self._host = {}
        self._done, self._removed = None, None
        self._join(again=True)

    @staticmethod
    def _digest(p):
        """Two sums of a parameter's values (float64): told apart when they change."""
        with torch.no_grad():
            d = p.detach().double()
            return d.sum().item(), (d * d).sum().item()

    @staticmethod
    def _default_init(p, finite=False):
        """A parameter the model made constant (a norm layer's scale 1, a bias 0) starts so on
        the shards; others xavier (2 or more dimensions) or zeros. `finite`: judged on its
        finite values (the way out named for one holding a NaN: a scale of ones keeps them)."""
        with torch.no_grad():
            flat = p.detach().reshape(-1)
            if finite:
                flat = flat[torch.isfinite(flat)]
            if flat.numel() and bool((flat == flat[0]).all()) and torch.isfinite(flat[0]):
                v = float(flat[0])
                return ("constant", v) if v != 0.0 else ("zeros", 0.0)
        return ("xavier", 0.0) if p.dim() >= 2 else ("zeros", 0.0)

    @property
    def rank(self):
        return self.client.rank

    @staticmethod
    def _in_place(t):
        return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()

    def _host_buf(self, tid, n):
        """The float32 host copy of tensor `tid` (`n` values), made once: a GPU or float64
        model's pushes and pulls go through it (one after the other: step() waits for its
        pushes before the pull) instead of a new host tensor at every step."""
        buf = self._host.get(tid)
        if buf is None or buf.numel() != n:
            # On the CPU whatever torch's default device is (set_default_device("cuda")): libps
            # reads and writes it at its address (_push_many_checked checks nothing).
            buf = self._host[tid] = torch.zeros(n, dtype=torch.float32, device="cpu")
        return buf

    def _staged(self, tid, t):
        """`t`'s values as libps reads them: `t` itself when it is CPU float32 and contiguous,
        else copied into tensor `tid`'s host copy."""
        if self._in_place(t):
            return t
        buf = self._host_buf(tid, t.numel())
        buf.view(t.shape).copy_(t.detach())
        return buf

    @classmethod
    def _host_f32(cls, t):
        """`t`'s values as libps reads them: `t` itself (detached) when it is CPU float32 and
        contiguous, else a float32 copy on the host."""
        v = t.detach()
        return v if cls._in_place(v) else v.to(device="cpu", dtype=torch.float32).contiguous()

    @staticmethod
    def _held_shape(t):
        """`t`'s shape as psd holds it: up to 4 dimensions, a Conv3d weight's last two as one
        (the same fans for xavier: the first dimension, and the product of the others)."""
        shape = tuple(t.shape) or (1,)
        return shape[:3] + (math.prod(shape[3:]),) if len(shape) > 4 else shape

    def _layout(self):
        """What the module's parameters hang on, cheap to compare: each module's parameter and
        submodule dicts with the objects in them, and the parameters not held (frozen at the
        join) with their requires_grad. Equal layouts hold the same parameters."""
        mods = list(self._module.modules())
        return ([(m, m._parameters, tuple(m._parameters.values()), m._modules,
                  tuple(m._modules.values())) for m in mods],
                [p for m in mods for p in m._parameters.values() if p is not None
                 and id(p) not in self._held_ids])

    def _same_layout(self):
        """Whether nothing was added, replaced, removed or unfrozen since _layout() (one pass
        over the modules' dicts with identity compares: named_parameters() took ~2 ms a call
        for 500 parameters)."""
        if self._layout_seen is None:  # a join since: walked
            return False
        mods, loose = self._layout_seen
        is_ = operator.is_
        return all(m._parameters is pd and m._modules is md and  # __init__ again: new dicts
                   len(pd) == len(pv) and all(map(is_, pd.values(), pv)) and
                   len(md) == len(mv) and all(map(is_, md.values(), mv))
                   for m, pd, pv, md, mv in mods) and not any(_trained(p) for p in loose)

    def _checked(self):
        """[(parameter, id)] of every parameter, once each is checked to have the values it was
        declared with (before any is pushed or pulled: a step half pushed would hold the
        others' under bsp): libps reads and writes that many at its address (a `.data`
        replaced with a smaller tensor was written past its end). A trainable parameter the
        shards do not hold (added, replaced or unfrozen after the join) is refused: it would
        train on this worker alone, apart from every other worker's copy; the modules are
        walked for it only when their layout changed (_same_layout)."""
        if not self._same_layout():
            for name, p in self._module.named_parameters():
                if _trained(p) and id(p) not in self._held_ids:
                    raise _ModelChanged(f"parameter {name!r} is not held on psd: it was added, "
                                        "replaced or unfrozen after the ParameterServer was "
                                        "made, and would train on this worker alone; make the "
                                        "ParameterServer once the model has all its trainable "
                                        "parameters (one trained later can be trainable from "
                                        "the start: a parameter without a gradient is left as "
                                        "it is)")
            self._layout_seen = self._layout()  # a change that holds no new trainable one
        moved = False
        for (name, p, tid, n), (shape, addr) in zip(self._params, self._where):
            if p.numel() != n:
                raise _ModelChanged(f"parameter {name!r} has {p.numel()} values now, but was "
                                    f"declared with {n}: its shape cannot change on psd")
            if p.shape != shape:  # the same values read in another shape: not the model's
                raise _ModelChanged(f"parameter {name!r} has shape {tuple(p.shape)} now, but "
                                    f"was declared with {tuple(shape)}: its shape cannot change "
                                    "on psd")
            moved = moved or p.data_ptr() != addr
        if moved:  # a `.data` replaced: two Parameters may share memory now (a helper's probe,
            try:   # session 58: one update was lost at every pull, without a word)
                _refuse_shared_memory([(name, p) for name, p, _, _ in self._params])
            except ValueError as e:
                raise _ModelChanged(str(e)) from None
            self._where = self._where_now()
        return [(p, tid) for _, p, tid, _ in self._params]

    def _where_now(self):
        """(shape, address) of each held parameter, for _checked."""
        return [(p.shape, p.data_ptr()) for _, p, _, _ in self._params]

    def pull(self, min_version):
        """Pull every parameter into the model once its chunks reached `min_version`."""
        items, copies = [], []
        for p, tid in self._checked() + self._held_buffers():
            if self._in_place(p):  # the parameter's memory itself (not p.data: a new object)
                dst = p
            else:
                dst = self._host_buf(tid, p.numel())
                copies.append((p, dst))
            items.append((tid, dst.data_ptr(), dst))
        # One call for all (not one per tensor), without push_many's per-item checks: each
        # `dst` is CPU float32, contiguous and of its declared size (_checked, _held_buffers).
        self.client._pull_many_checked(items, min_version).wait()
        with torch.no_grad():
            for p, host in copies:
                p.copy_(host.view_as(p))

    def batches(self):
        """The batches the coordinator hands this worker: each a psd.Batch whose `indices` (a
        list) name its samples; the model holds the parameters of its step. Call step() once
        per batch. At the end the model holds the final parameters."""
        bsp = self.client.consistency == "bsp"
        while True:
            # The last batch stepped is reported here, also by a later call of batches() (a
            # batch the coordinator never hears of is handed out again: applied twice under
            # asp). Until it answers, this worker holds no other batch.
            self._drive_here()
            try:
                if self._removed:
                    self._rejoin(self._removed)
                self._rank_seen = self.client.rank
                try:
                    b = self.client.next_batch(self.samples, self._done)
                except psd.PsError as e:
                    if e.name == "ECONFIG" and "declare the same tensors" in str(e):
                        held = sorted(n for n, _, _, _ in self._params) + \
                            sorted(n for n, _, _, _, _ in self._buffers)
                        # Either side may be the one without them (sync_buffers=False, or a
                        # worker that syncs them joining one that does not: a probe).
                        stats = " (running statistics included: every worker needs the same " \
                            "sync_buffers)" if self._buffers or _statistics(self._module) else ""
                        raise psd.PsError(e.code, e.name, f"{str(e)[len(e.name) + 2:]}; this "
                                          f"worker's: {', '.join(held[:6])}"
                                          f"{', ...' if len(held) > 6 else ''}{stats}") from e
                    raise
                self._done = None
                if b is None:
                    if not self._got_batch:
                        warnings.warn(f"psd.torch: the job is finished (step "
                                      f"{self.client.final_step}): no batch to train; more "
                                      "passes need a larger job.epochs, or a new job (fresh "
                                      "data_dirs)", stacklevel=2)
                    break
                self.pull(b.step if bsp else 0)
            except psd.PsError as e:
                if e.name != "ENOTMEMBER":
                    raise
                self._removed = str(e)
                continue
            self._batch, self._stepped, self._got_batch = b, False, True
            yield b
            if not self._client_open():  # closed inside the loop: as every call after close
                raise psd.PsError(-errno.EINVAL, "EINVAL", "the client is closed")
            if not self._stepped:
                raise RuntimeError(
                    f"batch of step {b.step}: the next batch was asked for before step() of this "
                    "one; call step() once per batch. A DataLoader with num_workers > 0 takes "
                    "batches ahead from its batch_sampler: make one loader per batch instead "
                    "(DataLoader(Subset(dataset, batch.indices), batch_size=len(batch.indices), "
                    "num_workers=N)); to step over more samples, raise job.batch_size")
        self.final_step = self.client.final_step
        self._batch = None
        self.pull(self.final_step if bsp else 0)

    def step(self):
        """Push every parameter's gradient for the current batch's step and wait until the
        shards applied them; then the batch counts as done even if this worker leaves next
        (under asp / ssp it is reported to shard 0 before this returns; under bsp the next batch
        request or the leave reports it, and if the worker dies before either, the batch goes
        to another worker, whose pushes of it the shards skip as applied).
        A parameter without a gradient (`.grad` None: the batch did not use it) is left out
        as a torch optimizer leaves it: under bsp (where a step waits for every member's
        push) its push says so (push_none), counted as a zero in the mean of the workers'
        gradients, and when no worker had one the shards leave its value and optimizer state
        (momentum, weight decay) as they are; under asp / ssp nothing is pushed.
        Returns True, or False when the shards left part of this step's pushes out because a
        gradient held a NaN or an infinity (warned; as that gradient None under bsp: a loss
        scaler would lower its scale) or dropped this worker meanwhile (the batch goes to
        another worker, unless its report reached shard 0 first: applied once either way)."""
        b = self._batch
        if b is None and not self.client._h:  # closed: PsError EINVAL, as every other call
            raise psd.PsError(-errno.EINVAL, "EINVAL", "the client is closed")
        if b is None or self._stepped:
            raise RuntimeError("step() belongs inside `for batch in ps.batches()`, once a batch")
        grads = []  # every one checked before the first push: half a step would hold bsp
        for p, tid in self._checked():
            g = p.grad
            if g is not None:
                if g.is_sparse:  # nn.Embedding(sparse=True): pushed dense
                    g = g.detach().to_dense()
                g = self._staged(tid, g)  # where it is when it can be (no detach)
                if g.numel() != p.numel():
                    raise RuntimeError(f"a gradient of {g.numel()} values for a parameter of "
                                       f"{p.numel()}")
            grads.append((tid, g))
        removed = None
        bsp = self.client.consistency == "bsp"
        # One call for all (fused as a group: the small gradients travel together); None: a
        # push_none, under bsp only.
        items = [(tid, None if g is None else g.data_ptr(), g) for tid, g in grads
                 if g is not None or bsp]
        for buf, tid in self._held_buffers():  # their values: the shards keep the mean
            v = self._staged(tid, buf)
            items.append((tid, v.data_ptr(), v))
        # Checked here (CPU float32, contiguous, declared size: _staged, the numel check above,
        # _held_buffers): push_many's per-item checks are left out.
        ops = self.client._push_many_checked(items, b.step)
        try:
            ops.wait()
        except psd.PsError as e:
            if e.name != "ENOTMEMBER":
                raise
            removed = str(e)
        finally:
            if ops.acked:
                # Done once acknowledged, even if an exception comes now (a signal handler's
                # on the wait's return, a warning made an error below): a batches() loop
                # begun again must not get it handed again (under asp it was applied twice:
                # a probe, session 45).
                self._stepped, self._done = True, b
                # Not on a client a signal handler of the program's closed meanwhile (close and
                # exit, for a preemption): its leave said it, and an EINVAL raised here would
                # replace the handler's SystemExit (exit 1: a probe, session 62).
                if self._client_open():
                    self.client.batch_done(b)
        if not removed and not bsp and self._client_open():
            # Said now, not with the next batch's request: what the program does before that
            # (evaluate, save) would otherwise hold every asp / ssp checkpoint, which waits for
            # the batches in flight and stops the other workers' meanwhile, and ssp's members
            # ahead (a probe, session 64). Under bsp the step's close does not wait for it.
            try:
                self.client.report_done(self.samples, b)
            except psd.PsError as e:
                if e.name != "ENOTMEMBER":
                    raise
                removed = str(e)
        if removed:
            # Dropped by the shards meanwhile: this batch went to another worker, and the next
            # one comes after a new join (batches()).
            self._stepped, self._removed, self._done = True, removed, None
            return False
        odd, whole = self.client.nonfinite_pushes, True
        if odd > self._nonfinite:
            whole = False
            warnings.warn(f"psd.torch: the shards left {odd - self._nonfinite} of this worker's "
                          f"pushes of step {b.step} out of the update: their gradient held a NaN "
                          f"or an infinity ({odd} so far; client.nonfinite_pushes). Under bsp "
                          "each counts as a zero in the workers' mean", RuntimeWarning)
            self._nonfinite = odd
        # Done above (acked): reported (asp / ssp), or the next next_batch reports it,
        # whichever batches() asks, and a leave from here on reports it (batch_done): it is
        # never handed again.
        return whole

    def close(self):
        """Leave the cluster. The model holds the newest parameters: after a loop over
        batches() left early (a break after step()), they are pulled first, with the last
        batch's update (under bsp: once its step is applied)."""
        self._leave(pull=True)

    def _leave(self, pull):
        b, self._batch = self._batch, None
        self._unregister()
        if self.client._pid != os.getpid():  # a forked child: the client is the parent's
            self.client.close()  # forgets it
            return
        try:
            if pull and b is not None and self._stepped and not self._removed:
                self.pull(b.step + 1 if self.client.consistency == "bsp" else 0)
        except psd.PsError as e:
            if e.name not in ("ECANCELED", "EBUSY"):
                raise
            # Interrupted (Ctrl-C, or client.interrupt()): the client is good only for its
            # close; leave without the pull, and let the KeyboardInterrupt go on, not this.
            # EBUSY: closed from another thread while the driving one is inside a call, which
            # the client's close interrupts; else (a compressed pull dropped unwaited by a
            # KeyboardInterrupt holds the tensor) said, as the model keeps older parameters (a
            # review, session 71: it left without a word).
            if e.name == "EBUSY" and "another thread" not in str(e):
                warnings.warn(f"left without pulling the newest parameters: {e}", RuntimeWarning)
        except _ModelChanged as e:  # since the last step(): the pull would be refused
            warnings.warn(f"left without pulling the newest parameters: {e}", RuntimeWarning)
        finally:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._leave(pull=exc[0] is None)  # after an error, leave without waiting for a step
