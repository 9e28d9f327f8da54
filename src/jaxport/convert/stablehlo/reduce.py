"""StableHLO reductions: reduce, reduce_window, select_and_scatter, sort, and top k.

Also chlo.top_k and the custom_calls `stablehlo.dynamic_reduce_window` (shape-polymorphic
windows), `stablehlo.dynamic_top_k` and `ApproxTopK` (exact, as CPU runs it).
Region bodies are recognised by their structure: `block_trees` evaluates a region into
canonical expression trees, compared with the bodies jax and TF emit.
* Monoid bodies (add, multiply, maximum, minimum, and, or, xor) become jax's own
  reductions (`lax.reduce_sum`, `lax.reduce_window` with `lax.max`, ...), and windows
  spanning a whole axis with one-sided padding become `lax.cumsum`/`cumprod`/`cummax`/
  `cummin`, so `grad` works and cumulative sums stay O(n).
* Value/index bodies (jnp.argmax's, TF's ArgMax) become argmax/argmin.
* Sort comparators that compare operands lexicographically (LT/GT, FLOAT or TOTALORDER,
  with or without jax's -0/NaN canonicalisation) become `lax.sort` keys.
* Other bodies run as the region itself: generic `lax.reduce`/`lax.reduce_window`
  (cumulative windows as `lax.associative_scan`), and unrecognised comparators of small
  sorts as an O(n^2) rank sort.
Windows follow XLA (CPU): padding and base-dilation holes are skipped and the init
enters each window once, so a window's result is `init (+) reduce(its elements)`.
Deviations: where XLA's answer depends on its reduction order (a body that is not
associative, NaNs under TF's GE-based ArgMax or under FLOAT sort comparators), jaxport
picks one valid answer: the first NaN wins, NaNs sort as IEEE totalOrder puts them.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.elementwise import _total_order_key, canon, is_const, jax_dtype
from jaxport.convert.stablehlo.custom_call import target
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.convert.stablehlo.module import Block
from jaxport.convert.stablehlo.shape import static_shape
from jaxport.errors import StableHLOError

# --------------------------------------------------------------------------- region bodies as trees

# A tree is (name, attrs, children): ("arg", (i,), ()), ("const", (repr,), ()), ("add", (), (a, b)), ...
_COMMUTATIVE = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"}


def node(name: str, attrs: tuple = (), children: tuple = ()) -> tuple:
  """A tree node; operands of commutative ops (and of EQ/NE compares) in a canonical order."""
  if name in _COMMUTATIVE or (name == "compare" and attrs[0] in ("EQ", "NE")):
    children = tuple(sorted(children, key=repr))
  return (name, tuple(attrs), tuple(children))


def arg(i: int) -> tuple:
  return ("arg", (i,), ())


def const(text: str) -> tuple:
  return ("const", (text,), ())


def cmp(direction: str, a, b, total: bool = False) -> tuple:
  return node("compare", (direction, "TOTALORDER" if total else None), (a, b))


def _const_tree(value) -> tuple | None:
  value = np.asarray(value).reshape(-1)
  return const(repr(value[0].item())) if value.size == 1 else None


def block_trees(block: Block, outer=None) -> list | None:
  """The block's results as trees of its arguments and constants, or None (nested regions, traced values
  from `outer`, the enclosing regions' values)."""
  env = {a: arg(i) for i, a in enumerate(block.args)}

  def lookup(v):
    if v not in env:
      try:
        value = outer[v] if outer is not None else None
      except StableHLOError:
        value = None
      env[v] = _const_tree(value) if is_const(value) else None
    return env[v]

  for op in block.ops:
    children = tuple(lookup(v) for v in op.operands)
    if op.regions or len(op.results) != 1 or any(c is None for c in children):
      return None
    name = op.name.split(".", 1)[1]
    if name == "constant":
      tree = _const_tree(op.attrs["value"])
    elif name == "compare":
      kind = getattr(op.attrs.get("compare_type"), "value", None)
      tree = node("compare", (op.attrs["comparison_direction"].value, "TOTALORDER" if kind == "TOTALORDER" else None),
                  children)
    else:
      tree = node(name, tuple(sorted((k, repr(v)) for k, v in op.attrs.items())), children)
    env[op.results[0]] = tree
  trees = [lookup(v) for v in block.returns]
  return None if any(t is None for t in trees) else trees


