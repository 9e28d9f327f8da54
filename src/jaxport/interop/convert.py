"""One call per target framework: describe the source buffer, decide share or copy, produce.

Every conversion, whatever the pair, runs `_leaf`: the source adapter describes the array
(`Buffer`), `decide` plans from the buffer and the target's capabilities, and `_execute` carries
the plan out with the adapters' primitives.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, NamedTuple

import jax
import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._cupy import CUPY
from jaxport.errors import InteropInputError, ShardedArrayError
from jaxport.interop._foreign import FOREIGN, is_foreign
from jaxport.interop._jax import JAX, dl_device
from jaxport.interop._numpy import NUMPY
from jaxport.interop._plan import Plan, Reason, Request, decide
from jaxport.interop._tf import TF
from jaxport.interop._torch import TORCH

Shards = Literal["split", "single"]
_SCALAR_REASON = (Reason("no-buffer", "a Python or NumPy scalar has no buffer to share; it is "
                                      "copied into a new array"),)
_PYTHON_SCALARS = (bool, int, float, complex)


class Shard(NamedTuple):
  """One device's part of a multi-device jax.Array: `data[...]` is `array[index]`."""
  index: tuple[slice, ...]
  device: str
  data: Any


_DEFAULT_DEVICE: dict[tuple, Request] = {}


def _request(target: _base.Framework, device: Any, copy: bool | None, writable: bool) -> Request:
  if device is None:
    key = (target, copy, writable)
    req = _DEFAULT_DEVICE.get(key)
    if req is None:
      req = _DEFAULT_DEVICE[key] = Request(target, None, None, False, copy, writable)
    return req
  location, native = target.resolve_device(device)
  return Request(target, location, native, location is None, copy, writable)


def _source(x: Any) -> tuple[_base.Framework, Any, tuple[Reason, ...]]:
  """The adapter for `x`, `x` itself (scalars become arrays), and reasons already incurred."""
  if isinstance(x, np.generic) or type(x) in _PYTHON_SCALARS:
    return NUMPY, np.asarray(x), _SCALAR_REASON
  framework = _base.owner(x)
  if framework is not None:
    return framework, framework.unwrap(x), ()
  if is_foreign(x):
    return FOREIGN, x, ()
  raise InteropInputError(f"jaxport.interop cannot convert a {type(x).__module__}."
                          f"{type(x).__name__}: not an array of NumPy, JAX, PyTorch, TensorFlow "
                          "or CuPy, nor a DLPack producer or capsule; convert it to one (e.g. "
                          "np.asarray) first.")


def _single_shard(x: jax.Array, req: Request) -> jax.Array:
  if not x.is_fully_replicated:
    raise ShardedArrayError(
        f"This jax.Array is split across {len(x.sharding.device_set)} devices "
        f"({x.sharding}), but one {req.target.label} array was asked for (shards='single'). "
        "Pass shards='split' for a list of per-device Shards, or gather it first, e.g. "
        "jax.device_put(x, jax.devices()[0]) (a copy).")
  shards = x.addressable_shards
  wanted = [s for s in shards if dl_device(s.device) == req.device]
  return (wanted or shards)[0].data


def _leaf(x: Any, req: Request, shards: Shards, explaining: bool) -> Any:
  """One leaf converted (or its plan, when explaining); multi-device jax.Arrays shard by shard."""
  framework, x, earlier = _source(x)
  if framework is JAX and req.target is not JAX and JAX.multi_device(x):
    if shards == "split":
      return [Shard(s.index, f"{s.device.platform}:{s.device.id}",
                    _leaf(s.data, req, shards, explaining)) for s in x.addressable_shards]
    x = _single_shard(x, req)
  if explaining:
    return _plan(x, framework, earlier, req, explaining=True)[2]
  key = None
  if not earlier and req.copy is not False and not req.target.needs_exact:
    key = framework.plan_key(x)
    if key is not None:
      key = _repeat_key(framework, key, req)
      run = _REPEATS.get(key)
      if run is not None:
        return run(x)
  x, buf, plan = _plan(x, framework, earlier, req)
  if key is not None and not plan.source_steps:
    if len(_REPEATS) >= 1024:
      _REPEATS.clear()
    _REPEATS[key] = _runner(buf._replace(shape=None), plan, req)  # plans never read the shape
  return _execute(x, buf, plan, req)


# Arrays whose adapter summarises them with a plan key (see Framework.plan_key) are described and
# planned once per (summary, request), into a function that carries the plan out.
_REPEATS: dict[tuple, Callable[[Any], Any]] = {}


def _repeat_key(framework: _base.Framework, plan_key: Any, req: Request) -> tuple:
  """The `_REPEATS` key of arrays that `framework` summarises as `plan_key`, converted by `req`."""
  return framework, plan_key, req, req.target.cache_token


