#!/usr/bin/env bash
# The GPU work of a session, as named steps run one after the other (a failed step does not stop the
# others), for tools/bg.sh on the device machine. Results under $BG_OUT (default ./gpu-session-out);
# $BG_OUT/steps.tsv says, per step, its exit status and seconds.
#
#   bash tools/gpu_session.sh STEP...
#
# Steps:
#   tests[:FILES[:GPUS]]  every `gpu`-marked test (pytest -m gpu), or those of FILES (comma-separated names
#                    under tests/, e.g. tests:test_fix_forkserver.py); GPUS: on those GPUs alone (indices
#                    joined by '+') and their share of the host's cores (see fmg)
#   memory[:CHECKS]  benchmarks/memory_truth.py --only CHECKS (default fragmentation,gpt2), merged
#                    into a copy of benchmarks/results/memory_truth.json -> $BG_OUT/mt/
#   record:CASES     tools/record_memory.py --only CASES --max-frames 16 -> $BG_OUT/memory_fixtures/
#   fve:NAME[:BUDGET[:MODE]]  benchmarks/fix_vs_expert.py --only NAME --budget BUDGET (default 5m);
#                    MODE "shared" adds --shared-baseline -> $BG_OUT/fve/
#   fvep:NAMES[:BUDGET[:GPUS[:PHASE[:PREV]]]]  fix_vs_expert on several workloads at once, one queue per GPU
#                    (every GPU the machine has, or GPUS: indices joined by '+', e.g. 2+3; empty: all),
#                    CUDA_VISIBLE_DEVICES, round-robin over the comma-separated NAMES; each workload's
#                    gpudoctor fix and its expert timed on the same GPU, each queue on its share of its
#                    GPU's NUMA-local cores (tools/gpu_cores.py, taskset); PHASE "fix": gpudoctor fix alone,
#                    no timing (the 5-minute verdicts); PHASE "time" with PREV, a folder (carried) holding
#                    fix/NAME/ of an earlier fix phase: the timing alone; FVE_ARGS: more options for
#                    fix_vs_expert.py (e.g. "--timing-max-s 300") -> $BG_OUT/fve_gpuK/; merge with
#                    `benchmarks/fix_vs_expert.py --merge DIR --measured-at COMMIT` (each queue's
#                    environment names its CUDA_VISIBLE_DEVICES; a name given once per GPU, e.g.
#                    fvep:timm_convnext_fp32,timm_convnext_fp32:10m:0+1:time:PREV, times the same kept
#                    fixes on each, and the merge pools their processes). Run nothing else on the host meanwhile
#                    that is being timed: the queues' loaders and compile workers perturb it.
#   mgo:PARALLEL[:PAIRS[:pin[:STEPS[:parts]]]]  benchmarks/multi_gpu_overhead.py --parallel PARALLEL (ddp or
#                    fsdp) --pairs PAIRS (default 4) --steps STEPS (default 100) on GPUs 0 and 1 (pin: --pin,
#                    each rank on its GPU's local cores; "-" for none; parts: --parts, the light phase with
#                    NVML, then the allocator's history, off too) -> $BG_OUT/mgo_PARALLEL[_pin][_parts]/
#   lt[:PAIRS[:CASES[:BLOCK_S[:pin[:nonvml]]]]]  benchmarks/light_toggle.py on GPUs 0 and 1: each rank alternates
#                    blocks with and without gpudoctor's capture in one process (default 10 pairs, every case,
#                    1 s blocks; pin: --pin, each rank on its GPU's local cores, "-" for none; nonvml: the
#                    capture without its NVML sampler) -> $BG_OUT/lt[_pin][_nonvml]/
#   mg[:SCENARIOS[:pin]]  benchmarks/multi_gpu.py (every scenario, or SCENARIOS comma-separated) with
#                    fixtures -> $BG_OUT/mg[_pin]/ (fixtures in fx/ there)
#   fmg[:NAMES[:BUDGET[:GPUS]]]  benchmarks/fix_multi_gpu.py --only NAMES (comma-separated; empty: all four)
#                    --budget BUDGET (default 3m) --pin on GPUS (two indices joined by '+', default 0+1; the
#                    whole step on those GPUs' share of the host's cores, as fvep's queues, so that two fmg
#                    steps in their own bg jobs run side by side on a 4-GPU host): gpudoctor fix --nproc 2 on each data-parallel
#                    script, then the script, its expert's version and the fix's patched copy timed as torchrun
#                    groups, each rank on its GPU's NUMA-local cores -> $BG_OUT/fmg_NAMES/ (fix_multi_gpu.json, to
#                    copy to benchmarks/results/); FMG_ARGS: more options for it (e.g. "--skip-fix")
#   zoo:NAMES        tools/record_zoo.py --only NAMES (zoo cases or controls, comma-separated) into a copy of
#                    tests/fixtures/zoo's manifest -> $BG_OUT/zoo/ (its traces and manifest.json to copy back)
#   spread:NAME[:N]  lab/process_spread.py: N processes of NAME left to the scheduler and N
#                    pinned to the GPU's cores (default 6) -> $BG_OUT/spread_NAME.json
#   aa:NAMES[:GPU]   benchmarks/aa_noise.py --only NAMES (comma-separated workloads; a name ending in .py is
#                    a script of one's own, a path in the tree, passed as --script): plain processes
#                    beside gpudoctor fix --aa on each -> $BG_OUT/aa/; GPU: on that GPU alone
#                    (CUDA_VISIBLE_DEVICES), on its share of the host's cores as an fvep queue has, so that
#                    it can run beside an fvep on the other GPU (a second gpu_session in its own bg job)
#   userfix:SCRIPT[:BUDGET[:GPU]]  `gpudoctor fix --budget BUDGET` (default 5m) on SCRIPT (a path in the tree)
#                    as its user runs it: copied alone into a folder of its own outside the tree and run from
#                    there, on GPU (default 0) and its share of the host's cores; UFIX_ARGS: more options for
#                    fix -> $BG_OUT/userfix_NAME/ (the fix directory: fix.json's proof beside the harness's figure)
#
# Wheels for what the machine lacks (.whl/, carried) are installed first, into /tmp/site. On the CPU, to
# check the plumbing: SMOKE=1 PYTHON=.venv/bin/python bash tools/gpu_session.sh fve:per_param_optimizer
set -u
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${BG_OUT:-$PWD/gpu-session-out}
PY=${PYTHON:-python3}
SMOKE=(${SMOKE:+--smoke})
mkdir -p "$OUT_DIR"
# once per machine: a second session started beside a first (e.g. `aa` on GPU 1 beside `fvep` on GPU 0)
# must not rewrite /tmp/site under the first one's imports
if [ -z "${SMOKE:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
    wheels=$(cd .whl && ls -- *.whl | sort | tr '\n' ' ')
    if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || exit 1
        printf '%s' "$wheels" >/tmp/site/.wheels
    fi
fi
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# on_gpus GPUS: the command prefix that runs a step on GPUS alone (indices joined by '+') and on those
# GPUs' share of the host's NUMA-local cores (tools/gpu_cores.py splits them among every GPU of the host,
# so that steps on other GPUs do not share them); in ON_GPUS (an array)
on_gpus() {
    local ids all gpu_id list_of union=""
    IFS=+ read -r -a ids <<<"$1"
    ON_GPUS=(env CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${ids[*]}")")
    all=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ -z "${SMOKE:-}" ] && [ "$all" -ge 1 ] && command -v taskset >/dev/null; then
        while read -r gpu_id list_of; do
            case "+$1+" in *"+$gpu_id+"*) union=${union:+$union,}$list_of ;; esac
        done < <("$PY" tools/gpu_cores.py $(seq 0 $((all - 1))))
    fi
    [ -n "$union" ] && ON_GPUS+=(taskset -c "$union")
    echo "on GPUs $1, cores ${union:-any}"
}