@dataclasses.dataclass
class Body:
  """A region (or a called function) of an op: its trees, and itself as a function of scalars."""
  block: Block
  trees: list | None
  fn: Callable[..., list]

  @classmethod
  def region(cls, ctx, index: int = 0) -> "Body":
    block = ctx.region_block(index)
    return cls(block, block_trees(block, ctx.env), ctx.region(index))

  @classmethod
  def called(cls, ctx, index: int = 0) -> "Body":
    """`called_computations[index]` of a custom_call."""
    name = ctx.attr("called_computations")[index]
    block = ctx.call.module.functions[name].block
    return cls(block, block_trees(block), lambda *args: ctx.call.call_function(name, args))

  def typed(self, n: int) -> Callable[..., tuple]:
    """The body with its results cast to its first `n` argument types (for lax tracing)."""
    types = [jax_dtype(t) for t in self.block.arg_types[:n]]
    return lambda *args: tuple(jnp.asarray(canon(o), t) for o, t in zip(self.fn(*args), types))

  def operands(self, xs, inits) -> tuple[tuple, tuple]:
    """Operands and inits as arrays of the body's types, for lax.reduce / lax.reduce_window."""
    types = [jax_dtype(t) for t in self.block.arg_types[:len(xs)]]
    return tuple(jnp.asarray(canon(x)) for x in xs), tuple(jnp.asarray(canon(i), t) for i, t in zip(inits, types))

  def ops(self) -> str:
    return ", ".join(op.name for op in self.block.ops) or "its arguments"


def elementwise(fn):
  """`fn` (a region over scalars) applied elementwise to arrays that broadcast together."""
  def apply(*xs) -> list:
    xs = [jnp.asarray(canon(x)) for x in xs]
    shape = jnp.broadcast_shapes(*[x.shape for x in xs])
    flat = [jnp.broadcast_to(x, shape).reshape(-1) for x in xs]
    out = jax.vmap(lambda *s: tuple(jnp.asarray(canon(o)) for o in fn(*s)))(*flat)
    return [o.reshape(shape) for o in out]
  return apply


# --------------------------------------------------------------------------- monoids

_MONOIDS = {
    "add": (lax.reduce_sum, lax.add, np.add),
    "multiply": (lax.reduce_prod, lax.mul, np.multiply),
    "maximum": (lax.reduce_max, lax.max, np.maximum),
    "minimum": (lax.reduce_min, lax.min, np.minimum),
    "and": (lax.reduce_and, lax.bitwise_and, np.bitwise_and),
    "or": (lax.reduce_or, lax.bitwise_or, np.bitwise_or),
    "xor": (lax.reduce_xor, lax.bitwise_xor, np.bitwise_xor),
}
_BOOL_MONOID = {"add": "or", "multiply": "and", "maximum": "or", "minimum": "and"}   # XLA's ops on i1
_COMBINE = {name: fns[1] for name, fns in _MONOIDS.items()} | {"logaddexp": jnp.logaddexp}
_CUMULATIVE = {"add": lax.cumsum, "multiply": lax.cumprod, "maximum": lax.cummax, "minimum": lax.cummin,
               "logaddexp": lax.cumlogsumexp}


def monoid_names(trees: list | None, n: int) -> list[str] | None:
  """The monoid of each result when result k is `op(arg k, arg k+n)`, else None."""
  if trees is None or len(trees) != n:
    return None
  names = []
  for k, tree in enumerate(trees):
    if tree[0] not in _MONOIDS or tree != node(tree[0], (), (arg(k), arg(k + n))):
      return None
    names.append(tree[0])
  return names


def _for_dtype(name: str, dtype) -> str:
  return _BOOL_MONOID.get(name, name) if np.dtype(dtype) == np.bool_ else name


def identity(name: str, dtype) -> np.ndarray:
  """The identity of monoid `name` (or of "logaddexp": -inf)."""
  dtype = np.dtype(dtype)
  if name in ("add", "or", "xor"):
    return np.zeros((), dtype)
  if name == "multiply":
    return np.ones((), dtype)
  if name == "and":
    return np.asarray(True if dtype == np.bool_ else -1).astype(dtype)
  if dtype == np.bool_:
    return np.asarray(name == "minimum")
  if jnp.issubdtype(dtype, jnp.inexact):
    return np.asarray(np.inf if name == "minimum" else -np.inf).astype(dtype)
  info = np.iinfo(dtype)
  return np.asarray(info.max if name == "minimum" else info.min, dtype)


