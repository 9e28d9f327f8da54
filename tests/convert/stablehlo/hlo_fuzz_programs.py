"""JAX programs for the differential fuzz of the StableHLO interpreter (test_fuzz_interpreter.py).

Each handler family has a list of program *kinds*; a kind draws one signature (shapes, dtypes,
attributes) from a `np.random.RandomState` and returns a `Program`: the function, one value set,
and how to draw more. Shapes stay tiny (0-size axes included) so one signature is cheap to run
with many value sets.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

F32 = np.dtype(np.float32)


@dataclasses.dataclass
class Program:
  name: str
  fn: Callable
  args: list                       # one value set (NumPy); its shapes and dtypes are the signature
  draw: Callable | None = None     # (rs, edges) -> a fresh value set; None: float inputs redrawn
  grad: bool = True                # reverse mode and jvp, w.r.t. the float inputs
  vmap: bool = True
  rtol: float = 2e-5
  atol: float = 1e-6
  grad_rtol: float = 1e-4
  grad_atol: float = 1e-5
  specs: list | None = None        # export specs (symbolic shapes) in place of the args' shapes
  edges: bool = True               # edge values (NaN, ±inf, 0, huge) in half of the value sets
  values: int | None = None        # value sets of this signature (default: the fuzz's)
  reference: Callable | None = None   # JAX's side, where it differs from `fn` (default: fn)
  platform: str = "cpu"            # the platform exported for (tpu and cuda modules run on CPU too)
  vmap_ref: bool = False           # vmap compared with JAX's own vmap (rng_bit_generator batches by
                                   # its first key), not with the value sets one by one


# --------------------------------------------------------------------------- values

_BASE = np.array([0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.5, 3.0, 0.1, -0.3, 7.25, -9.0, 1e-3, 0.75, 1.5])
_EDGES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 3e38, -3e38, 1e-30])


def floats(rs, shape, edges=False, dtype=F32, lo=-4.0, hi=4.0):
  """Uniform floats in [lo, hi), some from a pool of round values; with `edges`, ~15% edge values."""
  shape = tuple(shape)
  size = int(np.prod(shape, dtype=np.int64))
  out = rs.uniform(lo, hi, size)
  pick = rs.rand(size) < 0.3
  out[pick] = np.clip(_BASE[rs.randint(0, len(_BASE), size)], lo, hi)[pick]
  if edges:
    bad = rs.rand(size) < 0.15
    out[bad] = _EDGES[rs.randint(0, len(_EDGES), size)][bad]
  dtype = np.dtype(dtype)
  if dtype.kind == "c":
    return (out + 1j * floats(rs, shape, edges, F32, lo, hi).reshape(-1)).astype(dtype).reshape(shape)
  with np.errstate(over="ignore"):
    return out.astype(dtype).reshape(shape)


def ints(rs, shape, dtype=np.int32, lo=None, hi=None, edges=False):
  dtype = np.dtype(dtype)
  info = np.iinfo(dtype)
  lo = max(info.min, -100) if lo is None else lo
  hi = min(info.max, 100) if hi is None else hi
  out = rs.randint(lo, hi + 1, size=tuple(shape), dtype=np.int64)
  if edges:
    pool = np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], np.int64)
    bad = rs.rand(*out.shape) < 0.2
    out = np.where(bad, pool[rs.randint(0, len(pool), out.shape)], out)
  return out.astype(dtype)


def shape_of(rs, rank=None, empty=0.1, hi=4):
  rank = rs.randint(0, 4) if rank is None else rank
  return tuple(0 if rs.rand() < empty else int(rs.randint(1, hi)) for _ in range(rank))


def pick(rs, seq):
  return seq[rs.randint(len(seq))]


def redraw_floats(args, rs, edges, lo=-4.0, hi=4.0):
  return [floats(rs, a.shape, edges, a.dtype, lo, hi) if inexact(a.dtype) else a for a in args]


def inexact(dtype) -> bool:
  return bool(jnp.issubdtype(dtype, jnp.inexact))


def redraw_all(specs: list[Callable]):
  """`draw` from one drawing function per input: `(rs, edges) -> array`."""
  return lambda rs, edges: [np.asarray(s(rs, edges)) for s in specs]


def variants(kind, names) -> list:
  """One kind per name (the family runs its kinds in turn, so each is drawn)."""
  return [functools.partial(kind, name=n) for n in names]


def program(name, fn, makers, **kw) -> Program:
  """A program whose inputs come from `makers` (one `(rs, edges) -> array` per input)."""
  draw = redraw_all(makers)
  return Program(name, fn, draw(np.random.RandomState(0), False), draw=draw, **kw)


def fl(shape, lo=-4.0, hi=4.0, dtype=F32):
  return lambda rs, edges: floats(rs, shape, edges, dtype, lo, hi)


def it(shape, dtype=np.int32, lo=None, hi=None, edges=True):
  return lambda rs, e: ints(rs, shape, dtype, lo, hi, edges and e)


def fixed(value):
  return lambda rs, edges: value


# --------------------------------------------------------------------------- elementwise

_UNARY = {
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh, "exp": jnp.exp, "expm1": jnp.expm1,
    "log": jnp.log, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "cbrt": jnp.cbrt, "abs": jnp.abs,
    "neg": jnp.negative, "sign": jnp.sign, "floor": jnp.floor, "ceil": jnp.ceil, "round": jnp.round,
    "round_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO), "square": jnp.square,
    "reciprocal": jnp.reciprocal, "logistic": lax.logistic, "isfinite": lambda x: (jnp.isfinite(x), x * 2),
    "reduce_precision": lambda x: lax.reduce_precision(x, 5, 10), "isinf": lambda x: (jnp.isinf(x), jnp.isneginf(x)),
}
_BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide, "rem": lax.rem,
    "max": jnp.maximum, "min": jnp.minimum, "pow": lax.pow, "atan2": jnp.arctan2, "nextafter": jnp.nextafter,
    "mod": jnp.mod, "floor_divide": jnp.floor_divide, "hypot": jnp.hypot, "copysign": jnp.copysign,
}


def unary(rs, name=None):
  name = name or pick(rs, sorted(_UNARY))
  dtype = pick(rs, [F32, F32, F32, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)])
  tol = 2e-5 if dtype == F32 else 1e-2
  return program(f"unary:{name}:{dtype}", _UNARY[name], [fl(shape_of(rs), dtype=dtype)], rtol=tol,
                 grad_rtol=1e-4 if dtype == F32 else 3e-2, atol=1e-6 if dtype == F32 else 1e-3,
                 grad_atol=1e-5 if dtype == F32 else 1e-2)   # half types: JAX's rules cancel (1 - ans) in them


def binary(rs, name=None):
  name = name or pick(rs, sorted(_BINARY))
  shape = shape_of(rs)
  other = shape if name in ("pow", "rem") else pick(rs, [shape, (), shape[len(shape) // 2:]])   # lax: same shapes
  lo = 0.0 if name == "pow" and rs.rand() < 0.5 else -4.0
  return program(f"binary:{name}", _BINARY[name], [fl(shape, lo), fl(other)])


def compare_select(rs):
  shape = shape_of(rs)
  op = pick(rs, [jnp.less, jnp.less_equal, jnp.greater, jnp.greater_equal, jnp.equal, jnp.not_equal])
  form = rs.randint(3)
  if form == 0:
    fn = lambda x, y: jnp.where(op(x, y), x * 2.0, y - 1.0)
  elif form == 1:
    fn = lambda x, y: (op(x, y), lax.select(op(x, y), jnp.sin(x), y))
  else:   # a scalar predicate, broadcast (lax.select_n takes it as it is)
    fn = lambda x, y: lax.select_n(op(jnp.sum(x), 0.0), x, y)
  return program(f"compare_select:{op.__name__}:{form}", fn, [fl(shape), fl(shape)])


def clamp(rs):
  shape = shape_of(rs)
  scalar = rs.rand() < 0.5
  bound = () if scalar else shape
  # JAX cannot transpose a clamp with scalar bounds: its reference broadcasts them (the module keeps them scalar).
  ref = lambda lo, x, hi: lax.clamp(jnp.broadcast_to(lo, x.shape), x, jnp.broadcast_to(hi, x.shape))
  return program(f"clamp:{scalar}", lambda lo, x, hi: lax.clamp(lo, x, hi),
                 [fl(bound, -3, 0), fl(shape), fl(bound, 0, 3)], reference=ref)


_INT_UNARY = {"popcnt": lax.population_count, "clz": lax.clz, "not": jnp.invert, "neg": jnp.negative,
              "abs": jnp.abs, "sign": jnp.sign}
_INT_BINARY = {"div": lax.div, "rem": lax.rem, "and": jnp.bitwise_and, "or": jnp.bitwise_or,
               "xor": jnp.bitwise_xor, "shl": lax.shift_left, "sar": lax.shift_right_arithmetic,
               "shr": lax.shift_right_logical, "max": jnp.maximum, "min": jnp.minimum, "mul": jnp.multiply,
               "add": jnp.add, "floor_divide": jnp.floor_divide, "mod": jnp.mod, "pow": lambda x, y: x ** 3}


def integer(rs, name=None):
  dtype = np.dtype(pick(rs, [np.int32, np.int8, np.int16, np.uint8, np.uint32, np.uint16]))
  shape = shape_of(rs)
  name = name or pick(rs, sorted(_INT_UNARY) + sorted(_INT_BINARY))
  if name in _INT_UNARY:
    return program(f"int:{name}:{dtype}", _INT_UNARY[name], [it(shape, dtype)])
  bits = dtype.itemsize * 8
  second = it(shape, dtype, 0, bits + 2) if name in ("shl", "sar", "shr") else it(shape, dtype)
  return program(f"int:{name}:{dtype}", _INT_BINARY[name], [it(shape, dtype), second])


def logical(rs):
  shape = shape_of(rs)
  fn = lambda a, b, x: (a & b, a | ~b, a ^ b, jnp.where(a, x, -x), jnp.any(a), jnp.all(b, axis=-1) if a.ndim else a)
  return program("logical", fn, [lambda rs, e: rs.rand(*shape) < 0.5, lambda rs, e: rs.rand(*shape) < 0.5,
                                 fl(shape)])


_CONVERT = [np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.int8, np.uint8, np.uint32, np.bool_,
            np.int16, np.complex64]


def convert(rs):
  src, dst = (np.dtype(pick(rs, _CONVERT)) for _ in range(2))
  shape = shape_of(rs)
  if inexact(src):
    maker = fl(shape, -300, 300, src)
  elif src == np.bool_:
    maker = lambda rs, e: rs.rand(*shape) < 0.5
  else:
    maker = it(shape, src)
  fn = lambda x: (lax.convert_element_type(x, dst) if not (src.kind == "c" and dst.kind != "c")
                  else lax.convert_element_type(jnp.real(x), dst))
  tol = 2e-5 if {src, dst} <= {F32, np.dtype(np.complex64)} else 1e-2
  return program(f"convert:{src}->{dst}", fn, [maker], rtol=tol, grad_rtol=tol, atol=1e-6)


def bitcast(rs):
  src, dst = pick(rs, [(np.float32, np.int32), (np.float32, np.uint32), (np.int32, np.float32),
                       (np.float16, np.int16), (np.float32, np.uint8), (np.uint8, np.float32),
                       (np.float32, np.float16), (np.int16, ml_dtypes.bfloat16)])
  src, dst = np.dtype(src), np.dtype(dst)
  shape = shape_of(rs, rank=rs.randint(0, 3))
  if src.itemsize < dst.itemsize:
    shape = shape + (dst.itemsize // src.itemsize,)
  maker = fl(shape, -100, 100, src) if inexact(src) else it(shape, src, edges=True)
  fn = lambda x: lax.bitcast_convert_type(x, dst)
  return program(f"bitcast:{src}->{dst}", fn, [maker], grad=False)


def complex_ops(rs):
  shape = shape_of(rs)
  name = pick(rs, ["mul", "div", "exp", "log", "sqrt", "abs", "sin", "pow", "conj", "tanh", "sign", "expm1"])
  fns = {"mul": lambda z, w: z * w, "div": lambda z, w: z / w, "exp": lambda z, w: jnp.exp(z),
         "log": lambda z, w: jnp.log(z), "sqrt": lambda z, w: jnp.sqrt(z), "abs": lambda z, w: jnp.abs(z) + w.real,
         "sin": lambda z, w: jnp.sin(z), "pow": lambda z, w: z ** 2 + w ** 3, "conj": lambda z, w: jnp.conj(z) * w,
         "tanh": lambda z, w: jnp.tanh(z), "sign": lambda z, w: jnp.sign(z), "expm1": lambda z, w: jnp.expm1(z)}
  body = fns[name]
  fn = lambda x, y, u, v: body(lax.complex(x, y), lax.complex(u, v))
  return program(f"complex:{name}", fn, [fl(shape), fl(shape), fl(shape), fl(shape)], rtol=1e-4, atol=1e-5)


ELEMENTWISE = (variants(unary, sorted(_UNARY)) + variants(binary, sorted(_BINARY)) +
               variants(integer, sorted(_INT_UNARY) + sorted(_INT_BINARY)) +
               [compare_select, compare_select, clamp, clamp, logical, convert, convert, convert, bitcast, bitcast,
                complex_ops, complex_ops, complex_ops])


# --------------------------------------------------------------------------- special functions

def _attention(q, k, v, mask):
  logits = jnp.einsum("qd,kd->qk", q, k)
  logits = jnp.where(mask, logits, -jnp.inf)
  return jax.nn.softmax(logits, axis=-1) @ v


_SPECIAL = {
    "erf": (jax.scipy.special.erf, -4, 4), "erfc": (jax.scipy.special.erfc, -4, 4),
    "erfinv": (jax.scipy.special.erfinv, -1, 1), "lgamma": (jax.scipy.special.gammaln, -4, 8),
    "digamma": (jax.scipy.special.digamma, -4, 8), "logistic": (jax.nn.sigmoid, -30, 30),
    "softplus": (jax.nn.softplus, -30, 30), "gelu_exact": (functools.partial(jax.nn.gelu, approximate=False), -6, 6),
    "gelu_tanh": (functools.partial(jax.nn.gelu, approximate=True), -6, 6), "sinh": (jnp.sinh, -10, 10),
    "cosh": (jnp.cosh, -10, 10), "asinh": (jnp.arcsinh, -10, 10), "acosh": (jnp.arccosh, 0.5, 10),
    "atanh": (jnp.arctanh, -1, 1), "asin": (jnp.arcsin, -1, 1), "acos": (jnp.arccos, -1, 1), "atan": (jnp.arctan, -9, 9),
    "i1e": (jax.scipy.special.i1e, -9, 9), "i0e": (jax.scipy.special.i0e, -9, 9),
    "ndtri": (jax.scipy.special.ndtri, 0, 1), "log_sigmoid": (jax.nn.log_sigmoid, -30, 30),
    "silu": (jax.nn.silu, -9, 9), "elu": (jax.nn.elu, -9, 9), "selu": (jax.nn.selu, -9, 9), "relu": (jax.nn.relu, -3, 3),
    "polygamma1": (lambda x: jax.scipy.special.polygamma(1, x), 0.1, 8),
    "zeta": (lambda x: jax.scipy.special.zeta(x + 1.5, 2.0), 0, 6),
    "igamma": (lambda x: jax.scipy.special.gammainc(2.5, x), 0, 9),
    "xlogy": (lambda x: jax.scipy.special.xlogy(x, x + 1), -0.5, 4),
    "log_ndtr": (jax.scipy.special.log_ndtr, -9, 9), "mish": (lambda x: x * jnp.tanh(jax.nn.softplus(x)), -9, 9),
}


def special(rs, name=None):
  name = name or pick(rs, sorted(_SPECIAL))
  fn, lo, hi = _SPECIAL[name]
  return program(f"special:{name}", fn, [fl(shape_of(rs, empty=0.05), lo, hi)], rtol=1e-4, atol=1e-5,
                 grad_rtol=1e-3, grad_atol=1e-4)


def softmax_family(rs, name=None):
  name = name or pick(rs, ["softmax", "log_softmax", "logsumexp", "masked_softmax", "standardize"])
  shape = shape_of(rs, rank=rs.randint(1, 4), empty=0.05)
  axis = int(rs.randint(len(shape)))
  mask = lambda rs, e: rs.rand(*shape) < 0.7
  fns = {"softmax": lambda x, m: jax.nn.softmax(x, axis=axis),
         "log_softmax": lambda x, m: jax.nn.log_softmax(x, axis=axis),
         "logsumexp": lambda x, m: jax.scipy.special.logsumexp(x, axis=axis),
         "masked_softmax": lambda x, m: jax.nn.softmax(jnp.where(m, x, -jnp.inf), axis=axis),
         "standardize": lambda x, m: jax.nn.standardize(x, axis=axis)}
  return program(f"softmax:{name}", fns[name], [fl(shape, -20, 20), mask], rtol=1e-4, atol=1e-5,
                 grad_rtol=1e-3, grad_atol=1e-4)


def attention(rs):
  t, s, d = rs.randint(1, 4), rs.randint(1, 4), rs.randint(1, 3)
  causal = rs.rand() < 0.5
  mask = (lambda rs, e: np.tril(np.ones((t, s), bool))) if causal else (lambda rs, e: rs.rand(t, s) < 0.6)
  return program(f"attention:{causal}", _attention, [fl((t, d)), fl((s, d)), fl((s, 2)), mask],
                 rtol=1e-4, atol=1e-5, grad_rtol=1e-3, grad_atol=1e-4)


def safe_math(rs, name=None):
  """Zeros under sqrt/log/div, as models guard them (or do not)."""
  shape = shape_of(rs, empty=0.05)
  name = name or pick(rs, ["norm", "log0", "div0", "safe_where", "rsqrt_eps", "pow_frac"])
  fns = {"norm": lambda x: jnp.sqrt(jnp.sum(x * x)), "log0": lambda x: jnp.log(jnp.abs(x)),
         "div0": lambda x: 1.0 / x, "safe_where": lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0),
         "rsqrt_eps": lambda x: x * lax.rsqrt(jnp.mean(x * x) + 1e-6), "pow_frac": lambda x: jnp.abs(x) ** 0.5}
  zeros = lambda rs, e: np.where(rs.rand(*shape) < 0.4, 0.0, floats(rs, shape, e)).astype(F32)
  return program(f"safe:{name}", fns[name], [zeros], rtol=1e-4, atol=1e-5, grad_rtol=1e-3, grad_atol=1e-4)


SPECIAL = (variants(special, sorted(_SPECIAL)) +
           variants(softmax_family, ["softmax", "log_softmax", "logsumexp", "masked_softmax", "standardize"]) +
           [attention, attention] + variants(safe_math, ["norm", "log0", "div0", "safe_where", "rsqrt_eps", "pow_frac"]))


# --------------------------------------------------------------------------- reductions

def _axes(rs, rank):
  return tuple(int(a) for a in np.nonzero(rs.rand(rank) < 0.5)[0])


def reduction(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(1, 4))
  axes = _axes(rs, len(shape))
  name = name or pick(rs, ["sum", "max", "min", "prod", "mean", "var", "argmax", "argmin", "int_sum", "int_max",
                   "any", "all", "xor", "nanmax"])
  if name in ("argmax", "argmin"):
    axis = int(rs.randint(len(shape)))
    shape = tuple(max(d, 1) if i == axis else d for i, d in enumerate(shape))
    f = jnp.argmax if name == "argmax" else jnp.argmin
    return program(f"reduce:{name}", lambda x: (f(x, axis=axis), jnp.max(x, axis=axis) if name == "argmax"
                                                 else jnp.min(x, axis=axis)), [fl(shape)])
  if name.startswith("int_"):
    f = jnp.sum if name == "int_sum" else jnp.max
    return program(f"reduce:{name}", lambda x: f(x, axis=axes, initial=None if name == "int_sum" else -5),
                   [it(shape, pick(rs, [np.int32, np.uint8, np.int8]))])
  if name in ("any", "all", "xor"):
    f = {"any": jnp.any, "all": jnp.all, "xor": lambda b, axis: lax.reduce_xor_p.bind(b, axes=axis)}[name]
    return program(f"reduce:{name}", lambda b: f(b, axis=axes), [lambda rs, e: rs.rand(*shape) < 0.5])
  fns = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod, "mean": jnp.mean, "var": jnp.var,
         "nanmax": jnp.nanmax}
  f = fns[name]
  if name in ("max", "min", "nanmax") and any(shape[a] == 0 for a in axes):
    return program(f"reduce:{name}:init", lambda x: f(x, axis=axes, initial=-1.0 if name != "min" else 1.0),
                   [fl(shape)])
  return program(f"reduce:{name}", lambda x: f(x, axis=axes), [fl(shape)], rtol=1e-4, atol=1e-5)


def variadic_reduce(rs):
  """A two-operand reduce with a body jax's own functions do not emit: (max, its count)."""
  shape = shape_of(rs, rank=rs.randint(1, 3))
  axes = _axes(rs, len(shape)) or (0,)

  def body(a, b):
    (va, ca), (vb, cb) = a, b
    return jnp.maximum(va, vb), jnp.where(va == vb, ca + cb, jnp.where(va > vb, ca, cb))
  fn = lambda x: lax.reduce((x, jnp.ones(x.shape, jnp.int32)), (-jnp.inf, 0), body, axes)
  return program("reduce:variadic", fn, [fl(shape)])


