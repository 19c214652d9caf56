#!/usr/bin/env python3
"""Test vectors for gemmbridge's large-shape attention test: PyTorch's math backend of
torch.nn.functional.scaled_dot_product_attention, run in float64 on the GPU from bf16 inputs
(so the reference is exact up to float64 rounding), forward and backward.

Usage: python3 bench/attn_oracle.py DIR   (then GEMMBRIDGE_ATTN_ORACLE=DIR for the GPU tests)

For each case C, DIR/C/ holds meta.json ({"b", "h_q", "h_kv", "s_q", "s_kv", "d", "mask"}), the
bf16 inputs q, k, v, do as raw little-endian bf16 in BSHD order ([b, s, h, d]) named q.bf16 …,
and the float64 results o, dq, dk, dv (BSHD, raw little-endian float64, .f64) and lse
([b, h_q, s_q], natural log, .f64).
"""
import json
import os
import sys

CASES = [
    dict(name="b1_h8x2_s2048_d128_causal", b=1, h_q=8, h_kv=2, s_q=2048, s_kv=2048, d=128, mask="causal"),
    dict(name="b2_h16_s1536_d64", b=2, h_q=16, h_kv=16, s_q=1536, s_kv=1536, d=64, mask="none"),
    dict(name="b2_h8x1_s512x3000_d128_bottom_right", b=2, h_q=8, h_kv=1, s_q=512, s_kv=3000, d=128,
         mask="bottom_right"),
]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    import torch
    out = sys.argv[1]
    g = torch.Generator(device="cuda").manual_seed(20261203)
    for c in CASES:
        d = os.path.join(out, c["name"])
        os.makedirs(d, exist_ok=True)
        b, hq, hk, sq, sk, dd = c["b"], c["h_q"], c["h_kv"], c["s_q"], c["s_kv"], c["d"]
        mk = lambda s, h: torch.randn(b, s, h, dd, device="cuda", generator=g).to(torch.bfloat16)
        q, k, v, do = mk(sq, hq), mk(sk, hk), mk(sk, hk), mk(sq, hq)
        for name, t in (("q", q), ("k", k), ("v", v), ("do", do)):
            t.contiguous().view(torch.int16).cpu().numpy().tofile(os.path.join(d, name + ".bf16"))
        # float64, heads first, key/value heads repeated for the query heads that share them
        q64, k64, v64, do64 = (t.double().transpose(1, 2) for t in (q, k, v, do))
        k64, v64 = (t.repeat_interleave(hq // hk, dim=1) for t in (k64, v64))
        q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
        scale = dd ** -0.5
        s = (q64 @ k64.transpose(-1, -2)) * scale
        i = torch.arange(sq, device="cuda").view(-1, 1)
        j = torch.arange(sk, device="cuda").view(1, -1)
        if c["mask"] == "causal":
            s = s.masked_fill(j > i, float("-inf"))
        elif c["mask"] == "bottom_right":
            s = s.masked_fill(j > i + sk - sq, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        o = torch.softmax(s, dim=-1) @ v64
        dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), do64)
        # sum the repeated heads back into their key/value head
        dk, dv = (t.view(b, hk, hq // hk, sk, dd).sum(2) for t in (dk, dv))
        bshd = lambda t: t.transpose(1, 2).contiguous().cpu().numpy()
        for name, t in (("o", o), ("dq", dq), ("dk", dk), ("dv", dv)):
            bshd(t.detach()).tofile(os.path.join(d, name + ".f64"))
        lse.detach().contiguous().cpu().numpy().tofile(os.path.join(d, "lse.f64"))
        with open(os.path.join(d, "meta.json"), "w") as fh:
            json.dump({k: c[k] for k in ("b", "h_q", "h_kv", "s_q", "s_kv", "d", "mask")}, fh)
        print(f"{c['name']}: written to {d}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