def is_identity(name: str, init) -> bool:
  return is_const(init) and bool(np.all(np.asarray(init) == identity(name, np.asarray(init).dtype)))


def _combine_init(name: str, out, init):
  """`op(out, init)` unless `init` is the monoid's identity."""
  if is_identity(name, init):
    return out
  return _COMBINE[name](out, jnp.broadcast_to(jnp.asarray(canon(init), out.dtype), out.shape))


def _monoid_reduce(name: str, x, init, dims: tuple):
  name = _for_dtype(name, x.dtype)
  reducer, _, np_fn = _MONOIDS[name]
  if is_const(x) and is_const(init) and (x.dtype.kind in "biu" or name in ("maximum", "minimum")):
    with np.errstate(all="ignore"):   # exact: stays a trace-time constant
      return np.asarray(np_fn.reduce(x, axis=dims, dtype=x.dtype, initial=np.asarray(init)[()])).astype(x.dtype)
  x = jnp.asarray(canon(x))
  if name in ("maximum", "minimum") and jnp.issubdtype(x.dtype, jnp.inexact) and dims and x.size:
    return _combine_init(name, _chooser(name, dims, x), init)
  return _combine_init(name, reducer(x, dims), init)


_chooser = jax.custom_jvp(lambda name, dims, x: _MONOIDS[name][0](x, dims), nondiff_argnums=(0, 1))


@_chooser.defjvp
def _chooser_jvp(name, dims, primals, tangents):
  (x,), (t,) = primals, tangents
  out = _MONOIDS[name][0](x, dims)
  return out, chooser_tangent(name, dims, x, out, t)


def chooser_tangent(name: str, dims: tuple, x, out, t):
  """JAX's rule for max/min (the tangents where x equals `out`, averaged), robust to XLA recomputing x in
  another fusion with other rounding: a row where no element equals `out` takes its arg-max's tangent (JAX's
  rule gives 0/0 = NaN there; seen under jit in DeBERTa, whose softmax max is differentiated, as in every
  exported module: stop_gradient leaves no trace in StableHLO). A NaN row keeps JAX's reverse-mode answer."""
  hit = (x == jnp.expand_dims(out, dims)).astype(t.dtype)
  counts = jnp.sum(hit, dims)
  averaged = jnp.sum(t * hit, dims) / jnp.maximum(counts, 1)
  last = tuple(range(x.ndim - len(dims), x.ndim))
  flat = lambda v: jnp.moveaxis(v, dims, last).reshape(out.shape + (-1,))
  index = (jnp.argmax if name == "maximum" else jnp.argmin)(flat(x), axis=-1)
  chosen = jnp.take_along_axis(flat(t), index[..., None], axis=-1)[..., 0]
  return jnp.where((counts > 0) | jnp.isnan(out), averaged, chosen)


# --------------------------------------------------------------------------- argmax / argmin bodies

def _arg_templates() -> dict:
  va, ia, vb, ib = arg(0), arg(1), arg(2), arg(3)
  out = {}
  for kind, strict, loose in (("max", "GT", "GE"), ("min", "LT", "LE")):
    # jax: the first of the extremes wins, NaN beats everything.
    p = node("or", (), (cmp(strict, va, vb), cmp("NE", va, va)))
    first = node("or", (), (p, node("and", (), (cmp("EQ", va, vb), cmp("LT", ia, ib)))))
    jax_body = [node("select", (), (p, va, vb)), node("select", (), (first, ia, ib))]
    # TF's ArgMax/ArgMin: ties take the smaller index.
    c = cmp(loose, va, vb)
    tf_body = [node("select", (), (c, va, vb)),
               node("select", (), (cmp("EQ", va, vb), node("minimum", (), (ia, ib)), node("select", (), (c, ia, ib))))]
    out[kind, "jax"], out[kind, "tf"] = jax_body, tf_body
  return out


_ARG_TEMPLATES = _arg_templates()


