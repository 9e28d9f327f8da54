"""Moving checked host batches onto devices: placement, sharding and the dtype policy."""
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxport.interop.convert import jax_leaf_converter
from jaxport.data._batches import Flat
from jaxport.data._host_pool import HostPool
from jaxport.data._leaves import dtype_of, host_view, on_host, path_parts, path_str

DtypesSpec = Any  # None | dtype | Mapping[dtype | str, dtype]


def resolve_sharding(sharding: Any, processes: int) -> Sharding | None:
  """`sharding=` as a Sharding; by default, with several processes, the batch split over all
  devices."""
  if sharding is None:
    if processes == 1:
      return None
    return NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
  if isinstance(sharding, Sharding):
    return sharding
  if isinstance(sharding, tuple) and len(sharding) == 2 and isinstance(sharding[0], Mesh):
    mesh, spec = sharding
    if not isinstance(spec, PartitionSpec):
      spec = PartitionSpec(*spec) if isinstance(spec, (tuple, list)) else PartitionSpec(spec)
    return NamedSharding(mesh, spec)
  raise TypeError("jaxport.data: sharding= takes a jax.sharding.Sharding or a (Mesh, PartitionSpec) "
                  f"pair, not {type(sharding).__name__}.")


def default_device() -> jax.Device:
  """JAX's default device (`jax_default_device`, else the default backend's first)."""
  device = jax.config.jax_default_device
  if isinstance(device, jax.Device):
    return device
  return jax.local_devices(backend=device)[0]


class Placer:
  """Puts leaves on devices: onto the default device (zero-copy from host memory when it is the
  CPU; jax.Arrays stay where they are), or laid out by a sharding.

  With a sharding, each process passes only its local rows and
  `jax.make_array_from_process_local_data` assembles the global array.
  """

  def __init__(self, sharding: Sharding | None, pool: HostPool | None = None):
    self.sharding = sharding
    device = default_device() if sharding is None else None
    self._to_device = jax_leaf_converter(device) if device is not None else None
    # Whether placing a host batch copies it (to an accelerator, or laid out over devices).
    self.copies = device is None or device.platform != "cpu"
    # An accelerator gets host leaves in one jax.device_put per batch (asynchronous: the copy
    # runs while the next batch is read), straight from the host memory they are in.
    self._accelerator = device if self.copies and device is not None else None
    self.pool = pool
    self._by_rank: dict[int, Sharding] = {}

  @property
  def reuses_host_buffers(self) -> bool:
    """Whether a host buffer is free again once its copy is done: placing copies it (to an
    accelerator); on the CPU the device array aliases it."""
    return self._accelerator is not None

  def put_all(self, paths: tuple, leaves: list) -> tuple[list[jax.Array], int]:
    """The leaves on device (copies dispatched, not waited for), and the bytes moved."""
    if self._accelerator is not None and all(on_host(leaf) for leaf in leaves):
      hosts = [host_view(leaf) for leaf in leaves]
      # Dtypes JAX narrows (64-bit without jax_enable_x64) go through interop, which checks
      # their values fit.
      if all(host.dtype == jax.dtypes.canonicalize_dtype(host.dtype) for host in hosts):
        return jax.device_put(hosts, self._accelerator), sum(host.nbytes for host in hosts)
    placed = [self.put(path, leaf) for path, leaf in zip(paths, leaves)]
    return [array for array, _ in placed], sum(size for _, size in placed)

  def lent(self, leaves: list, arrays: list) -> None:
    """The batch of `leaves` was placed as `arrays`: pooled host buffers among the leaves are
    reused once their copies are done."""
    if self.pool is not None:
      self.pool.placed(leaves, arrays)

  def put(self, path: tuple, leaf: Any) -> tuple[jax.Array, int]:
    """The leaf on device, and the bytes this process moved for it."""
    if self.sharding is None:
      # jax.Arrays are taken as they are, wherever (and however sharded) they live.
      array = leaf if isinstance(leaf, jax.Array) else self._to_device(leaf)
      return array, math.prod(array.shape) * array.dtype.itemsize  # 3x faster than .nbytes
    host = host_view(leaf)
    try:
      return jax.make_array_from_process_local_data(self._for_rank(host.ndim), host), host.nbytes
    except ValueError as error:
      raise ValueError(f"jaxport.data: cannot lay out leaf {path_str(path)} of local shape "
                       f"{host.shape} with {self.sharding}: {error}. A batch must split evenly over "
                       "the devices of the batch axis; a short last batch needs last_batch='pad' "
                       "or 'drop'.") from error

  def _for_rank(self, rank: int) -> Sharding:
    """The sharding for a leaf of this rank; a PartitionSpec longer than the rank is cut."""
    sharding = self._by_rank.get(rank)
    if sharding is None:
      sharding = self.sharding
      if isinstance(sharding, NamedSharding) and len(sharding.spec) > rank:
        sharding = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[:rank]))
      self._by_rank[rank] = sharding
    return sharding


