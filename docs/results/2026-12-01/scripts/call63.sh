# training layers: 3 alternated pairs (peer-ours, ours-peer, peer-ours) of train-bench vs bench/train_peer.py,
# with the SM clock and power sampled every 200 ms (clocks.csv; markers.txt says which run is when)
mkdir -p /tmp/pairs
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > $OUT/clocks.csv &
smi=$!
mark() { echo "$(date +%Y/%m/%d\ %H:%M:%S.%3N) $1" >> $OUT/markers.txt; }
ours() { mark "ours$1 start"; timeout 150 .gpu/payload-bin/gemmbridge train-bench --out /tmp/pairs/ours$1.jsonl 2>&1 | grep -v "^$"; mark "ours$1 end"; }
peer() { mark "peer$1 start"; timeout 150 python3 bench/train_peer.py --out /tmp/pairs/peer$1.jsonl 2>&1 | grep -v -i warn; mark "peer$1 end"; }
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
kill $smi
tar -C /tmp -czf $OUT/pairs.tgz pairs
