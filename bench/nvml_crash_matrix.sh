#!/bin/sh
# Runs NVML polling variants side by side for $1 seconds (default 60) and reports which
# survived (heap-corruption hunt on a 2 x H200 NVLink host, docs/real-gpu.md).
# Usage on a GPU host: sh bench/nvml_crash_matrix.sh 60
P=bench/nvml_fieldvalues_probe.py
export PROBE_SECONDS=${1:-60}
run() {
    name=$1; shift
    start=$(date +%s)
    if env "$@" timeout $((PROBE_SECONDS + 30)) python3 $P backend free 10 \
        > /tmp/matrix-$name.log 2>&1; then
        echo "$name: $(tail -1 /tmp/matrix-$name.log)"
    else
        echo "$name: DIED after $(( $(date +%s) - start ))s: $(grep -m1 -i 'malloc\|corrupt\|free()\|Segmentation' /tmp/matrix-$name.log)"
    fi
}
run thread-8mb-default PROBE_GPUS=1 &
run main-thread PROBE_GPUS=1 PROBE_MAIN=1 &
run thread-64mb PROBE_GPUS=1 PROBE_STACK_MB=64 &
run two-threads-64mb PROBE_STACK_MB=64 &
run thread-arena1 PROBE_GPUS=1 MALLOC_ARENA_MAX=1 &
wait
ulimit -s
python3 -c "import threading; print('threading.stack_size', threading.stack_size())"