def _window(rs, rank):
  dims = tuple(int(rs.randint(1, 3)) for _ in range(rank))
  strides = tuple(int(rs.randint(1, 3)) for _ in range(rank))
  pad = tuple((int(rs.randint(0, 2)), int(rs.randint(0, 2))) for _ in range(rank))
  base = tuple(int(pick(rs, [1, 1, 2])) for _ in range(rank))
  dil = tuple(int(pick(rs, [1, 1, 2])) for _ in range(rank))
  return dims, strides, pad, base, dil


def reduce_window(rs, name=None):
  rank = rs.randint(1, 4)
  shape = tuple(int(rs.randint(1, 5)) for _ in range(rank))
  dims, strides, pad, base, dil = _window(rs, rank)
  name = name or pick(rs, ["add", "max", "min", "mul", "avg_pool", "max_pool", "custom"])
  if name == "max_pool":
    padding = pick(rs, ["SAME", "VALID"])
    fn = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, padding)
  elif name == "avg_pool":
    fn = lambda x: lax.reduce_window(x, 0.0, lax.add, dims, strides, pad) / np.prod(dims)
  elif name == "custom":   # a body that is no monoid: max of |values|
    fn = lambda x: lax.reduce_window(x, 0.0, lambda a, b: jnp.maximum(jnp.abs(a), jnp.abs(b)), dims, strides, pad,
                                     base, dil)
  else:
    op, init = {"add": (lax.add, 0.0), "max": (lax.max, -jnp.inf), "min": (lax.min, jnp.inf), "mul": (lax.mul, 1.0)}[name]
    fn = lambda x: lax.reduce_window(x, init, op, dims, strides, pad, base, dil)
  return program(f"reduce_window:{name}", fn, [fl(shape)], rtol=1e-4, atol=1e-5)


