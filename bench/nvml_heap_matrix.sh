#!/bin/sh
# The NVML heap-corruption matrix on a busy multi-GPU host (docs/real-gpu.md): an NCCL
# all-reduce on GPUs 1..N-1, then every variant of bench/nvml_heap_repro.py side by side
# under glibc's malloc checker for $1 seconds (default 150). One line per variant.
# Usage on a GPU host: sh bench/nvml_heap_matrix.sh 150 [OUTDIR]
T=${1:-150}
O=${2:-/tmp/heap-matrix}
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONFAULTHANDLER=1
N=$(nvidia-smi -L | wc -l)
BUSY=$(seq -s, 1 $((N - 1)))
python3 bench/nccl_load.py --gpus "$BUSY" --seconds $((T + 35)) > "$O/nccl.log" 2>&1 &
sleep 25  # NCCL up, processes on the GPUs
nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory --format=csv > "$O/apps.csv"
for v in procs-threads procs-threads-locked procs-one-thread procs-events fields-threads \
         getters-threads procs-canary backend-threads backend-threads-proclock; do
    (
        start=$(date +%s)
        if env LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3 timeout $((T + 30)) \
            python3 bench/nvml_heap_repro.py --variant $v --seconds "$T" > "$O/$v.log" 2>&1; then
            echo "$v: $(tail -1 "$O/$v.log")"
        else
            echo "$v: DIED (rc $?) after $(( $(date +%s) - start )) s: $(grep -m1 -i 'malloc\|corrupt\|free()\|fault\|Abort' "$O/$v.log")"
        fi
    ) &
done
wait
