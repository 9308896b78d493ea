"""TroubleShooter's face says what happened in its own terms: a wrong net is refused at
api_dump_init, api_dump_compare prints its table with a missing side shown as missing, and
save() says which members it did not write."""
import re

import pytest
import torch

import ts_core.compat as ts

from .nets import run_torch, weights


@pytest.mark.parametrize("net", [None, object(), "net"])
def test_api_dump_init_refuses_what_is_not_a_network(net, tmp_path):
    with pytest.raises(TypeError) as err:
        ts.migrator.api_dump_init(net, str(tmp_path))
    msg = str(err.value)
    assert msg.startswith("api_dump_init(net, output_path): net must be the network to dump")
    assert "start(model" not in msg and type(net).__name__.replace("NoneType", "None") in msg


def test_api_dump_compare_prints_the_table_and_counts_missing_rows(tmp_path, capsys):
    w = weights()
    run_torch(tmp_path / "a", w)
    run_torch(tmp_path / "b", w, mode="list", scope=["NN_Linear_0", "NN_Linear_1"])
    capsys.readouterr()
    result = ts.migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"))
    out = capsys.readouterr().out
    fwd = result["forward"]
    missing = [r for r in fwd if r[0] is None or r[1] is None]
    assert missing and all(r[4] is None for r in missing)
    assert "ORIGIN NET (torch)" in out and "result of allclose" in out
    relu_row = next(line for line in out.splitlines() if "NN_ReLU_0_forward_output.0" in line)
    assert re.search(r"\|\s+-\s+\|", relu_row) and "| missing " in relu_row, relu_row
    ok = sum(1 for r in fwd if r[4] is True)
    assert f"{len(fwd)} rows: {ok} allclose, 0 not allclose, {len(missing)} missing on one side" in out
    assert "vs None" not in out


def test_save_says_which_members_it_does_not_write(tmp_path):
    with pytest.warns(UserWarning, match=r"not tensors are not saved: 1 \(int\), 2 \(str\); wrote the tensors only"):
        ts.save(str(tmp_path / "x"), [torch.ones(2), 3, "a"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name for f in tmp_path.glob("*_x_0.npy")]
    with pytest.warns(UserWarning, match="wrote nothing"):
        ts.save(str(tmp_path / "y"), {"lr": 0.1})