def max_pool_grad(rs):
  """The vjp of max (min) pooling in the program: stablehlo.select_and_scatter."""
  rank = rs.randint(1, 3)
  shape = tuple(int(rs.randint(1, 5)) for _ in range(rank))
  dims, strides, pad, _, _ = _window(rs, rank)
  op, init = pick(rs, [(lax.max, -jnp.inf), (lax.min, jnp.inf)])
  pool = lambda x: lax.reduce_window(x, init, op, dims, strides, pad)
  out_shape = jax.eval_shape(pool, jax.ShapeDtypeStruct(shape, F32)).shape
  fn = lambda x, ct: jax.vjp(pool, x)[1](ct)[0]
  ties = lambda rs, e: np.round(floats(rs, shape, e)).astype(F32)   # ties pick the first
  return program(f"select_and_scatter:{op.__name__}", fn, [ties, fl(out_shape)])


def cumulative(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(1, 4), empty=0.05)
  axis = int(rs.randint(len(shape)))
  reverse = bool(rs.rand() < 0.5)
  name = name or pick(rs, ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "jnp_cumsum", "int_cumsum"])
  if name == "jnp_cumsum":
    return program("cumulative:jnp_cumsum", lambda x: jnp.cumsum(x, axis=axis), [fl(shape)], rtol=1e-4, atol=1e-5)
  f = getattr(lax, name.replace("int_", ""))
  maker = it(shape, np.int32) if name == "int_cumsum" else fl(shape)
  return program(f"cumulative:{name}:{reverse}", lambda x: f(x, axis=axis, reverse=reverse), [maker],
                 rtol=1e-4, atol=1e-5)


