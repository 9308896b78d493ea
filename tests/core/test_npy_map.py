"""The tool's own .npy reader (dumpfmt/npy_map.py) against numpy's ``np.load``: the same dtype,
shape, order and values for every kind of file np.save writes, small (read) and large (mapped),
at any offset inside a larger file (a packed member); bad files raise TensorFileError, with
nothing unpickled."""
import io
import os

import numpy as np
import pytest

from ts_core.dumpfmt.errors import TensorFileError
from ts_core.dumpfmt.npy_map import SMALL, is_mapped, read_npy
from ts_core.dumpfmt.tensor_store import load_tensor_file

rng = np.random.default_rng(0)
ARRAYS = {
    "f32 large": rng.standard_normal(SMALL // 4 + 7, dtype=np.float32),
    "f32 small 3d": rng.standard_normal((2, 3, 4), dtype=np.float32),
    "f64 fortran large": np.asfortranarray(rng.standard_normal((300, 40))),
    "f16 fortran small": np.asfortranarray(rng.standard_normal((5, 7)).astype(np.float16)),
    "big-endian f4": rng.standard_normal(50).astype(">f4"),
    "int64": rng.integers(-9, 9, (4, 5), dtype=np.int64),
    "uint8 large": rng.integers(0, 255, SMALL * 3, dtype=np.uint8),
    "bool": rng.random((3, 3)) > 0.5,
    "complex64": (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64),
    "0-d": np.array(3.5, dtype=np.float64),
    "empty": np.zeros((0, 5), dtype=np.int32),
    "structured": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),     # header through ast
    "unicode": np.array(["ab", "cde"]),
}


def _npy_bytes(array, version=None) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:     # a version-2 header (4-byte length), as np.save writes for very long headers
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def _check(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.c_contiguous == want.flags.c_contiguous and got.flags.f_contiguous == want.flags.f_contiguous
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable


@pytest.mark.parametrize("name", list(ARRAYS))
def test_file_reads_as_np_load_does(tmp_path, name):
    path = tmp_path / "t.npy"
    np.save(path, ARRAYS[name])
    got = load_tensor_file(path)
    _check(got, np.load(path))
    assert is_mapped(got) == (got.nbytes >= SMALL)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("name", ["f32 large", "f64 fortran large", "int64"])
def test_member_at_any_offset_reads_as_np_load_does(tmp_path, name, version):
    blob = _npy_bytes(ARRAYS[name], version)
    path = tmp_path / "pack"
    lead = 4096 * 3 + 512                       # not a page multiple: the map starts below it
    path.write_bytes(b"x" * lead + blob + b"y" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_npy(fd, lead, len(blob), "member")
    finally:
        os.close(fd)
    _check(got, np.load(io.BytesIO(blob)))


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "t.npy"
    blob = _npy_bytes(ARRAYS["f32 large"])
    path.write_bytes(blob[:-4])
    with pytest.raises(TensorFileError, match="header says"):
        load_tensor_file(path)
    path.write_bytes(blob[:20])                 # cut inside the header
    with pytest.raises(TensorFileError, match="cut short|bad .npy header"):
        load_tensor_file(path)


def test_object_arrays_are_refused_and_not_unpickled(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(TensorFileError, match="refusing to unpickle"):
        load_tensor_file(path)


def test_not_npy_and_missing_files_are_clear_errors(tmp_path):
    path = tmp_path / "t.npy"
    path.write_bytes(b"PK\x03\x04 not numpy at all")
    with pytest.raises(TensorFileError, match="not a .npy file"):
        load_tensor_file(path)
    with pytest.raises(TensorFileError, match="cannot be read"):
        load_tensor_file(tmp_path / "absent.npy")