step() {
    local spec=$1 kind arg1 arg2 arg3 arg4 arg5
    IFS=: read -r kind arg1 arg2 arg3 arg4 arg5 <<<"$spec"
    case "$kind" in
    tests)
        # the files that hold `gpu` tests (collecting every file would need every test dependency);
        # gpudoctor's pytest plugin named where it is not installed (run from source)
        local plugin=(-p gpudoctor.timing.pytest_plugin)
        "$PY" -c 'import sys; from importlib.metadata import entry_points as e
sys.exit(not any(p.value.startswith("gpudoctor") for p in e(group="pytest11")))' && plugin=()
        local files
        if [ -n "${arg1:-}" ]; then
            IFS=, read -r -a files <<<"$arg1"
            files=("${files[@]/#/tests/}")
        else
            mapfile -t files < <(grep -l 'pytest.mark.gpu' tests/test_*.py)
        fi
        ON_GPUS=()
        [ -n "${arg2:-}" ] && on_gpus "$arg2"
        "${ON_GPUS[@]}" "$PY" -m pytest -q -p no:cacheprovider -m gpu "${plugin[@]}" "${files[@]}" 2>&1 |
            tee "$OUT_DIR/gpu_tests.log"
        return "${PIPESTATUS[0]}"
        ;;
    memory)
        mkdir -p "$OUT_DIR/mt"
        [ -f "$OUT_DIR/mt/memory_truth.json" ] || cp benchmarks/results/memory_truth.json "$OUT_DIR/mt/"
        "$PY" benchmarks/memory_truth.py --out "$OUT_DIR/mt/memory_truth.json" --only "${arg1:-fragmentation,gpt2}" \
            "${SMOKE[@]}"
        ;;
    record)  # into a copy of the committed fixtures' manifest, which it updates
        mkdir -p "$OUT_DIR/memory_fixtures"
        [ -f "$OUT_DIR/memory_fixtures/manifest.json" ] || cp tests/fixtures/memory/manifest.json "$OUT_DIR/memory_fixtures/"
        "$PY" tools/record_memory.py --only "$arg1" --max-frames 16 --out "$OUT_DIR/memory_fixtures" "${SMOKE[@]}"
        ;;
    fve)
        local shared=()
        [ "${arg3:-}" = shared ] && shared=(--shared-baseline)
        "$PY" benchmarks/fix_vs_expert.py --out "$OUT_DIR/fve" --only "$arg1" --budget "${arg2:-5m}" "${shared[@]}" \
            "${SMOKE[@]}"
        ;;
    fvep)
        local names ids n k
        IFS=, read -r -a names <<<"$arg1"
        if [ -n "${arg3:-}" ]; then
            IFS=+ read -r -a ids <<<"$arg3"
        else
            n=$(nvidia-smi -L 2>/dev/null | wc -l)
            [ "$n" -ge 1 ] || n=1
            mapfile -t ids < <(seq 0 $((n - 1)))
        fi
        # each queue on its share of its GPU's NUMA-local cores: side by side, no queue's compile
        # workers or loader workers run on another's cores (tools/gpu_cores.py; unpinned where unknown).
        # The shares are those of every GPU of the host, whichever this call uses: two fvep steps started
        # apart (one per GPU) would otherwise each take all the host's cores, and a fix run on one GPU
        # slow the other's timing
        local -A cores=()
        local gpu_id list_of all
        all=$(nvidia-smi -L 2>/dev/null | wc -l)
        [ "$all" -ge 1 ] || all=1
        if [ -z "${SMOKE:-}" ] && command -v taskset >/dev/null; then
            while read -r gpu_id list_of; do cores[$gpu_id]=$list_of; done < <("$PY" tools/gpu_cores.py $(seq 0 $((all - 1))))
        fi
        local prev=()
        [ -n "${arg5:-}" ] && prev=(--previous "$(realpath "$arg5")")
        for ((k = 0; k < ${#ids[@]}; k++)); do
            local mine=() i gpu=${ids[$k]} pin=()
            [ -n "${cores[$gpu]:-}" ] && pin=(taskset -c "${cores[$gpu]}")
            for ((i = k; i < ${#names[@]}; i += ${#ids[@]})); do mine+=("${names[$i]}"); done
            [ ${#mine[@]} -gt 0 ] || continue
            local list
            list=$(IFS=,; echo "${mine[*]}")
            echo "GPU $gpu: $list on cores ${cores[$gpu]:-any}" >>"$OUT_DIR/fve_gpu$gpu.log"
            CUDA_VISIBLE_DEVICES=$gpu "${pin[@]}" "$PY" benchmarks/fix_vs_expert.py --out "$OUT_DIR/fve_gpu$gpu" \
                --only "$list" --budget "${arg2:-10m}" --phase "${arg4:-all}" "${prev[@]}" ${FVE_ARGS:-} "${SMOKE[@]}" \
                >>"$OUT_DIR/fve_gpu$gpu.log" 2>&1 &
        done
        wait
        tail -n 5 "$OUT_DIR"/fve_gpu*.log
        ;;
    mgo)
        local cpu=()
        [ -n "${SMOKE:-}" ] && cpu=(--cpu)
        local pin=() tag="" parts=()
        [ "${arg3:-}" = pin ] && pin=(--pin) tag=_pin
        [ "${arg5:-}" = parts ] && parts=(--parts) tag=${tag}_parts
        CUDA_VISIBLE_DEVICES=0,1 "$PY" benchmarks/multi_gpu_overhead.py --out "$OUT_DIR/mgo_$arg1$tag" \
            --parallel "$arg1" --pairs "${arg2:-4}" --steps "${arg4:-100}" "${cpu[@]}" "${pin[@]}" "${parts[@]}"
        ;;
    lt)
        local cpu=()
        [ -n "${SMOKE:-}" ] && cpu=(--cpu)
        local pin=() tag="" nvml=()
        [ "${arg4:-}" = pin ] && pin=(--pin) tag=_pin
        [ "${arg5:-}" = nonvml ] && nvml=(--no-nvml) tag=${tag}_nonvml
        CUDA_VISIBLE_DEVICES=0,1 "$PY" benchmarks/light_toggle.py --out "$OUT_DIR/lt$tag" --pairs "${arg1:-10}" \
            --cases "${arg2:-ddp,straggler,uneven,fsdp}" --block-s "${arg3:-1.0}" --case-timeout-s 600 \
            "${cpu[@]}" "${pin[@]}" "${nvml[@]}"
        ;;
    mg)
        local cpu=() only=()
        [ -n "${SMOKE:-}" ] && cpu=(--cpu)
        [ -n "${arg1:-}" ] && only=(--scenarios "$arg1")
        local pin=() tag=""
        [ "${arg2:-}" = pin ] && pin=(--pin) tag=_pin
        CUDA_VISIBLE_DEVICES=0,1 "$PY" benchmarks/multi_gpu.py --out "$OUT_DIR/mg$tag" \
            --fixtures "$OUT_DIR/mg$tag/fx" "${only[@]}" "${cpu[@]}" "${pin[@]}"
        ;;
    aa)
        local pin=() visible=()
        if [ -n "${arg2:-}" ]; then
            visible=(env CUDA_VISIBLE_DEVICES="$arg2")
            local all list_of gpu_id
            all=$(nvidia-smi -L 2>/dev/null | wc -l)
            if [ -z "${SMOKE:-}" ] && [ "$all" -ge 1 ] && command -v taskset >/dev/null; then
                while read -r gpu_id list_of; do
                    [ "$gpu_id" = "$arg2" ] && pin=(taskset -c "$list_of")
                done < <("$PY" tools/gpu_cores.py $(seq 0 $((all - 1))))
            fi
            echo "aa on GPU $arg2, cores ${pin[2]:-any}"
        fi
        # names ending in .py are scripts of one's own (paths in the tree), the rest fix workloads
        local names=() scripts=() items=() item
        IFS=, read -ra items <<<"$arg1"
        for item in "${items[@]}"; do
            case "$item" in
            *.py) scripts+=(--script "$item") ;;
            *) names+=("$item") ;;
            esac
        done
        local only=()  # `aa` alone: aa_noise's default workloads
        [ -n "$arg1" ] && only=(--only "$(IFS=,; echo "${names[*]}")")
        "${visible[@]}" "${pin[@]}" "$PY" benchmarks/aa_noise.py --out "$OUT_DIR/aa" "${only[@]}" \
            "${scripts[@]}" "${SMOKE[@]}"
        ;;
    userfix)
        local name home
        name=$(basename "$arg1" .py)
        home=/tmp/userfix/$name
        rm -rf "$home" && mkdir -p "$home" && cp "$arg1" "$home/" || return 1
        on_gpus "${arg3:-0}"
        (cd "$home" && "${ON_GPUS[@]}" "$PY" -m gpudoctor fix --budget "${arg2:-5m}" -o "$OUT_DIR/userfix_$name" \
            ${UFIX_ARGS:-} "$(basename "$arg1")") 2>&1 | tee "$OUT_DIR/userfix_$name.log"
        return "${PIPESTATUS[0]}"
        ;;
    fmg)
        local only=()
        [ -n "${arg1:-}" ] && only=(--only "$arg1")
        on_gpus "${arg3:-0+1}"
        "${ON_GPUS[@]}" "$PY" benchmarks/fix_multi_gpu.py --out "$OUT_DIR/fmg${arg1:+_${arg1//,/_}}" "${only[@]}" \
            --budget "${arg2:-3m}" --pin ${FMG_ARGS:-} "${SMOKE[@]}"
        ;;
    zoo)
        mkdir -p "$OUT_DIR/zoo"
        [ -f "$OUT_DIR/zoo/manifest.json" ] || cp tests/fixtures/zoo/manifest.json "$OUT_DIR/zoo/"
        local cpu=()
        [ -n "${SMOKE:-}" ] && cpu=(--cpu)
        "$PY" tools/record_zoo.py --only "$arg1" --out "$OUT_DIR/zoo" "${cpu[@]}"
        ;;
    spread)
        "$PY" lab/process_spread.py --out "$OUT_DIR/spread_$arg1.json" --workload "$arg1" \
            --processes "${arg2:-6}" "${SMOKE[@]}"
        ;;
    *)
        echo "unknown step $spec" >&2
        return 2
        ;;
    esac
}

# the disk under the work (a timing result once came back empty: a full disk would do that)
disk() { df -h "$OUT_DIR" /tmp 2>/dev/null | awk 'NR > 1 {print "disk", $6, $4, "free of", $2}' | sort -u; }
for spec in "$@"; do
    echo "=== $spec ($(date -u +%H:%M:%S))"
    disk
    t0=$(date -u +%s)
    step "$spec"
    rc=$?
    printf '%s\t%s\t%s\n' "$spec" "$rc" "$(($(date -u +%s) - t0))" | tee -a "$OUT_DIR/steps.tsv"
done
disk
