# SPDX-License-Identifier: Apache-2.0
"""FlexAttention with torch's signature (SPEC §13): score_mod and mask_mod
written as Python functions, run by tandem's kernels.

    import tandem
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    mask = tandem.create_block_mask(causal, None, None, 256, 256, BLOCK_SIZE=64)
    out = tandem.flex_attention(q, k, v, score_mod=alibi, block_mask=mask)

The callables are traced once per call into the mod language of SPEC §13.1:
each is called with traced values in place of score, b, h, q_idx and kv_idx,
and every operation on them (Python's arithmetic, comparisons, &, |, ~, //,
%, and torch.where, minimum, maximum, clamp, abs, exp, log, tanh, sigmoid)
records a node. A tensor the callable reads (a closure or a global) is
captured: indexed with integer expressions (`bias[h, q_idx - kv_idx]`), or
used whole when it has one element; a float tensor becomes a real tensor of
the call's dtype, an integer one an integer tensor whose declared range is
its values' [min, max], a bool one an integer tensor compared with 0.
Anything else (a Python `if` on a traced value, an operation the language
lacks, a slice) raises tandem.Error naming the operation and the callable.
The C++ side builds the programs, checks their types and index ranges over
the call (SPEC §13.2), and runs the kernels; gradients flow to query, key,
value and every float tensor the score_mod captured (SPEC §13.3).

A block mask is tandem's BlockMask or torch's
torch.nn.attention.flex_attention.BlockMask (the same fields:
kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
BLOCK_SIZE, mask_mod); tandem.create_block_mask builds one with the
reference, and tandem.validate_block_mask checks one against its mask_mod.

The kernels run as the torch operator tandem::flex_attention (and its
backward), with fake kernels and an autograd formula, so torch.library's
opcheck passes and the operator compiles with fullgraph=True. Under
torch.compile, flex_attention calls tandem::flex_attention_mods, which
takes the mods as a graph constant and traces them when it runs, so
torch.compile(flex_attention, fullgraph=True) compiles the whole call
(SPEC §13.6; see "Under torch.compile" below).
"""

import atexit
import dataclasses
import json
import math
import uuid
from typing import Any, Callable, List, Optional, Tuple

from ._errors import Error, MissingExtra

try:
    import torch
    from torch import Tensor
except ImportError as e:
    raise MissingExtra("tandem.flex", "PyTorch >= 2.4", "torch", "torch", e) from e

from . import _ext

__all__ = ["flex_attention", "create_block_mask", "validate_block_mask", "BlockMask"]

_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _callable_name(fn):
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


# ---------------------------------------------------------------------------
# Tracing a mod into the node list the extension builds a ModProgram from.


