"""Differential fuzz of the StableHLO interpreter against JAX itself (jaxport issue 19).

Hypothesis draws a program signature (a JAX function, its shapes, dtypes and attributes) from a
family's kinds in `hlo_fuzz_programs` / `hlo_fuzz_structured`; the function is exported once with
`jax.export`, loaded, and interpreted with many value sets (edge values in half of them). A case is
one value set, compared with the original function (under `jax.jit`) five ways:
  value: the interpreted module, eager (NumPy inputs: the handlers' constant paths);
  jit:   the same under `jax.jit`;
  grad:  reverse mode of a fixed random weighting of the float outputs, w.r.t. the float inputs;
  jvp:   forward mode with random tangents;   vmap: all value sets at once, batched by `jax.vmap`.
Every transform is compiled once per signature. A derivative that is not finite where JAX's is
fails; one that is finite where JAX's is not (JAX's "double where") passes and is counted. Known
differences are listed in `DOCUMENTED_DIFFERENCES`, and only those cases are excused.
`JAXPORT_FUZZ_SCALE` scales the number of signatures (default 1, the CI run).
"""
from __future__ import annotations

import collections
import dataclasses
import os

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hlo_fuzz_programs as hp
import hlo_fuzz_structured as hs
from jaxport.convert import stablehlo
from jaxport.convert.stablehlo.interpreter import handled_ops

pytestmark = pytest.mark.slow

SCALE = float(os.environ.get("JAXPORT_FUZZ_SCALE", "1"))
VALUES = 40      # value sets per signature
EAGER_LIMIT = 3  # value sets run eagerly for a module with a loop, a branch or over 80 ops (each eager call
                 # traces it anew: ~0.5 s); the others run eagerly with every value set
_REGION_OPS = {"stablehlo.while", "stablehlo.case", "stablehlo.if"}
TRANSFORMS = ("value", "jit", "grad", "jvp", "vmap")

# family -> transform -> cases (and "documented"); family -> op names its modules used
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
REACHED: dict[str, set] = collections.defaultdict(set)


class Mismatch(AssertionError):
  pass


# --------------------------------------------------------------------------- documented differences

# (programs, transforms, condition, reason); `pred(program, transform, inputs)` is the condition.
DOCUMENTED_DIFFERENCES: list[tuple[str, str, str, str]] = []
_PREDICATES: list = []


def difference(programs: str, transforms: str, condition: str, reason: str):
  """Declares a documented difference of the programs whose names start with one of `programs`
  (space-separated) under `transforms`; the decorated predicate excuses only the cases it accepts."""
  def decorator(pred):
    DOCUMENTED_DIFFERENCES.append((programs, transforms, condition, reason))
    _PREDICATES.append((tuple(programs.split()), tuple(transforms.split()), pred))
    return pred
  return decorator


def documented(prog, transform: str, inputs) -> bool:
  return any(prog.name.startswith(names) and transform in transforms and pred(prog, transform, inputs)
             for names, transforms, pred in _PREDICATES)


def _float_inputs(inputs):
  return [np.asarray(x).astype(np.complex128 if np.asarray(x).dtype.kind == "c" else np.float64)
          for x in inputs if np.asarray(x).dtype.kind in "fcV"]


def _non_finite(inputs) -> bool:
  return any((~np.isfinite(x)).any() for x in _float_inputs(inputs))


@difference("special:igamma", "grad", "always (a limitation: reverse mode raises a clear error)",
            "jax.export writes igamma's series as a stablehlo.while whose trip count depends on x and whose "
            "condition has no bound (only 'any element not converged'), so it can run neither as a scan nor as "
            "a bounded masked loop; lax.while_loop, which JAX cannot reverse-differentiate, raises. JAX "
            "differentiates igamma by its own rule, which the module does not hold; jvp works and is compared")
def _igamma_while(prog, transform, inputs):
  return True


@difference("top_k:approx", "value jit vmap grad jvp", "ties or NaN in the input",
            "XLA:CPU runs ApproxTopK as an unstable sort by its comparator (a > b): tied values come in an "
            "order of its choosing and NaN, unordered by it, lands anywhere; the interpreter sorts stably with "
            "NaN ordered (both are valid answers of an approximate top k)")
