#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops layer_fwd,layer_fwd_bwd`: one LLaMA-style
decoder layer (LLaMA-3-8B's: d 4096, 32 query and 8 key/value heads of 128, ffn 14336, RMSNorm
eps 1e-5, RoPE theta 500000 rotate-half, bf16) timed eagerly and under torch.compile, in the
same JSON lines as gemmbridge, so that `gemmbridge compare` pairs the rows by op, dtype, shape
and layout.

The layer (gemmbridge's crate::layer documents the same definition):
    h1 = F.rms_norm(x, w_norm1, eps);  qkv = h1 @ w_qkv.T        (q heads, then k, then v)
    q, k = rope(q), rope(k)            (rotate_half; cos/sin of pos * theta^(-2j/hd), f32)
    o  = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x2 = x + o @ w_o.T;  h2 = F.rms_norm(x2, w_norm2, eps);  gu = h2 @ w_gate_up.T
    g, u = gu.chunk(2) (gate first);   y = x2 + (F.silu(g) * u) @ w_down.T
Weights [out, in] as nn.Linear stores them: w_qkv [(hq + 2 hkv) hd, d], w_o [d, hq hd],
w_gate_up [2 ffn, d], w_down [d, ffn], w_norm1 and w_norm2 [d].

Rows: op layer_fwd (the forward under torch.no_grad()) or layer_fwd_bwd (the forward, then
torch.autograd.grad of y against a fixed dy for x and every weight), dtype bf16, m = s,
n = d, k = ffn, batch = b, layout "llama3-8b"; one row per (op, shape): the fastest way's,
named in "backend" (eager, compile = torch.compile's default mode with static shapes, and with --max-autotune
compile-max-autotune = mode "max-autotune-no-cudagraphs", off by default: its kernel search
takes many minutes at these sizes), with every way's time (or why it could not run) in
"backends". tflops counts 2 per multiply-add of the four projections (x3 with the backward)
plus attention's 4 b hq s^2 hd / 2 (x3.5 with the backward), as gemmbridge does.
Timing as bench/peer.py: 5 warm-up calls, then --reps samples (default 30, as gemmbridge bench) of ~1 ms of
back-to-back calls (one call per sample here) between CUDA events, median and minimum;
--gap-ms MS leaves the GPU idle for MS ms before each row's warm-up.

--check DIR: reads DIR/layer_check.safetensors (written by `gemmbridge layer-check --out DIR`)
and compares, per tensor, PyTorch's bf16 layer, a float64 PyTorch run of the same layer, and
what the file holds. The file's tensors:
    metadata   format "gemmbridge-layer-check-1"; d_model, heads_q, heads_kv, head_dim, ffn,
               eps, rope_theta, rope ("rotate-half"), dtype ("bf16" or "f16"), b, s; "ours"
               ("present" or why absent)
    x, dy      [b, s, d] in the layer's dtype
    w_qkv, w_o, w_gate_up, w_down, w_norm1, w_norm2   the weights, in the layer's dtype
    ref64.<r>  gemmbridge's float64 reference (F64)       for r in y, dx, d_w_qkv, d_w_o,
    ours.<r>   gemmbridge's GPU layer (F32), if present       d_w_gate_up, d_w_down,
                                                              d_w_norm1, d_w_norm2
(y and dx [b, s, d], d_<weight> in its weight's shape). It prints ||a - b|| / ||b|| for ours
against PyTorch's bf16 and float64 runs, PyTorch's bf16 against its float64, and gemmbridge's
float64 reference against PyTorch's float64 (the same definition twice: near 1e-12); it fails
(exit 1) where ours is off either PyTorch run by more than 1e-2 or the two float64 runs by
more than 1e-6. Without ours in the file only the float64 runs are judged.

Usage: python3 bench/layer_peer.py [--ops layer_fwd,layer_fwd_bwd] [--shapes 2x4096,8x1024]
                                   [--reps 10] [--gap-ms MS] [--max-autotune] [--out FILE]
       python3 bench/layer_peer.py --check DIR
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn, the timing arguments: the dense peer's)

OPS = ["layer_fwd", "layer_fwd_bwd"]
SHAPES = ["2x4096", "8x1024"]
LLAMA3_8B = dict(d_model=4096, heads_q=32, heads_kv=8, head_dim=128, ffn=14336, eps=1e-5,
                 rope_theta=500000.0, rope="rotate-half", dtype="bf16")
LAYOUT = "llama3-8b"
CHECK_FILE = "layer_check.safetensors"
RESULTS = ["y", "dx", "d_w_qkv", "d_w_o", "d_w_gate_up", "d_w_down", "d_w_norm1", "d_w_norm2"]
WEIGHTS = ["w_qkv", "w_o", "w_gate_up", "w_down", "w_norm1", "w_norm2"]
BAND = 1e-2
REF_BAND = 1e-6


def parse_shape(text):
    """'BxS' -> (b, s); UsageError otherwise."""
    try:
        b, s = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise peer.UsageError(f"--shapes: {text!r} is not BxS (e.g. 2x4096)") from None
    if b < 1 or s < 1:
        raise peer.UsageError(f"--shapes: {text!r} has no tokens")
    return b, s


def weight_shapes(c):
    w = (c["heads_q"] + 2 * c["heads_kv"]) * c["head_dim"]
    d, f = c["d_model"], c["ffn"]
    return dict(w_qkv=(w, d), w_o=(d, c["heads_q"] * c["head_dim"]), w_gate_up=(2 * f, d), w_down=(d, f),
                w_norm1=(d,), w_norm2=(d,))


def flops(c, b, s, op):
    gemm = 2.0 * b * s * sum(math.prod(v) for k, v in weight_shapes(c).items() if "norm" not in k)
    attn = 4.0 * b * c["heads_q"] * s * s * c["head_dim"] / 2
    return gemm + attn if op == "layer_fwd" else 3.0 * gemm + 3.5 * attn


def rope_tables(torch, c, s, dtype, device, f64=False):
    """cos, sin [s, hd] of rotate-half RoPE: angle pos * theta^(-2j/hd) for j < hd/2, repeated;
    inverse frequencies in f32 as Hugging Face's LLaMA computes them (f64 for the f64 run)."""
    hd = c["head_dim"]
    ft = torch.float64 if f64 else torch.float32
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, device=device, dtype=ft) / hd))
    ang = torch.outer(torch.arange(s, device=device, dtype=ft), inv)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def layer_fn(torch, c):
    """The layer as a function of (x, cos, sin, *weights)."""
    F = torch.nn.functional
    hq, hkv, hd, d, eps = c["heads_q"], c["heads_kv"], c["head_dim"], c["d_model"], c["eps"]

    def rot(t, cos, sin):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    def layer(x, cos, sin, w_qkv, w_o, w_gate_up, w_down, w_norm1, w_norm2):
        b, s, _ = x.shape
        h1 = F.rms_norm(x, (d,), w_norm1, eps)
        q, k, v = F.linear(h1, w_qkv).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        q = rot(q.view(b, s, hq, hd).transpose(1, 2), cos, sin)
        k = rot(k.view(b, s, hkv, hd).transpose(1, 2), cos, sin)
        v = v.view(b, s, hkv, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
        x2 = x + F.linear(o.transpose(1, 2).reshape(b, s, hq * hd), w_o)
        g, u = F.linear(F.rms_norm(x2, (d,), w_norm2, eps), w_gate_up).chunk(2, dim=-1)
        return x2 + F.linear(F.silu(g) * u, w_down)
    return layer


def make_call(torch, fn, op, x, rest, dy):
    """The timed callable: the forward under no_grad, or forward and every gradient."""
    if op == "layer_fwd":
        def call():
            with torch.no_grad():
                return fn(x, *rest)
        return call
    params = [x] + list(rest[2:])

    def call():
        y = fn(x, *rest)
        return torch.autograd.grad(y, params, dy)
    return call


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        clock = peer.Clock("cuda")
        med, low = peer.time_fn(make(), clock, reps)
        return med, low, None
    except Exception as e:  # a way that cannot run the shape (memory, compiler)
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {peer.first_line(e)}"


def bench(torch, a, ops, shapes):
    """--rounds runs (peer.alternate) of every (shape, op) row, eagerly and compiled. The compiled
    functions are made once for all runs: with static shapes torch.compile keeps one graph per
    shape and grad mode, so only the first run compiles."""
    c, dt = LLAMA3_8B, torch.bfloat16
    fn = layer_fn(torch, c)
    # static shapes: each (shape, op) is compiled for itself, not turned dynamic by the next
    ways = {"eager": fn, "compile": torch.compile(fn, dynamic=False)}
    if a.max_autotune:
        ways["compile-max-autotune"] = torch.compile(fn, dynamic=False, mode="max-autotune-no-cudagraphs")
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(shapes) * len(ops))
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [(torch.randn(*shp, device="cuda", generator=gen) / math.sqrt(shp[-1])).to(dt).requires_grad_()
               if len(shp) == 2 else torch.ones(*shp, device="cuda", dtype=dt).requires_grad_()
               for shp in weight_shapes(c).values()]

    def one_run(out):
        env = peer.cudnn_env(a.reps)
        print(json.dumps(env), file=out, flush=True)
        failed = False
        for b, s in shapes:
            x = torch.randn(b, s, c["d_model"], device="cuda", dtype=dt, generator=gen).requires_grad_()
            dy = torch.randn(b, s, c["d_model"], device="cuda", dtype=dt, generator=gen)
            cos, sin = rope_tables(torch, c, s, dt, "cuda")
            rest = [cos, sin] + weights
            for op in ops:
                times = {w: timed(torch, lambda f=f: make_call(torch, f, op, x, rest, dy), a.reps)
                         for w, f in ways.items()}
                failed |= emit_row(out, c, b, s, op, times)
            del x, dy
            torch.cuda.empty_cache()
        return 1 if failed else 0

    return peer.alternate(a, one_run)