def arg_reduce_kind(trees: list | None) -> tuple[str, str] | None:
  """("max" or "min", "jax" or "tf") for a value/index body, else None."""
  for kind, template in _ARG_TEMPLATES.items():
    if trees == template:
      return kind
  return None


def _is_iota(idx, shape: tuple, dim: int) -> bool:
  if not is_const(idx) or np.shape(idx) != shape:
    return False
  expected = np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
  return bool(np.all(idx == expected))


def _arg_reduce(body: Body, kind: tuple[str, str], x, idx, inits, dims: tuple) -> list:
  """jax's bodies: the first extreme, NaN first of all. TF's: XLA folds elements in order and a NaN is
  replaced by the element after it, so only the elements after the last NaN (or that NaN, when last) count."""
  x = jnp.asarray(canon(x))
  index_dtype = jax.dtypes.canonicalize_dtype(np.asarray(idx).dtype if is_const(idx) else idx.dtype)
  out_shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
  if any(x.shape[d] == 0 for d in dims):
    return [jnp.broadcast_to(jnp.asarray(canon(v)), out_shape) for v in inits]
  monoid = "maximum" if kind[0] == "max" else "minimum"
  nan_in_order = kind[1] == "tf" and jnp.issubdtype(x.dtype, jnp.inexact)
  if len(dims) == 1 and _is_iota(idx, x.shape, dims[0]) and not nan_in_order:
    d = dims[0]
    i = (lax.argmax if kind[0] == "max" else lax.argmin)(x, d, index_dtype)
    v = jnp.take_along_axis(x, jnp.expand_dims(i, d), axis=d).squeeze(d)
    if is_identity(monoid, inits[0]) and is_const(inits[1]) and int(np.asarray(inits[1])) == 0:
      return [v, i]   # (-inf, 0) for argmax: the init changes nothing
  else:   # the reduced dimensions flattened last, in XLA's (row-major) order
    perm = [i for i in range(x.ndim) if i not in dims] + list(dims)
    flat = lambda a: lax.transpose(a, perm).reshape(out_shape + (-1,))
    xs, ids = flat(x), flat(jnp.broadcast_to(jnp.asarray(canon(idx), index_dtype), x.shape))
    pos = lax.broadcasted_iota(np.int32, xs.shape, xs.ndim - 1)
    count = True
    if nan_in_order:
      last = jnp.max(jnp.where(jnp.isnan(xs), pos, -1), axis=-1, keepdims=True)
      count = pos >= jnp.where(last == xs.shape[-1] - 1, last, last + 1)
    v = _MONOIDS[monoid][0](jnp.where(count, xs, identity(monoid, xs.dtype)), (xs.ndim - 1,))
    vb = v[..., None]
    same = (xs == vb) | (jnp.isnan(xs) & jnp.isnan(vb)) if jnp.issubdtype(xs.dtype, jnp.inexact) else xs == vb
    hit = count & same
    i = lax.reduce_min(jnp.where(hit, ids, np.asarray(np.iinfo(index_dtype).max, index_dtype)), (xs.ndim - 1,))
  return elementwise(body.fn)(inits[0], inits[1], v, i)   # the init takes part once


# --------------------------------------------------------------------------- reduce

@handler("stablehlo.reduce")
def reduce(ctx, *args):
  n = len(args) // 2
  xs, inits = args[:n], args[n:]
  dims = tuple(int(d) for d in ctx.attr("dimensions"))
  body = Body.region(ctx)
  names = monoid_names(body.trees, n)
  if names is not None:
    return [_monoid_reduce(name, x, init, dims) for name, x, init in zip(names, xs, inits)]
  kind = arg_reduce_kind(body.trees) if n == 2 else None
  if kind is not None:
    return _arg_reduce(body, kind, xs[0], xs[1], inits, dims)
  region = body.typed(n)
  return list(lax.reduce(*body.operands(xs, inits), lambda a, b: region(*a, *b), dims))


# --------------------------------------------------------------------------- reduce_window