def _approx_top_k_ties(prog, transform, inputs):
  x = np.asarray(inputs[0])
  return bool(np.isnan(x).any()) or any(len(np.unique(row)) < len(row) for row in x.reshape(-1, x.shape[-1]))


@difference("select_and_scatter:", "grad jvp", "the pooled operand holds NaN, ±inf or a repeated value",
            "where a window's max (min) is tied, NaN, or -inf like the window's init, the pool is not "
            "differentiable there and the derivative w.r.t. the scattered source (second order of the pool) "
            "may pick another of the tied elements than JAX's select_and_scatter_add transpose (which pairs "
            "values with tangents in its own order); values, jit and vmap agree, and so do derivatives without ties")
def _pool_ties(prog, transform, inputs):
  x = np.asarray(inputs[0])
  return bool((~np.isfinite(x)).any()) or len(np.unique(x)) < x.size


def _extreme(inputs, big=1e30) -> bool:
  """Some float input is NaN, ±inf or of magnitude >= `big`."""
  return any((~np.isfinite(x) | (np.abs(x) >= big)).any() for x in _float_inputs(inputs))


def _index_out_of_range(inputs) -> bool:
  """Input 1 (the indices into input 0's first axis) holds one outside [-n, n)."""
  n, idx = np.shape(inputs[0])[0], np.asarray(inputs[1])
  return bool(((idx < -n) | (idx >= n)).any())


@difference("complex: attention: conv: dot_general: linalg: fft: special: softmax: cumulative:", "grad jvp vmap",
            "a float input is NaN, ±inf or |x| >= 1e30",
            "the module computes some of JAX's primitives as other ops (integer_pow as multiplies, complex "
            "log/sqrt with scaling selects, a batched conv or product as another contraction under vmap), so "
            "overflow and inf - inf take another route: inf vs NaN, or a different huge value")
def _extreme_inputs(prog, transform, inputs):
  return _extreme(inputs)


@difference("complex:", "grad jvp", "a real or imaginary part is exactly ±0",
            "jax.export writes complex exp (and sin, cos, tanh, expm1, ...) with selects that return a "
            "constant 0 part where a part of the input is 0 (so 0 * inf stays out): the module's derivative "
            "w.r.t. that part at exactly 0 is the constant's, 0, where JAX's rule for the primitive gives "
            "exp(z)'s (sin(z)'s, ...)")
def _complex_axes(prog, transform, inputs):
  return any((np.asarray(x) == 0).any() for x in inputs)


@difference("special:log_sigmoid special:softplus special:mish special:i0e special:i1e special:logistic "
            "special:relu special:elu special:selu special:silu",
            "grad jvp", "an input is exactly ±0, or NaN",
            "JAX differentiates these with custom_jvp rules (logaddexp's, i0e's, i1e's), which the exported "
            "module does not carry: at x = 0 the module's ops have a tie (max(x, 0)) or a kink (|x|), whose "
            "derivative JAX's primitives define one-sided; at NaN JAX's rule selects a finite value")
def _custom_jvp_ties(prog, transform, inputs):
  return any(((x == 0) | np.isnan(x)).any() for x in _float_inputs(inputs))


@difference("gather:multi gather:slices", "grad", "an index is out of range",
            "x[i] with an out-of-range i (jnp's default mode, promise_in_bounds) lowers to a bare gather, "
            "which clamps; JAX's gradient drops the cotangent (its transposed scatter drops out-of-range "
            "updates), the interpreter's clamps it (a StableHLO gather carries no mode: it uses CLIP, the "
            "gradient of jnp.take(mode='clip'))")
def _gather_promise(prog, transform, inputs):
  return _index_out_of_range(inputs)


@difference("scatter:max scatter:min", "grad jvp", "mode='clip' with an out-of-range index",
            "JAX's derivative rule of scatter max/min uses the unclamped indices, giving inf (or a cotangent "
            "to the operand element the update replaced); the interpreter differentiates the clamped scatter")
