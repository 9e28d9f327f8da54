"""Reading tf.data iterators fast: flat tensors, the prefetch stage, and retiring iterators."""
import queue
import sys
import threading
from typing import Any

from jax.tree_util import tree_flatten_with_path

from jaxport.data._batches import Flat, batch_rows, flatten
from jaxport.data._leaves import tf_dtype_problem

# An iterator deleted just after it ends blocks its deleter for ~20-300 ms while its threads
# wind down: a daemon thread finds finished iterators whose last reference it holds (checked every
# _REAP_S) and hands them to a short-lived thread to delete, so that a deletion that never ends
# (a pipeline stuck in its source) holds up no other.
_REAP_S = 0.05


class Retired:
  """Finished tf.data iterators, deleted by a daemon thread (one per process, started when first
  needed) once nothing else refers to them: the consumer never waits on their wind-down."""

  _queue: "queue.SimpleQueue | None" = None
  _guard = threading.Lock()

  def add(self, iterator: Any) -> None:
    if Retired._queue is None:
      with Retired._guard:
        if Retired._queue is None:
          arrivals = queue.SimpleQueue()
          threading.Thread(target=_reap, args=(arrivals,), name="jaxport-data-reaper",
                           daemon=True).start()
          Retired._queue = arrivals  # only once a thread reads it
    Retired._queue.put(iterator)


def _reap(arrivals: "queue.SimpleQueue") -> None:
  held: list = []
  while True:
    try:
      held.append(arrivals.get(timeout=_REAP_S) if held else arrivals.get())
    except queue.Empty:
      pass
    kept, unused = [], []
    for iterator in held:
      # Referred to by `held`, this loop and getrefcount's argument only: the last reference is ours.
      (kept if sys.getrefcount(iterator) > 3 else unused).append(iterator)
    del iterator
    held = kept
    if unused:
      try:
        threading.Thread(target=_delete, args=(unused,), name="jaxport-data-reaper-delete",
                         daemon=True).start()
      except RuntimeError:  # no thread to be had: delete them here
        unused.clear()
      del unused


def _delete(iterators: list) -> None:
  iterators.clear()


def _fitting(tf: Any, element_spec: Any, count: int, max_bytes: int | None) -> int:
  """`count` elements, fewer (at least one) where that many would hold over `max_bytes`."""
  specs = tf.nest.flatten(element_spec)
  if max_bytes is None or not all(isinstance(spec, tf.TensorSpec) and spec.shape.is_fully_defined()
                                  for spec in specs):
    return count
  size = sum(spec.shape.num_elements() * spec.dtype.size for spec in specs)
  return max(1, min(count, max_bytes // max(size, 1)))


def _ends_with_prefetch(dataset: Any) -> bool:
  """Whether the pipeline's last stage (past with_options) is a prefetch; by class name, as
  tf.data has no public way to tell: a wrong guess costs an extra prefetch stage or none."""
  while type(dataset).__name__ == "_OptionsDataset" and hasattr(dataset, "_input_dataset"):
    dataset = dataset._input_dataset  # pylint: disable=protected-access
  return "Prefetch" in type(dataset).__name__


def injects_prefetch(dataset: Any) -> bool:
  """Whether tf.data may inject a prefetch stage at the end of the pipeline itself (its default
  `inject_prefetch` rewrite, after a synchronous last stage; it needs autotuning and the default
  optimizations, which the pipeline's options may turn off)."""
  options = dataset.options()
  return (options.experimental_optimization.inject_prefetch is not False
          and options.experimental_optimization.apply_default_optimizations is not False
          and options.autotune.enabled is not False)


def _read_with_next(iterator: Any) -> Any:
  def read() -> Flat | None:
    element = next(iterator, None)
    return None if element is None else flatten(element, batched=True)
  return read


class _TensorReader:
  """Reads a tf.data iterator's elements as flat tensors with the IteratorGetNext op.

  `next(iterator)` rebuilds every element's structure in Python, 40-90 µs per batch; here the
  structure, the key paths and the leaf checks are worked out once from the element_spec. Built
  only when every component is a numeric tensor with a batch dimension; otherwise `next()` and
  the per-leaf checks (with their errors) are used.
  """

  def __init__(self, tf: Any, treedef: Any, paths: tuple, order: list[int], specs: list[Any],
               rows: int | None):
    try:  # the generated op wrapper, without tf.raw_ops' keyword-checking layer around it
      from tensorflow.python.ops.gen_dataset_ops import iterator_get_next  # pylint: disable=import-outside-toplevel
      self._get_next = iterator_get_next
    except ImportError:
      self._get_next = tf.raw_ops.IteratorGetNext
    self._end = tf.errors.OutOfRangeError
    self._treedef, self._paths, self._order, self._rows = treedef, paths, order, rows
    self._types = [spec.dtype for spec in specs]
    # Shapes of known rank as lists (-1: unknown dimension): the op converts those in C,
    # TensorShapes in Python (~15 µs per batch).
    self._shapes = [[-1 if d is None else d for d in spec.shape.as_list()]
                    if spec.shape.rank is not None else spec.shape for spec in specs]

  @classmethod
  def build(cls, tf: Any, element_spec: Any, rows: int | None) -> "_TensorReader | None":
    """`rows`: the static batch size every component shares, if any."""
    specs = tf.nest.flatten(element_spec)
    if not specs or any(type(spec) is not tf.TensorSpec or not spec.shape.rank
                        or tf_dtype_problem(spec.dtype) for spec in specs):
      return None
    # Which flat tensor each leaf (in JAX's flattening order) is.
    keyed, treedef = tree_flatten_with_path(
        tf.nest.pack_sequence_as(element_spec, list(range(len(specs)))))
    order = [index for _, index in keyed]
    if any(type(index) is not int for index in order) or sorted(order) != list(range(len(specs))):
      return None  # a structure JAX does not flatten like tf.nest (e.g. attrs classes)
    return cls(tf, treedef, tuple(path for path, _ in keyed), order, specs, rows)

  def bind(self, iterator: Any) -> Any:
    """A function returning the iterator's next batch, or None at its end (through `next()`
    where the iterator's resource handle is not reachable)."""
    resource = getattr(iterator, "_iterator_resource", None)
    if resource is None:
      return _read_with_next(iterator)
    get_next, end, types, shapes = self._get_next, self._end, self._types, self._shapes
    treedef, paths, order, rows = self._treedef, self._paths, self._order, self._rows

    def read() -> Flat | None:
      try:
        flat = get_next(iterator=resource, output_types=types, output_shapes=shapes)
      except end:
        return None
      leaves = [flat[index] for index in order]
      return Flat(treedef, paths, leaves, rows if rows is not None else _rows(paths, leaves))
    return read


def _rows(paths: tuple, leaves: list) -> int:
  """The batch dimension the leaves share; read from the eager tensors' shape tuples (a
  TensorShape costs ~10 µs per leaf)."""
  first = leaves[0]._shape_tuple()  # pylint: disable=protected-access
  if first and all(leaf._shape_tuple()[:1] == first[:1] for leaf in leaves[1:]):  # pylint: disable=protected-access
    return first[0]
  return batch_rows(paths, leaves)  # raises the error that names the leaf


def _static_batch_size(tf: Any, element_spec: Any) -> int | None:
  """The batch size when every component of a tf.data element has the same static first dim."""
  sizes = {spec.shape[0] if isinstance(spec, tf.TensorSpec) and spec.shape.rank else None
           for spec in tf.nest.flatten(element_spec)}
  return sizes.pop() if len(sizes) == 1 and None not in sizes else None