@dataclasses.dataclass(frozen=True)
class Window:
  dims: tuple
  strides: tuple
  padding: tuple      # ((low, high), ...)
  base: tuple         # base dilations
  dilation: tuple     # window dilations

  @classmethod
  def of(cls, rank: int, dims, strides=None, base=None, dilation=None, padding=None) -> "Window":
    ints = lambda v: (1,) * rank if v is None or len(v) == 0 else tuple(int(d) for d in np.asarray(v).reshape(-1))
    padding = ((0, 0),) * rank if padding is None else tuple(
        (int(lo), int(hi)) for lo, hi in np.broadcast_to(np.asarray(padding), (rank, 2)))
    return cls(ints(dims), ints(strides), padding, ints(base), ints(dilation))

  @classmethod
  def of_attrs(cls, ctx, rank: int) -> "Window":
    return cls.of(rank, *(ctx.attr(key, None) for key in ("window_dimensions", "window_strides", "base_dilations",
                                                          "window_dilations", "padding")))

  def cumulative_axis(self, shape: tuple) -> tuple[int, int, int] | None:
    """(axis, low, high) when the window spans one whole axis, padded on one side only."""
    if any(s != 1 for s in self.strides + self.base + self.dilation):
      return None
    moving = [a for a in range(len(shape)) if self.dims[a] != 1 or self.padding[a] != (0, 0)]
    if len(moving) != 1:
      return None
    a = moving[0]
    lo, hi = self.padding[a]
    if self.dims[a] == shape[a] > 1 and min(lo, hi) == 0 and max(lo, hi) > 0:
      return a, lo, hi
    return None

  def lax_args(self) -> tuple:
    return self.dims, self.strides, self.padding, self.base, self.dilation


def _logaddexp_bodies() -> list:
  """jnp.logaddexp's body (jax's cumlogsumexp) and TF's (its cumulative_logsumexp), either argument order."""
  out = []
  for a, b in ((arg(0), arg(1)), (arg(1), arg(0))):
    m = node("maximum", (), (a, b))
    d = node("subtract", (), (a, b))
    log1p_exp = lambda t: node("log_plus_one", (), (node("exponential", (), (t,)),))
    neg_abs = lambda t: node("negate", (), (node("abs", (), (t,)),))
    out.append([node("select", (), (cmp("NE", d, d), node("add", (), (a, b)),
                                    node("add", (), (m, log1p_exp(neg_abs(d))))))])
    infinite = node("not", (), (node("is_finite", (), (m,)),))
    shift = node("select", (), (infinite, neg_abs(m), node("subtract", (), (node("minimum", (), (a, b)), m))))
    out.append([node("add", (), (m, log1p_exp(shift)))])
  return out


_LOGADDEXP = _logaddexp_bodies()


def _fit_cumulative(out, init, n: int, axis: int, lo: int, hi: int):
  """A cumulative result (length n) as the window's result: empty windows (the init) or a crop at the far end."""
  config = [(0, 0, 0)] * out.ndim
  config[axis] = (lo - (n - 1), 0, 0) if hi == 0 else (0, hi - (n - 1), 0)
  if config[axis][:2] == (0, 0):
    return out
  return lax.pad(out, jnp.asarray(canon(init), out.dtype), config)


def _cumulative(name: str, x, init, axis: int, lo: int, hi: int):
  out = _CUMULATIVE[name](x, axis, reverse=hi > 0)
  return _fit_cumulative(_combine_init(name, out, init), init, x.shape[axis], axis, lo, hi)


def _one_element(w: Window) -> bool:
  """Each window holds one element: no padding, unit window, strides and base dilation."""
  return all(d == 1 for d in w.dims + w.strides + w.base) and all(p == (0, 0) for p in w.padding)


def _monoid_window(name: str, x, init, w: Window):
  x = jnp.asarray(canon(x))
  name = _for_dtype(name, x.dtype)
  if _one_element(w):   # (a cumulative op over an axis of one) x itself: a window max's derivative would
    return _combine_init(name, x, init)   # drop the tangent of an x equal to the -inf init
  cumulative = w.cumulative_axis(x.shape)
  if cumulative is not None and name in _CUMULATIVE:
    return _cumulative(name, x, init, *cumulative)
  out = lax.reduce_window(x, identity(name, x.dtype), _COMBINE[name], *w.lax_args())
  return _combine_init(name, out, init)


@handler("stablehlo.reduce_window")
def reduce_window(ctx, *args):
  n = len(args) // 2
  return _reduce_window(Body.region(ctx), args[:n], args[n:], Window.of_attrs(ctx, np.ndim(args[0])))


