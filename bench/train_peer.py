#!/usr/bin/env python3
"""PyTorch peer for `gemmbridge train-bench`: the same training steps with nn.Linear,
F.gelu(approximate="tanh") and autograd, written as the same JSON lines, so that the two can
be compared row by row (`gemmbridge compare --ours ... --peer ...`).

Usage (CUDA machine):  python3 bench/train_peer.py [--dtypes bf16,f16,fp8] [--ops mlp_train,linear_train]
                                                  [--tokens 4096] [--reps 30] [--out FILE]

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
import time

import os

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_oracle import Fp8Linear  # noqa: E402  (the FP8 recipe, shared with the oracle)

SHAPES = [
    ("mlp_train", 14336, 4096),
    ("mlp_train", 16384, 4096),
    ("linear_train", 4096, 4096),
    ("linear_train", 6144, 4096),
    ("linear_train", 28672, 4096),
    ("linear_train", 4096, 14336),
]
DT = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
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
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if gap_ms > 0:  # idle GPU before the warm-up, as gemmbridge train-bench --gap-ms
        torch.cuda.synchronize()
        time.sleep(gap_ms / 1e3)

    def burst(n):
        start.record()
        for _ in range(n):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    once = max(burst(1), 1e-3)
    inner = max(1, min(1000, int(1.0 / once)))
    times = sorted(burst(inner) / inner for _ in range(reps))
    return times[len(times) // 2], times[0]


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
    if not 0 <= a.gap_ms <= 60_000:  # (NaN fails both comparisons)
        ap.error(f"--gap-ms {a.gap_ms} is not between 0 and 60000 (milliseconds)")
    out = open(a.out, "w") if a.out else sys.stdout
    ops = [o for o in a.ops.split(",") if o]
    env = dict(op="env", backend="torch-train", torch=torch.__version__, device=torch.cuda.get_device_name(0),
               reps=a.reps, tokens=a.tokens, gap_ms=a.gap_ms)
    print(json.dumps(env), file=out, flush=True)
    for name in [d for d in a.dtypes.split(",") if d]:
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for op, n, k in SHAPES:
            if op not in ops:
                continue
            step, nlayers = build(op, n, k, a.tokens, DT[name], fp8=name == "fp8")
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


if __name__ == "__main__":
    main()
