#!/usr/bin/env python3
"""Device call 37's noise check: per-row time ratios of the same binary in consecutive runs
(new2/new1, old3/old2, new4/new3) beside those of the old and the new binary in adjacent runs,
and the launch rows' host cost above the bare cublasLtMatmul, per run. Run from this folder."""
import json, math, statistics as st

def rows(f):
    d = {}
    for l in open(f):
        r = json.loads(l)
        if 'median_ms' in r and 'error' not in r:
            d[(r['op'], r['dtype'], r['m'], r['n'], r['k'])] = r['median_ms']
    return d

names = ['old1', 'new1', 'new2', 'old2', 'old3', 'new3', 'new4', 'old4']
R = {n: rows(f'call37-{n}.jsonl') for n in names}
def ratios(a, b):
    return [R[a][k] / R[b][k] for k in R[a] if k in R[b]]
def q(v):
    v = sorted(v); n = len(v)
    return (f"n={n} median={st.median(v):.3f} p5={v[int(0.05 * n)]:.3f} p95={v[int(0.95 * n) - 1]:.3f} "
            f"min={v[0]:.3f} max={v[-1]:.3f}")
print("same binary, consecutive runs (time ratio)")
same = []
for a, b in [('new2', 'new1'), ('old3', 'old2'), ('new4', 'new3')]:
    r = ratios(a, b); same += r; print(f"  {a}/{b}: {q(r)}")
print(f"  pooled: {q(same)}")
print("old binary's time / new binary's, adjacent runs")
pairs = [('old1', 'new1'), ('old2', 'new2'), ('old3', 'new3'), ('old4', 'new4')]
diff = []
for o, n in pairs:
    r = ratios(o, n); diff += r; print(f"  {o}/{n}: {q(r)}")
print(f"  pooled: {q(diff)}")
med = [st.median([R[o][k] / R[n][k] for o, n in pairs]) for k in sorted(R['old1'])]
print(f"per-row median over the 4 pairs: {q(med)}; geometric mean {math.exp(sum(map(math.log, med)) / len(med)):.4f}")

def launch(n):
    return {r['dtype']: r for r in map(json.loads, open(f'call37-{n}-launch.jsonl')) if r.get('op') == 'launch'}
L = {n: launch(n) for n in names}
print("launch rows: µs above the bare cublasLtMatmul of the same run (old runs | new runs)")
for dt in sorted(L['old1']):
    for f in ['host_us', 'host_raw_us', 'host_fresh_us', 'host_direct_us', 'host_raw_direct_us']:
        o = [L[n][dt][f] - L[n][dt]['bare_lt_us'] for n in names if n.startswith('old')]
        w = [L[n][dt][f] - L[n][dt]['bare_lt_us'] for n in names if n.startswith('new')]
        print(f"  {dt:4s} {f:18s} old {' '.join(f'{x:+.2f}' for x in o)} | new {' '.join(f'{x:+.2f}' for x in w)}"
              f" | medians {st.median(o):+.2f} / {st.median(w):+.2f}")