def sorting(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(1, 3))
  axis = int(rs.randint(len(shape)))
  name = name or pick(rs, ["sort", "argsort", "argsort_desc", "multi", "int_sort", "complex", "sort_stable_keys"])
  rounded = lambda rs, e: np.round(floats(rs, shape, e)).astype(F32)   # ties
  if name == "sort":
    return program("sort:sort", lambda x: jnp.sort(x, axis=axis), [rounded])
  if name in ("argsort", "argsort_desc"):
    desc = name == "argsort_desc"
    return program(f"sort:{name}", lambda x: jnp.argsort(x, axis=axis, stable=True, descending=desc), [rounded])
  if name == "multi":
    keys = int(rs.randint(1, 3))
    fn = lambda x, y, z: lax.sort((x, y, z), dimension=axis, is_stable=True, num_keys=keys)
    return program(f"sort:multi:{keys}", fn, [rounded, rounded, fl(shape)])
  if name == "int_sort":
    return program("sort:int", lambda x, y: lax.sort_key_val(x, y, dimension=axis),
                   [it(shape, pick(rs, [np.int32, np.uint8]), -3, 3), fl(shape)])
  if name == "complex":
    return program("sort:complex", lambda x, y: jnp.sort(lax.complex(x, y), axis=axis), [rounded, rounded])
  return program("sort:lexsort", lambda x, y: jnp.lexsort((x, y), axis=axis), [rounded, rounded])


