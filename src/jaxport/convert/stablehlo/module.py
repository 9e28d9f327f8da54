"""Loads a StableHLO module with jaxlib's MLIR bindings and decodes it into plain Python.

The module is read once (VHLO portable artifact, MLIR bytecode or text) and turned
into `Function`s of `Op`s whose attributes are NumPy arrays, ints, strings and small
dataclasses, so interpreting it never touches MLIR again. Values are numbered:
an op's operands and results are integers, unique within the module.
"""
from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

import ml_dtypes
import numpy as np

from jaxport.errors import StableHLOError

TOKEN = "token"
TUPLE = "tuple"


@dataclasses.dataclass(frozen=True)
class TensorType:
  shape: tuple[int | None, ...]   # None for a dynamic dimension
  dtype: Any                      # a NumPy dtype, TOKEN or TUPLE
  elements: tuple = ()            # a TUPLE's element types

  @property
  def is_static(self) -> bool:
    return all(d is not None for d in self.shape)


@dataclasses.dataclass
class Block:
  args: list[int]
  arg_types: list[TensorType]
  ops: list["Op"]
  returns: list[int]              # operands of the terminator


@dataclasses.dataclass
class Op:
  name: str                       # e.g. "stablehlo.add"
  operands: list[int]
  results: list[int]
  result_types: list[TensorType]
  attrs: dict[str, Any]
  regions: list[Block]


@dataclasses.dataclass
class Function:
  name: str
  block: Block
  result_types: list[TensorType]
  arg_attrs: list[dict[str, Any]]


@dataclasses.dataclass
class Module:
  name: str
  functions: dict[str, Function]
  attrs: dict[str, Any]

  @property
  def main(self) -> Function:
    return self.functions["main"]

  def op_names(self) -> set[str]:
    """Every op name the module uses, regions included."""
    names: set[str] = set()
    def walk(block):
      for op in block.ops:
        names.add(op.name)
        for region in op.regions:
          walk(region)
    for fn in self.functions.values():
      walk(fn.block)
    return names


# --------------------------------------------------------------------------- loading

_lock = threading.Lock()   # MLIR contexts are not shared across threads


def load_module(data: bytes | str) -> Module:
  """Decodes a StableHLO module from a portable artifact, MLIR bytecode or text."""
  from jax._src.interpreters import mlir
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import stablehlo
  with _lock:
    ctx = mlir.make_ir_context()
    with ctx, ir.Location.unknown():
      module = None
      errors = []
      if isinstance(data, (bytes, bytearray)):
        try:
          module = stablehlo.deserialize_portable_artifact(ctx, bytes(data))
        except Exception as e:   # not a VHLO artifact: plain bytecode
          errors.append(e)
      if module is None:
        try:
          module = ir.Module.parse(data)
        except Exception as e:
          errors.append(e)
          raise StableHLOError(f"cannot read the StableHLO module ({'; '.join(map(str, errors))}). "
                               "Pass a VHLO portable artifact, MLIR bytecode or MLIR text.") from None
      return _Decoder().module(module)


class _Decoder:
  def __init__(self):
    self._ids: dict[Any, int] = {}

  def value(self, v) -> int:
    if v not in self._ids:
      self._ids[v] = len(self._ids)
    return self._ids[v]

  def module(self, module) -> Module:
    from jaxlib.mlir.dialects import func
    functions = {}
    for op in module.body.operations:
      if isinstance(op, func.FuncOp) or op.operation.name == "func.func":
        fn = self.function(op.operation)
        functions[fn.name] = fn
    attrs = {a.name: decode_attr(a.attr) for a in _named_attrs(module.operation)}
    name = attrs.get("sym_name", "module")
    if "main" not in functions:
      raise StableHLOError(f"StableHLO module {name!r} has no @main function")
    return Module(str(name), functions, attrs)

  def function(self, op) -> Function:
    name = op.attributes["sym_name"].value
    fn_type = op.attributes["function_type"].value
    arg_attrs = []
    if "arg_attrs" in op.attributes:
      arg_attrs = [decode_attr(a) for a in op.attributes["arg_attrs"]]
    block = self.block(op.regions[0].blocks[0])
    return Function(name, block, [decode_type(t) for t in fn_type.results], arg_attrs)

  def block(self, block) -> Block:
    args = [self.value(a) for a in block.arguments]
    arg_types = [decode_type(a.type) for a in block.arguments]
    ops, returns = [], []
    for op in block.operations:
      op = op.operation
      if op.name in ("stablehlo.return", "func.return", "mhlo.return"):
        returns = [self.value(v) for v in op.operands]
        continue
      ops.append(self.op(op))
    return Block(args, arg_types, ops, returns)

  def op(self, op) -> Op:
    return Op(
        name=op.name,
        operands=[self.value(v) for v in op.operands],
        results=[self.value(r) for r in op.results],
        result_types=[decode_type(r.type) for r in op.results],
        attrs={a.name: decode_attr(a.attr) for a in _named_attrs(op)},
        regions=[self.block(r.blocks[0]) for r in op.regions if len(r.blocks)])