def _scatter_extremal_clip(prog, transform, inputs):
  return "clip" in prog.name and _index_out_of_range(inputs)


# --------------------------------------------------------------------------- comparison

def _leaves(out):
  return [np.asarray(o) for o in jax.tree.leaves(out)]


def _is_float(x) -> bool:
  return jnp.issubdtype(np.asarray(x).dtype, jnp.inexact)


def _close(a, e, rtol, atol, finite_ok=False):
  """Where `a` (interpreted) and `e` (JAX) disagree: both NaN, the same inf or close values agree;
  with `finite_ok`, a finite `a` where `e` is not counts as agreeing (reported apart)."""
  if a.dtype.kind == "c":
    return _close(a.real, e.real, rtol, atol, finite_ok) | _close(a.imag, e.imag, rtol, atol, finite_ok)
  a, e = a.astype(np.float64), e.astype(np.float64)
  with np.errstate(all="ignore"):
    scale = np.max(np.abs(e[np.isfinite(e)]), initial=0.0)
    ok = (np.isnan(a) & np.isnan(e)) | (a == e) | (np.abs(a - e) <= atol * max(scale, 1.0) + rtol * np.abs(e))
  if finite_ok:   # derivatives: finite where JAX's is not (JAX's "double where"), or both non-finite
    ok |= ~np.isfinite(e)
  return ~ok


def compare(got, want, rtol, atol, finite_ok=False) -> str | None:
  got, want = _leaves(got), _leaves(want)
  if len(got) != len(want):
    return f"{len(got)} outputs, JAX has {len(want)}"
  for k, (a, e) in enumerate(zip(got, want)):
    if jax.dtypes.canonicalize_dtype(a.dtype) != jax.dtypes.canonicalize_dtype(e.dtype) or a.shape != e.shape:
      return f"output {k}: {a.dtype}{list(a.shape)}, JAX {e.dtype}{list(e.shape)}"
    if a.size == 0:
      continue
    if not _is_float(e):
      if not np.array_equal(a, e):
        return f"output {k}: values differ\n  ours {a.ravel()[:10]}\n  JAX  {e.ravel()[:10]}"
      continue
    bad = _close(a, e, rtol, atol, finite_ok)
    if bad.any():
      return (f"output {k} ({a.dtype}): {int(bad.sum())} of {a.size} values differ\n"
              f"  ours {a[bad].ravel()[:8]}\n  JAX  {e[bad].ravel()[:8]}")
  return None


def _finite_where_jax_is_not(got, want) -> bool:
  return any((np.isfinite(a) & ~np.isfinite(e)).any() for a, e in zip(_leaves(got), _leaves(want)) if _is_float(e))


# --------------------------------------------------------------------------- running one signature

def _module_ops(module) -> set[str]:
  names = set(module.op_names())
  def walk(block):
    for op in block.ops:
      if op.name == "stablehlo.custom_call":
        names.add("@" + str(op.attrs.get("call_target_name")))
      for region in op.regions:
        walk(region)
  for fn in module.functions.values():
    walk(fn.block)
  return names


def _op_count(module) -> int:
  def count(block):
    return sum(1 + sum(count(r) for r in op.regions) for op in block.ops)
  return sum(count(fn.block) for fn in module.functions.values())


def _export(prog):
  specs = prog.specs or [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in prog.args]
  exp = jax.export.export(jax.jit(prog.fn, keep_unused=True), platforms=[prog.platform])(*specs)
  return stablehlo.load_module(exp.mlir_module_serialized)


