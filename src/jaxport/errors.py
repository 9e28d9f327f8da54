"""Typed errors raised by jaxport. Each names the problem and the way out."""
import jax


class JaxportError(Exception):
  """Base class for jaxport errors."""


class MissingInputError(JaxportError, ValueError):
  """A required input, parameter or rng key was not provided."""


class UnsupportedOperationsError(JaxportError, NotImplementedError):
  """The graph uses ops that no conversion tier can handle.

  `ops` maps each unsupported op type to the sorted node names that use it.
  """

  def __init__(self, ops: dict[str, list[str]]):
    self.ops = {op: sorted(names) for op, names in sorted(ops.items())}
    lines = []
    for op, names in self.ops.items():
      shown = ", ".join(names[:5]) + (f", ... ({len(names)} nodes)" if len(names) > 5 else "")
      lines.append(f"  {op}: {shown}")
    super().__init__(
        f"{len(self.ops)} unsupported TensorFlow op type(s):\n" + "\n".join(lines) +
        "\nAdd a rule in jaxport/convert/ops/ (see jaxport.convert.registry.register), "
        "or rewrite the model to avoid these ops.")


class ShapeMismatchError(JaxportError, ValueError):
  """An input's shape does not match the traced signature."""


class DtypeMismatchError(JaxportError, TypeError, ValueError):
  """An input's dtype does not match the traced signature (strict_dtype_check). Also a ValueError,
  which tf2jax raises here."""


class SignatureError(JaxportError, ValueError):
  """A restored function has no single unambiguous concrete signature."""


class ZeroCopyError(JaxportError, BufferError):
  """`copy=False` was asked for, but sharing the buffer is impossible; `.reasons` says why."""

  def __init__(self, source: str, target: str, reasons):
    self.reasons = tuple(reasons)
    why = "; ".join(f"{r.kind}: {r.detail}" for r in self.reasons)
    super().__init__(f"Cannot share this {source} buffer with {target} without a copy ({why}). "
                     "Pass copy=None to allow the copy.")


class DeviceMismatchError(JaxportError, ValueError):
  """The target cannot address the source's device, and no `device=` asked for a transfer."""

  def __init__(self, message: str, source_device: str, target_device: str | None):
    self.source_device, self.target_device = source_device, target_device
    super().__init__(message)


class ShardedArrayError(JaxportError, ValueError):
  """A single array was asked for, but the jax.Array is split across several devices."""


class StableHLOError(JaxportError, ValueError):
  """A StableHLO module cannot be read or interpreted; the message names the op and module."""


class TierError(UnsupportedOperationsError):
  """One node cannot run in the tier chosen for it (TF's XLA lowering or a host callback).

  `.op`, `.node`, `.tier` and `.reason` say which and why; `.ops` is as in the parent class.
  """

  def __init__(self, op: str, node: str, tier: str, reason: str, fix: str = ""):
    super().__init__({op: [node]})
    self.op, self.node, self.tier, self.reason = op, node, tier, reason
    self.args = (f"{op} node {node!r} cannot be converted through the {tier} tier: {reason}"
                 + (f" {fix}" if fix else ""),)


class StringTensorError(JaxportError, TypeError):
  """A string tensor would cross into JAX (a function input or output, or a native rule's input)."""


class ShapeAssertionError(JaxportError, ValueError):
  """Inputs break a shape constraint recorded in a shape-polymorphic export."""


class AssertionFailedError(JaxportError, AssertionError):
  """A TF run-time check (`Assert`, `CheckNumerics`) fails on values known when tracing."""


class ModelFileError(JaxportError, ValueError):
  """A path is not a model jaxport can read (missing, empty, corrupt, or another kind of file)."""


class ArtifactError(JaxportError, ValueError):
  """An artifact directory (`jaxport.export` / `jaxport.load`) cannot be written or read: a missing
  or changed file, a manifest that does not check out, or a platform it was not exported for."""


class DynamicShapeError(JaxportError, ValueError, jax.errors.ConcretizationTypeError):
  """A value that decides an output shape (a Range limit, a Reshape target, Where's mask...) is
  traced: under `jax.jit`/`vmap`, or inside a TF loop, it is not known until run time.

  `.op`, `.node` and `.operand` say which; eager calls (no jit) see concrete values and work.
  Also a `jax.errors.ConcretizationTypeError`, what JAX (and tf2jax) raise in this case.
  """

  def __init__(self, op: str | None, node: str | None, operand: str):
    self.op, self.node, self.operand = op, node, operand
    where = f"{op} node {node!r} needs its `{operand}`" if node else f"`{operand}` is needed"
    Exception.__init__(   # not ConcretizationTypeError's (it wants the tracer)
        self,
        f"{where} as a trace-time constant, but it depends on the function's inputs, which are traced "
        "here (under jax.jit, vmap or grad, or inside a TF loop or cond): call the converted function without "
        "jax.jit (its inputs are then concrete), or make the value a constant of the TF function "
        "(close over it instead of passing it in), or use a fixed-size alternative in TF.")