class DtypePolicy:
  """The `dtypes=` argument of `loader`: which dtype each leaf is cast to, on device.

  * a dtype: every floating leaf is cast to it;
  * a mapping whose keys are dtypes: leaves of that source dtype are cast;
  * a mapping whose keys are strings: the leaf (or subtree) at that key path is cast, where a
    path is the dict keys, tuple indices and attribute names joined by "/" ("features/image").
  Key paths win over source dtypes; a longer path wins over a shorter one.
  """

  def __init__(self, spec: DtypesSpec):
    self._floats: np.dtype | None = None
    self._by_dtype: dict[np.dtype, np.dtype] = {}
    self._by_path: dict[tuple[str, ...], np.dtype] = {}
    self._plans: dict[tuple, tuple[np.dtype | None, ...]] = {}
    if spec is None:
      return
    if isinstance(spec, Mapping):
      for key, target in spec.items():
        if isinstance(key, str):
          self._by_path[tuple(part for part in key.split("/") if part)] = jnp.dtype(target)
        else:
          self._by_dtype[jnp.dtype(key)] = jnp.dtype(target)
    else:
      self._floats = jnp.dtype(spec)

  def targets(self, batch: Flat) -> tuple[np.dtype | None, ...]:
    """The dtype to cast each leaf of `batch` to, None to keep it."""
    if self._floats is None and not self._by_dtype and not self._by_path:
      return (None,) * len(batch.leaves)
    dtypes = tuple(dtype_of(leaf) for leaf in batch.leaves)
    key = (batch.treedef, dtypes)
    plan = self._plans.get(key)
    if plan is None:
      plan = self._plans[key] = self._plan(batch.paths, dtypes)
    return plan

  def _plan(self, paths: tuple[tuple, ...],
            dtypes: tuple[np.dtype, ...]) -> tuple[np.dtype | None, ...]:
    parts = [path_parts(path) for path in paths]
    unused = ["/".join(key) for key in self._by_path
              if not any(leaf_parts[:len(key)] == key for leaf_parts in parts)]
    if unused:
      known = ", ".join(repr("/".join(leaf_parts)) for leaf_parts in parts)
      raise KeyError(f"jaxport.data: dtypes= names key path(s) {', '.join(map(repr, unused))} "
                     f"that match no leaf of the batch; its leaves are {known}.")
    plan = []
    for leaf_parts, dtype in zip(parts, dtypes):
      matches = [key for key in self._by_path if leaf_parts[:len(key)] == key]
      if matches:
        target = self._by_path[max(matches, key=len)]
      elif dtype in self._by_dtype:
        target = self._by_dtype[dtype]
      elif self._floats is not None and jnp.issubdtype(dtype, jnp.floating):
        target = self._floats
      else:
        target = None
      plan.append(None if target == dtype else target)
    return tuple(plan)