@dataclasses.dataclass
class Signature:
  """One exported program and its transforms, each compiled once, interpreted and original."""
  prog: hp.Program
  module: object
  floats: list        # indices of the float inputs
  weights: list       # per output: fixed random weights of the loss, None for non-float outputs

  def interpreted(self, *args):
    return tuple(stablehlo.call_module(self.module, list(args)))

  def original(self, *args):
    return tuple(jax.tree.leaves((self.prog.reference or self.prog.fn)(*args)))

  def loss(self, fn):
    def scalar(*args):
      total = jnp.zeros((), jnp.float32)
      for out, w in zip(fn(*args), self.weights):
        if w is not None:
          total = total + jnp.sum(jnp.real(jnp.asarray(out).astype(w.dtype) * w)).astype(jnp.float32)
      return total
    return scalar

  def _with(self, args, floats):
    args = list(args)
    for i, v in zip(self.floats, floats):
      args[i] = v
    return args

  def grad(self, fn):
    loss = self.loss(fn)
    return jax.jit(lambda *args: jax.grad(lambda fs: loss(*self._with(args, fs)))([args[i] for i in self.floats]))

  def jvp(self, fn):
    def tangent_out(args, tangents):
      f = lambda *fs: tuple(o for o, w in zip(fn(*self._with(args, fs)), self.weights) if w is not None)
      return jax.jvp(f, tuple(args[i] for i in self.floats), tuple(tangents))[1]
    return jax.jit(tangent_out)


def _weights(rs, outs):
  out = []
  for o in outs:
    o = np.asarray(o)
    if not _is_float(o):
      out.append(None)
      continue
    dtype = np.complex64 if o.dtype.kind == "c" else np.float32
    w = rs.normal(size=o.shape) + (1j * rs.normal(size=o.shape) if o.dtype.kind == "c" else 0)
    out.append(np.asarray(w, dtype))
  return out


def run_signature(family: str, prog: hp.Program, rs: np.random.RandomState, values: int) -> int:
  """Runs `prog` with `values` value sets through every transform; returns the cases run."""
  module = _export(prog)
  REACHED[family] |= _module_ops(module)
  counts = COUNTS[family]
  sets = [list(prog.args)]
  draw = prog.draw or (lambda rs, edges: hp.redraw_floats(prog.args, rs, edges))
  for _ in range(values - 1):
    sets.append([np.asarray(a) for a in draw(rs, bool(prog.edges and rs.rand() < 0.5))])
  jit_ref = jax.jit(lambda *a: tuple(jax.tree.leaves((prog.reference or prog.fn)(*a))))
  wants = [jit_ref(*args) for args in sets]
  sig = Signature(prog, module, [i for i, a in enumerate(prog.args) if _is_float(a)], _weights(rs, wants[0]))
  differentiable = prog.grad and sig.floats and any(w is not None for w in sig.weights)

  def check(transform, args, got, want, rtol, atol, finite_ok=False):
    if got is None:   # raised, as documented
      return
    problem = compare(got, want, rtol, atol, finite_ok)
    if problem is None:
      counts[transform] += 1
      if finite_ok and _finite_where_jax_is_not(got, want):
        counts["derivative_finite_where_jax_is_not"] += 1
      return
    if documented(prog, transform, args):
      counts["documented"] += 1
      return
    lines = "\n".join(f"  input {i}: {np.asarray(a).dtype}{list(np.shape(a))} {np.asarray(a).ravel()[:10]}"
                      for i, a in enumerate(args))
    raise Mismatch(f"[{family}] {prog.name} [{transform}]: {problem}\n{lines}")

  def attempt(transform, args, fn):
    try:
      return fn()
    except Mismatch:
      raise
    except Exception as e:   # noqa: BLE001 - the interpreter raised where JAX did not
      if documented(prog, transform, args):
        counts["documented"] += 1
        return None
      raise Mismatch(f"[{family}] {prog.name} [{transform}] raised {type(e).__name__}: {e}\n  inputs "
                     f"{[(np.asarray(a).dtype.name, np.shape(a)) for a in args]}") from e

  jit_interp = jax.jit(sig.interpreted)
  eager = len(sets) if _op_count(module) <= 80 and not (_REGION_OPS & _module_ops(module)) \
      else EAGER_LIMIT
  for k, (args, want) in enumerate(zip(sets, wants)):
    if k < eager:
      check("value", args, attempt("value", args, lambda: sig.interpreted(*args)), want, prog.rtol, prog.atol)
    check("jit", args, attempt("jit", args, lambda: jit_interp(*args)), want, prog.rtol, prog.atol)
  if differentiable:
    grad_ours, grad_ref = sig.grad(sig.interpreted), sig.grad(sig.original)
    jvp_ours, jvp_ref = sig.jvp(sig.interpreted), sig.jvp(sig.original)
    for args in sets:
      tangents = [rs.normal(size=np.shape(args[i])).astype(np.asarray(args[i]).dtype) for i in sig.floats]
      try:
        want_grad, want_jvp = grad_ref(*args), jvp_ref(args, tangents)
      except (NotImplementedError, TypeError, ValueError):   # JAX cannot differentiate it (nextafter, ...)
        counts["jax_cannot_differentiate"] += 1
        break
      check("grad", args, attempt("grad", args, lambda: grad_ours(*args)), want_grad, prog.grad_rtol,
            prog.grad_atol, finite_ok=True)
      check("jvp", args, attempt("jvp", args, lambda: jvp_ours(args, tangents)), want_jvp, prog.grad_rtol,
            prog.grad_atol, finite_ok=True)
  if prog.vmap:
    stacked = [np.stack([np.asarray(s[i]) for s in sets]) for i in range(len(prog.args))]
    outs = attempt("vmap", stacked, lambda: jax.jit(jax.vmap(sig.interpreted))(*stacked))
    outs = [None] * len(prog.args) if outs is None else outs
    if prog.vmap_ref:
      wants = list(zip(*[np.asarray(o) for o in jax.jit(jax.vmap(sig.original))(*stacked)]))
    for k, (args, want) in enumerate(zip(sets, wants)):
      check("vmap", args, None if outs[0] is None else [np.asarray(o)[k] for o in outs], want, prog.rtol, prog.atol)
  counts["cases"] += len(sets)
  counts["signatures"] += 1
  return len(sets)


