"""Train a torch.nn.Module on psd: the shards hold its parameters and run the optimizer.

    import psd.torch
    ps = psd.torch.ParameterServer("cluster.yaml", model)
    for batch in ps.batches(len(dataset)):            # the coordinator's batches for this worker
        x, y = inputs[batch.indices], targets[batch.indices]
        model.zero_grad()
        loss_fn(model(x), y).backward()
        ps.step()                                     # push the gradients; applied on the shards
    ps.close()                                        # the final parameters are in the model

Each parameter becomes a tensor named as in model.named_parameters(), declared on the shards
(the first worker's declaration creates it: weights of 2 or more dimensions start xavier,
others zeros, unless `init` says otherwise) and pulled into the model before each batch (under
bsp the parameters of that batch's step). The manifest's job says the optimizer, the
consistency, the batch size and the passes. CPU float32 contiguous parameters are pulled into
and pushed from in place; others (CUDA, other dtypes) go through a float32 copy on the host.
"""
import torch

import psd


class ParameterServer:
    """`model`'s parameters on the shards of `manifest`; joins at creation, leaves at close().

    init: {parameter name: (kind, arg)} for the shards' initialization (kind: zeros, normal,
    uniform, xavier) of the parameters it names."""

    def __init__(self, manifest, model, init=None, connect_timeout_ms=None):
        self.client = psd.Client(manifest, connect_timeout_ms=connect_timeout_ms)
        self.model = model
        self._params = []  # (parameter, id, host buffer or None)
        init = init or {}
        try:
            for name, p in model.named_parameters():
                kind, arg = init.get(name, ("xavier" if p.dim() >= 2 else "zeros", 0.0))
                tid = self.client.declare(name, tuple(p.shape) or (1,), init=kind, init_arg=arg)
                direct = (p.device.type == "cpu" and p.dtype == torch.float32
                          and p.is_contiguous())
                host = None if direct else torch.zeros(p.numel(), dtype=torch.float32)
                self._params.append((p, tid, host))
            self._zeros = {}
            self._batch = None
            self._stepped = False
            self.final_step = None
            self.pull(0)
        except BaseException:
            self.client.close()
            raise

    @property
    def rank(self):
        return self.client.rank

    def pull(self, min_version):
        """Pull every parameter into the model once its chunks reached `min_version`."""
        ops = []
        for p, tid, host in self._params:
            dst = host if host is not None else p.data
            ops.append((self.client.pull(tid, dst.data_ptr(), min_version, keep=dst), p, host))
        for op, p, host in ops:
            op.wait()
            if host is not None:
                with torch.no_grad():
                    p.copy_(host.view_as(p))

    def batches(self, samples):
        """The batches the coordinator hands this worker for a training set of `samples`: each a
        psd.Batch whose `indices` (a list) name its samples; the model holds the parameters of
        its step. Call step() once per batch. At the end the model holds the final parameters."""
        order, order_pass, done = None, None, None
        bsp = self.client.consistency == "bsp"
        while True:
            b = self.client.next_batch(samples, done)
            if b is None:
                break
            if b.pass_ != order_pass:
                order, order_pass = psd.batch_order(samples, self.client.seed, b.pass_), b.pass_
            b.indices = order[b.offset:b.offset + b.count].tolist()
            self.pull(b.step if bsp else 0)
            self._batch, self._stepped = b, False
            yield b
            if not self._stepped:
                raise RuntimeError(f"batch of step {b.step}: call step() once per batch")
            self.client.batch_done(b)
            done = b
        self.final_step = self.client.final_step
        self._batch = None
        self.pull(self.final_step if bsp else 0)

    def step(self):
        """Push every parameter's gradient for the current batch's step (zeros for one without
        a gradient: under bsp a step waits for every member's push) and wait until the shards
        applied them."""
        b = self._batch
        if b is None or self._stepped:
            raise RuntimeError("step() belongs inside `for batch in ps.batches(n)`, once a batch")
        ops = []
        self.client.group_begin()  # the small gradients travel fused
        try:
            for p, tid, host in self._params:
                g = p.grad
                if g is None:
                    g = self._zeros.setdefault(p.numel(), torch.zeros(p.numel()))
                else:
                    g = g.detach()
                    if g.device.type != "cpu" or g.dtype != torch.float32 or not g.is_contiguous():
                        g = g.to(device="cpu", dtype=torch.float32).contiguous()
                ops.append(self.client.push(tid, g.data_ptr(), b.step, keep=g))
        finally:
            self.client.group_end()
        for op in ops:
            op.wait()
        self._stepped = True

    def close(self):
        """Leave the cluster."""
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
