#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops grouped`: the mixture-of-experts shapes of
bench/grouped.json through torch._grouped_mm (PyTorch's own grouped kernels: y = x · w[e]ᵀ
with the rows of x sorted by expert and the group ends as int32 offsets on the device), in the
same JSON lines as gemmbridge (m = Σ rows, n, k, batch = experts, layout = the shape's name;
TFLOP/s = 2·Σ m_e·N·K / time). A second row per shape, layout "<name>+loop", times a Python
loop of one torch.matmul per expert, for context. Timing as bench/peer.py: 5 warm-up calls,
then --reps samples of ~1 ms of back-to-back calls between CUDA events, median and minimum per
call; --gap-ms MS leaves the GPU idle for MS ms before each row's warm-up.

Usage: python3 bench/grouped_peer.py [--dtypes bf16,f16] [--shapes NAME,...] [--reps 30]
                                     [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grouped.json")) as fh:
    SHAPES = json.load(fh)["shapes"]
DTYPES = ["bf16", "f16"]


def timed(torch, fn, reps):
    """(median, min, None), or (None, None, why) where PyTorch refuses the call."""
    try:
        fn()
        med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
        return med, low, None
    except Exception as e:  # a dtype or shape the kernel does not take
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def rows(torch, s, name, dt, reps):
    m, n, k, e = sum(s["sizes"]), s["n"], s["k"], s["e"]
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(e, n, k, device="cuda", dtype=dt)
    offs = torch.tensor(s["sizes"], device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    xs = x.split(s["sizes"])
    calls = {
        s["name"]: ("_grouped_mm", lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)),
        s["name"] + "+loop": ("matmul loop", lambda: [torch.matmul(xi, w[i].t()) for i, xi in enumerate(xs)]),
    }
    for layout, (backend, fn) in calls.items():
        med, low, why = timed(torch, fn, reps)
        base = dict(op="grouped", dtype=name, m=m, n=n, k=k, batch=e, layout=layout, backend=backend)
        if med is None:
            yield dict(base, error=why)
        else:
            yield dict(base, median_ms=med, min_ms=low, tflops=2.0 * m * n * k / (med * 1e-3) / 1e12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--shapes", default="", help="comma list of shape names (default: every shape)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        names = [s["name"] for s in SHAPES]
        wanted = peer.split_list("--shapes", a.shapes, names) if a.shapes.strip() else names
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    dts = {"bf16": torch.bfloat16, "f16": torch.float16}
    out = open(a.out, "w") if a.out else None
    env = dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(), reps=a.reps, gap_ms=a.gap_ms)
    for line in [env] + [r for d in dtypes for s in SHAPES if s["name"] in wanted
                         for r in rows(torch, s, d, dts[d], a.reps)]:
        text = json.dumps(line)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
