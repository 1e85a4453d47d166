#!/usr/bin/python3
"""torch_many.py [--layers N] [--steps S] [--build DIR]: what psd.torch costs a model of many
small tensors: N torch.nn.Linear(2, 2) (2N tensors), one worker, two psd shards of a fresh
manifest in a temporary directory (bsp, sgd). Prints the medians over S steps (the first
S / 2 left out) of step() (the pushes and their acknowledgements), the next batch with its
pull, and the forward and backward passes, beside torch's own SGD step on the same model in
this process. Run from the repository root with Debian's python3; DIR (default build) holds
server/psd and worker/libps.so."""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "worker", "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def model_of(torch, n):
    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(n)])

        def forward(self, x):
            return sum(m(x) for m in self.layers)
    return Many()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=500)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    os.environ.setdefault("PSD_LIBPS", os.path.join(a.build, "worker", "libps.so"))
    os.environ.setdefault("PS_LOG_LEVEL", "warn")
    import torch
    import psd.torch
    torch.set_num_threads(1)
    x = torch.randn(64, 2)
    skip = a.steps // 2

    # torch alone
    model = model_of(torch, a.layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own, fb_own = [], []
    for k in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).sum().backward()
        t1 = time.perf_counter()
        opt.step()
        if k >= skip:
            fb_own.append(t1 - t0)
            own.append(time.perf_counter() - t1)

    tmp = tempfile.mkdtemp(prefix="torch-many-")
    manifest = os.path.join(tmp, "manifest.yaml")
    with open(manifest, "w") as f:
        f.write(f"cluster: torch-many-{os.getpid()}\nservers:\n")
        for i in range(2):
            f.write(f"  - {{host: 127.0.0.1, port: {free_port()}, data_dir: {tmp}/data{i}}}\n")
        f.write("job:\n  model: mlp\n  batch_size: 64\n  epochs: 1\n  workers: 1\n"
                "  consistency: bsp\n  optimizer: {name: sgd, lr: 0.01}\n")
    procs = []
    try:
        for i in range(2):
            p = subprocess.Popen([os.path.join(a.build, "server", "psd"), "--manifest", manifest,
                                  "--shard", str(i)], stdout=subprocess.PIPE,
                                 stderr=open(os.path.join(tmp, f"psd{i}.log"), "w"), text=True)
            procs.append(p)
            if "listening" not in p.stdout.readline():
                sys.exit(f"psd {i} did not start: see {tmp}/psd{i}.log")
        model = model_of(torch, a.layers)
        steps, nexts, fb = [], [], []
        with psd.torch.ParameterServer(manifest, model, samples=64 * (a.steps + 1)) as ps:
            t1 = None
            for k, _ in enumerate(ps.batches()):
                t00 = time.perf_counter()
                if k >= a.steps:
                    break
                model.zero_grad()
                model(x).sum().backward()
                t0 = time.perf_counter()
                ps.step()
                if k >= skip:
                    nexts.append(t00 - t1)
                    fb.append(t0 - t00)
                    steps.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
        subprocess.run(["rm", "-rf", tmp])
    ms = lambda v: f"{1e3 * v:.2f} ms"  # noqa: E731
    print(f"{a.layers} x Linear(2, 2) ({2 * a.layers} tensors), medians of {a.steps - skip} steps:")
    print(f"  psd.torch: step() {ms(median(steps))}, next batch and its pull "
          f"{ms(median(nexts))}, forward + backward {ms(median(fb))}")
    print(f"  torch alone: optimizer step {ms(median(own))}, forward + backward "
          f"{ms(median(fb_own))}")


if __name__ == "__main__":
    main()
