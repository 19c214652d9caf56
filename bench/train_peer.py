#!/usr/bin/env python3
"""PyTorch peer for `gemmbridge train-bench`: the same training steps with nn.Linear,
F.gelu(approximate="tanh") and autograd, written as the same JSON lines, so that the two can
be compared row by row (`gemmbridge compare --ours ... --peer ...`).

Usage (CUDA machine):  python3 bench/train_peer.py [--dtypes bf16,f16,fp8] [--ops mlp_train,linear_train]
                                                  [--tokens 4096] [--reps 30] [--gap-ms MS] [--out FILE]
--gap-ms MS leaves the GPU idle for MS ms before each row's warm-up (gemmbridge train-bench
--gap-ms does the same). Usage errors, a missing PyTorch and a missing GPU exit with status 2.

Rows (m = tokens, n = the layer's out / the block's hidden width f, k = in / d):
  mlp_train     Linear(d, f) -> GELU-tanh -> Linear(f, d), both with biases
  linear_train  one Linear(in, out) with a bias
dtype fp8: bf16 tensors, every Linear through train_oracle.py's Fp8Linear (torch._scaled_mm with
E4M3 forward operands and E5M2 gradients, per-tensor current scaling: gemmbridge's default FP8
recipe); the activation in bf16.
One step: grads set to None (as optimizer.zero_grad() does), the forward on an input that
requires grad, then y.backward(dy): dx, dW and db of every layer.
  median_ms, min_ms  device time per step (CUDA events; 5 warm-up steps, then `reps` samples
                     of back-to-back steps spanning ~1 ms each), as gemmbridge times it
  tflops             6 * tokens * n * k * layers / median time
  gemm_ms            GPU time of the GEMM kernels of one step (torch.profiler over 10 steps:
                     kernels whose name has gemm, nvjet, cutlass or xmma),
  pass_ms            the step's time in that same pass (CUDA events around the 10 steps), and
  beyond_ms          pass_ms - gemm_ms: what the step costs beyond its GEMMs
"""
import argparse
import json
import sys

import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (time_fn, Clock, checked_gap_ms: the dense peer's timing and gap)

# PyTorch (and the FP8 recipe, shared with train_oracle.py, which imports it) are loaded by
# load_torch() once the arguments are checked, so that --help and usage errors need neither
torch = F = Fp8Linear = None

SHAPES = [
    ("mlp_train", 14336, 4096),
    ("mlp_train", 16384, 4096),
    ("linear_train", 4096, 4096),
    ("linear_train", 6144, 4096),
    ("linear_train", 28672, 4096),
    ("linear_train", 4096, 14336),
]
DT = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "bfloat16", "fp8": "bfloat16"}


def load_torch():
    """Imports PyTorch and the FP8 recipe; 0, or 2 (with a message) where PyTorch or the GPU is missing."""
    global torch, F, Fp8Linear
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:
        print(f"error: PyTorch is not installed ({e})", file=sys.stderr)
        return 2
    if not _torch.cuda.is_available():
        print("error: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2
    torch, F = _torch, _F
    peer.torch = _torch  # peer.Clock's CUDA events
    from train_oracle import Fp8Linear as _Fp8Linear

    Fp8Linear = _Fp8Linear
    return 0
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "xmma")


def build(op, n, k, tokens, dtype, fp8=False):
    dev = "cuda"
    # a layer applied: nn.Linear itself, or its weight and bias through the FP8 recipe
    lin = (lambda l, h: Fp8Linear.apply(h, l.weight, l.bias)) if fp8 else (lambda l, h: l(h))
    if op == "mlp_train":
        layers = [torch.nn.Linear(k, n, device=dev, dtype=dtype), torch.nn.Linear(n, k, device=dev, dtype=dtype)]
        fwd = lambda x: lin(layers[1], F.gelu(lin(layers[0], x), approximate="tanh"))
        out = k
    else:
        layers = [torch.nn.Linear(k, n, device=dev, dtype=dtype)]
        fwd = lambda x: lin(layers[0], x)
        out = n
    x = torch.randn(tokens, k, device=dev).to(dtype).requires_grad_()
    dy = torch.randn(tokens, out, device=dev).to(dtype)
    params = [p for l in layers for p in l.parameters()]

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        fwd(x).backward(dy)

    return step, len(layers)


def time_step(step, reps, gap_ms=0.0):
    """Median and minimum ms per step, timed as bench/peer.py times a GEMM (`gap_ms` of idle
    GPU, 5 warm-up steps, then `reps` samples of ~1 ms of back-to-back steps)."""
    return peer.time_fn(step, peer.Clock("cuda"), reps, gap_ms=gap_ms)


def gemm_ms(step, steps=10, breakdown=False):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
    total_us = 0.0
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and any(g in e.name.lower() for g in GEMM_NAMES):
            total_us += e.device_time
            kernels.setdefault(e.name, []).append(e.device_time)
    if breakdown:
        # each GEMM kernel of one step: its mean device time and how often it ran per step
        for name, ts in kernels.items():
            print(f"  {sum(ts) / len(ts) / 1e3:8.3f} ms x{len(ts) / steps:.0f}  {name[:110]}", file=sys.stderr)
    return total_us / 1e3 / steps, start.elapsed_time(end) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--ops", default="mlp_train,linear_train")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle GPU time before each row's warm-up, ms (as gemmbridge train-bench --gap-ms)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--breakdown", action="store_true", help="print each GEMM kernel's time (stderr)")
    a = ap.parse_args()
    try:
        a.gap_ms = peer.checked_gap_ms(a.gap_ms)
    except peer.UsageError as e:
        ap.error(str(e))
    ops = [o for o in a.ops.split(",") if o]
    dtypes = [d for d in a.dtypes.split(",") if d]
    for o in ops:
        if o not in {op for op, _, _ in SHAPES}:
            ap.error(f"unknown op {o!r}; choose mlp_train, linear_train")
    for d in dtypes:
        if d not in DT:
            ap.error(f"unknown dtype {d!r}; choose {', '.join(DT)}")
    if not ops or not dtypes:
        ap.error("nothing to run: give --ops and --dtypes")
    if a.reps < 1 or a.tokens < 1:
        ap.error(f"--reps {a.reps} and --tokens {a.tokens} must both be at least 1")
    rc = load_torch()
    if rc:
        return rc
    out = open(a.out, "w") if a.out else sys.stdout
    env = dict(op="env", backend="torch-train", torch=torch.__version__, device=torch.cuda.get_device_name(0),
               reps=a.reps, tokens=a.tokens, gap_ms=a.gap_ms)
    print(json.dumps(env), file=out, flush=True)
    for name in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for op, n, k in SHAPES:
            if op not in ops:
                continue
            step, nlayers = build(op, n, k, a.tokens, getattr(torch, DT[name]), fp8=name == "fp8")
            med, mn = time_step(step, a.reps, a.gap_ms)
            g, pass_ms = gemm_ms(step, breakdown=a.breakdown)
            flops = 6.0 * a.tokens * n * k * nlayers
            row = dict(op=op, dtype=name, m=a.tokens, n=n, k=k, batch=1, median_ms=med, min_ms=mn,
                       tflops=flops / (med * 1e-3) / 1e12, gemm_ms=g, pass_ms=pass_ms, beyond_ms=pass_ms - g)
            print(json.dumps(row), file=out, flush=True)
            print(f"{op:<13} {name:<5} {a.tokens}x{n}x{k}  {med:8.3f} ms  GEMMs {g:8.3f} of {pass_ms:8.3f} ms  beyond {pass_ms - g:7.3f} ms",
                  file=sys.stderr)
            del step
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
