"""Typed errors raised by jaxport. Each names the problem and the way out."""


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


class DtypeMismatchError(JaxportError, TypeError):
  """An input's dtype does not match the traced signature (strict_dtype_check)."""


class SignatureError(JaxportError, ValueError):
  """A restored function has no single unambiguous concrete signature."""
