#!/usr/bin/env python3
"""The PyTorch peer of a whole LLaMA-3-8B model (bf16): a greedy decode step and a prefill of
the 32-layer model with its embedding, final RMSNorm and LM head, eager and under
torch.compile, in the same JSON lines as gemmbridge.

The model (the layer is bench/decode_step_peer.py's and bench/layer_peer.py's):
    x = embedding[ids]                                   ids [b, s] -> x [b, s, d]
    per layer (32):
        h1 = F.rms_norm(x, w_norm1, eps);  q, k, v = (h1 @ w_qkv.T).split
        q, k = rope(q), rope(k) at positions p .. p+s-1  (rotate_half; cos/sin in f32, cast to bf16)
        k_cache[:, :, p:p+s], v_cache[:, :, p:p+s] = k, v          (in place; [b, h_kv, S, hd])
        decode (s = 1):  o = SDPA(q, k_cache[:, :, :p+1], v_cache[:, :, :p+1], enable_gqa=True)
        prefill (p = 0): o = SDPA(q, k, v, is_causal=True, enable_gqa=True)
        x = x + o @ w_o.T;  g, u = (rms_norm(x, w_norm2) @ w_gate_up.T).chunk(2)
        x = x + (F.silu(g) * u) @ w_down.T
    logits = rms_norm(x[:, -1], norm) @ lm_head.T        the last token's: [b, vocab] (bf16)
    ids' = logits.argmax(-1)                             on the GPU; nothing is read back
d 4096, 32 query and 8 key/value heads of 128, ffn 14336, vocab 128256, eps 1e-5. RoPE is
LLaMA 3's: theta 500000, inverse frequencies 1 / theta^(2j/hd) in f32 (as Hugging Face), then
the "llama3" frequency scaling (factor 8, low_freq_factor 1, high_freq_factor 4,
original_max_position 8192: wavelengths above 8192/1 divided by 8, below 8192/4 kept, those
between blended), computed here (rope_tables below; layer_peer.rope_tables has no scaling).
Weights are random (randn / sqrt(fan_in) for the matrices, the embedding and the LM head
included; ones for the norms), drawn once per process and shared by every row; the KV caches
are allocated per shape and freed after it.

Rows:
  llama_decode   one greedy decode step of b sequences (b of --batch-sizes, default 1, 8, 64)
                 at context s_kv (--contexts, default 1024, 4096): every sequence holds
                 s_kv - 1 positions (random cache contents, no prefill) and the step writes
                 position s_kv - 1; caches preallocated contiguous [b, 8, s_kv, 128] per layer.
                 Each call writes the same position with the same token ids (b ids in, b ids
                 out). m = b, n = s_kv, k = 4096, batch = b, tflops 0.0,
                 tbps = bytes / median: the 32 layers' weights, the final norm and the LM head
                 (the embedding's b rows are not counted), plus the keys and values read,
                 2 * 32 * b * s_kv * 8 * 128 * 2 bytes.
  llama_prefill  one forward of b prompts of s tokens (--prefill-shapes, default 1x2048,
                 8x512) writing the caches ([b, 8, s, 128] per layer), then the last token's
                 logits and argmax. m = b*s, n = s, k = 4096, batch = b, tflops = flops /
                 median with flops = 2 * b * s * (the 32 layers' projection weights: w_qkv,
                 w_o, w_gate_up, w_down) + 2 * b * vocab * d (the LM head, on the last token
                 only) + 32 * 4 * b * 32 * s^2 * 128 / 2 (QK^T and PV, causal: half).
dtype "bf16"; layout "llama3-8b" for eager, "llama3-8b+compile" for torch.compile: the whole
model step as one graph, static shapes (dynamic=False), mode "reduce-overhead" (CUDA graphs;
the weights, caches and RoPE tables marked static addresses, as decode_step_peer.py does, so
that one graph writes the caches in place) for llama_decode, the default mode for
llama_prefill. With --layers N below 32 the layout is "llama3-8b-layersN" (a quick check; its
rows pair with nothing). A way that cannot run a shape (out of memory, a compiler error)
gives a row with an "error" field instead of times, the run goes on, and the exit status is 1.

Timing as bench/peer.py: 5 warm-up calls (compiling, for torch.compile), then --reps samples
of ~1 ms of back-to-back calls (here one call a sample) between CUDA events, median and
minimum per call; --gap-ms MS leaves the GPU idle for MS ms before each row's warm-up.

Memory: the weights take ~16 GB; the caches of b 64 at s_kv 4096, 34 GB. Each shape's
compiled graph is dropped (torch._dynamo.reset()) with its caches before the next shape.

Usage: python3 bench/llama_peer.py [--ops decode,prefill] [--ways eager,compile]
                                   [--batch-sizes 1,8,64] [--contexts 1024,4096]
                                   [--prefill-shapes 1x2048,8x512] [--layers 32]
                                   [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import gc
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn, the timing arguments: the dense peer's)
import layer_peer  # noqa: E402  (the layer's sizes and weight shapes)

C = dict(layer_peer.LLAMA3_8B, vocab=128256, layers=32,
         rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192))
OPS = {"decode": "llama_decode", "prefill": "llama_prefill"}
WAYS = ["eager", "compile"]
LAYOUT = "llama3-8b"
BATCH_SIZES = [1, 8, 64]
CONTEXTS = [1024, 4096]
PREFILL_SHAPES = [(1, 2048), (8, 512)]


def layout(way, layers):
    base = LAYOUT if layers == C["layers"] else f"{LAYOUT}-layers{layers}"
    return base if way == "eager" else f"{base}+{way}"


def layer_params(c=C):
    """Elements of one layer's weights: (the four projections, the two norms)."""
    shapes = layer_peer.weight_shapes(c)
    proj = sum(math.prod(v) for k, v in shapes.items() if "norm" not in k)
    return proj, sum(math.prod(v) for k, v in shapes.items() if "norm" in k)