def _named_attrs(op):
  attributes = op.attributes
  for i, name in enumerate(list(attributes)):
    name = name if isinstance(name, str) else name.name
    try:
      attr = attributes[name]
    except TypeError:   # complex dense elements: the bindings cannot cast them, so read the printed form
      attr = _Printed(str(attributes[i]).split("=", 1)[1][:-1])
    yield _Named(name, attr)


@dataclasses.dataclass
class _Printed:
  text: str


@dataclasses.dataclass
class _Named:
  name: str
  attr: Any


# --------------------------------------------------------------------------- types

_FLOAT_TYPES = {
    "F16Type": np.float16, "F32Type": np.float32, "F64Type": np.float64, "BF16Type": ml_dtypes.bfloat16,
    "Float8E4M3FNType": ml_dtypes.float8_e4m3fn, "Float8E5M2Type": ml_dtypes.float8_e5m2,
    "Float8E4M3FNUZType": ml_dtypes.float8_e4m3fnuz, "Float8E5M2FNUZType": ml_dtypes.float8_e5m2fnuz,
    "Float8E4M3B11FNUZType": ml_dtypes.float8_e4m3b11fnuz,
}
_INT_TYPES = {(1, True): np.bool_, (1, False): np.bool_, (2, True): ml_dtypes.int2, (2, False): ml_dtypes.uint2,
              (4, True): ml_dtypes.int4, (4, False): ml_dtypes.uint4, (8, True): np.int8, (8, False): np.uint8,
              (16, True): np.int16, (16, False): np.uint16, (32, True): np.int32, (32, False): np.uint32,
              (64, True): np.int64, (64, False): np.uint64}


def decode_element_type(t):
  from jaxlib.mlir import ir
  kind = type(t).__name__
  if kind in _FLOAT_TYPES:
    return np.dtype(_FLOAT_TYPES[kind])
  if isinstance(t, ir.IntegerType):
    return np.dtype(_INT_TYPES[(t.width, not t.is_unsigned)])
  if isinstance(t, ir.ComplexType):
    return np.dtype(np.complex64 if type(t.element_type).__name__ == "F32Type" else np.complex128)
  if isinstance(t, ir.IndexType):
    return np.dtype(np.int64)
  text = str(t)
  if "token" in text:
    return TOKEN
  raise StableHLOError(f"unsupported StableHLO element type {text}")


def decode_type(t) -> TensorType:
  from jaxlib.mlir import ir
  if isinstance(t, ir.RankedTensorType):
    dyn = ir.ShapedType.get_dynamic_size()
    return TensorType(tuple(None if d == dyn else int(d) for d in t.shape), decode_element_type(t.element_type))
  if isinstance(t, ir.TupleType):   # custom calls of TF's lowering (Qr, Eigh) return tuples
    return TensorType((), TUPLE, tuple(decode_type(t.get_type(i)) for i in range(t.num_types)))
  if "token" in str(t):
    return TensorType((), TOKEN)
  if isinstance(t, ir.UnrankedTensorType):
    raise StableHLOError(f"unranked tensor type {t} is not supported; refine the module's shapes first")
  return TensorType((), decode_element_type(t))


# --------------------------------------------------------------------------- attributes

@dataclasses.dataclass(frozen=True)
class EnumAttr:
  kind: str
  value: str


def _stablehlo_attr(a):
  """Decodes stablehlo's own attributes into dicts, or returns None."""
  from jaxlib.mlir.dialects import stablehlo as shlo
  structs = {
      "GatherDimensionNumbers": ("offset_dims", "collapsed_slice_dims", "operand_batching_dims",
                                 "start_indices_batching_dims", "start_index_map", "index_vector_dim"),
      "ScatterDimensionNumbers": ("update_window_dims", "inserted_window_dims", "input_batching_dims",
                                  "scatter_indices_batching_dims", "scattered_dims_to_operand_dims",
                                  "index_vector_dim"),
      "DotDimensionNumbers": ("lhs_batching_dimensions", "rhs_batching_dimensions",
                              "lhs_contracting_dimensions", "rhs_contracting_dimensions"),
      "ConvDimensionNumbers": ("input_batch_dimension", "input_feature_dimension", "input_spatial_dimensions",
                               "kernel_input_feature_dimension", "kernel_output_feature_dimension",
                               "kernel_spatial_dimensions", "output_batch_dimension",
                               "output_feature_dimension", "output_spatial_dimensions"),
  }
  for cls_name, fields in structs.items():
    cls = getattr(shlo, cls_name)
    if cls.isinstance(a):
      a = cls(a)
      return {f: (list(getattr(a, f)) if isinstance(getattr(a, f), (list, tuple)) or hasattr(getattr(a, f), "__len__")
                  else int(getattr(a, f))) for f in fields}
  for cls_name in ("ComparisonDirectionAttr", "ComparisonTypeAttr", "PrecisionAttr", "FftTypeAttr",
                   "RngAlgorithmAttr", "RngDistributionAttr", "TransposeAttr"):
    cls = getattr(shlo, cls_name, None)
    if cls is not None and cls.isinstance(a):
      return EnumAttr(cls_name, cls(a).value)
  return None


