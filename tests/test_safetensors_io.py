"""The hand-written safetensors reader/writer: round trips, interop with the real package, strict errors."""
import json
import os

import pytest
import torch

from nanomars.util.safetensors_io import load_file, read_header, save_file


def sample_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "w.bf16": torch.randn(3, 5, generator=g).bfloat16(),  # odd byte count: tests alignment sorting
        "w.f16": torch.randn(7, generator=g).half(),
        "w.f32": torch.randn(4, 2, 3, generator=g),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "i32": torch.tensor([-1, 2], dtype=torch.int32),
        "flags": torch.tensor([True, False, True]),
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def test_round_trip(tmp_path):
    d = sample_tensors()
    save_file(d, tmp_path / "x.safetensors", metadata={"format": "pt"})
    assert_same(d, load_file(tmp_path / "x.safetensors"))
    _, meta, start = read_header(tmp_path / "x.safetensors")
    assert meta == {"format": "pt"} and start % 8 == 0  # header padded: data buffer 8-byte aligned
    assert os.listdir(tmp_path) == ["x.safetensors"]  # the temp file was renamed away


def test_loaded_tensors_are_private_views(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(4)}, path)
    before = path.read_bytes()
    t = load_file(path)["a"]
    t += 1  # copy-on-write mapping: the tensor is writable, the file is untouched
    assert path.read_bytes() == before and torch.equal(load_file(path)["a"], torch.zeros(4))


def test_interop_with_reference_package(tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="the reference `safetensors` package checks interop")
    d = sample_tensors()
    save_file(d, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    assert_same(d, st.load_file(tmp_path / "ours.safetensors"))  # ours -> theirs
    st.save_file(d, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert_same(d, load_file(tmp_path / "theirs.safetensors"))  # theirs -> ours


def write_raw(path, header, data=b"", n=None):
    head = json.dumps(header).encode() if isinstance(header, dict) else header
    path.write_bytes((len(head) if n is None else n).to_bytes(8, "little") + head + data)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"\x01\x02\x03") and p, "truncated safetensors file (3 bytes, need at least 8)"),
    (lambda p: write_raw(p, {}, n=1000), "header length 1000 runs past the end of the file"),
    (lambda p: write_raw(p, b"{not json"), "header is not valid JSON"),
    (lambda p: write_raw(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
     "tensor 'a' offsets [0, 16] out of range (data is 8 bytes)"),
    (lambda p: write_raw(p, {"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}}, b"\0" * 2),
     "tensor 'a' has unknown dtype 'Q4'"),
    (lambda p: write_raw(p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16),
     "tensor 'a' spans 16 bytes but F32[3] needs 12"),
    (lambda p: write_raw(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
     "tensors 'a' and 'b' overlap"),
    (lambda p: write_raw(p, {"a": {"dtype": "F32"}}), "malformed header entry for tensor 'a'"),
])
def test_bad_files(tmp_path, make, message):
    path = make(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError) as e:
        load_file(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
