#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops moe_fwd,moe_fwd_bwd`: one mixture-of-experts
feed-forward step, bf16, on the layers of bench/moe.json, written as a PyTorch MoE layer is
(torchtitan's grouped-GEMM experts), in the same JSON lines as gemmbridge.

The step, x [S, H], the router Wr [E, H], the experts' W_gu [E, 2I, H] and W_d [E, H, I]:
    logits = x @ Wr.T;  v, ids = logits.topk(k);  w = v.float().softmax(-1)
    order = ids.flatten().argsort(stable=True)          (the routed rows sorted by expert)
    offs = bincount(ids, E).cumsum()                    (int32 group ends, on the device)
    h = _grouped_mm(x[order // k], W_gu.T, offs);  a = silu(g) * u  (g, u = h's halves)
    o = _grouped_mm(a, W_d.T, offs);  y = (unsorted(o).view(S, k, H) * w).sum(1)
moe_fwd times the forward; moe_fwd_bwd the forward and autograd's backward of y against a
fixed dy (gradients of x and of all three weights). No host synchronisation on either side.

Rows: op, dtype bf16, m = S, n = H, k = I, batch = E, layout = the layer's name; eager under
that name, torch.compile (default mode) of the same function under "<name>+compile".
TFLOP/s as gemmbridge counts them: 6·R·H·I + 2·S·H·E per forward (R = S·k), three times that
forward and backward. A way that cannot run a layer gives a row with an "error".

Timing as bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls
between CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms
before each row's warm-up.

Usage: python3 bench/moe_peer.py [--ops moe_fwd,moe_fwd_bwd] [--ways eager,compile]
                                 [--shapes NAME,...] [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe.json")) as fh:
    SHAPES = json.load(fh)["shapes"]
OPS = ["moe_fwd", "moe_fwd_bwd"]
WAYS = ["eager", "compile"]


def forward_flops(s):
    r = s["tokens"] * s["top_k"]
    return 6.0 * r * s["hidden"] * s["intermediate"] + 2.0 * s["tokens"] * s["hidden"] * s["experts"]


def moe_step(torch, k, e):
    """The layer's forward as a function of (x, Wr, W_gu, W_d)."""
    F = torch.nn.functional

    def step(x, wr, w_gu, w_d):
        s = x.shape[0]
        logits = x @ wr.t()
        v, ids = logits.topk(k, dim=-1)
        w = v.float().softmax(dim=-1)
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        offs = torch.bincount(flat, minlength=e).cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x[order // k], w_gu.transpose(-2, -1), offs=offs)
        g, u = h.chunk(2, dim=-1)
        o = torch._grouped_mm(F.silu(g) * u, w_d.transpose(-2, -1), offs=offs)
        back = torch.empty_like(o).index_copy(0, order, o)
        return (back.view(s, k, -1) * w.unsqueeze(-1).to(o.dtype)).sum(dim=1)

    return step


def rows(torch, op, s, way, reps):
    t, h, i, e, k = s["tokens"], s["hidden"], s["intermediate"], s["experts"], s["top_k"]
    dt = torch.bfloat16
    grad = op == "moe_fwd_bwd"
    x = torch.randn(t, h, device="cuda", dtype=dt, requires_grad=grad)
    wr = (torch.randn(e, h, device="cuda") / h ** 0.5).to(dt).requires_grad_(grad)
    w_gu = (torch.randn(e, 2 * i, h, device="cuda") / h ** 0.5).to(dt).requires_grad_(grad)
    w_d = (torch.randn(e, h, i, device="cuda") / i ** 0.5).to(dt).requires_grad_(grad)
    dy = torch.randn(t, h, device="cuda", dtype=dt)
    step = moe_step(torch, k, e)
    if way == "compile":
        step = torch.compile(step)
    if grad:
        params = [x, wr, w_gu, w_d]

        def fn():
            y = step(x, wr, w_gu, w_d)
            return torch.autograd.grad(y, params, dy)
    else:
        def fn():
            with torch.no_grad():
                return step(x, wr, w_gu, w_d)
    name = s["name"] if way == "eager" else f"{s['name']}+{way}"
    base = dict(op=op, dtype="bf16", m=t, n=h, k=i, batch=e, layout=name, backend=f"torch {way}")
    try:
        fn()
        med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
    except Exception as ex:  # a way that cannot run this layer
        torch.cuda.synchronize()
        return [dict(base, error=f"{type(ex).__name__}: {str(ex).splitlines()[0][:200]}")]
    flops = forward_flops(s) * (3.0 if grad else 1.0)
    return [dict(base, median_ms=med, min_ms=low, tflops=flops / (med * 1e-3) / 1e12)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--ways", default=",".join(WAYS), help="comma list of " + ", ".join(WAYS))
    ap.add_argument("--shapes", default="", help="comma list of layer names (default: every layer)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ops = peer.split_list("--ops", a.ops, OPS)
        ways = peer.split_list("--ways", a.ways, WAYS)
        names = [s["name"] for s in SHAPES]
        wanted = peer.split_list("--shapes", a.shapes, names) if a.shapes.strip() else names
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    out = open(a.out, "w") if a.out else None
    env = dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(), reps=a.reps, gap_ms=a.gap_ms)
    lines = [env] + [r for s in SHAPES if s["name"] in wanted for op in ops for way in ways
                     for r in rows(torch, op, s, way, a.reps)]
    for line in lines:
        text = json.dumps(line)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
