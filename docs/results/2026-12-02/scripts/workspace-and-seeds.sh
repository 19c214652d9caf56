#!/usr/bin/env bash
# (1) Does the workspace size passed at launch explain matmul 3537x12288x2048's gap? The llm
# suite's matmul rows with the stream's whole workspace (the default) and with the size the
# algorithm needs (as cuBLAS passes it), beside PyTorch, four rounds. (2) The FP8 MLP test that
# missed its 2e-2 band by 2 % once: its seed again and three fresh seeds.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
T=$(ls /tmp/gb/tests/train_gpu-* | head -1)
for seed in 8801841979584304481 fresh fresh fresh; do
  if [ $seed = fresh ]; then timeout 60 $T --include-ignored fp8_mlps_match_the_cpu_emulation > $R/fp8mlp.txt 2>&1; else GEMMBRIDGE_TEST_SEED=$seed timeout 60 $T --include-ignored fp8_mlps_match_the_cpu_emulation > $R/fp8mlp.txt 2>&1; fi
  echo "seed $seed rc $?" >> $R/fp8mlp-all.txt; grep -E "test seed|panicked|rel error|test result" $R/fp8mlp.txt >> $R/fp8mlp-all.txt
done
cat $R/fp8mlp-all.txt
M="--suite llm --dtypes f16,bf16 --ops matmul,linear"
for i in 1 2 3 4; do
  timeout 60 python3 bench/peer.py $M --out $R/wpeer$i.jsonl > /dev/null 2>&1
  timeout 60 $B bench $M --db $DB --out $R/wfull$i.jsonl > /dev/null 2>&1
  timeout 60 $B bench $M --db $DB --exact-workspace --out $R/wexact$i.jsonl > /dev/null 2>&1
done
for v in full exact; do $B compare --ours $R/w${v}1.jsonl,$R/w${v}2.jsonl,$R/w${v}3.jsonl,$R/w${v}4.jsonl --peer $R/wpeer1.jsonl,$R/wpeer2.jsonl,$R/wpeer3.jsonl,$R/wpeer4.jsonl --bound 0.98 > $R/compare-$v.txt 2>&1; echo "== $v"; grep -E "^(matmul|linear) " $R/compare-$v.txt; done
tar czf $OUT/run5.tgz -C /tmp r