def decode_bytes(b, s_kv, layers, c=C, elem=2):
    """The bytes one decode step must move: every layer's weights, the final norm and the LM
    head, and every sequence's s_kv keys and values in every layer (the embedding's b rows are
    left out)."""
    weights = layers * sum(layer_params(c)) + c["d_model"] + c["vocab"] * c["d_model"]
    kv = 2 * layers * b * s_kv * c["heads_kv"] * c["head_dim"]
    return float(weights + kv) * elem


def prefill_flops(b, s, layers, c=C):
    """2 per multiply-add of the projections over every token, of the LM head over the last
    token of each sequence, and of causal attention's QK^T and PV (half the s x s square)."""
    gemm = 2.0 * b * s * layers * layer_params(c)[0] + 2.0 * b * c["vocab"] * c["d_model"]
    attn = layers * 4.0 * b * c["heads_q"] * s * s * c["head_dim"] / 2
    return gemm + attn


def inv_freqs(torch, c, device, f64=False):
    """LLaMA 3's RoPE inverse frequencies [hd/2]: 1 / theta^(2j/hd) (in f32 as Hugging Face
    computes them), then the "llama3" scaling (Hugging Face's _compute_llama3_parameters)."""
    hd, sc = c["head_dim"], c["rope_scaling"]
    ft = torch.float64 if f64 else torch.float32
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, device=device, dtype=ft) / hd))
    factor, low, high, old = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], sc["original_max_position"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, blended, scaled)


def rope_tables(torch, c, start, s, dtype, device):
    """cos, sin [s, hd] of rotate-half RoPE at positions start .. start+s-1: angle
    pos * inv_freq_j (f32) for j < hd/2, repeated, cast to `dtype`."""
    inv = inv_freqs(torch, c, device)
    pos = torch.arange(start, start + s, device=device, dtype=torch.float32)
    ang = torch.outer(pos, inv)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def build_weights(torch, c, layers, dtype, device, gen):
    """The model's weights: dict(embed [vocab, d], layers: per layer the list of
    layer_peer.WEIGHTS, norm [d], lm_head [vocab, d]); matrices randn / sqrt(fan_in), norms
    ones."""
    def draw(shp):
        if len(shp) == 1:
            return torch.ones(*shp, device=device, dtype=dtype)
        return (torch.randn(*shp, device=device, generator=gen) / math.sqrt(shp[-1])).to(dtype)

    shapes = list(layer_peer.weight_shapes(c).values())
    return dict(embed=draw((c["vocab"], c["d_model"])),
                layers=[[draw(shp) for shp in shapes] for _ in range(layers)],
                norm=draw((c["d_model"],)), lm_head=draw((c["vocab"], c["d_model"])))