def _runner(buf: _base.Buffer, plan: Plan, req: Request) -> Callable[[Any], Any]:
  """`_execute` of `plan` for any array described like `buf`; a plain DLPack share, the common
  case, runs without the pipeline's tests for the steps it does not have."""
  src, dst = buf.framework, req.target
  if (plan.identity or plan.source_steps or plan.post_steps or plan.via_host
      or plan.check_range is not None or plan.wire != plan.send
      or (not dst.takes_stream and buf.device[0] != _dlpack.CPU)):
    return lambda x: _execute(x, buf, plan, req)
  export = src.exporter(buf, plan.send, dst.immutable)
  # No transfer: that is a post step.
  import_ = dst.importer(plan.import_device, req.native, False if req.copy is False else None)
  return lambda x: import_(export(x))


def _plan(x: Any, framework: _base.Framework, earlier: tuple[Reason, ...], req: Request,
          explaining: bool = False) -> tuple[Any, _base.Buffer, Plan]:
  buf = framework.describe(x, explaining or req.target.needs_exact or req.copy is False)
  if earlier:
    buf = buf._replace(owned=True)
  if framework is FOREIGN and buf.device[0] == _dlpack.CPU:
    # Host memory of another library: adopted as a NumPy view (zero-copy), converted as that.
    if explaining:  # without consuming a capsule: the view would have these properties
      buf = buf._replace(framework=NUMPY)
    else:
      x = _execute(x, buf, decide(buf, _HOST_VIEW), _HOST_VIEW)
      buf = NUMPY.describe(x)._replace(owned=buf.owned)
  placed = framework is not req.target or framework.placed(x, buf, req.native)
  plan = decide(buf, req, placed, earlier)
  if framework is FOREIGN:
    plan = dataclasses.replace(plan, source=FOREIGN.label)
  return x, buf, plan


def _execute(x: Any, buf: _base.Buffer, plan: Plan, req: Request) -> Any:
  src, dst = buf.framework, req.target
  if plan.identity:
    if plan.transfer:
      x = dst.transfer(x, req.native)
    return dst.copy(x) if plan.final_copy else x
  if plan.source_steps:
    if plan.detach:
      x = src.detach(x)
    if plan.resolve:
      x = src.resolve(x)
    if plan.host:
      x = src.to_host(x)
    elif plan.compact:
      x = src.compact(x)
    copied = plan.resolve or plan.host or plan.compact or buf.owned
    framework, x, _ = _source(x)
    again = framework.describe(x, dst.needs_exact)._replace(owned=copied)
    return _execute(x, again, decide(again, req, True, plan.reasons), req)

  if plan.narrow is not None and buf.device[0] == _dlpack.CPU:
    # The narrowing copy is unavoidable: check and make it once with NumPy on a host view,
    # then import that new array like any other.
    host = _leaf(x, _HOST_VIEW, "split", False)
    if plan.check_range is not None and host.size:
      _dtypes.check_fits(buf.dtype, plan.check_range, int(host.min()), int(host.max()))
    framework, x, _ = _source(host.astype(plan.narrow))
    again = framework.describe(x, dst.needs_exact)._replace(owned=True)
    return _execute(x, again, decide(again, req, True, plan.reasons), req)
  if plan.check_range is not None:
    _dtypes.check_fits(buf.dtype, plan.check_range, *src.value_range(x))
  if plan.via_host:
    host = _HOST_VIEW if buf.device[0] == _dlpack.CPU else _HOST_COPY
    native = req.native if req.native is not None else \
        dst.resolve_device(_dlpack.device_name(buf.device))[1]  # stay on the source's device
    y = dst.from_host(_leaf(x, host, "split", False), native)
  else:
    producer = src.producer(x, buf, plan.send, dst.immutable)
    if plan.wire != plan.send:
      producer = _dlpack.Retagged(producer, plan.wire)
    if not dst.takes_stream and buf.device[0] != _dlpack.CPU:
      src.synchronize(x)
    y = dst.import_(producer, plan.import_device, None if plan.transfer else req.native,
                    False if req.copy is False else None)
    if not plan.post_steps:
      return y
    if plan.wire != plan.dtype:
      y = dst.view(y, plan.dtype)
  if plan.narrow is not None:
    y = dst.narrow(y, plan.narrow)
  if plan.transfer:
    y = dst.transfer(y, req.native)
  if plan.final_copy:
    y = dst.copy(y)
  if plan.mark_read_only:
    y = dst.mark_read_only(y)
  return y


_HOST_VIEW = Request(NUMPY, None, None, False, None, False)
_HOST_COPY = Request(NUMPY, _dlpack.HOST, "cpu", False, None, False)


def _convert_tree(tree: Any, target: _base.Framework, device: Any, copy: bool | None,
                  writable: bool, shards: Shards) -> Any:
  if shards not in ("split", "single"):
    raise ValueError(f"shards must be 'split' or 'single', not {shards!r}.")
  req = _request(target, device, copy, writable)
  if _base.owner(tree) is not None:  # a single array: skip the pytree machinery
    return _leaf(tree, req, shards, False)
  return jax.tree_util.tree_map(lambda leaf: _leaf(leaf, req, shards, False), tree)