@target("stablehlo.dynamic_reduce_window")
def dynamic_reduce_window(ctx, *args):
  """jax.export's reduce_window of shape-polymorphic windows: the window as operands, the body called."""
  n = (len(args) - 5) // 2
  dims, strides, base, dilation, padding = (static_shape(ctx, v, "window") for v in args[2 * n:])
  w = Window.of(np.ndim(args[0]), dims, strides, base, dilation, np.reshape(padding, (-1, 2)))
  return _reduce_window(Body.called(ctx), args[:n], args[n:2 * n], w)


def _reduce_window(body: Body, xs, inits, w: Window) -> list:
  n = len(xs)
  names = monoid_names(body.trees, n)
  if names is not None:
    return [_monoid_window(name, x, init, w) for name, x, init in zip(names, xs, inits)]
  cumulative = w.cumulative_axis(np.shape(xs[0])) if n == 1 else None
  if cumulative is not None and body.trees in _LOGADDEXP:
    return [_cumulative("logaddexp", jnp.asarray(canon(xs[0])), inits[0], *cumulative)]
  region = body.typed(n)
  if _one_element(w):
    # One element per window (a cumulative op over an axis of one): the body once, elementwise (the generic
    # lax.reduce_window below has no reverse-mode rule); x itself under logaddexp from -inf, whose body's
    # derivative at x = -inf is NaN (-inf - -inf).
    if n == 1 and body.trees in _LOGADDEXP and is_identity("maximum", inits[0]):
      return [jnp.asarray(canon(xs[0]))]
    return elementwise(region)(*inits, *xs)
  if cumulative is not None:   # an associative body (as XLA assumes): a scan, O(n log n) and differentiable
    axis, lo, hi = cumulative
    x = jnp.asarray(canon(xs[0]))
    combine = lambda a, b: elementwise(region)(a, b)[0]
    out = combine(inits[0], lax.associative_scan(combine, x, reverse=hi > 0, axis=axis))
    return [_fit_cumulative(out, inits[0], x.shape[axis], axis, lo, hi)]
  return list(lax.reduce_window(*body.operands(xs, inits), lambda a, b: region(*a, *b), *w.lax_args()))


# --------------------------------------------------------------------------- select_and_scatter

_SCATTERS = {"add": "add", "multiply": "multiply", "maximum": "max", "minimum": "min"}


@handler("stablehlo.select_and_scatter")
def select_and_scatter(ctx, operand, source, init):
  """Scatters each source value onto the element its window selects (max-pool gradients)."""
  operand, source = jnp.asarray(canon(operand)), jnp.asarray(canon(source))
  w = Window.of_attrs(ctx, operand.ndim)
  select = Body.region(ctx, 0)
  scatter = monoid_names(Body.region(ctx, 1).trees, 1)
  if scatter is None or _for_dtype(scatter[0], operand.dtype) not in _SCATTERS:
    raise StableHLOError(f"stablehlo.select_and_scatter in module {ctx.call.name!r}: only add, multiply, maximum "
                         "and minimum scatter bodies are supported")
  scatter = _for_dtype(scatter[0], operand.dtype)
  for fn, direction in ((lax.max, "GE"), (lax.min, "LE")):
    if (select.trees == [cmp(direction, arg(0), arg(1))] and scatter == "add"
        and jnp.issubdtype(operand.dtype, jnp.floating)):
      # jax's own gradient of max (min) pooling is this very op.
      ident = identity("maximum" if fn is lax.max else "minimum", operand.dtype)
      pool = lambda x: lax.reduce_window(x, ident, fn, w.dims, w.strides, w.padding)
      _, vjp = jax.vjp(pool, lax.stop_gradient(operand))
      return _combine_init("add", vjp(source)[0], init)
  return _select_and_scatter(select.fn, operand, source, init, w, scatter)


