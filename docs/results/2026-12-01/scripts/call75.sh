# burn adapter, final binaries: bench on the shapes in four precisions (device ordering,
# host wait, raw, raw+spin, raw between the device edges, host floor), then burn autotuned
# (binary built with --features burn-autotune): the bench's f16/bf16 rows and the digits training
# (burn autotuned, adapter device-ordered, adapter host-wait)
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
D=crates/gemmbridge/examples/data/digits.csv.gz
date +%T
timeout 120 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --dtypes f16,bf16,f32,tf32 --reps 5 --out $OUT/burn_bench.jsonl > /tmp/b.log 2>&1; echo "bench rc $?"; tail -14 /tmp/b.log
date +%T
gunzip -c .gpu/gemmbridge-burn-autotune.gz > /tmp/gba && chmod +x /tmp/gba
timeout 150 /tmp/gba bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --dtypes f16,bf16 --reps 5 --out $OUT/burn_bench_autotuned.jsonl > /tmp/ba.log 2>&1; echo "autotuned bench rc $?"; tail -8 /tmp/ba.log
date +%T
timeout 280 /tmp/gba train --data $D --batch 4096 --modes off,on-tf32,on-tf32-host-wait --out $OUT/burn_train_autotuned.jsonl > /tmp/ta.log 2>&1; echo "autotuned train rc $?"; tail -6 /tmp/ta.log
date +%T
