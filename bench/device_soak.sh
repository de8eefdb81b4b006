#!/bin/sh
# The issue-21 measurement on a lent multi-GPU machine, in the pieces a lease allows (a
# command may run 10 minutes; a soak outlives it in its own process session).
#
#   bench/device_soak.sh cost SECONDS     # cost window: no XIDs, no checker daemons
#   bench/device_soak.sh start SECONDS    # start the soak (XIDs, 4 daemons) in the background
#   bench/device_soak.sh wait SECONDS     # wait (the soak keeps running), print its progress
#   bench/device_soak.sh collect          # wait for the soak's end, copy its report to $OUT
#
# Every call sets the NVLink-multicast switches off, as the lent machines require.
set -eu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/soak-out}"
DIR=/tmp/gpuwatchd-soak
XID_GPU="${XID_GPU:-3}"
mkdir -p "$OUT" "$DIR"
case "$1" in
cost)
    nvidia-smi topo -m >"$OUT/topo.txt" 2>&1 || true
    python3 bench/busy_node_soak.py --cost-only --seconds "$2" --warmup 45 \
        --xid-gpu "$XID_GPU" --out "$OUT/cost"
    ;;
start)
    rm -rf "$DIR/out"
    cp -r "$PWD" "$DIR/repo"  # the next call's copy of the tree replaces this one's
    cd "$DIR/repo"
    setsid nohup python3 bench/busy_node_soak.py --seconds "$2" --warmup 60 \
        --xid-gpu "$XID_GPU" --out "$DIR/out" >"$DIR/soak.log" 2>&1 </dev/null &
    echo "soak started for $2 s"
    ;;
wait)
    sleep "$2"
    uptime
    pgrep -af "gpuwatchd run" | wc -l
    tail -5 "$DIR/soak.log" || true
    ;;
collect)
    while pgrep -f "busy_node_soak.py --seconds" >/dev/null; do sleep 5; done
    cp "$DIR/soak.log" "$OUT/" || true
    cp -r "$DIR/out" "$OUT/soak" || true
    cat "$DIR/out/soak.txt" || tail -40 "$DIR/soak.log"
    ;;
esac
