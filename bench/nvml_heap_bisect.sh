#!/bin/sh
# Rounds two and three of the NVML heap hunt (docs/real-gpu.md). Busy GPUs (NCCL on
# 1..N-1), glibc's malloc checker, $1 seconds per variant (default 45), all side by side,
# one line per variant. ROUND=2: field-id subsets and guarded arrays; ROUND=3 (default):
# the backend through a pynvml proxy (all calls locked, one call locked or failing, field
# values guarded) and each getter alone on one thread per GPU. BUSY=0,1 picks the NCCL GPUs.
T=${1:-45}
O=${2:-/tmp/heap-bisect}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONFAULTHANDLER=1
N=$(nvidia-smi -L | wc -l)
python3 bench/nccl_load.py --gpus "${BUSY:-$(seq -s, 1 $((N - 1)))}" --seconds $((T + 40)) > "$O/nccl.log" 2>&1 &
NCCL=$!
sleep 25
one() {  # name variant ids [env...]
    name=$1 variant=$2 ids=$3; shift 3
    start=$(date +%s)
    if env LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3 "$@" timeout $((T + 20)) \
        python3 bench/nvml_heap_repro.py --variant "$variant" --ids "$ids" --name "$name" \
        --seconds "$T" > "$O/$name.log" 2>&1; then
        echo "$name: $(tail -1 "$O/$name.log")"
    else
        echo "$name: DIED/FAILED (rc $?) after $(( $(date +%s) - start )) s: $(grep -m1 -i 'malloc\|corrupt\|free()\|wrote\|Abort\|Segmentation' "$O/$name.log")"
    fi
}
PIDS=""
if [ "${ROUND:-3}" = 2 ]; then
    ALL="82,83,3,4,11,12,5,6,29,30,31,142,143,144,145,94,230,165@0-17,161@0-17,162@0-17,163@0-17"
    one f-all fields-threads "$ALL" & PIDS="$PIDS $!"
    one f-230 fields-threads 230 & PIDS="$PIDS $!"
    one f-links fields-threads "165@0-17,161@0-17,162@0-17,163@0-17" & PIDS="$PIDS $!"
    one canary-all fields-canary "$ALL" & PIDS="$PIDS $!"
    one backend-one-thread backend-threads one-thread & PIDS="$PIDS $!"
    one backend-threads-arena1 backend-threads "" MALLOC_ARENA_MAX=1 & PIDS="$PIDS $!"
else
    one proxy-lock-all backend-proxy lock=all & PIDS="$PIDS $!"
    one proxy-lock-fields backend-proxy lock=nvmlDeviceGetFieldValues & PIDS="$PIDS $!"
    one proxy-no-fields backend-proxy fail=nvmlDeviceGetFieldValues & PIDS="$PIDS $!"
    one proxy-canary backend-proxy canary & PIDS="$PIDS $!"
    one proxy-no-procs backend-proxy fail=nvmlDeviceGetComputeRunningProcesses & PIDS="$PIDS $!"
    one proxy-no-meminfo backend-proxy fail=nvmlDeviceGetMemoryInfo & PIDS="$PIDS $!"
    for g in TemperatureV MemoryInfo ViolationStatus MarginTemperature RowRemapperHistogram \
             CurrPcieLinkWidth,CurrPcieLinkGeneration,MaxPcieLinkGeneration,MaxPcieLinkWidth \
             ClockInfo,PowerUsage,UtilizationRates,CurrentClocksEventReasons \
             MemoryErrorCounter,TotalEnergyConsumption; do
        one "c-$(echo $g | cut -c1-24)" calls-threads "$g" & PIDS="$PIDS $!"
    done
fi
wait $PIDS
kill $NCCL 2>/dev/null
pkill -f nccl_load.py 2>/dev/null
exit 0
