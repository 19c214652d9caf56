#!/usr/bin/env python3
"""PyTorch autograd as an oracle for gemmbridge's training layers: MLP blocks
(Linear(d, f) -> act -> Linear(f, d), both with biases) and tf32 cases, forward and backward,
written as safetensors test vectors that `tests/train_gpu.rs` reads.

Usage (on a CUDA machine with PyTorch and safetensors):  python3 bench/train_oracle.py DIR
Writes DIR/<case>.safetensors and DIR/index.json.

Each file holds, row-major and contiguous, layer i = 0, 1, ...:
  x [tokens, d]; w{i} [out_i, in_i]; b{i} [out_i]; dy [tokens, out_last]   inputs (case dtype)
  y, dx, dw{i}, db{i}        PyTorch's result on the GPU (autograd), case dtype
  y_ref, dx_ref, dw{i}_ref, db{i}_ref   the same in float64 on the CPU from the same inputs
Metadata (__metadata__): tokens, dtype (f32 | tf32 | f16 | bf16 | fp8; tf32 is float32 storage
with TF32 tensor-core GEMMs; fp8 is bfloat16 storage with every GEMM in FP8 by per-tensor current
scaling, as Transformer Engine's Linear does it: E4M3 x and w forward, E5M2 output gradients in
the backward, each tensor quantised with scale = max_finite / amax, `torch._scaled_mm` with f32
accumulation and a bfloat16 output, the bias gradient summed in f32), layers: JSON list of [in, out, act, bias] with act one of none, relu,
gelu (erf, PyTorch's default), gelu_tanh.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

# (tokens, d, f, dtype, act): the block Linear(d, f) -> act -> Linear(f, d)
BLOCKS = [
    (64, 96, 256, "f32", "gelu_tanh"),
    (33, 65, 130, "f32", "relu"),
    (47, 40, 72, "f32", "gelu"),
    (128, 256, 1024, "tf32", "gelu_tanh"),
    (77, 128, 200, "tf32", "gelu"),
    (256, 512, 2048, "bf16", "gelu_tanh"),
    (255, 384, 1000, "f16", "gelu_tanh"),
    (512, 1024, 4096, "bf16", "gelu"),
    (100, 256, 512, "f16", "relu"),
    (1, 512, 1536, "bf16", "gelu_tanh"),
    # FP8 (all sizes multiples of 16: torch._scaled_mm refuses others)
    (512, 1024, 4096, "fp8", "gelu_tanh"),
    (256, 256, 512, "fp8", "gelu"),
    (128, 128, 384, "fp8", "relu"),
]
# (tokens, in, out, dtype, act, bias): single layers the shared oracle lacks (tf32)
SINGLE = [
    (64, 256, 128, "tf32", "none", True),
    (129, 77, 255, "tf32", "gelu_tanh", True),
    (50, 64, 96, "tf32", "relu", False),
    (256, 512, 384, "fp8", "none", True),
    (1024, 2048, 1024, "fp8", "none", True),
    (64, 4096, 4096, "fp8", "none", False),
]
DT = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
ACT = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(t, fmt):
    """Per-tensor current scaling: (t * max/amax) rounded to nearest even and saturated, and
    the dequantisation scale amax/max (f32, 0-dim, as _scaled_mm takes it)."""
    fmax = torch.finfo(fmt).max
    amax = t.abs().max().float()
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (t.float() * scale).clamp(-fmax, fmax).to(fmt), scale.reciprocal()


def fp8_mm(a, b_t, fa, fb, bias=None):
    """a[M, K] @ b_t[N, K]^T through torch._scaled_mm (the second operand column-major)."""
    qa, sa = quantize(a.contiguous(), fa)
    qb, sb = quantize(b_t.contiguous(), fb)
    return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=a.dtype)


class Fp8Linear(torch.autograd.Function):
    """y = x @ w^T + b with E4M3 x, w forward and E5M2 dy backward (per-tensor scaling)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return fp8_mm(x, w, E4M3, E4M3, b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = fp8_mm(dy, w.t(), E5M2, E4M3)  # dy[M, N] @ w[N, K]
        dw = fp8_mm(dy.t(), x.t(), E5M2, E4M3)  # dy^T[N, M] @ x[M, K]
        db = dy.float().sum(0).to(dy.dtype) if ctx.has_bias else None
        return dx, dw, db


def linear(dt, gpu):
    if dt == "fp8" and gpu:
        return lambda h, w, b: Fp8Linear.apply(h, w, b)
    return torch.nn.functional.linear


def run(tokens, layers, dt, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    d = DT[dt]
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(d).to(torch.float64)
    x64 = rnd(tokens, layers[0][0])
    params = [(rnd(o, i, scale=i ** -0.5), rnd(o) if bias else None) for (i, o, _act, bias) in layers]
    dy64 = rnd(tokens, layers[-1][1])
    out = {"x": x64.to(d), "dy": dy64.to(d)}
    for i, (w, b) in enumerate(params):
        out[f"w{i}"] = w.to(d)
        if b is not None:
            out[f"b{i}"] = b.to(d)
    torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    try:
        for tag, dev, dtype in (("", device, d), ("_ref", "cpu", torch.float64)):
            x = x64.to(dev, dtype).requires_grad_()
            ps = [(w.to(dev, dtype).requires_grad_(), None if b is None else b.to(dev, dtype).requires_grad_()) for w, b in params]
            h, lin = x, linear(dt, tag == "")
            for (w, b), (_i, _o, act, _bias) in zip(ps, layers):
                h = ACT[act](lin(h, w, b))
            h.backward(dy64.to(dev, dtype))
            out["y" + tag] = h.detach()
            out["dx" + tag] = x.grad
            for i, (w, b) in enumerate(ps):
                out[f"dw{i}" + tag] = w.grad
                if b is not None:
                    out[f"db{i}" + tag] = b.grad
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = []
    for n, (tokens, d, f, dt, act) in enumerate(BLOCKS):
        cases.append((f"mlp_{dt}_{act}_{tokens}x{d}x{f}", tokens, [(d, f, act, True), (f, d, "none", True)], dt, 1000 + n))
    for n, (tokens, i, o, dt, act, bias) in enumerate(SINGLE):
        name = f"linear_{dt}_{act}_{'bias' if bias else 'nobias'}_{tokens}x{o}x{i}"
        cases.append((name, tokens, [(i, o, act, bias)], dt, 2000 + n))
    index = []
    for name, tokens, layers, dt, seed in cases:
        tensors = run(tokens, layers, dt, device, seed)
        meta = dict(tokens=str(tokens), dtype=dt, layers=json.dumps([list(l) for l in layers]))
        save_file(tensors, os.path.join(outdir, name + ".safetensors"), metadata=meta)
        index.append(dict(name=name, tokens=tokens, dtype=dt, layers=layers))
    with open(os.path.join(outdir, "index.json"), "w") as fh:
        json.dump(dict(torch=torch.__version__, device=device, cases=index), fh, indent=1)
    print(f"wrote {len(index)} cases to {outdir} (torch {torch.__version__}, {device})")


if __name__ == "__main__":
    main()