def decode_attr(a) -> Any:
  from jaxlib.mlir import ir
  if isinstance(a, _Printed):
    m = _DENSE.match(a.text.strip())
    if not m:
      return a.text
    t = decode_type(ir.Type.parse(m.group(2)))
    return _parse_dense(a.text, t.dtype, tuple(t.shape))
  if isinstance(a, (ir.DenseIntElementsAttr, ir.DenseFPElementsAttr, ir.DenseElementsAttr)):
    return decode_elements(a)
  if isinstance(a, ir.BoolAttr):
    return bool(a.value)
  if isinstance(a, ir.IntegerAttr):
    return int(a.value)
  if isinstance(a, ir.FloatAttr):
    return float(a.value)
  if isinstance(a, ir.StringAttr):
    try:
      return a.value
    except (UnicodeDecodeError, RuntimeError):   # raw bytes (legacy custom calls' opaque descriptors)
      return a.value_bytes
  if isinstance(a, ir.FlatSymbolRefAttr):
    return a.value
  if isinstance(a, (ir.DenseI64ArrayAttr, ir.DenseI32ArrayAttr, ir.DenseBoolArrayAttr, ir.DenseF32ArrayAttr,
                    ir.DenseF64ArrayAttr)):
    return list(a)
  if isinstance(a, ir.ArrayAttr):
    return [decode_attr(x) for x in a]
  if isinstance(a, ir.DictAttr):
    return {x.name: decode_attr(x.attr) for x in a}
  if isinstance(a, ir.TypeAttr):
    try:
      return decode_type(a.value)
    except StableHLOError:
      return str(a.value)
  if isinstance(a, ir.UnitAttr):
    return True
  special = _stablehlo_attr(a)
  if special is not None:
    return special
  return str(a)


_DENSE = re.compile(r"^dense<(.*)>\s*:\s*(.*)$", re.S)


def decode_elements(a) -> np.ndarray:
  """A dense elements attribute as a NumPy array of its element type."""
  t = decode_type(a.type)
  shape = tuple(t.shape)
  if getattr(a, "is_splat", False) and int(np.prod(shape)) > 1:   # one value: a read-only broadcast view
    return np.broadcast_to(_parse_dense(str(a), t.dtype, ()), shape)
  try:
    arr = np.array(a)
    if arr.dtype == t.dtype or (t.dtype == np.bool_ and arr.dtype == np.bool_):
      return arr.reshape(shape)
  except Exception:   # bf16, float8, complex, sub-byte ints: read the printed form
    pass
  return _parse_dense(str(a), t.dtype, shape)


def _parse_dense(text: str, dtype, shape) -> np.ndarray:
  m = _DENSE.match(text.strip())
  if not m:
    raise StableHLOError(f"cannot decode constant {text[:80]}")
  body = m.group(1).strip()
  if body.startswith('"0x'):   # raw little-endian bytes
    raw = bytes.fromhex(body[3:-1])
    storage = np.dtype(np.int8) if dtype in (ml_dtypes.int4, ml_dtypes.int2) else dtype
    arr = np.frombuffer(raw, dtype=storage).astype(dtype)
    return (np.broadcast_to(arr.reshape(()), shape) if arr.size == 1 else arr.reshape(shape)).copy()
  body = body.replace("true", "1").replace("false", "0")
  if np.dtype(dtype).kind == "c":
    pairs = re.findall(r"\(([^,()]+),([^()]+)\)", body)
    part = np.float32 if np.dtype(dtype) == np.complex64 else np.float64
    values = [complex(_float(r, part), _float(i, part)) for r, i in pairs]
  else:
    tokens = [tok for tok in re.split(r"[\[\],\s]+", body) if tok]
    values = [_float(tok, dtype) if np.dtype(dtype).kind == "f" or dtype in _FLOAT_TYPES.values()
              else int(tok, 0) for tok in tokens]
  arr = np.array(values, dtype=np.complex128 if np.dtype(dtype).kind == "c" else None)
  if np.dtype(dtype).kind == "f" or dtype in _FLOAT_TYPES.values():
    arr = np.asarray(values, np.float64)
  arr = arr.astype(dtype)
  return np.broadcast_to(arr.reshape(()), shape).copy() if arr.size == 1 else arr.reshape(shape)


def _float(token: str, dtype) -> float:
  """A float literal, or a bit pattern in hex (NaN payloads, infinities) of `dtype`."""
  token = token.strip()
  if token.startswith("0x"):
    dtype = np.dtype(dtype)
    bits = np.array(int(token, 16), {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize])
    return float(bits.view(dtype).astype(np.float64))
  return float(token)