def top_k(rs, name=None):
  n = int(rs.randint(1, 6))
  shape = shape_of(rs, rank=rs.randint(0, 2)) + (n,)
  k = int(rs.randint(0, n + 1))
  rounded = lambda rs, e: np.round(floats(rs, shape, e) * 2).astype(F32)
  if name == "approx":   # custom_call @ApproxTopK, exact on CPU
    k = max(k, 1)
    fn = lax.approx_max_k if rs.rand() < 0.5 else lax.approx_min_k
    return program(f"top_k:approx:{fn.__name__}:{k}", lambda x: fn(x, k), [rounded])
  return program(f"top_k:{k}", lambda x: lax.top_k(x, k), [rounded])


REDUCE = (variants(reduction, ["sum", "max", "min", "prod", "mean", "var", "argmax", "argmin", "int_sum", "int_max",
                                "any", "all", "xor", "nanmax"]) + [variadic_reduce, max_pool_grad, max_pool_grad] +
          variants(reduce_window, ["add", "max", "min", "mul", "avg_pool", "max_pool", "custom"]) +
          variants(cumulative, ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "jnp_cumsum", "int_cumsum"]) +
          variants(sorting, ["sort", "argsort", "argsort_desc", "multi", "int_sort", "complex", "sort_stable_keys"]) +
          variants(top_k, ["exact", "approx"]))


