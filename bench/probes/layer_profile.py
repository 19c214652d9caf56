#!/usr/bin/env python3
"""Where a decoder layer's step spends its GPU time in PyTorch: one step of bench/layer_peer.py's
layer (LLaMA-3-8B's, bf16), eager or under torch.compile, traced with torch.profiler after
warm-up; every kernel of the step in launch order with its duration, then the sum per class
(GEMM, attention, norm, RoPE, SwiGLU/SiLU, other elementwise), so that it can be set beside
the same step of gemmbridge's layer (its kernels' durations from Nsight Compute:
`ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv
--page raw gemmbridge bench --ops layer_fwd --layer-shapes 2x4096 --reps 2`, read with
`--ours FILE`, whose last step is classified the same way).

Usage: python3 bench/probes/layer_profile.py [--op layer_fwd|layer_fwd_bwd] [--shape 2x4096]
           [--way eager|compile] [--ours NCU_CSV] [--out FILE]
"""

import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import layer_peer  # noqa: E402
import peer  # noqa: E402

CLASSES = [  # (class, substrings of a kernel's name, lower case), first match wins
    ("norm", ["rms", "norm", "rsqrt"]),
    ("attention", ["flash", "fmha", "sdpa", "attn", "cudnn_generated", "mha"]),
    ("rope", ["rope"]),
    ("swiglu", ["swiglu", "silu", "sigmoid"]),
    ("gemm", ["gemm", "nvjet", "xmma", "cutlass", "sm90_", "ampere_", "cublas"]),
    ("axpy", ["axpy"]),
]


def classify(name):
    low = name.lower()
    for cls, keys in CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def summary(kernels):
    """{class: ms} over [(name, ms)], and the total."""
    out = {}
    for name, ms in kernels:
        out[classify(name)] = out.get(classify(name), 0.0) + ms
    return out, sum(ms for _, ms in kernels)


def print_step(title, kernels):
    print(f"== {title}: {len(kernels)} kernels")
    for name, ms in kernels:
        print(f"  {ms * 1e3:9.1f} us  {classify(name):<9}  {name[:110]}")
    by, total = summary(kernels)
    print("  per class: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
          + f"; total {total:.3f} ms")
    return dict(by_class_ms=by, total_ms=total, kernels=[dict(name=n, ms=m) for n, m in kernels])


def torch_step(a):
    rc = peer.import_torch("cuda")
    if rc:
        sys.exit(rc)
    torch = peer.torch
    c, dt = layer_peer.LLAMA3_8B, torch.bfloat16
    b, s = layer_peer.parse_shape(a.shape)
    fn = layer_peer.layer_fn(torch, c)
    f = fn if a.way == "eager" else torch.compile(fn, dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [(torch.randn(*shp, device="cuda", generator=gen) / math.sqrt(shp[-1])).to(dt).requires_grad_()
               if len(shp) == 2 else torch.ones(*shp, device="cuda", dtype=dt).requires_grad_()
               for shp in layer_peer.weight_shapes(c).values()]
    x = torch.randn(b, s, c["d_model"], device="cuda", dtype=dt, generator=gen).requires_grad_()
    dy = torch.randn(b, s, c["d_model"], device="cuda", dtype=dt, generator=gen)
    cos, sin = layer_peer.rope_tables(torch, c, s, dt, "cuda")
    call = layer_peer.make_call(torch, f, a.op, x, [cos, sin] + weights, dy)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = [(e.name, e.device_time / 1e3) for e in prof.events()
               if e.device_type.name == "CUDA" and e.device_time > 0 and "Memcpy" not in e.name]
    return print_step(f"PyTorch {a.way}, {a.op} {a.shape}", kernels)


def ours_step(path, op):
    """The last step's kernels of an Nsight Compute raw CSV of gemmbridge's bench: the kernels after
    the last launch of the step's first kernel (its first RMSNorm)."""
    rows = []
    with open(path) as fh:
        lines = [ln for ln in fh if ln.startswith('"')]
    scale = 1e-6  # ncu's raw page names the unit in the row under the header
    for r in csv.DictReader(lines):
        name, t = r.get("Kernel Name", ""), r.get("gpu__time_duration.sum", "")
        if not name and t:
            scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(t.strip(), scale)
            continue
        try:
            rows.append((name, float(t.replace(",", "")) * scale))
        except ValueError:
            continue
    firsts = [i for i, (n, _) in enumerate(rows) if classify(n) == "norm"]
    per_step = {"layer_fwd": 2, "layer_fwd_bwd": 4}[op]  # norm kernels in one step
    start = firsts[-per_step] if len(firsts) >= per_step else 0
    return print_step(f"gemmbridge, {op} (last step of {os.path.basename(path)})", rows[start:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", default="layer_fwd", choices=layer_peer.OPS)
    ap.add_argument("--ops", help="comma list of ops traced one after the other in this process (PyTorch only)")
    ap.add_argument("--shape", default="2x4096")
    ap.add_argument("--way", default="compile", choices=["eager", "compile"])
    ap.add_argument("--ours", help="Nsight Compute raw CSV of gemmbridge's bench of the same op and shape")
    ap.add_argument("--torch", action="store_true", help="also trace PyTorch's step (default when no --ours)")
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        layer_peer.parse_shape(a.shape)
    except peer.UsageError as e:
        ap.error(str(e))
    rec = {}
    if a.ours:
        rec["ours"] = ours_step(a.ours, a.op)
    if a.torch or not a.ours:
        for op in (a.ops.split(",") if a.ops else [a.op]):
            a.op = op
            rec[f"torch {op}"] = torch_step(a)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(dict(op=a.op, shape=a.shape, way=a.way, **rec), fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
