#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the fuzz seed corpus from the case corpus (run from anywhere):

  corpus/npy/   every distinct .npy file under tests/cases (good and malformed)
  corpus/case/  each case.json, a NUL byte, then its input shapes in the
                encoding fuzz_case.cpp reads (rank byte, one byte per dim);
                the bf16 and f16 attention cases once more with each
                rounding profile they do not name (SPEC §10.3)
  corpus/tuning/ tuning files (SPEC §11.3), good and malformed, a NUL byte,
                then the bytes of a base geometry as fuzz_tuning.cpp reads
                them (with Geometry::invariant off and on)

  corpus/case.dict, corpus/tuning.dict  libFuzzer dictionaries: the quoted
                words of the loaders' sources (tools/src/case.cpp with the
                rounding profiles of include/tandem/rounding.hpp;
                optimized/src/tuning.cpp with the Geometry fields of
                optimized/options.hpp), so that mutations reach every key
                and value the loaders know, the newest included
"""
import hashlib
import json
import os
import re
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CASES = os.path.join(ROOT, "tests", "cases")
DICTS = {
    "case.dict": [("tools/src/case.cpp", r'"([a-z][a-z0-9_]*)"'),
                  ("include/tandem/rounding.hpp", r'kRounding\w+\{"([a-z]+)"')],
    "tuning.dict": [("optimized/src/tuning.cpp", r'"([a-z][a-z0-9_]*)"'),
                    ("optimized/include/tandem/optimized/options.hpp",
                     r'^\s+(?:std::int64_t|bool|DecodeTiles) ([a-z_]+)(?: = [^;]+)?;')],
}
ROUNDING_PROFILES = ["pytorch", "exact", "ggml"]  # include/tandem/rounding.hpp

# Tuning files: one of each kind of class, then one per check of
# parse_tuning (optimized/src/tuning.cpp), geometry fields that reorder
# float operations (Geometry::invariant among them) included.
CPU = '"cpu": {"vendor": "AuthenticAMD", "brand": "AMD EPYC", "target": "AVX2", ' \
      '"family": 25, "model": 1}'
TUNING_FILES = {
    "good": '{"format": 1, %s, "classes": [{"kind": "prefill", "D": 64, "rows_per_tile": 128}, '
            '{"kind": "decode", "D": 64}, {"kind": "backward", "D": 128}]}' % CPU,
    "empty_classes": '{"format": 1, %s, "classes": []}' % CPU,
    "not_json": 'not json',
    "not_object": '[1, 2]',
    "format_2": '{"format": 2, %s, "classes": []}' % CPU,
    "format_float": '{"format": 1.0, %s, "classes": []}' % CPU,
    "cpu_missing": '{"format": 1, "classes": []}',
    "cpu_not_object": '{"format": 1, "cpu": "AVX2", "classes": []}',
    "cpu_family_string": '{"format": 1, "cpu": {"vendor": "v", "brand": "b", "target": "AVX2", '
                         '"family": "25", "model": 1}, "classes": []}',
    "classes_object": '{"format": 1, %s, "classes": {}}' % CPU,
    "class_not_object": '{"format": 1, %s, "classes": [7]}' % CPU,
    "kind_unknown": '{"format": 1, %s, "classes": [{"kind": "sideways", "D": 64}]}' % CPU,
    "d_zero": '{"format": 1, %s, "classes": [{"kind": "decode", "D": 0}]}' % CPU,
    "d_huge": '{"format": 1, %s, "classes": [{"kind": "decode", "D": 18446744073709551615}]}' % CPU,
    "rows_outside_space": '{"format": 1, %s, "classes": [{"kind": "prefill", "D": 64, '
                          '"rows_per_tile": 8}]}' % CPU,
    "rows_on_backward": '{"format": 1, %s, "classes": [{"kind": "backward", "D": 64, '
                        '"rows_per_tile": 128}]}' % CPU,
    "rows_float": '{"format": 1, %s, "classes": [{"kind": "prefill", "D": 64, '
                  '"rows_per_tile": 128.0}]}' % CPU,
    "key_block": '{"format": 1, %s, "classes": [{"kind": "prefill", "D": 64, '
                 '"key_block": 32}]}' % CPU,
    "invariant": '{"format": 1, %s, "classes": [{"kind": "prefill", "D": 64, '
                 '"invariant": true}]}' % CPU,
    "repeated_class": '{"format": 1, %s, "classes": [{"kind": "decode", "D": 8}, '
                      '{"kind": "decode", "D": 8}]}' % CPU,
}
# Base geometries near the defaults (optimized/options.hpp) in fuzz_tuning's
# encoding, with invariant off and on.
GEOMETRY = bytes([4, 16, 77, 64, 0, 0, 2, 4, 8, 8, 0])


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
    for sub in ["npy", "case", "tuning"]:
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
                for profile, variant in rounding_variants(text):
                    with open(os.path.join(HERE, "corpus", "case", name + "_rounding_" + profile),
                              "wb") as out:
                        out.write(variant + b"\0" + tail)
    for name, sources in DICTS.items():
        write_dict(os.path.join(HERE, "corpus", name), sources)
    for name, text in TUNING_FILES.items():
        for invariant in [0, 1]:
            with open(os.path.join(HERE, "corpus", "tuning", "%s_%d" % (name, invariant)),
                      "wb") as out:
                out.write(text.encode() + b"\0" + GEOMETRY + bytes([invariant]))


def write_dict(path, sources):
    """A libFuzzer dictionary of every word `pattern` finds in each source,
    as a JSON string."""
    words = set()
    for source, pattern in sources:
        with open(os.path.join(ROOT, source)) as f:
            words.update(re.findall(pattern, f.read(), re.MULTILINE))
    with open(path, "w") as out:
        for w in sorted(words):
            out.write('"\\"%s\\""\n' % w)


def rounding_variants(text):
    """The case once per rounding profile it does not name, when it is a bf16
    or f16 attention case (the only ones a profile applies to)."""
    try:
        case = json.loads(text)
    except ValueError:
        return []
    if not isinstance(case, dict) or case.get("dtype") not in ("bf16", "f16") or \
            case.get("op") not in ("attention", "attention_backward"):
        return []
    out = []
    for profile in ROUNDING_PROFILES:
        if case.get("rounding", "pytorch") != profile:
            variant = dict(case, rounding=profile)
            out.append((profile, json.dumps(variant, indent=1).encode()))
    return out


if __name__ == "__main__":
    main()
