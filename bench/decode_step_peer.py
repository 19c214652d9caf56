#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops decode_step`: one LLaMA-3-8B decoder layer's
decode step (bf16; the layer of bench/layer_peer.py) on b sequences of one new token each over
a contiguous, preallocated KV cache, on the shapes of bench/decode.json that give every
sequence one length (b 1, 8, 64 at s_kv = 4096), in the same JSON lines as gemmbridge.

The step, each sequence holding s_kv - 1 positions before it (position p = s_kv - 1):
    h1 = F.rms_norm(x, w_norm1, eps);  q, k, v = (h1 @ w_qkv.T).split    x [b, 1, d]
    q, k = rope(q), rope(k) at p         (rotate_half, cos/sin of p * theta^(-2j/hd), f32)
    k_cache[:, :, p], v_cache[:, :, p] = k, v      (in place; caches [b, h_kv, s_kv, hd])
    o  = F.scaled_dot_product_attention(q, k_cache[:, :, :p+1], v_cache[:, :, :p+1],
                                        enable_gqa=True)            (no mask: one query row)
    x2 = x + o @ w_o.T;  y = x2 + (F.silu(g) * u) @ w_down.T, g, u = rms_norm(x2) @ w_gate_up.T
Each call writes the same position (as gemmbridge's rows, which replay one step without
advancing the lengths).

Rows: op "decode_step", dtype bf16, m = 1, n = s_kv, k = d (4096), batch = b; eager under
the layout "llama3-8b-p16" (gemmbridge's label), torch.compile(mode="reduce-overhead") (CUDA
graphs; the layer's weights and caches as a module's buffers at addresses marked static, so
one graph writes the caches in place) under "llama3-8b-p16+compile" (`gemmbridge compare` sets
it beside the same row of ours). tbps = the bytes a step must move / median time, counted as gemmbridge counts them:
the layer's weights (436 MB) and the keys and values read (2 b s_kv h_kv hd elements).
A way that cannot run a shape gives a row with an "error".

Timing as bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls
between CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms
before each row's warm-up.

Usage: python3 bench/decode_step_peer.py [--ways eager,compile] [--batch-sizes 1,8,64]
                                         [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)
import layer_peer  # noqa: E402  (the layer's sizes, weight shapes and RoPE tables)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.json")) as fh:
    SHAPES = [s for s in json.load(fh)["shapes"] if not s.get("lens")]
OP = "decode_step"
LAYOUT = "llama3-8b-p16"
WAYS = ["eager", "compile"]
C = layer_peer.LLAMA3_8B


def weight_bytes(c=C, elem=2):
    """The layer's weights: the four projections and the two norms."""
    return sum(math.prod(v) for v in layer_peer.weight_shapes(c).values()) * elem


def bytes_moved(s, c=C, elem=2):
    """The bytes one step must move, as gemmbridge's DecodeStep::bytes counts them: the
    weights, and every sequence's s_kv keys and values after the append."""
    return weight_bytes(c, elem) + 2.0 * s["b"] * s["s_kv"] * c["heads_kv"] * c["head_dim"] * elem


def layout(way):
    return LAYOUT if way == "eager" else f"{LAYOUT}+{way}"


def step_module(torch, c, weights, caches, rope):
    """The step as a module: weights, caches and the position's cos/sin as buffers."""
    F = torch.nn.functional
    hq, hkv, hd, d, eps = c["heads_q"], c["heads_kv"], c["head_dim"], c["d_model"], c["eps"]

    def rot(t, cos, sin):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, w in zip(layer_peer.WEIGHTS, weights):
                self.register_buffer(name, w)
            self.register_buffer("k_cache", caches[0])
            self.register_buffer("v_cache", caches[1])
            self.register_buffer("cos", rope[0])
            self.register_buffer("sin", rope[1])

        def forward(self, x, p: int):
            b = x.shape[0]
            h1 = F.rms_norm(x, (d,), self.w_norm1, eps)
            q, k, v = F.linear(h1, self.w_qkv).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            q = rot(q.view(b, 1, hq, hd).transpose(1, 2), self.cos, self.sin)
            k = rot(k.view(b, 1, hkv, hd).transpose(1, 2), self.cos, self.sin)
            self.k_cache[:, :, p: p + 1].copy_(k)
            self.v_cache[:, :, p: p + 1].copy_(v.view(b, 1, hkv, hd).transpose(1, 2))
            kc, vc = self.k_cache[:, :, : p + 1], self.v_cache[:, :, : p + 1]
            o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=hq != hkv)
            x2 = x + F.linear(o.transpose(1, 2).reshape(b, 1, hq * hd), self.w_o)
            g, u = F.linear(F.rms_norm(x2, (d,), self.w_norm2, eps), self.w_gate_up).chunk(2, dim=-1)
            return x2 + F.linear(F.silu(g) * u, self.w_down)
    return Step()


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        fn = make()
        med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
        return med, low, None
    except Exception as e:  # a way that cannot run the shape (memory, compiler)
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {peer.first_line(e)}"