class DynamicLoopError(DynamicShapeError):
  """A While loop cannot be one lax loop (its shapes change between iterations, or its body needs a
  loop variable as a constant), and its trip count is traced, so it cannot run step by step either."""

  def __init__(self, node: str, cause: BaseException):
    self.op, self.node, self.operand = "While", node, "trip count"
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    Exception.__init__(
        self,
        f"While node {node!r} cannot run as a lax loop ({first}), and it cannot run step by step "
        "either: its condition depends on traced values (under jax.jit, vmap or grad, or inside another "
        "loop), so its trip count is not known at trace time. Call the converted function without "
        "jax.jit (the loop then runs step by step on concrete values), or make the loop bound a constant "
        "of the TF function (the loop is then unrolled), or keep the loop variables' shapes fixed in TF "
        "(e.g. a preallocated buffer written with tf.tensor_scatter_nd_update).")


class PaddedSizeError(DynamicShapeError):
  """Outputs sized by values (a Unique's distinct values, a DynamicPartition's rows per partition,
  accidental hits) are padded to their bound under jit; a node uses them in a way the padding would change (anything
  but per-row math ending in a scatter, a stitch or a gather at Unique's `idx`)."""

  _SIZED_BY = {"Unique": "as many outputs as distinct values",
               "DynamicPartition": "outputs as long as the number of rows each partition gets",
               "ComputeAccidentalHits": "as many outputs as true classes that were also sampled"}

  def __init__(self, origin: str, rows: int, op: str | None, node: str, maker: str = "Unique"):
    """`op` None: `node` names a function whose outputs include a padded value; `maker` is the op
    whose outputs were padded (`origin` its node)."""
    self.op, self.node, self.operand = op, node, f"the size of {origin!r}'s outputs"
    user = f"{op} node {node!r} uses them otherwise" if op else f"function {node!r} returns one"
    Exception.__init__(
        self,
        f"{maker} node {origin!r} has {self._SIZED_BY.get(maker, 'outputs sized by values')}, known only "
        f"at run time. Traced (under jax.jit, vmap or grad, or inside a TF loop) they are padded to {rows}, "
        "which is exact while they only pick, combine and scatter rows (a sparse gradient summed per id and "
        "scattered into a variable, a lookup deduplicated first, a lookup into partitioned variables "
        f"stitched back), but {user}. Call the converted function without jax.jit (its inputs are then "
        "concrete), or keep the padded values inside such an update in TF.")


class InteropInputError(JaxportError, TypeError):
  """`jaxport.interop` cannot exchange this input: not an array or DLPack producer, an unsupported
  dtype or byte order, or a producer that does not keep the DLPack protocol."""


class DeletedArrayError(JaxportError, ValueError):
  """The input's buffer is gone: a deleted or donated jax.Array, or a consumed DLPack capsule."""


class LoaderStateError(JaxportError, ValueError):
  """A `jaxport.data` loader state is invalid, corrupt, or from another pipeline; `.field` names
  the state's entry at fault."""

  def __init__(self, field: str, message: str):
    self.field = field
    super().__init__(f"jaxport.data: invalid loader state, field {field!r}: {message}")


class ConfigError(JaxportError, ValueError, TypeError):
  """`update_config`/`override_config` got an unknown key or a value of the wrong type."""


class UnsupportedValueError(JaxportError, TypeError, ValueError):
  """A value jaxport cannot take or return: `convert(None)`, a `None` input, params that are not a
  dict, a ragged or sparse tensor where a dense one belongs. The message names it and the way out."""


class UnwrittenListError(UnsupportedValueError):
  """A TensorList with an unknown element shape is read before anything was written to it. A loop
  whose body reads such a list runs step by step, so that a loop that reads nothing passes."""


class StaticArgumentError(SignatureError):
  """A static argument (`training`, a string mode, a `None` mask) differs from the traced value and
  the function cannot be retraced (it came from a SavedModel signature)."""


class InvalidNodeError(JaxportError, ValueError):
  """A node TF itself would reject: an attribute combination or a known operand value its kernel
  refuses (align_corners with half_pixel_centers, an iou_threshold outside [0, 1]). The message
  names the node and quotes TF's rule."""


class X64OverflowError(JaxportError, OverflowError):
  """64-bit integers outside the 32-bit range while jax_enable_x64 is off: JAX would store them in 32 bits
  and wrap them, so they are refused instead."""


class BatchFallbackWarning(UserWarning):
  """An export without example inputs could not keep the batch dim symbolic and fixed it instead."""


class DtypeCastWarning(UserWarning):
  """An input or param of another dtype was cast to the traced dtype (`strict_dtype_check` off)."""


class X64NarrowingWarning(UserWarning):
  """A converted function declares 64-bit inputs, outputs or params while jax_enable_x64 is off: JAX
  computes them in 32 bits (float64 loses precision, int64 beyond 32 bits would wrap)."""


class RunTimeBranchWarning(UserWarning):
  """Under jit, a cond branch with a value-dependent size is compiled as a run-time error (raised only
  if the predicate takes it); the other branches run as usual."""
