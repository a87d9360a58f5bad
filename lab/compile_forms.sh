#!/usr/bin/env bash
# Probe: the three-module language model (benchmarks/fix_workloads/lm_three_modules.py) timed plainly by
# plain_timer.py as written, with gpudoctor's compile fix applied at runtime (each module's forward
# compiled), with `X.compile()` after each module's assignment (the diff gpudoctor writes), and with
# `X.forward = torch.compile(X.forward)` in the script: do the recommendation and the measured fix agree?
# Run on a GPU from the repository's root: bash lab/compile_forms.sh OUT_DIR [ROUNDS]
set -u
out=${1:?OUT_DIR}; rounds=${2:-2}
mkdir -p "$out/copies"
src=benchmarks/fix_workloads/lm_three_modules.py
cp "$src" "$out/copies/plain.py"
sed -e 's/^\(embed = .*\)$/\1\nembed.compile()/' -e 's/^\(encoder = .*\)$/\1\nencoder.compile()/' \
    -e 's/^\(head = .*\)$/\1\nhead.compile()/' "$src" >"$out/copies/module_compile.py"
sed -e 's/^\(head = .*\)$/\1\nfor m in (embed, encoder, head):\n    m.forward = torch.compile(m.forward)/' \
    "$src" >"$out/copies/forward_compile.py"
export PYTHONPATH=${PYTHONPATH:-}:$PWD/src PYTHONUNBUFFERED=1
for ((k = 0; k < rounds; k++)); do
    for c in plain:plain: runtime:plain:compile modcompile:module_compile: fwdcompile:forward_compile:; do
        IFS=: read -r name script fixes <<<"$c"
        timeout 300 python3 benchmarks/fix_workloads/plain_timer.py --out "$out/$name-$k.json" --windows 3 \
            ${fixes:+--fixes $fixes} -- "$out/copies/$script.py" >/dev/null 2>&1
        python3 -c "import json; r = json.load(open('$out/$name-$k.json')); print('$name', $k, round(r['step_s'] * 1e3, 2) if r['step_s'] else r['error'], 'wall', round(r['wall_s'], 1))" ||
            echo "$name $k failed"
    done
done