def to_jax(x: Any, *, device: Any = None, copy: bool | None = None) -> Any:
  """`x` (an array, or a pytree of arrays) as jax.Arrays, sharing memory where possible.

  device: a jax.Device, a Sharding (several devices: a copy) or a string like 'cpu', 'gpu:1';
    default: the source's device. copy: None shares where possible and copies where needed,
    False raises BufferError instead of copying, True always copies. Without jax_enable_x64,
    64-bit dtypes are narrowed as JAX does (a copy; integers that do not fit raise).
  """
  return _convert_tree(x, JAX, device, copy, False, "split")


def jax_leaf_converter(device: Any = None, copy: bool | None = None) -> Callable[[Any], jax.Array]:
  """`to_jax` of one array (not a pytree), with the target resolved once: for loops over many
  arrays, such as an input pipeline's leaves."""
  req = _request(JAX, device, copy, False)
  if req.copy is False or JAX.needs_exact:
    return lambda x: _leaf(x, req, "split", False)

  def convert(x: Any) -> jax.Array:
    # A repeated kind of array runs its reused plan without `_leaf`'s front (~2 µs a leaf).
    framework = _base.owner(x)
    if framework is not None and framework is not JAX:
      key = framework.plan_key(x)
      run = _REPEATS.get(_repeat_key(framework, key, req)) if key is not None else None
      if run is not None:
        return run(x)
    return _leaf(x, req, "split", False)
  return convert


def to_torch(x: Any, *, device: Any = None, copy: bool | None = None, writable: bool = False,
             shards: Shards = "split") -> Any:
  """`x` as torch.Tensors, sharing memory where possible (see `to_jax` for device and copy).

  writable: True copies sources that must not be written (JAX, TF, read-only NumPy); with False
    the tensor shares their memory and must be treated as read-only (torch cannot mark it so).
  shards: a multi-device jax.Array gives a list of `Shard`s ('split') or raises ('single').
  Tensors that require grad are exported detached: the result does not track gradients.
  """
  return _convert_tree(x, TORCH, device, copy, writable, shards)


def to_tf(x: Any, *, device: Any = None, copy: bool | None = None,
          shards: Shards = "split") -> Any:
  """`x` as eager tf.Tensors, sharing memory where TF accepts the buffer (compact, row-major,
  64-byte aligned; a copy otherwise). device: a TF device string ('/GPU:0', 'cpu')."""
  return _convert_tree(x, TF, device, copy, False, shards)


def to_numpy(x: Any, *, device: Any = None, copy: bool | None = None, writable: bool = False,
             shards: Shards = "split") -> Any:
  """`x` as np.ndarrays (bfloat16/float8 via ml_dtypes), sharing host memory where possible.

  Views of memory that must not be written are marked read-only; writable=True copies them
  instead. Device arrays need device='cpu' (a copy).
  """
  return _convert_tree(x, NUMPY, device, copy, writable, shards)


def to_cupy(x: Any, *, device: Any = None, copy: bool | None = None, writable: bool = False,
            shards: Shards = "split") -> Any:
  """`x` as cupy.ndarrays on a GPU (device: an index or cupy.cuda.Device); host sources need
  device= (a copy). See `to_torch` for writable."""
  return _convert_tree(x, CUPY, device, copy, writable, shards)


def _extents(x: Any) -> list[tuple[int, int, int]]:
  """(memory space, first byte, end byte) of each buffer behind `x`."""
  if isinstance(x, Shard):
    x = x.data
  if JAX.multi_device(x):
    return [e for s in x.addressable_shards for e in _extents(s.data)]
  framework, x, earlier = _source(x)
  buf = framework.describe(x, exact=True)
  if earlier or buf.address is None:  # a scalar copy, or a buffer that cannot be exported
    return []
  space = _dlpack.HOST if buf.device[0] == _dlpack.CPU else buf.device
  return [(space, *_base.extent(buf))]


def shares_memory(a: Any, b: Any) -> bool:
  """Whether arrays `a` and `b` (any supported framework) overlap in memory, by buffer address.

  Multi-device jax.Arrays and `Shard`s compare shard by shard. Buffers that cannot be exported
  (TF float8 tensors) share only with themselves; Python scalars with nothing.
  """
  if a is b and hasattr(a, "shape"):
    return int(np.prod(tuple(a.shape))) > 0
  return any(sa == sb and lo_a < hi_b and lo_b < hi_a
             for sa, lo_a, hi_a in _extents(a) for sb, lo_b, hi_b in _extents(b))


def plans(x: Any, target: _base.Framework, device: Any, copy: bool | None,
          writable: bool, shards: Shards) -> Any:
  """The conversion plan(s) for `x`, as a pytree mirroring `x` (see `explain`)."""
  req = _request(target, device, None if copy is False else copy, writable)

  if _base.owner(x) is not None or _dlpack.is_capsule(x):
    return _leaf(x, req, shards, True)
  return jax.tree_util.tree_map(lambda leaf: _leaf(leaf, req, shards, True), x)