def record(s, way, timed_):
    """A JSON row: the times and TB/s, or the error that stopped the row."""
    base = dict(op=OP, dtype="bf16", m=1, n=s["s_kv"], k=C["d_model"], batch=s["b"], layout=layout(way))
    med, low, err = timed_
    if err is not None:
        return dict(base, error=err)
    return dict(base, median_ms=med, min_ms=low, tflops=0.0, tbps=bytes_moved(s) / (med * 1e-3) / 1e12)


def shape_rows(torch, s, ways, reps, gen):
    """The rows of one shape, one per way, on one set of weights and caches."""
    c, dt = C, torch.bfloat16
    b, sk, hkv, hd = s["b"], s["s_kv"], c["heads_kv"], c["head_dim"]
    weights = [(torch.randn(*shp, device="cuda", generator=gen) / math.sqrt(shp[-1])).to(dt)
               if len(shp) == 2 else torch.ones(*shp, device="cuda", dtype=dt)
               for shp in layer_peer.weight_shapes(c).values()]
    caches = [torch.randn(b, hkv, sk, hd, device="cuda", dtype=dt, generator=gen) for _ in range(2)]
    p = sk - 1
    cos, sin = (t[p: p + 1] for t in layer_peer.rope_tables(torch, c, sk, dt, "cuda"))
    for t in weights + caches:
        # a fixed address for CUDA graphs (as Hugging Face's StaticCache marks its caches), so
        # that reduce-overhead replays one graph that writes the caches in place
        torch._dynamo.mark_static_address(t)
    module = step_module(torch, c, weights, caches, (cos, sin))
    x = torch.randn(b, 1, c["d_model"], device="cuda", dtype=dt, generator=gen)
    fns = {"eager": module, "compile": None}
    rows = []
    for way in ways:
        def make(way=way):
            if way == "compile" and fns["compile"] is None:
                fns["compile"] = torch.compile(module, mode="reduce-overhead", dynamic=False)
            f = fns[way]

            def call():
                if way == "compile":
                    torch.compiler.cudagraph_mark_step_begin()
                with torch.no_grad():
                    return f(x, p)
            return call
        rows.append(record(s, way, timed(torch, make, reps)))
    del module, caches, weights, fns
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--batch-sizes", default=",".join(str(s["b"]) for s in SHAPES),
                    help="comma list of the batch sizes to run (default: every shape's)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ways = peer.split_list("--ways", a.ways, WAYS)
        known = [str(s["b"]) for s in SHAPES]
        batches = peer.split_list("--batch-sizes", a.batch_sizes, known)
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    out = open(a.out, "w") if a.out else sys.stdout
    env = peer.cudnn_env(a.reps)
    print(json.dumps(env), file=out, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    failed = False
    for s in (s for s in SHAPES if str(s["b"]) in batches):
        for rec in shape_rows(torch, s, ways, a.reps, gen):
            failed |= "error" in rec
            print(json.dumps(rec), file=out, flush=True)
            print(f"{OP} b{s['b']:<3} {rec['layout']:<24} {rec.get('median_ms', float('nan')):.4f} ms "
                  f"{rec.get('tbps', float('nan')):.2f} TB/s {rec.get('error', '')}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
