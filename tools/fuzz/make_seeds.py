#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the fuzz seed corpus from the case corpus (run from anywhere):

  corpus/npy/   every distinct .npy file under tests/cases (good and malformed)
  corpus/case/  each case.json, a NUL byte, then its input shapes in the
                encoding fuzz_case.cpp reads (rank byte, one byte per dim)
"""
import hashlib
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "..", "..", "tests", "cases")


def npy_shape(path):
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b"\x93NUMPY") or len(data) < 10:
        return None
    n = 2 if data[6] == 1 else 4
    hlen = int.from_bytes(data[8:8 + n], "little")
    header = data[8 + n:8 + n + hlen].decode("latin1")
    start = header.find("'shape': (")
    if start < 0:
        return None
    dims = header[start + 10:header.find(")", start)]
    try:
        return [int(d) for d in dims.split(",") if d.strip()]
    except ValueError:
        return None


def main():
    for sub in ["npy", "case"]:
        d = os.path.join(HERE, "corpus", sub)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    seen = set()
    for dirpath, _, files in sorted(os.walk(CASES)):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if f.endswith(".npy"):
                data = open(path, "rb").read()
                digest = hashlib.sha1(data).hexdigest()[:16]
                if len(data) <= 4096 and digest not in seen:
                    seen.add(digest)
                    shutil.copy(path, os.path.join(HERE, "corpus", "npy", digest))
            elif f == "case.json":
                text = open(path, "rb").read()
                try:
                    inputs = json.loads(text).get("inputs", {})
                    names = sorted(inputs) if isinstance(inputs, dict) else []
                except (ValueError, AttributeError):
                    names = []
                tail = b""
                for name in names:
                    fname = inputs[name] if isinstance(inputs[name], str) else ""
                    shape = npy_shape(os.path.join(dirpath, fname)) if fname else None
                    shape = [d for d in (shape or []) if 0 <= d < 0xF0][:6]
                    tail += bytes([len(shape)] + shape)
                # then some data bytes for the reference run
                tail += bytes(range(0, 256, 7))
                name = os.path.basename(dirpath)
                with open(os.path.join(HERE, "corpus", "case", name), "wb") as out:
                    out.write(text + b"\0" + tail)


if __name__ == "__main__":
    main()