# --------------------------------------------------------------------------- indexing

def gather(rs):
  shape = tuple(int(rs.randint(1, 5)) for _ in range(rs.randint(1, 4)))
  form = pick(rs, ["take", "take_clip", "take_fill", "multi", "slices", "along", "vmapped"])
  n = int(rs.randint(0, 4))
  idx = it((n,), np.int32, -shape[0] - 1, shape[0] + 1, edges=False)
  x = fl(shape)
  if form == "take":
    return program("gather:take", lambda x, i: jnp.take(x, i, axis=0), [x, idx])
  if form == "take_clip":
    return program("gather:clip", lambda x, i: jnp.take(x, i, axis=0, mode="clip"), [x, idx])
  if form == "take_fill":
    return program("gather:fill", lambda x, i: jnp.take(x, i, axis=0, mode="fill", fill_value=-7.0), [x, idx])
  if form == "multi" and len(shape) >= 2:
    j = it((n,), np.int32, 0, shape[1] - 1, edges=False)
    return program("gather:multi", lambda x, i, j: x[i, j], [x, idx, j])
  if form == "along":
    axis = int(rs.randint(len(shape)))
    ishape = tuple(int(rs.randint(0, 3)) if a == axis else d for a, d in enumerate(shape))
    ii = it(ishape, np.int32, 0, shape[axis] - 1, edges=False)
    return program("gather:along", lambda x, i: jnp.take_along_axis(x, i, axis=axis), [x, ii])
  if form == "vmapped" and len(shape) >= 2:   # operand and indices batched together: batching dims
    ib = it((shape[0], n), np.int32, 0, shape[1] - 1, edges=False)
    return program("gather:batching", jax.vmap(lambda x, i: x[i]), [x, ib])
  start = it((), np.int32, -2, shape[0] + 2, edges=False)
  if len(shape) == 1:
    return program("gather:slices", lambda x, s: x[s] + x[::-1][:2], [x, start])
  return program("gather:slices", lambda x, s: x[s, ::-1][..., :2], [x, start])


