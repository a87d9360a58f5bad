"""The permanent change of `gpudoctor fix` as a unified diff against the user's script: keyword changes
at the recorded call sites, deleted statements, lines inserted after the imports or after the model's
assignment, a statement put under `with torch.autocast(...)`; an edit that cannot be placed is returned
with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

from gpudoctor.fixes.diff import apply_edits, unified_diff
from gpudoctor.fixes.edits import Edit

SCRIPT = '''\
"""Train a small model."""
import argparse

import torch
from torch.utils.data import DataLoader


def main():
    model = Net()
    model = model.cuda()
    loader = DataLoader(dataset, batch_size=32,
                        shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), foreach=False, lr=1e-3)
    for x, y in loader:
        x = x.to("cuda")
        out = model(x)
        loss = criterion(out, y)
        torch.cuda.empty_cache()
        opt.zero_grad(set_to_none=False)
'''


def edit(op: str, line: int = 0, **kw: object) -> Edit:
    return Edit(op, "train.py", line, **kw)  # type: ignore[arg-type]


def apply(*edits: Edit, text: str = SCRIPT) -> tuple[str, list[tuple[Edit, str]]]:
    new, unplaced = apply_edits(text, list(edits))
    ast.parse(new)  # every result still parses
    return new, unplaced


def test_keywords_are_added_replaced_and_dropped_in_a_multi_line_call() -> None:
    new, unplaced = apply(
        edit("set_kwargs", 11, call="DataLoader", kwargs={"num_workers": "8", "batch_size": "64"}),
        edit("set_kwargs", 13, call="AdamW", kwargs={"fused": "True"}, drop=("foreach",)),
    )
    assert not unplaced
    assert (
        "loader = DataLoader(dataset, batch_size=64,\n                        shuffle=True, num_workers=8)"
        in new
    )
    assert "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)" in new


def test_a_call_with_one_argument_a_line_gets_its_keywords_a_line_each() -> None:
    text = "loader = DataLoader(\n    dataset,\n    batch_size=32\n)\nargs = Args(\n    out='o',\n)\n"
    new, unplaced = apply(
        Edit("set_kwargs", "t.py", 1, call="DataLoader", kwargs={"num_workers": "8", "pin_memory": "True"}),
        Edit("set_kwargs", "t.py", 5, call="Args", kwargs={"bf16": "True"}),
        text=text,
    )
    assert not unplaced
    assert "    batch_size=32,\n    num_workers=8,\n    pin_memory=True\n)" in new  # no trailing comma
    assert "    out='o',\n    bf16=True,\n)" in new  # after the trailing comma, keeping it


def test_two_fixes_on_one_call_merge() -> None:
    new, _ = apply(
        edit("set_kwargs", 11, call="DataLoader", kwargs={"num_workers": "8"}),
        edit("set_kwargs", 11, call="DataLoader", kwargs={"pin_memory": "True"}),
    )
    assert "shuffle=True, num_workers=8, pin_memory=True)" in new


def test_a_method_call_gets_its_keyword() -> None:
    new, _ = apply(edit("set_kwargs", 15, call="to", kwargs={"non_blocking": "True"}))
    assert 'x = x.to("cuda", non_blocking=True)' in new


def test_an_empty_call_gets_its_first_keyword() -> None:
    new, _ = apply(edit("set_kwargs", 1, call="f", kwargs={"a": "1"}), text="f()\n")
    assert new == "f(a=1)\n"


def test_global_settings_go_after_the_imports_and_import_torch_if_needed() -> None:
    line = 'torch.set_float32_matmul_precision("high")'
    new, _ = apply(edit("insert_after_imports", code=(line,)))
    assert f"from torch.utils.data import DataLoader\n{line}\n" in new
    bare, _ = apply(edit("insert_after_imports", code=(line,)), text='"""doc"""\nx = 1\n')
    assert bare == f'"""doc"""\nimport torch\n{line}\nx = 1\n'


def test_compile_goes_after_the_last_assignment_of_the_model_in_its_scope() -> None:
    new, _ = apply(edit("after_assignment", 16, name="model", code=("{name}.compile()",)))
    assert "    model = model.cuda()\n    model.compile()\n    loader" in new


def test_a_line_that_names_torch_brings_its_import_where_the_file_has_none() -> None:
    # GIVEN the forward's compile (a module of torch's own) in a file that imports only `from torch import nn`
    text = "from torch import nn\n\nhead = nn.Linear(4, 2)\nout = head(x)\n"
    form = ("{name}.forward = torch.compile({name}.forward)",)
    new, unplaced = apply(edit("after_assignment", 4, name="head", code=form), text=text)
    # THEN `import torch` comes with it; in a file that imports torch, the line alone
    assert not unplaced
    assert "head = nn.Linear(4, 2)\nimport torch\nhead.forward = torch.compile(head.forward)\nout" in new
    new, _ = apply(edit("after_assignment", 5, name="head", code=form), text="import torch\n" + text)
    assert new.count("import torch") == 1 and "head.forward = torch.compile(head.forward)\nout" in new


def test_a_step_function_is_compiled_after_its_definition_decorated_or_not() -> None:
    # GIVEN the function a rollout calls its actor and critic from, once plain and once decorated
    text = (
        "import torch\n"
        "def act(obs):\n"
        "    return actor(obs), critic(obs)\n"
        "\n"
        "for t in range(8):\n"
        "    act(obs)\n"
    )
    form = ("{name} = torch.compile({name})",)
    new, unplaced = apply(edit("after_definition", 2, name="act", code=form), text=text)
    # THEN its name is bound to the compiled one right after its body, before anything calls it
    assert not unplaced
    assert "    return actor(obs), critic(obs)\nact = torch.compile(act)\n\nfor t" in new
    decorated = "import functools\n@functools.lru_cache\ndef act(obs):\n    return actor(obs)\nact(obs)\n"
    new, unplaced = apply(edit("after_definition", 2, name="act", code=form), text=decorated)
    assert not unplaced
    # (a file without torch's import gets it beside the line, as the modules' compile does)
    assert "    return actor(obs)\nimport torch\nact = torch.compile(act)\nact(obs)\n" in new
    # a function of that name that is not at the top level, or on another line, is not this one
    _, unplaced = apply(edit("after_definition", 4, name="act", code=form), text=text)
    assert unplaced and "no top-level function act defined on line 4" in unplaced[0][1]


def test_compile_skips_an_assignment_in_a_branch_the_call_lies_outside() -> None:
    text = (
        "import torch\n"
        "model = Net().cuda()\n"
        "if args.expert:\n"
        "    model = torch.compile(model)\n"
        "for x in loader:\n"
        "    out = model(x)\n"
    )
    new, unplaced = apply(edit("after_assignment", 6, name="model", code=("{name}.compile()",)), text=text)
    assert not unplaced
    assert new.startswith("import torch\nmodel = Net().cuda()\nmodel.compile()\nif args.expert:\n")
    # with none on the path, the last one before the call, as before
    only = "if a:\n    model = A()\nelse:\n    model = B()\nout = model(x)\n"
    new, _ = apply(edit("after_assignment", 5, name="model", code=("{name}.compile()",)), text=only)
    assert "    model = B()\n    model.compile()\nout" in new
    # an assignment in the loop that holds the call is on its path
    loop = "model = A()\nfor x in xs:\n    model = B(model)\n    out = model(x)\n"
    new, _ = apply(edit("after_assignment", 4, name="model", code=("{name}.compile()",)), text=loop)
    assert "    model = B(model)\n    model.compile()\n    out" in new


def test_autocast_wraps_the_call_and_channels_last_converts_the_input_before_it() -> None:
    new, _ = apply(
        edit("wrap_statement", 16, wrap='torch.autocast("cuda", dtype=torch.bfloat16)'),
        edit("before_statement", 16, code=("x = x.to(memory_format=torch.channels_last)",)),
    )
    assert (
        "        x = x.to(memory_format=torch.channels_last)\n"
        '        with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "            out = model(x)\n"
    ) in new


def test_the_calls_of_several_modules_in_a_row_go_under_one_autocast() -> None:
    # GIVEN a step that calls an encoder and then a head, and a discriminator after the backward
    step = (
        "for x in xs:\n"
        "    z = encoder(x)\n"
        "    # the head\n"
        "    y = head(z)\n"
        "    loss = y.sum()\n"
        "    loss.backward()\n"
        "    d = disc(y.detach())\n"
    )
    wrap = 'torch.autocast("cuda", dtype=torch.bfloat16)'
    new, unplaced = apply(*(edit("wrap_statement", n, wrap=wrap) for n in (2, 4, 7)), text=step)
    # THEN the encoder and the head share one block (the comment between them moves with them), the
    # discriminator, past other statements, gets its own
    assert not unplaced
    assert (
        f"    with {wrap}:\n        z = encoder(x)\n        # the head\n        y = head(z)\n    loss = y.sum()\n"
    ) in new
    assert f"    with {wrap}:\n        d = disc(y.detach())\n" in new


def test_what_an_autocast_block_assigns_is_cast_back_to_float32_after_it() -> None:
    # GIVEN a GAN's step: the discriminator on real images, its loss; then the generator and the
    # discriminator on the fake, in a row; a head whose output is not assigned to one name
    step = (
        "for real in loader:\n"
        "    output = netD(real)\n"
        "    err = criterion(output, ones)\n"
        "    fake = netG(noise)\n"
        "    output = netD(fake.detach())\n"
        "    a, b = head(output)\n"
    )
    wrap, cast = 'torch.autocast("cuda", dtype=torch.bfloat16)', ("{target} = {target}.float()",)
    new, unplaced = apply(*(edit("wrap_statement", n, wrap=wrap, code=cast) for n in (2, 4, 5, 6)), text=step)
    # THEN each block is followed by the casts of the names it assigned (once each), the loss taking
    # float32 as it did; a statement that assigns no single name gets no cast
    assert not unplaced
    assert f"    with {wrap}:\n        output = netD(real)\n    output = output.float()\n    err =" in new
    assert (
        f"    with {wrap}:\n        fake = netG(noise)\n        output = netD(fake.detach())\n"
        f"        a, b = head(output)\n    fake = fake.float()\n    output = output.float()\n"
    ) in new
    compile(new, "train.py", "exec")


def test_a_modules_other_call_lines_go_under_autocast_only_where_they_call_it_itself() -> None:
    # GIVEN the discriminator's other call lines: its call on the fake batch, and the generator's loss
    # around it (BCELoss fails under autocast)
    step = (
        "for real in loader:\n"
        "    output = netD(real).view(-1)\n"
        "    err = criterion(output, ones)\n"
        "    output = netD(fake.detach()).view(-1)\n"
        "    err_g = criterion(netD(fake), ones)\n"
    )
    wrap, cast = 'torch.autocast("cuda", dtype=torch.bfloat16)', ("{target} = {target}.float()",)
    first = edit("wrap_statement", 2, wrap=wrap, code=cast)
    others = (edit("wrap_statement", n, wrap=wrap, code=cast, call="netD") for n in (4, 5))
    new, unplaced = apply(first, *others, text=step)
    # THEN the call itself goes under autocast with its cast after; the loss stays as it was, silently
    assert not unplaced
    assert (
        f"    with {wrap}:\n        output = netD(fake.detach()).view(-1)\n    output = output.float()\n"
        in new
    )
    assert "\n    err_g = criterion(netD(fake), ones)\n" in new and new.count("with torch.autocast") == 2


def test_a_statement_is_deleted_and_a_block_left_empty_gets_pass() -> None:
    new, unplaced = apply(edit("delete_statement", 18, call="empty_cache"))
    assert "empty_cache" not in new and not unplaced
    alone, _ = apply(
        edit("delete_statement", 2, call="empty_cache"), text="for x in y:\n    torch.cuda.empty_cache()\n"
    )
    assert alone == "for x in y:\n    pass\n"


def test_edits_that_cannot_be_placed_say_why() -> None:
    text = "import torch\nx = f(); torch.cuda.empty_cache()\n"
    _, unplaced = apply(
        edit("delete_statement", 2, call="empty_cache"),
        edit("set_kwargs", 2, call="DataLoader", kwargs={"num_workers": "2"}),
        edit("after_assignment", 2, name="model", code=("{name}.compile()",)),
        text=text,
    )
    reasons = sorted(why for _, why in unplaced)
    assert reasons == ["line 2 holds more than one statement", "no assignment to model before line 2",
                       "no call to DataLoader on line 2"]  # fmt: skip


def test_the_unified_diff_names_the_file_and_shows_only_the_changed_lines(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = unified_diff([edit("set_kwargs", 19, call="zero_grad", kwargs={"set_to_none": "True"})])
    assert result.diff.startswith("--- a/train.py\n+++ b/train.py\n")
    assert (
        "-        opt.zero_grad(set_to_none=False)\n+        opt.zero_grad(set_to_none=True)\n" in result.diff
    )
    assert (tmp_path / "train.py").read_text() == SCRIPT  # the user's file is never edited


def test_modules_made_in_one_unpacking_assignment_are_each_compiled_after_it() -> None:
    # GIVEN a GAN's two networks made in one statement, as DCGAN scripts write them, and remade in a branch
    # the calls lie outside
    text = (
        "import torch\n"
        "netG, netD = Generator().cuda(), Discriminator().cuda()\n"
        "if args.expert:\n"
        "    netG, netD = netG.half(), netD.half()\n"
        "for real in loader:\n"
        "    out = netD(real)\n"
        "    fake = netG(noise)\n"
    )
    both = [edit("after_assignment", 6, name="netD", code=("{name}.compile()",)),
            edit("after_assignment", 7, name="netG", code=("{name}.compile()",))]  # fmt: skip
    new, unplaced = apply(*both, text=text)
    # THEN each goes after the statement that made it, not "no assignment to netD"
    assert not unplaced, unplaced
    assert (
        "netG, netD = Generator().cuda(), Discriminator().cuda()\nnetD.compile()\nnetG.compile()\nif" in new
    )
    # AND a starred or nested target binds its names too; another name does not
    nested = "import torch\n(a, *rest), b = f()\nout = rest(x)\n"
    new, unplaced = apply(edit("after_assignment", 3, name="rest", code=("{name}.compile()",)), text=nested)
    assert not unplaced and "(a, *rest), b = f()\nrest.compile()\nout" in new
    _, unplaced = apply(edit("after_assignment", 3, name="c", code=("{name}.compile()",)), text=nested)
    assert unplaced and "no assignment to c before line 3" in unplaced[0][1]
