#!/bin/bash
# Default-settings speed on real-weight data: pure-decode limit (2 processes), our loader over the
# default conversion (decode_threads 0/1/2) and the raw folder, LeRobot 0.6.1's map-style dataset;
# 2 workers, batch 16, 2 frames per camera + 50 actions. Prints steady samples/s and CPU ms per
# steady sample (all processes). On a shared machine only ratios of CPU ms within one run mean much.
#   DATA=DIR (DIR/raw: a LeRobot v3.0 dataset, DIR/conv: its default conversion) benchmarks/speed/run.sh
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
ROOTFS=${ROOTFS:-/work/bench-env/lerobot-0.6.1-root}   # built by lerobot-latest.sh setup
LEROBOT_LATEST=${LEROBOT_LATEST:-/work/shared/tools/lerobot-latest.sh}
D=${DATA:?DATA=dir with raw/ and conv/}
B=${B:-15}
for rep in ${REPS:-1}; do
  for cfg in "limit" "conv uint8 {\"decode_threads\":0}" "conv uint8 {\"decode_threads\":1}" \
      "conv uint8 {\"decode_threads\":2}" "raw uint8 {\"decode_threads\":1}" "lerobot uint8" \
      "conv float32 {\"decode_threads\":1}" "lerobot float32"; do
    set -- $cfg
    case $1 in
      limit) r=$(PYTHONPATH=src $PY benchmarks/speed/limit.py "$D/conv" 2 20 2>/dev/null);;
      conv|raw) r=$(PYTHONPATH=src $PY benchmarks/speed/ours.py "$D/$1" "$2" 2 "$B" "$3" 2>/dev/null);;
      lerobot) r=$(bash "$LEROBOT_LATEST" run "$ROOTFS" "$PWD/benchmarks/speed" "$D" -- \
          "$PWD/benchmarks/speed/peer.py" "$D/raw" "$2" 2 "$B" 2>/dev/null | tail -1);;
    esac
    echo "$(date +%H:%M:%S) rep=$rep load=$(cut -d' ' -f1 /proc/loadavg) $cfg $r"
  done
done
