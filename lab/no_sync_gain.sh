#!/usr/bin/env bash
# Probe: what the `no_sync` fix alone gains on benchmarks/fix_multi_gpu/ddp_hf_lm.py on 2 GPUs — the script
# against a copy with lab/no_sync_hf_lm.diff (gpudoctor fix's diff of its no_sync round on the CPU path)
# applied, as torchrun groups timed by _rank_timer.py, alternating A B B A. Results: $OUT/nosync/*/rank*.json.
set -eu
OUT=${OUT:-/tmp/nosync_out}
mkdir -p "$OUT/nosync"
copy=$(mktemp -d)
mkdir -p "$copy/benchmarks/fix_multi_gpu"
cp benchmarks/fix_multi_gpu/ddp_hf_lm.py "$copy/benchmarks/fix_multi_gpu/"
patch -s -p1 -d "$copy" <lab/no_sync_hf_lm.diff
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PIN_CORES=1
PY=${PY:-python3}
for run in plain:1 nosync:1 nosync:2 plain:2; do
    label=${run%%:*}
    script=benchmarks/fix_multi_gpu/ddp_hf_lm.py
    [ "$label" = nosync ] && script=$copy/benchmarks/fix_multi_gpu/ddp_hf_lm.py
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/fix_multi_gpu/_rank_timer.py \
        --out "$OUT/nosync/$run" --warmup-steps 10 --steps 40 -- "$script" >"$OUT/nosync/$label.log" 2>&1 || true
    "$PY" -c "import json,sys; r=[json.load(open(f'$OUT/nosync/$run/rank{k}.json')) for k in (0,1)]; print('$run', max(x['step_s'] for x in r)*1e3, 'ms')"
done
