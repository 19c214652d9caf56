# FP8 training layers and the burn adapter's fused bias gradient: the oracles (FP8 cases included),
# every GPU test, memcheck over the FP8 layer test, gemmbridge-burn train (fused vs unfused bias
# gradient) with burn's autotuner off and on
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
export CUDA_PATH=/usr/local/cuda
python3 .gpu/torch_oracle.py /tmp/oracle_shared > $OUT/oracle_shared.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > $OUT/oracle_train.log 2>&1
tail -3 $OUT/oracle_train.log
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 330 bash .gpu/run tests --test-threads 1 > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result|FAILED|panicked|^fp8|ratio .* (FAIL|ok)$' /tmp/t.log | grep -v ' ok$' | head -60
grep -E 'fp8_' /tmp/t.log | grep -E 'ratio' | head -40
timeout 150 bash .gpu/run sanitize fp8_mlps > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY|test result' /tmp/s.log
D=crates/gemmbridge/examples/data/digits.csv.gz
timeout 100 bash .gpu/run bin gemmbridge-burn train --data $D --batch 4096 --modes off,on-tf32,on-tf32-unfused-bgrad,on-tf32 --out $OUT/burn_train.jsonl 2>&1 | tail -8
gunzip -c .gpu/gemmbridge-burn-autotune.gz > /tmp/gba && chmod +x /tmp/gba
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 200 /tmp/gba train --data $D --batch 4096 --modes off,on-tf32,on-tf32-unfused-bgrad --out $OUT/burn_train_autotuned.jsonl 2>&1 | tail -8