def _select_and_scatter(select, operand, source, init, w: Window, scatter: str):
  """Windows pick an element pairwise in window order (row-major = increasing flat position)."""
  size = operand.size
  positions = lax.iota(np.int32, size).reshape(operand.shape)

  def pick(a, b):
    (va, pa), (vb, pb) = a, b
    a_first = pa <= pb
    first_v, second_v = lax.select(a_first, va, vb), lax.select(a_first, vb, va)
    first_p, second_p = lax.select(a_first, pa, pb), lax.select(a_first, pb, pa)
    keep = jnp.asarray(select(first_v, second_v)[0])
    v, p = lax.select(keep, first_v, second_v), lax.select(keep, first_p, second_p)
    v = lax.select(pa < 0, vb, lax.select(pb < 0, va, v))   # padding (position -1) is never selected
    p = lax.select(pa < 0, pb, lax.select(pb < 0, pa, p))
    return v, p

  _, chosen = lax.reduce_window((lax.stop_gradient(operand), positions),
                                (np.zeros((), operand.dtype), np.int32(-1)), pick, w.dims, w.strides, w.padding)
  chosen = jnp.where(chosen < 0, size, chosen).reshape(-1)   # windows of padding only: dropped
  out = jnp.broadcast_to(jnp.asarray(canon(init), source.dtype), (size,))
  out = getattr(out.at[chosen], _SCATTERS[scatter])(source.reshape(-1), mode="drop")
  return out.reshape(operand.shape)


# --------------------------------------------------------------------------- sort

@dataclasses.dataclass(frozen=True)
class SortKey:
  operand: int
  part: str | None = None      # "real" / "imag" of a complex operand
  zero: bool = False           # -0 is made +0 before comparing
  nan: bool = False            # every NaN is made the canonical +NaN
  total: bool = False          # TOTALORDER comparison
  descending: bool = False


_ZERO, _NAN = const("0.0"), const("nan")


def _raw(tree):
  while tree[0] == "select":
    tree = tree[2][2]
  return tree


def _key_expr(tree) -> SortKey | None:
  """An operand seen through jax's canonicalising selects and real/imag; operand is the block argument."""
  name, attrs, children = tree
  if name == "arg":
    return SortKey(attrs[0])
  if name in ("real", "imag"):
    inner = _key_expr(children[0])
    return dataclasses.replace(inner, part=name) if inner is not None and inner == SortKey(inner.operand) else None
  if name == "select":
    pred, on_true, on_false = children
    inner, raw = _key_expr(on_false), _raw(on_false)
    if inner is None:
      return None
    if on_true == _ZERO and pred == cmp("EQ", raw, _ZERO) and not inner.zero:
      return dataclasses.replace(inner, zero=True)
    if on_true == _NAN and pred == cmp("NE", raw, raw) and not inner.nan:
      return dataclasses.replace(inner, nan=True)
  return None


def _strict_key(tree) -> SortKey | None:
  """`x_i < y_i` or `x_i > y_i` (either operand order) as the key of operand i."""
  name, attrs, children = tree
  if name != "compare" or attrs[0] not in ("LT", "GT"):
    return None
  lhs, rhs = (_key_expr(c) for c in children)
  if lhs is None or rhs is None or dataclasses.replace(lhs, operand=rhs.operand) != rhs:
    return None
  if {lhs.operand, rhs.operand} != {lhs.operand & ~1, lhs.operand | 1}:
    return None
  x_first = lhs.operand % 2 == 0
  return dataclasses.replace(lhs, operand=lhs.operand // 2, total=attrs[1] == "TOTALORDER",
                             descending=(attrs[0] == "GT") == x_first)


def comparator_keys(tree) -> list[SortKey] | None:
  """The lexicographic keys of `lt_0 or (eq_0 and (lt_1 or ...))`, else None."""
  key = _strict_key(tree)
  if key is not None:
    return [key]
  name, _, children = tree
  if name != "or" or len(children) != 2:
    return None
  for strict, rest in (children, children[::-1]):
    key = _strict_key(strict)
    if key is None or rest[0] != "and" or len(rest[2]) != 2:
      continue
    for eq, tail in (rest[2], rest[2][::-1]):
      if eq == node("compare", ("EQ",) + strict[1][1:], strict[2]):
        keys = comparator_keys(tail)
        if keys is not None:
          return [key] + keys
  return None


def _jax_keys(dtypes: list, count: int) -> list[SortKey]:
  """The keys of jax's own comparator (`lax.sort` of the first operands), at least `count` of them."""
  keys = []
  for i, dtype in enumerate(dtypes):
    if len(keys) >= count:
      break
    if jnp.issubdtype(dtype, jnp.complexfloating):
      keys += [SortKey(i, part, True, True, True) for part in ("real", "imag")]
    elif jnp.issubdtype(dtype, jnp.floating):
      keys.append(SortKey(i, None, True, True, True))
    else:
      keys.append(SortKey(i))
  return keys


