"""The PyTorch front end (worker/python/psd) against real psd shards on 127.0.0.1:
- one worker under bsp + sgd ends with the parameters plain torch SGD reaches on the same
  batches from the same start;
- two workers share the passes (every sample once per pass), end with the same parameters and
  a lower loss;
- errors come back as PsError / ValueError naming the problem.
Run by meson (test torch_frontend) with PSD, PSD_LIBPS and PYTHONPATH set; exit 77 without torch.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("test_torch: no torch for this python3 (Debian: python3-torch): skipped")
    sys.exit(77)

import psd
import psd.torch

SAMPLES, FEATURES, BATCH, EPOCHS, LR = 256, 8, 16, 2, 0.1


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=g)


def model():
    torch.manual_seed(1)  # the shards initialize it anyway
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Two psd shards of a fresh manifest in a temp dir; stop() ends them (SIGTERM, exit 0)."""

    def __init__(self, tmp, name, workers):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.manifest = os.path.join(self.dir, "manifest.yaml")
        ports = [free_port(), free_port()]
        while ports[1] == ports[0]:
            ports[1] = free_port()
        with open(self.manifest, "w") as f:
            f.write(f"cluster: torch-{os.getpid()}-{name}\nchunk_bytes: 4096\nmap_size_mb: 64\n"
                    "servers:\n")
            for i, p in enumerate(ports):
                f.write(f"  - {{host: 127.0.0.1, port: {p}, data_dir: {self.dir}/data{i}}}\n")
            f.write(f"job:\n  model: mlp\n  batch_size: {BATCH}\n  epochs: {EPOCHS}\n"
                    f"  workers: {workers}\n  consistency: bsp\n"
                    f"  optimizer: {{name: sgd, lr: {LR}}}\n")
        self.procs = []
        for i in range(2):
            log = open(os.path.join(self.dir, f"psd{i}.log"), "w")
            p = subprocess.Popen([os.environ["PSD"], "--manifest", self.manifest, "--shard", str(i)],
                                 stdout=subprocess.PIPE, stderr=log, text=True)
            self.procs.append(p)
            line = p.stdout.readline()
            assert "listening" in line, f"psd {i} did not start: {line!r}"

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for i, p in enumerate(self.procs):
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            assert rc == 0, f"psd {i} exited with {rc}"

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def train(manifest, record):
    """One worker's run; returns (final state_dict, [(step, indices, params before it)])."""
    x, y = data()
    m = model()
    with psd.torch.ParameterServer(manifest, m) as ps:
        for b in ps.batches(SAMPLES):
            if record is not None:
                record.append((b.step, list(b.indices),
                               {k: v.clone() for k, v in m.state_dict().items()}))
            m.zero_grad()
            torch.nn.functional.mse_loss(m(x[b.indices]), y[b.indices]).backward()
            ps.step()
        final = {k: v.clone() for k, v in m.state_dict().items()}
        step = ps.final_step
    return final, step


def one_worker_matches_sgd(tmp):
    c = Cluster(tmp, "one", 1)
    try:
        record = []
        final, step = train(c.manifest, record)
    finally:
        c.stop()
    assert len(record) == SAMPLES * EPOCHS // BATCH, f"{len(record)} batches"
    assert step == len(record), f"final step {step}"
    for p in range(EPOCHS):  # each pass covers every sample once
        seen = sorted(i for _, idx, _ in record[p * SAMPLES // BATCH:(p + 1) * SAMPLES // BATCH]
                      for i in idx)
        assert seen == list(range(SAMPLES)), f"pass {p} does not cover the set once"
    x, y = data()
    ref = model()
    ref.load_state_dict(record[0][2])  # the shards' initial parameters
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for _, idx, _ in record:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x[idx]), y[idx]).backward()
        opt.step()
    worst = 0.0
    for k, v in ref.state_dict().items():
        d = (v - final[k]).abs().max().item()
        assert d < 1e-5, f"{k}: psd and torch SGD differ by {d}"
        worst = max(worst, d)
    loss0 = torch.nn.functional.mse_loss(torch.nn.utils.stateless.functional_call(
        model(), record[0][2], (x,)), y).item()
    loss1 = torch.nn.functional.mse_loss(ref(x), y).item()
    assert loss1 < 0.7 * loss0, f"loss {loss0} -> {loss1}"
    print(f"one worker: {len(record)} steps match torch SGD (largest difference {worst:.2g}); "
          f"loss {loss0:.4f} -> {loss1:.4f}")


def worker_main(manifest, out):
    record = []
    final, step = train(manifest, record)
    with open(out, "w") as f:
        json.dump({"step": step, "indices": [idx for _, idx, _ in record],
                   "final": {k: v.flatten().tolist() for k, v in final.items()}}, f)


def two_workers_share(tmp):
    c = Cluster(tmp, "two", 2)
    outs = [os.path.join(c.dir, f"w{i}.json") for i in range(2)]
    try:
        ws = [subprocess.Popen([sys.executable, __file__, "worker", c.manifest, o]) for o in outs]
        rcs = [w.wait(timeout=120) for w in ws]
        assert rcs == [0, 0], f"workers exited with {rcs}"
    finally:
        c.stop()
    r = [json.load(open(o)) for o in outs]
    assert r[0]["final"] == r[1]["final"], "the workers ended with different parameters"
    assert r[0]["step"] == r[1]["step"] == SAMPLES * EPOCHS // (BATCH * 2), r[0]["step"]
    seen = sorted(i for w in r for idx in w["indices"] for i in idx)
    assert seen == sorted(list(range(SAMPLES)) * EPOCHS), "samples not shared once per pass"
    x, y = data()
    m = model()
    m.load_state_dict({k: torch.tensor(v).view_as(p)
                       for (k, v), p in zip(r[0]["final"].items(), m.state_dict().values())})
    loss = torch.nn.functional.mse_loss(m(x), y).item()
    assert loss < 0.5, f"loss after training {loss}"
    print(f"two workers: {r[0]['step']} steps each, same parameters, loss {loss:.4f}")


def errors(tmp):
    try:
        psd.Client(os.path.join(tmp, "missing.yaml"))
        raise AssertionError("a missing manifest was taken")
    except psd.PsError as e:
        assert "missing.yaml" in str(e), str(e)
    c = Cluster(tmp, "err", 1)
    try:
        with psd.Client(c.manifest) as cl:
            try:
                cl.declare("t", (1, 2, 3, 4, 5))
                raise AssertionError("5 dimensions were taken")
            except ValueError as e:
                assert "5 dimensions" in str(e), str(e)
            cl.declare("t", (4, 4))
            try:
                cl.declare("t", (8,))
                raise AssertionError("a second shape was taken")
            except psd.PsError as e:
                assert e.name == "ECONFLICT", e.name
    finally:
        c.stop()
    print("errors: named")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker_main(sys.argv[2], sys.argv[3])
        return
    tmp = tempfile.mkdtemp(prefix="psd-torch.")
    try:
        one_worker_matches_sgd(tmp)
        two_workers_share(tmp)
        errors(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