class _Val:
    """A traced value: node `id` of `tracer`'s program. Operators record
    nodes; Python's control flow on it raises tandem.Error."""

    __slots__ = ("tracer", "id")
    __hash__ = None

    def __init__(self, tracer, id):
        self.tracer, self.id = tracer, id

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = _find_tracer((args, kwargs))
        return tracer.torch_call(func, args, kwargs or {})

    def __bool__(self):
        self.tracer.fail("`if`, `and`, `or`, `not`, a chained comparison or bool() on a traced "
                         "value (write it with &, |, ~ and torch.where)")

    def __index__(self):
        self.tracer.fail("a traced value used as a Python number (int(), float(), math.*, "
                         "range, a list index)")

    __int__ = __float__ = __index__

    def __iter__(self):
        self.tracer.fail("iterating a traced value")

    def __getitem__(self, index):
        self.tracer.fail("indexing a traced value (index a captured tensor instead)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self.tracer.fail(f"Tensor.{name}")

    # arithmetic and comparisons, with Python scalars and captured tensors
    def _bin(op, swap=False):
        def f(self, other):
            a, b = (other, self) if swap else (self, other)
            return self.tracer.apply(op, a, b)
        return f

    __add__, __radd__ = _bin("add"), _bin("add", True)
    __sub__, __rsub__ = _bin("sub"), _bin("sub", True)
    __mul__, __rmul__ = _bin("mul"), _bin("mul", True)
    __truediv__, __rtruediv__ = _bin("div"), _bin("div", True)
    __floordiv__, __rfloordiv__ = _bin("floor_div"), _bin("floor_div", True)
    __mod__, __rmod__ = _bin("mod"), _bin("mod", True)
    __and__, __rand__ = _bin("logical_and"), _bin("logical_and", True)
    __or__, __ror__ = _bin("logical_or"), _bin("logical_or", True)
    __lt__, __le__ = _bin("lt"), _bin("le")
    __gt__, __ge__ = _bin("gt"), _bin("ge")
    __eq__, __ne__ = _bin("eq"), _bin("ne")
    del _bin

    def __xor__(self, other):
        self.tracer.fail("^ (write != for booleans)")

    __rxor__ = __xor__

    def __neg__(self):
        return self.tracer.apply("neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return self.tracer.apply("abs", self)

    def __invert__(self):
        return self.tracer.apply("logical_not", self)

    def __pow__(self, p):
        if isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 8:
            r = self
            for _ in range(p - 1):
                r = self.tracer.apply("mul", r, self)
            return r
        self.tracer.fail(f"x ** {p!r} (only integer powers 1 to 8)")

    # Tensor methods of the language
    def exp(self):
        return self.tracer.apply("exp", self)

    def log(self):
        return self.tracer.apply("log", self)

    def tanh(self):
        return self.tracer.apply("tanh", self)

    def sigmoid(self):
        return self.tracer.apply("sigmoid", self)

    def abs(self):
        return self.tracer.apply("abs", self)

    def neg(self):
        return self.tracer.apply("neg", self)

    def square(self):
        return self.tracer.apply("mul", self, self)

    def minimum(self, other):
        return self.tracer.apply("minimum", self, other)

    def maximum(self, other):
        return self.tracer.apply("maximum", self, other)

    def clamp(self, min=None, max=None):
        return self.tracer.clamp(self, min, max)

    clip = clamp

    def clamp_min(self, min):
        return self.tracer.clamp(self, min, None)

    def clamp_max(self, max):
        return self.tracer.clamp(self, None, max)

    def where(self, condition, other):
        return self.tracer.apply("where", condition, self, other)

    def logical_and(self, other):
        return self.tracer.apply("logical_and", self, other)

    def logical_or(self, other):
        return self.tracer.apply("logical_or", self, other)

    def logical_not(self):
        return self.tracer.apply("logical_not", self)

    def float(self):
        return self.tracer.apply("as_real", self)

    double = half = bfloat16 = float

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
        if dtype is None or dtype.is_floating_point:
            return self.float() if dtype is not None else self
        self.tracer.fail(f"Tensor.to({dtype}) (a traced value converts to float only)")

    def new_ones(self, size=(), dtype=None, **kwargs):
        return self.tracer.constant_of(1, dtype, size)

    def new_zeros(self, size=(), dtype=None, **kwargs):
        return self.tracer.constant_of(0, dtype, size)

    def new_full(self, size, fill_value, dtype=None, **kwargs):
        return self.tracer.constant_of(fill_value, dtype, size)

    def new_tensor(self, data, dtype=None, **kwargs):
        return self.tracer.constant_of(data, dtype, ())

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def shape(self):
        return torch.Size([])

    def dim(self):
        return 0


class _Rows:
    """A captured tensor indexed on its first axes only (`bias[h]`): index
    it further before computing with it."""

    __slots__ = ("tracer", "tensor", "index")

    def __init__(self, tracer, tensor, index):
        self.tracer, self.tensor, self.index = tracer, tensor, index

    def __getitem__(self, index):
        return self.tracer.index(self.tensor, self.index + self.tracer.indices(index))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = _find_tracer((args, kwargs))
        return tracer.torch_call(func, args, kwargs or {})


def _find_tracer(x):
    if isinstance(x, (_Val, _Rows)):
        return x.tracer
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _find_tracer(y)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _find_tracer(list(x.values()))
    return None


def _unary(op):
    return lambda tr, a, k: tr.apply(op, a[0])


def _binary(op):
    return lambda tr, a, k: tr.apply(op, a[0], a[1] if len(a) > 1 else k.get("other"))


def _rbinary(op):
    return lambda tr, a, k: tr.apply(op, a[1], a[0])


def _min_max(op):
    def f(tr, a, k):
        if len(a) != 2 or k:
            tr.fail(f"torch.{op[:3]} as a reduction (use torch.{op}(a, b))")
        return tr.apply(op, a[0], a[1])
    return f


def _div(tr, a, k):
    mode = k.get("rounding_mode")
    if mode is None:
        return tr.apply("div", a[0], a[1] if len(a) > 1 else k["other"])
    if mode == "floor":
        return tr.apply("floor_div", a[0], a[1] if len(a) > 1 else k["other"])
    tr.fail(f"torch.div(rounding_mode={mode!r}) (only 'floor', Python's //)")


def _where(tr, a, k):
    if len(a) != 3:
        tr.fail(f"torch.where with {len(a)} arguments (wants condition, input, other)")
    return tr.apply("where", a[0], a[1], a[2])


def _clamp(tr, a, k):
    return tr.clamp(a[0], a[1] if len(a) > 1 else k.get("min"),
                    a[2] if len(a) > 2 else k.get("max"))


# torch functions and Tensor methods, by name, that the language expresses
_TORCH_OPS = {
    "add": _binary("add"), "__add__": _binary("add"), "__radd__": _rbinary("add"),
    "sub": _binary("sub"), "subtract": _binary("sub"), "__sub__": _binary("sub"),
    "__rsub__": _rbinary("sub"),
    "mul": _binary("mul"), "multiply": _binary("mul"), "__mul__": _binary("mul"),
    "__rmul__": _rbinary("mul"),
    "div": _div, "divide": _div, "true_divide": _binary("div"), "__truediv__": _binary("div"),
    "__rtruediv__": _rbinary("div"), "__div__": _binary("div"), "__rdiv__": _rbinary("div"),
    "floor_divide": _binary("floor_div"), "__floordiv__": _binary("floor_div"),
    "__rfloordiv__": _rbinary("floor_div"),
    "remainder": _binary("mod"), "__mod__": _binary("mod"), "__rmod__": _rbinary("mod"),
    "neg": _unary("neg"), "negative": _unary("neg"), "__neg__": _unary("neg"),
    "abs": _unary("abs"), "__abs__": _unary("abs"), "absolute": _unary("abs"),
    "exp": _unary("exp"), "log": _unary("log"), "tanh": _unary("tanh"),
    "sigmoid": _unary("sigmoid"),
    "minimum": _binary("minimum"), "maximum": _binary("maximum"),
    "min": _min_max("minimum"), "max": _min_max("maximum"),
    "clamp": _clamp, "clip": _clamp,
    "lt": _binary("lt"), "less": _binary("lt"), "__lt__": _binary("lt"),
    "le": _binary("le"), "less_equal": _binary("le"), "__le__": _binary("le"),
    "gt": _binary("gt"), "greater": _binary("gt"), "__gt__": _binary("gt"),
    "ge": _binary("ge"), "greater_equal": _binary("ge"), "__ge__": _binary("ge"),
    "eq": _binary("eq"), "__eq__": _binary("eq"), "ne": _binary("ne"),
    "not_equal": _binary("ne"), "__ne__": _binary("ne"),
    "logical_and": _binary("logical_and"), "__and__": _binary("logical_and"),
    "__rand__": _rbinary("logical_and"), "bitwise_and": _binary("logical_and"),
    "logical_or": _binary("logical_or"), "__or__": _binary("logical_or"),
    "__ror__": _rbinary("logical_or"), "bitwise_or": _binary("logical_or"),
    "logical_not": _unary("logical_not"), "__invert__": _unary("logical_not"),
    "bitwise_not": _unary("logical_not"),
    "where": _where,
    "__getitem__": lambda tr, a, k: tr.getitem(a[0], a[1]),
}


class _Tracer:
    """Records the nodes of one mod (`role`: "score_mod" or "mask_mod") as
    the extension's flex_call takes them: (op, operands, type, value,
    ivalue, tensor, index), operands by position. The types are the C++
    builder's to derive and check; the tracer only names constants' types."""

    def __init__(self, role, fn, inputs=None):
        self.role, self.fn, self.name = role, fn, _callable_name(fn)
        self.nodes, self.memo = [], {}
        self.tensors = []   # (name, shape, type, lo, hi), as the extension captures them
        self.arrays = []    # the data of each, as the kernels read it
        self.sources = []   # the caller's tensor of each (its gradient's owner)
        self.captured = {}  # id(tensor) -> (number, is bool)
        named = _named_tensors(fn)
        self.names = {id(x): name for name, x in named}
        # under torch.compile the operator's inputs stand for the tensors fn
        # names (position by position); another tensor it reads is a constant
        self.inputs = None if inputs is None else \
            {id(x): t for (_, x), t in zip(named, inputs)}

    def fail(self, what):
        raise Error(f"{self.role} {self.name}: {what} is not in the mod language (SPEC §13.1)",
                    self.role)

    def node(self, op, args=(), type="real", value=0.0, ivalue=0, tensor=-1, index=()):
        key = (op, tuple(args), type, repr(value), ivalue, tensor, tuple(index))
        at = self.memo.get(key)
        if at is None:
            at = self.memo[key] = len(self.nodes)
            self.nodes.append((op, list(args), type, float(value), int(ivalue), tensor,
                               list(index)))
        return _Val(self, at)

    def constant(self, x):
        if isinstance(x, bool):
            return self.node("constant", type="boolean", ivalue=int(x))
        if isinstance(x, int):
            return self.node("constant", type="integer", ivalue=x)
        if isinstance(x, float):
            if math.isnan(x):
                self.fail("a NaN constant")
            return self.node("constant", type="real", value=x)
        self.fail(f"a constant of type {type(x).__name__}")

    def constant_of(self, x, dtype, size):
        if tuple(size) not in ((), (1,)):
            self.fail(f"a constant tensor of size {tuple(size)}")
        if dtype is torch.bool:
            return self.constant(bool(x))
        if dtype is not None and not dtype.is_floating_point:
            return self.constant(int(x))
        return self.constant(float(x))

    def value(self, x):
        """x as a node: a traced value, a Python scalar, or a captured
        tensor of one element."""
        if isinstance(x, _Val):
            return x
        if isinstance(x, _Rows):
            self.fail(f"{self.tensors[x.tensor][0]} indexed on {len(x.index)} of its "
                      f"{len(self.tensors[x.tensor][1])} axes")
        if isinstance(x, torch.Tensor):
            if x.numel() != 1:
                self.fail(f"a captured tensor of shape {tuple(x.shape)} used whole (index it)")
            t = self.capture(x)
            return self.index(t, [self.constant(0)] * len(self.tensors[t][1]))
        if isinstance(x, (bool, int, float)):
            return self.constant(x)
        self.fail(f"an operand of type {type(x).__name__}")

    def apply(self, op, *operands):
        ids = [self.value(x).id for x in operands]
        return self.node(op, ids)

    def clamp(self, x, lo, hi):
        if lo is not None:
            x = self.apply("maximum", x, lo)
        if hi is not None:
            x = self.apply("minimum", x, hi)
        return x

    def capture(self, t):
        """The number of captured tensor t (captured on first use)."""
        got = self.captured.get(id(t))
        if got is not None:
            return got[0]
        if t.device.type != "cpu":
            raise Error(f"{self.role} {self.name}: a captured tensor is on {t.device}: must be "
                        "on cpu", self.role)
        name = self.names.get(id(t), f"tensor{len(self.tensors)}")
        if self.inputs is not None:
            if id(t) not in self.inputs and t.requires_grad and self.role == "score_mod":
                raise Error(f"{self.role} {self.name}: under torch.compile a tensor that needs "
                            "a gradient must be a global or closure variable of the mod "
                            f"(read otherwise: {name})", self.role)
            t = self.inputs.get(id(t), t)
        shape = list(t.shape) or [1]
        if t.dtype.is_floating_point:
            kind, lo, hi, data = "real", 0, 0, t.reshape(shape)
        elif t.dtype is torch.bool or t.dtype in _INTEGERS:
            data = t.detach().reshape(shape)
            data = data.to(torch.int32) if t.dtype is torch.bool else data
            if data.dtype not in (torch.int32, torch.int64):
                data = data.to(torch.int64)
            kind = "integer"
            lo, hi = (int(data.min()), int(data.max())) if data.numel() else (0, 0)
        else:
            raise Error(f"{self.role} {self.name}: captured tensor {name} has dtype {t.dtype}: "
                        "must be floating, integer or bool", self.role)
        self.tensors.append((name, shape, kind, lo, hi))
        self.arrays.append(data.contiguous())
        self.sources.append(t)
        self.captured[id(t)] = (len(self.tensors) - 1, t.dtype is torch.bool)
        return len(self.tensors) - 1

    def indices(self, index):
        index = index if isinstance(index, tuple) else (index,)
        out = []
        for i in index:
            if isinstance(i, (_Val, int)) and not isinstance(i, bool):
                out.append(i)
            elif isinstance(i, torch.Tensor) and i.numel() == 1 and not i.dtype.is_floating_point:
                out.append(i)
            else:
                self.fail(f"indexing a captured tensor with {type(i).__name__} "
                          f"({i!r}: only integer expressions)")
        return out

    def index(self, t, index):
        name, shape, kind = self.tensors[t][:3]
        if len(index) > len(shape):
            self.fail(f"{name}[...] with {len(index)} indices ({name} has rank {len(shape)})")
        if len(index) < len(shape):
            return _Rows(self, t, index)
        ids = []
        for axis, i in enumerate(index):
            if isinstance(i, int) and i < 0:
                i += shape[axis]  # a negative constant counts from the end, as in torch
            ids.append(self.value(i).id)
        v = self.node("load", type=kind, tensor=t, index=ids)
        if self.captured[id(self.sources[t])][1]:  # a bool tensor, stored as integers
            v = self.apply("ne", v, 0)
        return v

    def getitem(self, x, index):
        if isinstance(x, _Rows):
            return x[index]
        if not isinstance(x, torch.Tensor):
            self.fail(f"indexing {type(x).__name__}")
        return self.index(self.capture(x), self.indices(index))

    def torch_call(self, func, args, kwargs):
        name = getattr(func, "__name__", str(func))
        f = _TORCH_OPS.get(name)
        if f is None:
            self.fail(f"torch.{name}")
        return f(self, args, kwargs)

    def result(self, x, want):
        """The spec the extension takes, with x the callable's result."""
        r = self.value(x)
        if want == "real":  # score_mod(score, …) returning an integer expression: as torch
            r = self.apply("as_real", r)
        return {"name": self.name, "tensors": self.tensors, "nodes": self.nodes, "result": r.id}


def _named_tensors(fn):
    """[(name, tensor)] of the tensors callable fn names: the globals it
    reads, then its closure cells (a name in both: the closure's)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = {}
    globs = getattr(fn, "__globals__", {})
    for name in code.co_names:
        x = globs.get(name)
        if isinstance(x, torch.Tensor):
            found[name] = x
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            x = cell.cell_contents
        except ValueError:  # a cell not yet bound
            continue
        if isinstance(x, torch.Tensor):
            found[name] = x
    return list(found.items())


def _trace(fn, role, inputs=None):
    """(spec, tracer) of score_mod or mask_mod `fn`; `inputs`, under
    torch.compile, the tensors that stand for those fn names."""
    tr = _Tracer(role, fn, inputs)
    leaves = [tr.node(op, type="integer") for op in ("b", "h", "q_idx", "kv_idx")]
    if role == "score_mod":
        leaves.insert(0, tr.node("score"))
    try:
        r = fn(*leaves)
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the callable under tracing
        raise Error(f"{role} {tr.name}: tracing failed: {type(e).__name__}: {e}", role) from e
    return tr.result(r, "real" if role == "score_mod" else "boolean"), tr


# ---------------------------------------------------------------------------
# Block masks


@dataclasses.dataclass
class BlockMask:
    """A block mask with the fields of torch's BlockMask (SPEC §13.4): for
    batch b, head h and query block m (b, h taken modulo the first two
    extents, which may be 1), the kv blocks `kv_indices[b, h, m,
    :kv_num_blocks[b, h, m]]` are partial (mask_mod decides each element)
    and `full_kv_indices[b, h, m, :full_kv_num_blocks[b, h, m]]` are full
    (every element visible); the rest are hidden. BLOCK_SIZE is (rows of a
    query block, keys of a kv block)."""

    kv_num_blocks: Any
    kv_indices: Any
    full_kv_num_blocks: Optional[Any]
    full_kv_indices: Optional[Any]
    BLOCK_SIZE: tuple
    mask_mod: Optional[Callable]
    seq_lengths: tuple


def _block_size(bm):
    bs = bm.BLOCK_SIZE
    if isinstance(bs, int):
        return bs, bs
    return int(bs[0]), int(bs[1])


def _index_array(x, name):
    if not isinstance(x, torch.Tensor):
        raise Error(f"{name} must be a torch.Tensor (got {type(x).__name__})", name)
    if x.device.type != "cpu":
        raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")
    return x.detach().contiguous()


def _block_mask_parts(block_mask):
    """(shapes for flex_call, arrays for the kernels) of a tandem or torch BlockMask."""
    q_block, kv_block = _block_size(block_mask)
    shapes = {"q_block": q_block, "kv_block": kv_block}
    arrays = {}
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        x = getattr(block_mask, field, None)
        if x is None:
            continue
        arrays[field] = _index_array(x, f"block_mask.{field}")
        shapes[field] = tuple(arrays[field].shape)
    if "kv_num_blocks" not in arrays or "kv_indices" not in arrays:
        raise Error("block_mask.kv_num_blocks and kv_indices are required", "block_mask")
    if ("full_kv_num_blocks" in arrays) != ("full_kv_indices" in arrays):
        raise Error("block_mask.full_kv_num_blocks and full_kv_indices must be given together",
                    "block_mask.full_kv_indices")
    return shapes, arrays


def _mask_mod_of(block_mask):
    fn = getattr(block_mask, "mask_mod", None)
    return None if fn is None else _trace(fn, "mask_mod")


def _real_as(arrays, tensors, dtype, grad=False):
    """The captured arrays with the real ones in `dtype` (detached unless
    `grad`: the score_mod's, which autograd passes to the kernels)."""
    out = [a.to(dtype) if t[2] == "real" else a for a, t in zip(arrays, tensors)]
    return out if grad else [a.detach() for a in out]


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128):
    """torch's create_block_mask, by the reference: the blocks of
    BLOCK_SIZE (an int, or (q_block, kv_block)) where mask_mod(b, h, q_idx,
    kv_idx) keeps every element are full, those where it keeps some are
    partial, the rest hidden. B or H None: mask_mod evaluated at b = 0 (h =
    0) and broadcast. Returns a tandem.BlockMask of int32 index tensors."""
    if str(device) != "cpu":
        raise Error(f"device = {device} must be cpu", "device")
    bs = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    spec, tr = _trace(mask_mod, "mask_mod")
    r = _ext.create_block_mask(spec, _real_as(tr.arrays, tr.tensors, torch.float64),
                               1 if B is None else int(B), 1 if H is None else int(H),
                               int(Q_LEN), int(KV_LEN), int(bs[0]), int(bs[1]))

    def tensor(field):
        data, shape = r[field]
        return torch.tensor(data, dtype=torch.int32).reshape(shape)

    return BlockMask(tensor("kv_num_blocks"), tensor("kv_indices"), tensor("full_kv_num_blocks"),
                     tensor("full_kv_indices"), bs, mask_mod, (int(Q_LEN), int(KV_LEN)))


def validate_block_mask(block_mask, B=None, H=None, Q_LEN=None, KV_LEN=None):
    """Checks `block_mask` (tandem's or torch's) against its mask_mod over
    B × H × Q_LEN × KV_LEN by the reference: raises tandem.Error (parameter
    "block_mask") naming the first full block where mask_mod hides an
    element, or hidden block where it keeps one (partial blocks are always
    right); also for index arrays that are out of range. B and H default to
    the mask's own extents, Q_LEN and KV_LEN to its seq_lengths."""
    shapes, arrays = _block_mask_parts(block_mask)
    B = shapes["kv_num_blocks"][0] if B is None else B
    H = shapes["kv_num_blocks"][1] if H is None else H
    if Q_LEN is None or KV_LEN is None:
        lengths = getattr(block_mask, "seq_lengths", None)
        if lengths is None:
            raise Error("Q_LEN and KV_LEN are required: the block mask has no seq_lengths",
                        "Q_LEN")
        Q_LEN = lengths[0] if Q_LEN is None else Q_LEN
        KV_LEN = lengths[1] if KV_LEN is None else KV_LEN
    traced = _mask_mod_of(block_mask)
    spec, tr = traced if traced else (None, None)
    q = (int(B), int(H), int(Q_LEN), 1)
    plan, _ = _ext.flex_call({"query": q, "key": (q[0], q[1], int(KV_LEN), 1),
                              "value": (q[0], q[1], int(KV_LEN), 1)},
                             False, None, None, spec, shapes)
    inputs = dict(arrays)
    inputs["mask_tensors"] = _real_as(tr.arrays, tr.tensors, torch.float64) if tr else []
    message = _ext.validate_block_mask(plan, inputs)
    if message is not None:
        raise Error(f"block_mask: {message}", "block_mask")


# ---------------------------------------------------------------------------
# flex_attention


# The torch operators: tandem::flex_attention (out, lse) and its backward,
# with fake kernels for torch.compile and an autograd formula. `call` is the
# call's JSON (the traced programs, the block sizes, scale, enable_gqa); the
# tensors are q, k, v, each mod's captured tensors and the block mask's
# index arrays (kv_num_blocks, kv_indices[, full_kv_num_blocks,
# full_kv_indices]).

_BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
_PLANS = {}  # (call, shapes) -> (FlexPlan, views) of _ext.flex_call
atexit.register(_PLANS.clear)  # before the extension is torn down


def _plan(call, query, key, value, block_mask):
    """_ext.flex_call for `call` at these tensors' shapes, kept per call and shapes."""
    shapes = {"query": tuple(query.shape), "key": tuple(key.shape), "value": tuple(value.shape)}
    bm_shapes = tuple(tuple(t.shape) for t in block_mask)
    k = (call, tuple(shapes.values()), bm_shapes)
    got = _PLANS.get(k)
    if got is None:
        c = json.loads(call)
        bm = None
        if c["block_size"] is not None:
            bm = dict(zip(("q_block", "kv_block"), c["block_size"]))
            bm.update(zip(_BLOCK_FIELDS, bm_shapes))
        if len(_PLANS) >= 64:
            _PLANS.clear()
        got = _PLANS[k] = _ext.flex_call(shapes, c["enable_gqa"], c["scale"], c["score_mod"],
                                         c["mask_mod"], bm)
    return got


def _inputs(query, key, value, score_tensors, mask_tensors, block_mask):
    """The kernels' input dict: contiguous, and detached (nothing crosses
    with autograd state)."""
    def c(t):
        return t.detach().contiguous()
    inputs = {f: c(t) for f, t in zip(_BLOCK_FIELDS, block_mask)}
    inputs.update(query=c(query), key=c(key), value=c(value),
                  score_tensors=[c(t) for t in score_tensors],
                  mask_tensors=[c(t) for t in mask_tensors])
    return inputs


def _stat(query):
    return torch.float32 if query.dtype in (torch.bfloat16, torch.float16) else query.dtype


def _forward(query, key, value, score_tensors, mask_tensors, block_mask, call, backend):
    plan, views = _plan(call, query, key, value, block_mask)
    out = query.new_empty(views["out"])
    lse = query.new_empty(views["lse"], dtype=_stat(query))
    _ext.flex_forward(backend, plan, _inputs(query, key, value, score_tensors, mask_tensors,
                                             block_mask), out, lse)
    return out, lse


def _forward_fake(query, value):
    # out [B, H, Sq, Dv], lse [B, H, Sq] (float32 for bfloat16 and float16)
    return (query.new_empty((*query.shape[:-1], value.shape[-1])),
            query.new_empty(query.shape[:-1], dtype=_stat(query)))


@torch.library.custom_op("tandem::flex_attention", mutates_args=())
def _flex_op(query: Tensor, key: Tensor, value: Tensor, score_tensors: List[Tensor],
             mask_tensors: List[Tensor], block_mask: List[Tensor], call: str,
             backend: str) -> Tuple[Tensor, Tensor]:
    return _forward(query, key, value, score_tensors, mask_tensors, block_mask, call, backend)


@_flex_op.register_fake
def _(query, key, value, score_tensors, mask_tensors, block_mask, call, backend):
    return _forward_fake(query, value)


@torch.library.custom_op("tandem::flex_attention_backward", mutates_args=())
def _flex_backward_op(query: Tensor, key: Tensor, value: Tensor, score_tensors: List[Tensor],
                      mask_tensors: List[Tensor], block_mask: List[Tensor], dout: Tensor,
                      call: str, backend: str, needs: List[bool]
                      ) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """(dq, dk, dv, d score_tensors): those `needs` asks for (dq, dk, dv,
    then one per score tensor), the others empty ([0])."""
    return _backward(query, key, value, score_tensors, mask_tensors, block_mask, dout, call,
                     backend, needs)


def _backward(query, key, value, score_tensors, mask_tensors, block_mask, dout, call, backend,
              needs):
    plan, _ = _plan(call, query, key, value, block_mask)
    grads = [torch.empty(x.shape, dtype=x.dtype) if n else None  # contiguous
             for x, n in zip((query, key, value, *score_tensors), needs)]
    if any(g is not None for g in grads):
        dts = grads[3:] if any(g is not None for g in grads[3:]) else []
        _ext.flex_backward(backend, plan, _inputs(query, key, value, score_tensors,
                                                  mask_tensors, block_mask),
                           dout.detach().contiguous(), *grads[:3], dts)
    empty = query.new_empty((0,))
    grads = [empty.clone() if g is None else g for g in grads]
    return grads[0], grads[1], grads[2], grads[3:]


def _backward_fake(query, key, value, score_tensors, needs):
    grads = [torch.empty_like(x) if n else query.new_empty((0,))
             for x, n in zip((query, key, value, *score_tensors), needs)]
    return grads[0], grads[1], grads[2], grads[3:]


@_flex_backward_op.register_fake
def _(query, key, value, score_tensors, mask_tensors, block_mask, dout, call, backend, needs):
    return _backward_fake(query, key, value, score_tensors, needs)


def _flex_setup(ctx, inputs, output):
    """Both operators': `call` is the call's JSON or, under torch.compile, its _Mods."""
    query, key, value, score_tensors, mask_tensors, block_mask, call, backend = inputs
    ctx.counts = (len(score_tensors), len(mask_tensors))
    ctx.call, ctx.backend = call, backend
    # only the float tensors that require grad get one: needs_input_grad of
    # the list says whether any does, and asking the kernels for a gradient
    # nobody wants takes the program path (SPEC §13.5: no native slopes' gradient)
    ctx.real = [t.is_floating_point() and t.requires_grad for t in score_tensors]
    ctx.save_for_backward(query, key, value, *score_tensors, *mask_tensors, *block_mask)
    ctx.mark_non_differentiable(output[1])


def _flex_grad(ctx, dout, _dlse):
    query, key, value, *rest = ctx.saved_tensors
    n_score, n_mask = ctx.counts
    score, mask, bm = rest[:n_score], rest[n_score:n_score + n_mask], rest[n_score + n_mask:]
    need = ctx.needs_input_grad
    needs = [bool(need[0]), bool(need[1]), bool(need[2])] + \
        [bool(need[3]) and r for r in ctx.real]
    backward = _flex_backward_op if isinstance(ctx.call, str) else _mods_backward_op
    dq, dk, dv, dts = backward(query, key, value, list(score), list(mask), list(bm), dout,
                               ctx.call, ctx.backend, needs)
    keep = [(g if n else None) for g, n in zip((dq, dk, dv, *dts), needs)]
    # a list input takes a list of gradients (None for each of the index arrays)
    return keep[0], keep[1], keep[2], keep[3:], [None] * n_mask, [None] * len(bm), None, None


_flex_op.register_autograd(_flex_grad, setup_context=_flex_setup)


# ---------------------------------------------------------------------------
# Under torch.compile
#
# Dynamo cannot trace the tracer (it calls the mods with values of its own),
# so under torch.compile flex_attention calls tandem::flex_attention_mods in
# place of tandem::flex_attention: its `mods` argument, a constant of the
# compiled graph (one of torch's opaque constants, torch >= 2.15), holds the
# mods themselves and the call's constants; the tensors the score_mod and
# mask_mod name (globals and closure variables) are its tensor inputs, so
# that autograd reaches them; and the operator traces the mods when it runs,
# those inputs standing for the tensors they read. The mods must be made
# outside the compiled code (a function defined inside it is not a constant
# Dynamo can hold). With an older torch the tracing stays a graph break.

try:
    from torch._library.opaque_object import register_custom_class as _register_opaque
except ImportError:
    _register_opaque = None

_GRAPH_MODS = []  # the _Mods written into compiled graphs' code, by number
# in that code too: a graph cached by another process never reads this one's numbers
_PROCESS = uuid.uuid4().hex


class _Mods:
    """The mods and constants (block size, scale, enable_gqa) of one flex
    call under torch.compile. Equal when the mods are the same objects and
    the constants equal: Dynamo recompiles for another."""

    def __init__(self, score_mod, mask_mod, block_size, scale, enable_gqa):
        self.score_mod, self.mask_mod = score_mod, mask_mod
        self.constants = (block_size, None if scale is None else float(scale), bool(enable_gqa))

    def __eq__(self, other):
        return isinstance(other, _Mods) and self.score_mod is other.score_mod and \
            self.mask_mod is other.mask_mod and self.constants == other.constants

    def __hash__(self):
        return hash((id(self.score_mod), id(self.mask_mod), self.constants))

    def __fx_repr__(self):
        number = next((i for i, m in enumerate(_GRAPH_MODS) if m == self), None)
        if number is None:
            number = len(_GRAPH_MODS)
            _GRAPH_MODS.append(self)
        return f"_Mods.written({number}, {_PROCESS!r})", {"_Mods": _Mods}

    @staticmethod
    def written(number, process):
        if process != _PROCESS:
            raise Error("a graph compiled by another process calls tandem.flex_attention: "
                        "its mods are not in this one (compile it here)", "score_mod")
        return _GRAPH_MODS[number]

    def trace(self, dtype, score_inputs, mask_inputs):
        """(call, score arrays, mask arrays, the score input of each score
        array) of the call, with `score_inputs` and `mask_inputs` standing
        for the tensors each mod names (_named_tensors)."""
        score = _trace(self.score_mod, "score_mod", score_inputs) if self.score_mod else None
        mask = _trace(self.mask_mod, "mask_mod", mask_inputs) if self.mask_mod else None
        score_arrays = _real_as(score[1].arrays, score[1].tensors, dtype) if score else []
        mask_arrays = _real_as(mask[1].arrays, mask[1].tensors, dtype) if mask else []
        position = {id(t): i for i, t in enumerate(score_inputs)}
        owners = [position.get(id(t)) for t in score[1].sources] if score else []
        return _call_json(score, mask, *self.constants), score_arrays, mask_arrays, owners


def _compiled_args(query, key, value, score_mod, block_mask, scale, enable_gqa, backend):
    """The arguments of tandem::flex_attention_mods for a flex_attention call."""
    mask_mod = getattr(block_mask, "mask_mod", None) if block_mask is not None else None
    bm_shapes, bm_arrays = _block_mask_parts(block_mask) if block_mask is not None else (None, {})
    mods = _Mods(score_mod, mask_mod, _block_sizes(bm_shapes), scale, enable_gqa)
    score = [t for _, t in _named_tensors(score_mod)] if score_mod is not None else []
    mask = [t.detach() for _, t in _named_tensors(mask_mod)] if mask_mod is not None else []
    return (query, key, value, score, mask,
            [bm_arrays[f] for f in _BLOCK_FIELDS if f in bm_arrays], mods, backend)


if _register_opaque is not None:
    _register_opaque(_Mods, typ="constant")

    @torch.library.custom_op("tandem::flex_attention_mods", mutates_args=())
    def _mods_op(query: Tensor, key: Tensor, value: Tensor, score_tensors: List[Tensor],
                 mask_tensors: List[Tensor], block_mask: List[Tensor], mods: _Mods,
                 backend: str) -> Tuple[Tensor, Tensor]:
        call, score, mask, _ = mods.trace(query.dtype, score_tensors, mask_tensors)
        return _forward(query, key, value, score, mask, block_mask, call, backend)

    @_mods_op.register_fake
    def _(query, key, value, score_tensors, mask_tensors, block_mask, mods, backend):
        return _forward_fake(query, value)

    @torch.library.custom_op("tandem::flex_attention_mods_backward", mutates_args=())
    def _mods_backward_op(query: Tensor, key: Tensor, value: Tensor, score_tensors: List[Tensor],
                          mask_tensors: List[Tensor], block_mask: List[Tensor], dout: Tensor,
                          mods: _Mods, backend: str, needs: List[bool]
                          ) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
        """As tandem::flex_attention_backward, the gradient of each score
        array summed into the input it came from (zero for one the mod
        does not read)."""
        call, score, mask, owners = mods.trace(query.dtype, score_tensors, mask_tensors)
        wants = list(needs[:3]) + [o is not None and needs[3 + o] for o in owners]
        dq, dk, dv, d_arrays = _backward(query, key, value, score, mask, block_mask, dout, call,
                                         backend, wants)
        grads = [torch.zeros_like(t) if n else query.new_empty((0,))
                 for t, n in zip(score_tensors, needs[3:])]
        for d, o in zip(d_arrays, owners):
            if o is not None and needs[3 + o]:
                grads[o] = d.reshape(score_tensors[o].shape).to(score_tensors[o].dtype)
        return dq, dk, dv, grads

    @_mods_backward_op.register_fake
    def _(query, key, value, score_tensors, mask_tensors, block_mask, dout, mods, backend,
          needs):
        return _backward_fake(query, key, value, score_tensors, needs)

    _mods_op.register_autograd(_flex_grad, setup_context=_flex_setup)


def _check_tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise Error(f"{name} must be a torch.Tensor (got {type(x).__name__})", name)
    if x.device.type != "cpu":
        raise Error(f"{name}.device = {x.device} must be cpu", f"{name}.device")


@torch.compiler.disable  # the tracer calls the mods with its own values: not for Dynamo
def _op_args(query, key, value, score_mod, block_mask, scale, enable_gqa, backend):
    """The arguments of tandem::flex_attention for a flex_attention call:
    the mods traced, their tensors in the call's dtype (the score_mod's
    still attached to autograd), the block mask's arrays, the call's JSON.
    Outside torch.compile (torch.compiler.disable: with a torch too old
    for _compiled_args, a graph break)."""
    score = _trace(score_mod, "score_mod") if score_mod is not None else None
    mask = _mask_mod_of(block_mask) if block_mask is not None else None
    bm_shapes, bm_arrays = _block_mask_parts(block_mask) if block_mask is not None else (None, {})
    mask_tensors = _real_as(mask[1].arrays, mask[1].tensors, query.dtype) if mask else []
    score_tensors = _real_as(score[1].arrays, score[1].tensors, query.dtype, grad=True) \
        if score else []
    call = _call_json(score, mask, _block_sizes(bm_shapes), scale, enable_gqa)
    return (query, key, value, score_tensors, mask_tensors,
            [bm_arrays[f] for f in _BLOCK_FIELDS if f in bm_arrays], call, backend)


def _block_sizes(bm_shapes):
    return (bm_shapes["q_block"], bm_shapes["kv_block"]) if bm_shapes else None


def _call_json(score, mask, block_size, scale, enable_gqa):
    """The call's JSON for the extension: the traced (spec, tracer) of
    each mod or None, (q_block, kv_block) or None, scale, enable_gqa."""
    return json.dumps({"score_mod": score[0] if score else None,
                       "mask_mod": mask[0] if mask else None,
                       "block_size": list(block_size) if block_size else None,
                       "scale": None if scale is None else float(scale),
                       "enable_gqa": bool(enable_gqa)})


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   backend="optimized"):
    """torch.nn.attention.flex_attention.flex_attention on tandem's kernels
    (SPEC §13.4): query [B, H, Sq, D], key [B, Hkv, Sk, D], value [B, Hkv,
    Sk, Dv] (Hkv != H needs enable_gqa; H a multiple of Hkv), out [B, H,
    Sq, Dv]; with return_lse, (out, lse) with lse [B, H, Sq] (natural log;
    float32 for bfloat16 and float16, −inf and out 0 for a row that sees no
    key). score_mod(score, b, h, q_idx, kv_idx) changes score = scale·<q,
    k> (scale defaults to 1/sqrt(D)); block_mask (tandem's or torch's
    BlockMask) selects blocks, its mask_mod deciding inside partial ones.
    Differentiable in query, key, value and the float tensors score_mod
    captures. float64 runs the reference in double; float32, bfloat16 and
    float16 run `backend` ("optimized" by default, as every op; "reference"
    for the reference's double sums rounded once, SPEC §13.4). As torch's,
    return_aux=AuxRequest(lse=True) returns (out, AuxOutput(lse=lse));
    max_scores is not offered (an Error). kernel_options, torch's Triton
    tuning, is accepted and has no effect. Invalid input raises
    tandem.Error before anything is computed."""
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        _check_tensor(x, name)
    if return_aux is not None:
        if return_lse:
            raise Error("return_lse = True and return_aux: ask for lse by one of them",
                        "return_aux")
        if getattr(return_aux, "max_scores", False):
            raise Error("return_aux.max_scores = True is not offered (lse is)",
                        "return_aux.max_scores")
    if _register_opaque is not None and torch.compiler.is_compiling():
        out, lse = _mods_op(*_compiled_args(query, key, value, score_mod, block_mask, scale,
                                            enable_gqa, backend))
    else:
        out, lse = _flex_op(*_op_args(query, key, value, score_mod, block_mask, scale,
                                      enable_gqa, backend))
    if return_aux is not None:
        return out, _aux_output(lse if return_aux.lse else None)
    return (out, lse) if return_lse else out


def _aux_output(lse):
    """torch's AuxOutput (torch >= 2.9) holding lse."""
    from torch.nn.attention import flex_attention as torch_flex
    return torch_flex.AuxOutput(lse=lse)
