# gemmbridge-burn train against burn 0.21 with its autotuner on (binary built with
# --features burn-autotune): burn alone, the adapter with the fused bias gradient, the adapter
# with burn's bias-gradient reduction; digits MLP, batch 4096, tf32
set -x
export CUDA_PATH=/usr/local/cuda
D=crates/gemmbridge/examples/data/digits.csv.gz
gunzip -c .gpu/gemmbridge-burn-autotune.gz > /tmp/gba && chmod +x /tmp/gba
date +%T
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 470 /tmp/gba train --data $D --batch 4096 --modes off,on-tf32,on-tf32-unfused-bgrad --out $OUT/burn_train_autotuned.jsonl 2>&1 | tail -10
date +%T