def emit_row(out, c, b, s, op, times):
    """Writes one row (the fastest way's time, every way's in "backends"); True if none ran."""
    ok = {w: t for w, t in times.items() if t[0] is not None}
    rec = dict(op=op, dtype="bf16", m=s, n=c["d_model"], k=c["ffn"], batch=b, layout=LAYOUT,
               backends={w: (t[0] if t[0] is not None else t[2]) for w, t in times.items()})
    if ok:
        best = min(ok, key=lambda w: ok[w][0])
        med, low, _ = ok[best]
        rec.update(backend=best, median_ms=med, min_ms=low, tflops=flops(c, b, s, op) / (med * 1e-3) / 1e12)
    else:
        rec["error"] = "no way ran this shape"
    print(json.dumps(rec), file=out, flush=True)
    print(f"{op:<14} b{b} s{s:<6} {rec.get('backend', '-'):<21} {rec.get('median_ms', float('nan')):8.3f} ms "
          f"{rec['backends']}", file=sys.stderr, flush=True)
    return not ok


def rel(torch, got, want):
    got, want = got.double().flatten(), want.double().flatten()
    den = torch.linalg.vector_norm(want).item()
    num = torch.linalg.vector_norm(got - want).item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def run_layer(torch, c, t, dtype, f64):
    """y and every gradient (the RESULTS order) of the layer on the file's inputs `t`."""
    dt = torch.float64 if f64 else dtype
    x = t["x"].to("cuda", dt).requires_grad_()
    ws = [t[n].to("cuda", dt).requires_grad_() for n in WEIGHTS]
    cos, sin = rope_tables(torch, c, x.shape[1], dt, "cuda", f64=f64)
    y = layer_fn(torch, c)(x, cos, sin, *ws)
    grads = torch.autograd.grad(y, [x] + ws, t["dy"].to("cuda", dt))
    return dict(zip(RESULTS, [y.detach()] + list(grads)))


