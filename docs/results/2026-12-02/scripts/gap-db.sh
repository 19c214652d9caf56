#!/usr/bin/env bash
# The idle-gap protocol (`--gap-ms 200` on both sides), and the tactic database in bursts:
# (1) dense square + llm f16/bf16, four ops: PyTorch, gemmbridge with tactics/h200.json and
# gemmbridge without a database (the heuristic's plans), three alternated rounds; (2) the
# entries whose rows ran slower than the heuristic's plans (median ratio < 0.99) dropped
# (prune-burst.py); (3) that database beside PyTorch, three alternated pairs; (4) the MLP
# training step beside PyTorch with every GEMM of the step autotuned (`train-bench --tune`)
# and without, three alternated rounds.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/gap3; mkdir -p $R $OUT
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json; G="--gap-ms 200"; S=docs/results/2026-12-02/scripts
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi3.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi3.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi3.txt 2>&1; tar czf $OUT/gap3.tgz -C /tmp gap3; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
P="--dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu $G"
peer() { for s in square llm; do timeout 80 python3 bench/peer.py --suite $s $P --out /tmp/p$1-$s.jsonl > /dev/null 2>&1; done; cat /tmp/p$1-square.jsonl /tmp/p$1-llm.jsonl > $R/$1.jsonl; mark $1; }
ours() { local n=$1; shift; for s in square llm; do timeout 80 $B bench --suite $s $P "$@" --out /tmp/o$n-$s.jsonl > /dev/null 2>&1; done; cat /tmp/o$n-square.jsonl /tmp/o$n-llm.jsonl > $R/$n.jsonl; mark $n; }
peer peer1; ours db1 --db $DB; ours heur1; ours heur2; ours db2 --db $DB; peer peer2; peer peer3; ours db3 --db $DB; ours heur3
$B compare --ours $(j db1 db2 db3) --peer $(j peer1 peer2 peer3) --bound 0.98 > $R/compare-db-vs-peer.txt 2>&1
$B compare --ours $(j heur1 heur2 heur3) --peer $(j peer1 peer2 peer3) --bound 0.98 > $R/compare-heur-vs-peer.txt 2>&1
$B compare --ours $(j db1 db2 db3) --peer $(j heur1 heur2 heur3) --bound 0.99 > $R/compare-db-vs-heur.txt 2>&1
python3 $S/prune-burst.py $DB $R/h200-pruned.json 0.99 $(j db1 db2 db3) $(j heur1 heur2 heur3) > $R/prune.txt 2>&1
grep -E "◂" $R/compare-db-vs-peer.txt $R/compare-heur-vs-peer.txt; grep -E "^drop|dropped" $R/prune.txt
peer vpeer1; ours vours1 --db $R/h200-pruned.json; ours vours2 --db $R/h200-pruned.json; peer vpeer2; peer vpeer3; ours vours3 --db $R/h200-pruned.json
$B compare --ours $(j vours1 vours2 vours3) --peer $(j vpeer1 vpeer2 vpeer3) --bound 0.98 > $R/compare-pruned-vs-peer.txt 2>&1
grep -E "◂" $R/compare-pruned-vs-peer.txt; tail -9 $R/compare-pruned-vs-peer.txt
T="--ops mlp_train $G"
tpeer() { timeout 60 python3 bench/train_peer.py $T --out $R/tpeer$1.jsonl > /tmp/tpeer$1.txt 2>&1; mark tpeer$1; }
tours() { timeout 90 $B train-bench $T --out $R/tours$1.jsonl > /tmp/tours$1.txt 2>&1; mark tours$1; }
ttuned() { timeout 120 $B train-bench $T --tune --out $R/ttuned$1.jsonl > $R/ttuned$1.txt 2>&1; mark ttuned$1; }
tpeer 1; ttuned 1; tours 1; tours 2; ttuned 2; tpeer 2; tpeer 3; ttuned 3; tours 3
$B compare --ours $(j tours1 tours2 tours3) --peer $(j tpeer1 tpeer2 tpeer3) --bound 1.03 > $R/compare-mlp-gap.txt 2>&1
$B compare --ours $(j ttuned1 ttuned2 ttuned3) --peer $(j tpeer1 tpeer2 tpeer3) --bound 1.03 > $R/compare-mlp-tuned-gap.txt 2>&1
head -8 $R/compare-mlp-gap.txt; head -8 $R/compare-mlp-tuned-gap.txt
tar czf $OUT/gap3.tgz -C /tmp gap3
