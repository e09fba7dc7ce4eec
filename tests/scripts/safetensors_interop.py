#!/usr/bin/python3
"""safetensors interoperability check for Crowdtrain (tests/unit/ckpt/test_safetensors_py.c).

Parses the format independently of our C code, following the specification
(https://github.com/huggingface/safetensors): 8-byte little-endian header
length, JSON header {name: {dtype, shape, data_offsets}}, optional
__metadata__, raw little-endian data. Only json, struct and numpy are used,
because the `safetensors` package is not in Debian.

  safetensors_interop.py check FILE   verify the tensors our exporter wrote
  safetensors_interop.py write FILE   write a file for our importer to read
Exit 0 on success; any mismatch raises (non-zero exit).
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
          "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    end = 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        assert b == end, f"{name}: hole or overlap at {b}"
        end = e
        dt = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[b:e], dtype=dt).reshape(info["shape"])
        out[name] = arr
    assert end == len(data), "unindexed bytes after the last tensor"
    assert n % 8 == 0, "header not padded to 8 bytes"
    return out, meta


def check(path):
    t, meta = read(path)
    i = np.arange(12, dtype=np.float32)
    want = {
        "layer1.weight": (i * 0.5 - 1).reshape(3, 4),
        "layer1.bias": (np.arange(4, dtype=np.float32) ** 2 / 8 - 3),
        "scale": np.array(42.0, dtype=np.float32),
    }
    assert set(t) == set(want), f"tensors {sorted(t)}"
    for k, v in want.items():
        assert t[k].dtype == np.float32, (k, t[k].dtype)
        assert t[k].shape == v.shape, (k, t[k].shape, v.shape)
        assert np.array_equal(t[k], v), (k, t[k], v)
    assert meta == {"format": "pt", "step": "17"}, meta
    try:  # a standard tool, when present: the arrays become torch tensors as they are
        import torch
        w = torch.from_numpy(t["layer1.weight"].copy())
        assert tuple(w.shape) == (3, 4) and float(w[2, 3]) == 4.5
    except ImportError:
        pass
    print("check: ok", {k: v.shape for k, v in t.items()})


def write(path):
    tensors = [
        ("emb", np.arange(6, dtype=np.float32).reshape(2, 3) * 0.25),
        ("half", np.array([0, 1, -2, 0.5, 65504], dtype=np.float16)),
        ("dbl", np.array([[1e-3, -2.5], [3.0, 1e10]], dtype=np.float64)),
    ]
    names = {np.float32: "F32", np.float16: "F16", np.float64: "F64"}
    header = {"__metadata__": {"source": "numpy"}}
    off = 0
    blobs = []
    for name, arr in tensors:
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[arr.dtype.type], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    print("write: ok")


if __name__ == "__main__":
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