# --------------------------------------------------------------------------- the tests

# family -> (program kinds, hypothesis examples (signatures), cases at least)
FAMILIES = {
    "elementwise": (hp.ELEMENTWISE, 75, 2900),
    "special": (hp.SPECIAL, 46, 1800),
    "reduce": (hp.REDUCE, 42, 1600),
    "index": (hp.INDEX, 35, 1350),
    "shape": (hs.SHAPE, 35, 1350),
    "contraction": (hs.CONTRACTION, 25, 950),
    "control": (hs.CONTROL, 17, 650),
    "linalg": (hs.LINALG, 27, 1000),
    "random": (hs.RANDOM, 10, 380),
}
_SALT = {name: i for i, name in enumerate(FAMILIES)}


def run_family(family: str, scale: float = SCALE, on_failure=None) -> int:
  """Runs the family's signatures (kinds in turn, each drawn from a hypothesis seed); returns its cases.
  `on_failure(exc)`, when given, takes each mismatch instead of it failing the run."""
  kinds, examples, _ = FAMILIES[family]
  assert examples >= len(kinds), f"{family}: {examples} signatures cannot draw its {len(kinds)} kinds"
  ran = []

  # No shrinking: the seed is not a meaningful size; the failure message shows the case.
  @hypothesis.settings(max_examples=max(1, int(examples * scale)), derandomize=True, database=None, deadline=None,
                       phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(seed=st.integers(0, 2**32 - 1))
  def run(seed):
    rs = np.random.RandomState((seed + 7919 * _SALT[family]) % 2**32)
    prog = kinds[len(ran) % len(kinds)](rs)
    try:
      ran.append(run_signature(family, prog, rs, prog.values or VALUES))
    except Mismatch as e:
      if on_failure is None:
        raise
      ran.append(0)
      on_failure(e)

  run()
  return sum(ran)


def table(families=None) -> str:
  """family × transform × cases, as the closing note of issue 19 reports it."""
  rows = [f"{'family':<12} {'signatures':>10} {'cases':>6} " + " ".join(f"{t:>6}" for t in TRANSFORMS) +
          f" {'documented':>10} {'finite derivative, JAX not':>26}"]
  total = collections.Counter()
  for family in families or FAMILIES:
    c = COUNTS[family]
    total.update(c)
    rows.append(f"{family:<12} {c['signatures']:>10} {c['cases']:>6} " + " ".join(f"{c[t]:>6}" for t in TRANSFORMS) +
                f" {c['documented']:>10} {c['derivative_finite_where_jax_is_not']:>26}")
  if len(rows) > 2:
    rows.append(f"{'total':<12} {total['signatures']:>10} {total['cases']:>6} " +
                " ".join(f"{total[t]:>6}" for t in TRANSFORMS) +
                f" {total['documented']:>10} {total['derivative_finite_where_jax_is_not']:>26}")
  return "\n".join(rows)


def test_total_case_count():
  # Issue 19 asks for at least 10,000 cases; each family asserts it ran its share.
  assert sum(n for _, _, n in FAMILIES.values()) >= 10_000


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fuzz(family):
  cases = run_family(family)
  print(f"\n{table([family])}\nops reached: {len(REACHED[family])}")
  assert cases >= FAMILIES[family][2] * min(SCALE, 1.0)
  missing = FAMILY_OPS[family] - REACHED[family]
  assert not missing, f"{family} no longer reaches {sorted(missing)}"


def _names(text: str, prefix: str = "stablehlo.") -> set[str]:
  return {name if name.startswith(("@", "sdy.", "func.")) else prefix + name for name in text.split()}


# The handlers (and CPU custom_call targets) each family must reach; together with UNREACHABLE and
# ELSEWHERE they are every handled op.
FAMILY_OPS = {
    "elementwise": _names("abs add and atan2 bitcast_convert cbrt ceil clamp compare constant convert cosine "
                          "count_leading_zeros divide exponential exponential_minus_one floor is_finite log "
                          "log_plus_one maximum minimum multiply negate not or popcnt power reduce_precision remainder "
                          "round_nearest_afz round_nearest_even rsqrt select shift_left shift_right_arithmetic "
                          "shift_right_logical sign sine sqrt subtract tan tanh xor complex real imag"),
    "special": _names("composite while log_plus_one exponential_minus_one is_finite"),
    "reduce": _names("reduce reduce_window select_and_scatter sort @ApproxTopK"),
    "index": _names("dynamic_slice dynamic_update_slice gather scatter"),
    "shape": _names("broadcast_in_dim concatenate dynamic_broadcast_in_dim dynamic_gather dynamic_iota dynamic_pad "
                    "dynamic_reshape get_dimension_size iota pad real_dynamic_slice reshape reverse slice transpose "
                    "custom_call @shape_assertion @stablehlo.dynamic_reduce_window @stablehlo.dynamic_top_k"),
    "contraction": _names("convolution dot_general fft"),
    "control": _names("func.call sdy.sharding_constraint all_gather all_reduce case collective_permute "
                      "optimization_barrier partition_id reduce_scatter while"),
    "linalg": _names("cholesky triangular_solve @Eigh @LuDecomposition @ProductOfElementaryHouseholderReflectors @Qr "
                     "@cu_lu_pivots_to_permutation @cusolver_geqrf_ffi @cusolver_gesvdj_ffi @cusolver_getrf_ffi "
                     "@cusolver_orgqr_ffi @cusolver_potrf_ffi @cusolver_syevd_ffi @lapack_sgees_ffi @lapack_sgeev_ffi "
                     "@lapack_sgehrd_ffi @lapack_sgeqrf_ffi @lapack_sgesdd_ffi @lapack_sgetrf_ffi @lapack_sgtsv_ffi "
                     "@lapack_sorgqr_ffi @lapack_spotrf_ffi @lapack_ssyevd_ffi @lapack_strsm_ffi"),
    "random": _names("rng_bit_generator @stablehlo.dynamic_rng_bit_generator"),
}

_CHLO = ("jax.export writes StableHLO only: jax lowers CHLO into it before serialising (erf_inv, lgamma, digamma, "
         "... as polynomial code with selects; erf, sinh, top_k, ... as stablehlo.composite around that code); "
         "TF's XLA bridge and other producers emit CHLO")
# Handled ops no jax.export module of one device holds, and why.
UNREACHABLE = {
    **{name: _CHLO for name in handled_ops() if name.startswith("chlo.")},
    "stablehlo.after_all": "tokens: jax emits them only for ordered effects (callbacks), which it cannot export",
    "stablehlo.create_token": "tokens: jax emits them only for ordered effects (callbacks), which it cannot export",
    "stablehlo.all_to_all": "on a one-device mesh jax lowers lax.all_to_all to nothing (its identity)",
    "stablehlo.collective_broadcast": "no jax primitive lowers to it on CPU (lax.pbroadcast has no CPU lowering)",
    "stablehlo.replica_id": "only pmap's axis_index emits it, and pmap functions cannot be exported",
    "sdy.reshard": "jax.sharding.reshard on one device exports as sdy.sharding_constraint",
    "stablehlo.batch_norm_training": "jax's batch norms are arithmetic; TF's XLA bridge emits this op",
    "stablehlo.batch_norm_inference": "jax's batch norms are arithmetic; TF's XLA bridge emits this op",
    "stablehlo.batch_norm_grad": "jax's batch norms are arithmetic; TF's XLA bridge emits this op",
    "stablehlo.broadcast": "jax emits broadcast_in_dim",
    "stablehlo.dot": "jax emits dot_general",
    "stablehlo.einsum": "deprecated; no current producer emits it",
    "stablehlo.unary_einsum": "deprecated; no current producer emits it",
    "stablehlo.call": "jax emits func.call",
    "stablehlo.if": "jax lowers lax.cond, boolean predicate included, to stablehlo.case",
    "stablehlo.logistic": "jax lowers lax.logistic to exponential and divide",
    "stablehlo.map": "jax never emits it (lax.map is a loop)",
    "stablehlo.set_dimension_size": "XLA's dynamic-padding op; jax emits none",
    "stablehlo.torch_index_select": "a Torch-MLIR op; jax emits gather",
    "stablehlo.tuple": "jax's modules take and return flat values (TF's XLA modules hold tuples)",
    "stablehlo.get_tuple_element": "jax's modules take and return flat values (TF's XLA modules hold tuples)",
}
# Reached, but by a test of its own below (its values cannot be compared with JAX's).
ELSEWHERE = {"stablehlo.rng": "test_keyless_rng_draws_in_range"}


def test_every_handler_is_fuzzed_or_documented():
  fuzzed = set().union(*FAMILY_OPS.values())
  missing = handled_ops() - fuzzed - set(UNREACHABLE) - set(ELSEWHERE)
  assert not missing, f"handlers neither fuzzed nor documented as unreachable: {sorted(missing)}"
  stale = {n for n in fuzzed | set(UNREACHABLE) | set(ELSEWHERE) if not n.startswith("@")} - handled_ops()
  assert not stale, f"no handler for {sorted(stale)}"


def test_keyless_rng_draws_in_range():
  # stablehlo.rng (lax.rng_uniform): XLA seeds it from hidden state, so only its range and its
  # transforms are compared; the interpreter draws from the call's key.
  f = lambda x: lax.rng_uniform(np.float32(-1), np.float32(2), (3, 4)) * x
  x = np.float32(2.0)
  module = stablehlo.load_module(jax.export.export(jax.jit(f), platforms=["cpu"])(x).mlir_module_serialized)
  assert "stablehlo.rng" in module.op_names()
  g = lambda x, key: stablehlo.call_module(module, [x], rng=key)[0]
  keys = jax.random.split(jax.random.key(0), 5)
  for out in (g(x, keys[0]), jax.jit(g)(x, keys[1]), jax.vmap(g, (None, 0))(x, keys)):
    out = np.asarray(out)
    assert out.shape[-2:] == (3, 4) and ((out >= -2) & (out < 4)).all() and np.unique(out).size > 1
  np.testing.assert_allclose(jax.grad(lambda x: g(x, keys[0]).sum())(x), np.asarray(g(x, keys[0])).sum() / 2,
                             rtol=1e-5)