def scatter(rs):
  shape = tuple(int(rs.randint(1, 5)) for _ in range(rs.randint(1, 3)))
  n = int(rs.randint(0, 5))
  op = pick(rs, ["set", "add", "mul", "min", "max", "apply", "subtract", "drop", "batched", "multi_index"])
  idx = it((n,), np.int32, -shape[0] - 2, shape[0] + 1, edges=False)   # duplicates, out of range
  x, upd = fl(shape), fl((n,) + shape[1:])
  if op == "apply":
    return program("scatter:apply", lambda x, i: x.at[i].apply(jnp.sin, mode="drop"), [x, idx])
  if op == "subtract":
    return program("scatter:subtract", lambda x, i, u: x.at[i].subtract(u, mode="drop"), [x, idx, upd])
  if op == "drop":
    return program("scatter:promise", lambda x, i, u: x.at[jnp.abs(i) % shape[0]].add(u, mode="promise_in_bounds"),
                   [x, idx, upd])
  if op == "batched" and len(shape) >= 2:
    ib = it((shape[0], n), np.int32, 0, shape[1] - 1, edges=False)
    ub = fl((shape[0], n) + shape[2:])
    return program("scatter:batching", jax.vmap(lambda x, i, u: x.at[i].add(u)), [x, ib, ub])
  if op == "multi_index" and len(shape) >= 2:
    j = it((n,), np.int32, 0, shape[1] - 1, edges=False)
    return program("scatter:multi", lambda x, i, j, u: x.at[i, j].max(u), [x, idx, j, fl((n,) + shape[2:])])
  op = op if op in ("set", "add", "mul", "min", "max") else "set"
  mode = pick(rs, ["drop", "clip"])
  return program(f"scatter:{op}:{mode}", lambda x, i, u: getattr(x.at[i], op)(u, mode=mode), [x, idx, upd])