def check(torch, a):
    from safetensors import safe_open
    from safetensors.torch import load_file
    path = os.path.join(a.check, CHECK_FILE)
    if not os.path.exists(path):
        print(f"error: {path} not found (write it with gemmbridge layer-check --out {a.check})", file=sys.stderr)
        return 2
    with safe_open(path, "pt") as fh:
        meta = fh.metadata() or {}
    if meta.get("format") != "gemmbridge-layer-check-1" or meta.get("rope") != "rotate-half":
        print(f"error: {path}: unknown format {meta.get('format')!r} or RoPE {meta.get('rope')!r}", file=sys.stderr)
        return 2
    c = {k: (float(v) if k in ("eps", "rope_theta") else int(v)) for k, v in meta.items()
         if k in ("d_model", "heads_q", "heads_kv", "head_dim", "ffn", "eps", "rope_theta")}
    t = load_file(path)
    dtype = peer.torch_dtype(meta["dtype"])
    low, high = run_layer(torch, c, t, dtype, False), run_layer(torch, c, t, dtype, True)
    ours = meta.get("ours") == "present"
    if not ours:
        print(f"ours absent ({meta.get('ours')}): judging the float64 runs only", file=sys.stderr)
    failed, out = False, (open(a.out, "w") if a.out else None)
    print(f"{'tensor':<12} {'ours/torch':>11} {'ours/torch64':>13} {'torch/torch64':>14} {'ref64/torch64':>14}")
    for r in RESULTS:
        want = high[r].reshape(t[f"ref64.{r}"].shape)
        row = dict(op="layer_check", tensor=r, torch_vs_torch64=rel(torch, low[r].reshape(want.shape), want),
                   ref64_vs_torch64=rel(torch, t[f"ref64.{r}"].cuda(), want))
        bad = row["ref64_vs_torch64"] > REF_BAND
        if ours:
            mine = t[f"ours.{r}"].cuda()
            row.update(ours_vs_torch=rel(torch, mine, low[r].reshape(mine.shape)), ours_vs_torch64=rel(torch, mine, want))
            bad |= not (row["ours_vs_torch"] <= BAND and row["ours_vs_torch64"] <= BAND)
        failed |= bad
        fmt = lambda k, w: f"{row[k]:>{w}.2e}" if k in row else f"{'-':>{w}}"  # noqa: E731
        print(f"{r:<12} {fmt('ours_vs_torch', 11)} {fmt('ours_vs_torch64', 13)} {fmt('torch_vs_torch64', 14)} "
              f"{fmt('ref64_vs_torch64', 14)}{'  FAIL' if bad else ''}")
        if out:
            print(json.dumps(row), file=out, flush=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of BxS (default 2x4096,8x1024)")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also time torch.compile(mode='max-autotune-no-cudagraphs') (a long kernel search)")
    ap.add_argument("--check", metavar="DIR", help=f"compare against DIR/{CHECK_FILE} instead of timing")
    peer.add_timing_args(ap)
    peer.add_round_args(ap)
    ap.set_defaults(reps=30)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ops = peer.split_list("--ops", a.ops, OPS)
        shapes = [parse_shape(v) for v in a.shapes.split(",") if v.strip()]
        if not shapes:
            raise peer.UsageError("no shape to run: give --shapes with at least one BxS")
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    if a.check:
        return check(torch, a)
    try:
        return bench(torch, a, ops, shapes)
    except peer.UsageError as e:
        ap.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
