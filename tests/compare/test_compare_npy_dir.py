"""compare_npy_dir keeps TroubleShooter's contract (seed 004)."""
import csv
import math

import numpy as np
import pytest

from ts_core.compare import DumpFormatError
from ts_core.compat import compare_npy_dir, get_name_map_list_by_name


@pytest.fixture
def dirs(tmp_path):
    a, b = tmp_path / "ms", tmp_path / "pt"
    a.mkdir(); b.mkdir()
    x = np.array([[0.2, 0.5, 0.2]], np.float32)
    np.save(a / "0_input.npy", x); np.save(b / "0_input.npy", x)
    np.save(a / "1_dense.npy", np.array([[1.0, 2.0]], np.float32))
    np.save(b / "1_dense.npy", np.array([[1.0, 2.1]], np.float32))
    np.save(a / "2_dense_backward.npy", np.zeros((1, 2), np.float32))
    np.save(b / "2_dense_backward.npy", np.zeros((2, 1), np.float32))
    np.save(a / "3_only_ms.npy", x)
    return a, b


def test_default_pairs_identical_names_and_reports_metrics(dirs, capsys):
    rows = compare_npy_dir(str(dirs[0]), str(dirs[1]))
    by = {(r.orig_name, r.target_name): r for r in rows}
    same = by[("0_input.npy", "0_input.npy")]
    assert (same.allclose, same.allclose_ratio, same.cosine, same.max_diff) == (True, 1.0, pytest.approx(1.0), 0.0)
    dense = by[("1_dense.npy", "1_dense.npy")]
    assert dense.allclose is False and dense.allclose_ratio == 0.5
    expected_cos = (1 * 1 + 2 * 2.1) / (math.sqrt(5) * math.sqrt(1 + 2.1 ** 2))
    assert dense.cosine == pytest.approx(expected_cos, rel=1e-6)
    assert dense.mean_diff == pytest.approx(0.05, rel=1e-5) and dense.max_diff == pytest.approx(0.1, rel=1e-5)
    assert by[("2_dense_backward.npy", "2_dense_backward.npy")].result == "Shape is inconsistent"
    assert by[("3_only_ms.npy", None)].allclose is False
    out = capsys.readouterr().out
    assert "The list of comparison results" in out and "orig array name" in out and "100.00%" in out


def test_tolerances_equal_nan_and_name_map(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(); b.mkdir()
    np.save(a / "x.npy", np.array([1.0, np.nan])); np.save(b / "y.npy", np.array([1.0005, np.nan]))
    pairs = [("x.npy", "y.npy")]
    assert compare_npy_dir(str(a), str(b), name_map_list=pairs)[0].allclose is False
    assert compare_npy_dir(str(a), str(b), 1e-3, 1e-3, True, name_map_list=pairs)[0].allclose is True
    assert get_name_map_list_by_name(str(a), str(b)) == [("x.npy", None), (None, "y.npy")]


def test_shapes_and_csv_with_numbers(dirs, tmp_path, capsys):
    out = tmp_path / "res" / "compare.csv"
    compare_npy_dir(str(dirs[0]), str(dirs[1]), compare_shape=True, output_file=str(out))
    assert "shape of orig" in capsys.readouterr().out
    with open(out) as f:
        rows = list(csv.DictReader(f))
    r = next(x for x in rows if x["orig array name"] == "1_dense.npy")
    assert float(r["ratio of allclose"]) == 0.5 and float(r["max diff"]) == pytest.approx(0.1, rel=1e-5)
    assert r["shape of orig"] == "[1, 2]" and r["result of allclose"] == "False"


def test_not_a_directory(tmp_path):
    with pytest.raises(DumpFormatError, match="orig_dir"):
        compare_npy_dir(str(tmp_path / "nope"), str(tmp_path))