def model_module(torch, c, weights, caches, rope):
    """The model as a module: the weights, each layer's (k_cache, v_cache) of `caches` and the
    cos/sin tables of the positions the call writes (`rope`) as buffers. forward(ids, p) runs
    ids [b, s] at positions p .. p+s-1 and returns the argmax ids [b] of the last token's
    logits; logits(ids, p) returns those logits [b, vocab]."""
    F = torch.nn.functional
    hq, hkv, hd, d, eps = c["heads_q"], c["heads_kv"], c["head_dim"], c["d_model"], c["eps"]

    def rot(t, cos, sin):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    class Layer(torch.nn.Module):
        def __init__(self, ws, kv):
            super().__init__()
            for name, w in zip(layer_peer.WEIGHTS, ws):
                self.register_buffer(name, w)
            self.register_buffer("k_cache", kv[0])
            self.register_buffer("v_cache", kv[1])

        def forward(self, x, cos, sin, p: int):
            b, s, _ = x.shape
            h1 = F.rms_norm(x, (d,), self.w_norm1, eps)
            q, k, v = F.linear(h1, self.w_qkv).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            q = rot(q.view(b, s, hq, hd).transpose(1, 2), cos, sin)
            k = rot(k.view(b, s, hkv, hd).transpose(1, 2), cos, sin)
            v = v.view(b, s, hkv, hd).transpose(1, 2)
            self.k_cache[:, :, p: p + s].copy_(k)
            self.v_cache[:, :, p: p + s].copy_(v)
            if s == 1:  # one query row per sequence: no mask, over the whole cache so far
                o = F.scaled_dot_product_attention(q, self.k_cache[:, :, : p + 1], self.v_cache[:, :, : p + 1],
                                                   enable_gqa=hq != hkv)
            else:  # a prompt from position 0: causal over its own keys and values
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
            x = x + F.linear(o.transpose(1, 2).reshape(b, s, hq * hd), self.w_o)
            g, u = F.linear(F.rms_norm(x, (d,), self.w_norm2, eps), self.w_gate_up).chunk(2, dim=-1)
            return x + F.linear(F.silu(g) * u, self.w_down)

    class Llama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("embed", weights["embed"])
            self.register_buffer("norm", weights["norm"])
            self.register_buffer("lm_head", weights["lm_head"])
            self.register_buffer("cos", rope[0])
            self.register_buffer("sin", rope[1])
            self.layers = torch.nn.ModuleList(Layer(ws, kv) for ws, kv in zip(weights["layers"], caches))

        def logits(self, ids, p: int):
            x = F.embedding(ids, self.embed)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin, p)
            return F.linear(F.rms_norm(x[:, -1], (d,), self.norm, eps), self.lm_head)

        def forward(self, ids, p: int):
            return self.logits(ids, p).argmax(dim=-1)
    return Llama()


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        fn = make()
        med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
        return med, low, None
    except Exception as e:  # a way that cannot run the shape (memory, compiler)
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {peer.first_line(e)}"


def record(kind, b, s, layers, way, timed_):
    """A JSON row: the times and rates, or the error that stopped the row."""
    m = b if kind == "decode" else b * s
    base = dict(op=OPS[kind], dtype="bf16", m=m, n=s, k=C["d_model"], batch=b, layout=layout(way, layers))
    med, low, err = timed_
    if err is not None:
        return dict(base, error=err)
    sec = med * 1e-3
    if kind == "decode":
        return dict(base, median_ms=med, min_ms=low, tflops=0.0, tbps=decode_bytes(b, s, layers) / sec / 1e12)
    return dict(base, median_ms=med, min_ms=low, tflops=prefill_flops(b, s, layers) / sec / 1e12)


def release(torch):
    """Drops every compiled graph (and its CUDA graph pool) and frees the cached memory."""
    torch._dynamo.reset()
    try:
        from torch._inductor import cudagraph_trees
        cudagraph_trees.reset_cudagraph_trees()
    except Exception:  # older or newer PyTorch without it: reset() is enough there
        pass
    gc.collect()
    torch.cuda.empty_cache()


def shape_rows(torch, kind, b, s, ways, reps, weights, gen):
    """The rows of one shape, one per way, on the shared weights and this shape's caches."""
    c, dt, layers = C, torch.bfloat16, len(weights["layers"])
    hkv, hd = c["heads_kv"], c["head_dim"]
    state = {}
    try:
        if kind == "decode":  # s - 1 positions held (random), position s - 1 written
            p = s - 1
            state["caches"] = [tuple(torch.randn(b, hkv, s, hd, device="cuda", dtype=dt, generator=gen)
                                     for _ in range(2)) for _ in range(layers)]
            rope = rope_tables(torch, c, p, 1, dt, "cuda")
            ids = torch.randint(0, c["vocab"], (b, 1), device="cuda", generator=gen)
        else:  # a prompt of s tokens from position 0
            p = 0
            state["caches"] = [tuple(torch.empty(b, hkv, s, hd, device="cuda", dtype=dt) for _ in range(2))
                               for _ in range(layers)]
            rope = rope_tables(torch, c, 0, s, dt, "cuda")
            ids = torch.randint(0, c["vocab"], (b, s), device="cuda", generator=gen)
        for t in [t for kv in state["caches"] for t in kv] + list(rope):
            # fixed addresses for CUDA graphs (as Hugging Face's StaticCache marks its caches), so
            # that reduce-overhead replays one graph that writes the caches in place
            torch._dynamo.mark_static_address(t)
        state["module"] = model_module(torch, c, weights, state["caches"], rope)
    except Exception as e:  # the caches do not fit, say: every way's row says so
        why = f"{type(e).__name__}: {peer.first_line(e)}"
        state.clear()
        release(torch)
        return [record(kind, b, s, layers, way, (None, None, why)) for way in ways]

    def make(way):
        if way == "eager":
            f = state["module"]
        else:
            mode = "reduce-overhead" if kind == "decode" else "default"
            f = state.setdefault("compiled", torch.compile(state["module"], mode=mode, dynamic=False))
        graphs = way == "compile" and kind == "decode"

        def call():
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return f(ids, p)
        return call

    rows = [record(kind, b, s, layers, way, timed(torch, lambda w=way: make(w), reps)) for way in ways]
    state.clear()
    del rope, ids
    release(torch)
    return rows


