"""
The safetensors format, read and written by hand. A file is:
    8 bytes     N, the header length, little-endian unsigned 64-bit
    N bytes     JSON header: {name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...}
                plus an optional "__metadata__": {str: str}; padded with spaces to a multiple of 8
    the rest    one raw byte buffer; each tensor is buffer[begin:end], row-major, little-endian
There is no pickle anywhere, so loading an untrusted file cannot run code, and the layout lets us
memory-map the file and hand out tensors that point straight into it (no copy until someone writes).
"""
import json
import math
import os

import torch

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
          "U8": torch.uint8, "BOOL": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def read_header(path):
    """Parse and validate the header; returns ({name: (dtype, shape, begin, end)}, metadata, data_start)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated safetensors file ({size} bytes, need at least 8)")
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            raise ValueError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except ValueError:  # bad JSON or bad UTF-8
            raise ValueError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    buf_len = size - 8 - n
    entries, spans = {}, []
    for name, info in header.items():
        try:
            dname, shape = info["dtype"], [int(s) for s in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path}: malformed header entry for tensor {name!r}") from None
        if dname not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unknown dtype {dname!r} (supported: {', '.join(DTYPES)})")
        dtype = DTYPES[dname]
        if not (0 <= begin <= end <= buf_len):
            raise ValueError(f"{path}: tensor {name!r} offsets [{begin}, {end}] out of range (data is {buf_len} bytes)")
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise ValueError(f"{path}: tensor {name!r} spans {end - begin} bytes but {dname}{shape} needs {nbytes}")
        entries[name] = (dtype, shape, begin, end)
        spans.append((begin, end, name))
    spans.sort()
    for (_, e0, a), (b1, _, b) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(f"{path}: tensors {a!r} and {b!r} overlap in the data buffer")
    return entries, metadata, 8 + n


def load_file(path):
    """{name: tensor} on the CPU. The tensors are views into a private (copy-on-write) mmap of the file."""
    entries, _, start = read_header(path)
    storage = torch.UntypedStorage.from_file(os.fspath(path), shared=False, nbytes=os.path.getsize(path))
    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        raw = torch.empty(0, dtype=torch.uint8).set_(storage[start + begin:start + end])  # bytes, no copy
        tensors[name] = raw.view(dtype).view(shape)
    return tensors


def save_file(tensors, path, metadata=None):
    """Write {name: tensor} as safetensors, atomically: a half-written file is never left at `path`."""
    # widest dtypes first (as the reference writer does) so every tensor starts aligned to its itemsize
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    items = [(name, t.detach().to("cpu").contiguous()) for name, t in items]
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in items:
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"{path}: cannot save tensor {name!r} of dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # pad so the data buffer starts 8-byte aligned
    tmp = f"{path}.tmp{os.getpid()}"  # same folder, so os.replace below is an atomic rename
    try:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for _, t in items:
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)  # raw bytes (works for bf16 too)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