def int_scatter(rs):
  shape = (int(rs.randint(1, 5)),)
  n = int(rs.randint(0, 5))
  op = pick(rs, ["add", "max", "set", "or"])
  idx = it((n,), np.int32, 0, shape[0] - 1, edges=False)
  if op == "or":
    return program("scatter:bool_or", lambda x, i, u: x.at[i].max(u),
                   [lambda rs, e: rs.rand(*shape) < 0.3, idx, lambda rs, e: rs.rand(n) < 0.5])
  return program(f"scatter:int_{op}", lambda x, i, u: getattr(x.at[i], op)(u), [it(shape), idx, it((n,))])


def dynamic_slices(rs):
  shape = tuple(int(rs.randint(1, 5)) for _ in range(rs.randint(1, 3)))
  sizes = tuple(int(rs.randint(0, d + 1)) for d in shape)
  dtype = pick(rs, [np.int32, np.int32, np.uint32])
  starts = [it((), dtype, -3 if dtype == np.int32 else 0, d + 2, edges=False) for d in shape]
  if rs.rand() < 0.5:
    fn = lambda x, *s: lax.dynamic_slice(x, s, sizes)
    return program("dynamic_slice", fn, [fl(shape)] + starts)
  fn = lambda x, u, *s: lax.dynamic_update_slice(x, u, s)
  return program("dynamic_update_slice", fn, [fl(shape), fl(sizes)] + starts)


INDEX = [gather, gather, scatter, scatter, int_scatter, dynamic_slices, dynamic_slices]