def _key_array(x, key: SortKey):
  """Integers (or the operand) that `lax.sort` orders ascending as the key orders `x`."""
  if key.part is not None:
    x = lax.real(x) if key.part == "real" else lax.imag(x)
  if jnp.issubdtype(x.dtype, jnp.floating):
    if key.zero or not key.total:    # FLOAT comparisons see -0 == +0
      x = jnp.where(x == 0, jnp.zeros_like(x), x)
    if key.nan or not key.total:
      x = jnp.where(jnp.isnan(x), jnp.full_like(x, jnp.nan), x)
    x = _total_order_key(x)
  elif x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  return lax.bitwise_not(x) if key.descending else x


_RANK_SORT_LIMIT = 1 << 24   # comparisons an unrecognised comparator may cost


@handler("stablehlo.sort")
def sort(ctx, *operands):
  xs = [jnp.asarray(canon(x)) for x in operands]
  dim = int(ctx.attr("dimension", -1)) % xs[0].ndim
  return sort_by(ctx, Body.region(ctx), xs, dim, bool(ctx.attr("is_stable", False)))


def sort_by(ctx, comparator: Body, xs: list, dim: int, stable: bool) -> list:
  """`xs` sorted along `dim` by the comparator: `lax.sort`, with keys derived from it when it is not jax's."""
  trees = comparator.trees
  keys = comparator_keys(trees[0]) if trees is not None and len(trees) == 1 else None
  if keys is None:
    return _rank_sort(ctx, comparator, xs, dim)
  if keys == _jax_keys([x.dtype for x in xs], len(keys)):
    return list(lax.sort(xs, dimension=dim, is_stable=stable, num_keys=len({k.operand for k in keys})))
  key_arrays = [_key_array(xs[k.operand], k) for k in keys]
  out = lax.sort(key_arrays + xs, dimension=dim, is_stable=stable, num_keys=len(keys))
  return list(out[len(keys):])


def _rank_sort(ctx, comparator: Body, xs: list, dim: int) -> list:
  """Sorts by each element's count of smaller elements under the comparator: O(n^2), stable."""
  n = xs[0].shape[dim]
  if n * xs[0].size > _RANK_SORT_LIMIT:
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: its comparator ({comparator.ops()}) is not "
                         f"a lexicographic LT/GT comparison jaxport recognises, and the sort ({n} elements along "
                         f"dimension {dim} of {xs[0].shape}) is too large to rank pairwise. Please report it.")
  less = elementwise(comparator.fn)
  moved = [jnp.moveaxis(x, dim, -1) for x in xs]
  pairs = []
  for x in moved:
    pairs += [x[..., :, None], x[..., None, :]]    # less(x_j, x_i) at [..., j, i]
  smaller = jnp.sum(less(*pairs)[0].astype(np.int32), axis=-2)
  rank = jnp.moveaxis(smaller, -1, dim)
  return list(lax.sort([rank] + xs, dimension=dim, is_stable=True, num_keys=1)[1:])


@handler("chlo.top_k")
def top_k(ctx, x):
  return list(lax.top_k(jnp.asarray(canon(x)), int(ctx.attr("k"))))


@target("stablehlo.dynamic_top_k")
def dynamic_top_k(ctx, x, k):
  return list(lax.top_k(jnp.asarray(canon(x)), static_shape(ctx, k, "k")[0]))


@target("ApproxTopK")
def approx_top_k(ctx, *args):
  """lax.approx_max_k/approx_min_k as CPU and GPU run them: an exact top k by the comparator."""
  n = len(args) // 2
  config = ctx.attrs.get("mhlo.backend_config", {})
  dim, k = int(config.get("reduction_dim", -1)), int(config["top_k"])
  xs = [jnp.asarray(canon(x)) for x in args[:n]]
  dim %= xs[0].ndim
  size = ctx.result_types[0].shape[dim]   # top_k, unless aggregate_to_topk is off
  out = sort_by(ctx, Body.called(ctx), xs, dim, stable=True)
  return [lax.slice_in_dim(o, 0, k if size is None else size, axis=dim) for o in out]