def int_list(flag, text):
    """A comma list of positive integers, in the order given, each once; UsageError otherwise."""
    out = []
    for v in (v.strip() for v in text.split(",")):
        if not v:
            continue
        try:
            n = int(v)
        except ValueError:
            raise peer.UsageError(f"{flag}: {v!r} is not a whole number") from None
        if n < 1:
            raise peer.UsageError(f"{flag}: {v!r} is not positive")
        if n not in out:
            out.append(n)
    if not out:
        raise peer.UsageError(f"no {flag[2:]} to run: give {flag} with at least one value")
    return out


def shape_list(text):
    """--prefill-shapes: a comma list of BxS."""
    out = []
    for v in (v.strip() for v in text.split(",")):
        if not v:
            continue
        try:
            b, s = (int(x) for x in v.lower().split("x"))
        except ValueError:
            raise peer.UsageError(f"--prefill-shapes: {v!r} is not BxS (e.g. 1x2048)") from None
        if b < 1 or s < 2:
            raise peer.UsageError(f"--prefill-shapes: {v!r} needs b >= 1 and a prompt of at least 2 tokens")
        if (b, s) not in out:
            out.append((b, s))
    if not out:
        raise peer.UsageError("no prefill shape to run: give --prefill-shapes with at least one BxS")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of decode, prefill (default both)")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)), help="llama_decode's b (default 1,8,64)")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="llama_decode's s_kv (default 1024,4096)")
    ap.add_argument("--prefill-shapes", default=",".join(f"{b}x{s}" for b, s in PREFILL_SHAPES),
                    help="llama_prefill's BxS (default 1x2048,8x512)")
    ap.add_argument("--layers", type=int, default=C["layers"],
                    help="decoder layers (default 32; fewer for a quick check, rows then labelled apart)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ops = peer.split_list("--ops", a.ops, list(OPS))
        ways = peer.split_list("--ways", a.ways, WAYS)
        batches = int_list("--batch-sizes", a.batch_sizes)
        contexts = int_list("--contexts", a.contexts)
        prefills = shape_list(a.prefill_shapes)
        if not 1 <= a.layers <= C["layers"]:
            raise peer.UsageError(f"--layers {a.layers} is not between 1 and {C['layers']}")
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    out = open(a.out, "w") if a.out else sys.stdout
    print(json.dumps(peer.cudnn_env(a.reps, layers=a.layers)), file=out, flush=True)
    # one graph per shape, each compiled afresh (reset after each shape); room for recompiles
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = build_weights(torch, C, a.layers, torch.bfloat16, "cuda", gen)
    for t in [weights["embed"], weights["norm"], weights["lm_head"]] + [w for ws in weights["layers"] for w in ws]:
        torch._dynamo.mark_static_address(t)
    torch.cuda.synchronize()
    print(f"weights: {a.layers} layers, {torch.cuda.memory_allocated() / 1e9:.2f} GB on the GPU",
          file=sys.stderr, flush=True)
    shapes = []
    if "decode" in ops:
        shapes += [("decode", b, s) for b in batches for s in contexts]
    if "prefill" in ops:
        shapes += [("prefill", b, s) for b, s in prefills]
    failed = False
    for kind, b, s in shapes:
        for rec in shape_rows(torch, kind, b, s, ways, a.reps, weights, gen):
            failed |= "error" in rec
            print(json.dumps(rec), file=out, flush=True)
            rate = (f"{rec['tbps']:.2f} TB/s" if "tbps" in rec else f"{rec['tflops']:.1f} TFLOP/s") \
                if "median_ms" in rec else ""
            print(f"{rec['op']:<13} b{b:<3} s{s:<5} {rec['layout']:<20} {rec.get('median_ms', float('nan')):9.3f} ms "
                  f"{rate} {rec.get('error', '')}", file=sys.stderr, flush=True)
    if out is not sys.stdout:
        out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
