#!/usr/bin/env bash
# Probe: the three-module language model (benchmarks/fix_workloads/lm_three_modules.py) timed plainly by
# plain_timer.py as written (plain), with gpudoctor's compile fix applied at runtime as the fix rounds apply
# it (runtime), with the change gpudoctor writes applied to a copy by gpudoctor's own edit code (written:
# `X.forward = torch.compile(X.forward)` for these modules of torch's own), and with `X.compile()` after
# each module's assignment (modcompile: compiles nothing for torch's own modules, pytorch/pytorch#150915).
# Does the written change run as fast as what the rounds measured? Each run's Dynamo recompilations and
# graph breaks are kept in OUT/NAME-K.log.
# Run on a GPU from the repository's root: bash lab/compile_forms.sh OUT_DIR [ROUNDS]
set -u
out=${1:?OUT_DIR}; rounds=${2:-2}
mkdir -p "$out/copies"
src=benchmarks/fix_workloads/lm_three_modules.py
export PYTHONPATH=${PYTHONPATH:-}:$PWD/src PYTHONUNBUFFERED=1
cp "$src" "$out/copies/plain.py"
sed -e 's/^\(embed = .*\)$/\1\nembed.compile()/' -e 's/^\(encoder = .*\)$/\1\nencoder.compile()/' \
    -e 's/^\(head = .*\)$/\1\nhead.compile()/' "$src" >"$out/copies/module_compile.py"
# the change `gpudoctor fix` writes for each of the three modules, placed by its own edit code at the
# line a fix round binds them from (the loop's call of the function that calls them)
python3 - "$src" "$out/copies/written.py" <<'EOF' || exit 1
import sys

import torch

from gpudoctor.fixes.diff import apply_edits
from gpudoctor.fixes.edits import Edit
from gpudoctor.fixes.patches.compile import written_form

src, dest = sys.argv[1:]
text = open(src).read()
call = max(i for i, line in enumerate(text.splitlines(), 1) if "logits = forward(" in line)
layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
modules = {
    "embed": torch.nn.Embedding(4, 8),
    "encoder": torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
    "head": torch.nn.Linear(8, 4),
}
edits = [Edit("after_assignment", src, call, name=n, code=(written_form(m),)) for n, m in modules.items()]
new, unplaced = apply_edits(text, edits)
if unplaced:
    sys.exit(f"not placed: {unplaced}")
open(dest, "w").write(new)
print("written:", *(line for line in new.splitlines() if line not in text.splitlines()), sep="\n  ")
EOF
python3 -c "import torch; print('torch', torch.__version__)"
for ((k = 0; k < rounds; k++)); do
    for c in plain:plain: runtime:plain:compile written:written: modcompile:module_compile:; do
        IFS=: read -r name script fixes <<<"$c"
        TORCH_LOGS=recompiles,graph_breaks timeout 300 python3 benchmarks/fix_workloads/plain_timer.py \
            --out "$out/$name-$k.json" --windows 3 ${fixes:+--fixes $fixes} -- "$out/copies/$script.py" \
            >/dev/null 2>"$out/$name-$k.log"
        python3 -c "import json; r = json.load(open('$out/$name-$k.json')); print('$name', $k, round(r['step_s'] * 1e3, 2) if r['step_s'] else r['error'], 'wall', round(r['wall_s'], 1))" ||
            echo "$name $k failed"
    done
done
