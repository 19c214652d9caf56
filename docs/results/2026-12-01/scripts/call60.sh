# training layers: oracles, GPU tests, the digits example on the GPU, a first step-time look
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
python3 .gpu/torch_oracle.py /tmp/oracle_shared > $OUT/oracle_shared.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > $OUT/oracle_train.log 2>&1
cp /tmp/oracle_shared/index.json $OUT/oracle_shared_index.json; cp /tmp/oracle_train/index.json $OUT/oracle_train_index.json
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 240 bash .gpu/run tests --test-threads 1
timeout 60 bash .gpu/run bin digits_mlp
timeout 60 bash .gpu/run bin digits_mlp --precision bf16 --act gelu
timeout 100 bash .gpu/run bin gemmbridge train-bench --reps 10 --out $OUT/train_ours.jsonl
timeout 100 python3 bench/train_peer.py --reps 10 --out $OUT/train_peer.jsonl
