#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops conv_fwd,conv_bias_relu,conv_dgrad,conv_wgrad`:
ResNet-50's convolutions timed through torch.nn.functional.conv2d and its backward, with
torch.backends.cudnn.benchmark = True and TF32 off except for the tf32 rows, in the same
JSON lines as gemmbridge (one row per op, dtype, layout and batch; m = P*Q, n = K,
k = C/groups*R*S, batch = N, so 2*m*n*k*batch is the convolution's flop count).

Usage (on a CUDA machine with PyTorch):
  python3 bench/conv_peer.py [--dtypes f32,tf32,f16,bf16] [--ops conv_fwd,...]
                             [--layouts nhwc,nchw] [--batches 32,1] [--reps 30] [--gap-ms MS] [--out FILE]

Ops: conv_fwd (F.conv2d(x, w)), conv_bias_relu (torch.relu(F.conv2d(x, w, b)): PyTorch's
eager sequence), conv_dgrad and conv_wgrad (torch.ops.aten.convolution_backward for the
input or the weight gradient alone). NHWC rows use channels_last tensors. Timing as
bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls between
CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms before
each row's warm-up. Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

# (C, H, W, K, R, S, stride, pad): ResNet-50's convolutions, shared with gemmbridge's bench
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet50.json")) as fh:
    RESNET50 = [tuple(x) for x in json.load(fh)["shapes"]]
OPS = ["conv_fwd", "conv_bias_relu", "conv_dgrad", "conv_wgrad"]
DTYPES = ["f32", "tf32", "f16", "bf16"]


def out_hw(h, w, r, s, stride, pad):
    return (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1


def row(torch, op, dtype, layout, n, shape, reps):
    F = torch.nn.functional
    c, h, w, k, r, s, stride, pad = shape
    dt = peer.torch_dtype(dtype)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    p, q = out_hw(h, w, r, s, stride, pad)
    x = torch.randn(n, c, h, w, device="cuda").to(dt).contiguous(memory_format=fmt)
    wt = (torch.randn(k, c, r, s, device="cuda") * (c * r * s) ** -0.5).to(dt).contiguous(memory_format=fmt)
    b = torch.randn(k, device="cuda").to(dt)
    dy = torch.randn(n, k, p, q, device="cuda").to(dt).contiguous(memory_format=fmt)
    conv = dict(stride=stride, padding=pad)
    back = lambda mask: torch.ops.aten.convolution_backward(
        dy, x, wt, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1, mask
    )
    fns = {
        "conv_fwd": lambda: F.conv2d(x, wt, **conv),
        "conv_bias_relu": lambda: torch.relu(F.conv2d(x, wt, b, **conv)),
        "conv_dgrad": lambda: back([True, False, False]),
        "conv_wgrad": lambda: back([False, True, False]),
    }
    clock = peer.Clock("cuda")
    with torch.no_grad():
        med, low = peer.time_fn(fns[op], clock, reps)
    m, kk = p * q, c * r * s
    flops = 2.0 * m * k * kk * n
    return dict(op=op, dtype=dtype, m=m, n=k, k=kk, batch=n, layout=layout, median_ms=med, min_ms=low,
                tflops=flops / (med * 1e-3) / 1e12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--layouts", default="nhwc,nchw")
    ap.add_argument("--batches", default="32,1")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        ops = peer.split_list("--ops", a.ops, OPS)
        layouts = peer.split_list("--layouts", a.layouts, ["nhwc", "nchw"])
    except peer.UsageError as e:
        ap.error(str(e))
    try:
        batches = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--batches {a.batches!r} is not a comma list of whole numbers")
    if not batches or min(batches) < 1:
        ap.error("--batches needs batch sizes of at least 1")
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    torch.backends.cudnn.benchmark = True
    out = open(a.out, "w") if a.out else sys.stdout
    env = peer.cudnn_env(a.reps, cudnn_benchmark=True)
    print(json.dumps(env), file=out, flush=True)
    for dtype in dtypes:
        torch.backends.cudnn.allow_tf32 = dtype == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        for layout in layouts:
            for n in batches:
                for shape in RESNET50:
                    for op in ops:
                        rec = row(torch, op, dtype, layout, n, shape, a.reps)
                        print(json.dumps(rec), file=out, flush=True)
                        print(f"{op:<15} {dtype:<5} {layout} n{n:<3} {shape} {rec['median_ms']:.4f} ms "
                              f"{rec['tflops']:.1f} TF/s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
