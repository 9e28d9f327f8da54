"""Op patterns `jax.export` writes for one JAX function, run as that function (its value and derivative).

- `lax.logistic` (jax.nn.sigmoid, every sigmoid gate) is written `1 / (1 + exp(-x))`. Where exp(-x)
  overflows (x < -88 in float32, -11 in bfloat16) that derivative is inf / inf = NaN; lax.logistic's is 0.
- `jnp.logaddexp(a, b)` (softplus, log_sigmoid) is written `select(a - b != a - b, a + b, max(a, b) +
  log1p(exp(-|a - b|)))`; its custom_jvp rule is not in the module, and at a == b the ops' derivative is
  that of max's tie and abs's kink (softplus'(0) = -1/2, not 1/2).
`annotate` marks the pattern's last op to run as the function of the pattern's inputs; the ops before it
still run for any other reader (and are dropped by XLA where none is).
"""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp
from jax import lax

from jaxport.convert.stablehlo.module import Block, Op

_LOOK_THROUGH = {"stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert"}


def annotate(block: Block) -> None:
  """Sets `op.rewrite = (fn, operands)` on the ops of `block` that run as `fn(*values of operands)`."""
  producer: dict[int, Op] = {v: op for op in block.ops for v in op.results}

  def constant(v) -> np.ndarray | None:
    op = producer.get(v)
    while op is not None and op.name in _LOOK_THROUGH:
      op = producer.get(op.operands[0])
    return np.asarray(op.attrs["value"]) if op is not None and op.name == "stablehlo.constant" else None

  def is_one(v) -> bool:
    value = constant(v)
    return value is not None and value.size > 0 and bool(np.all(value == 1))

  def made_by(v, name: str) -> Op | None:
    op = producer.get(v)
    return op if op is not None and op.name == name else None

  def same(u, v) -> bool:
    """The same value, or constants of equal values (jax writes a broadcast of 0 per use)."""
    cu, cv = (constant(u), constant(v)) if u != v else (None, None)
    return u == v or (cu is not None and cv is not None and cu.shape == cv.shape and bool(np.all(cu == cv)))

  def same_pair(us, vs) -> bool:
    return (same(us[0], vs[0]) and same(us[1], vs[1])) or (same(us[0], vs[1]) and same(us[1], vs[0]))

  def chain(v, *names) -> Op | None:
    """The op at the end of the single-operand chain `names` (outermost first) that makes `v`."""
    op = None
    for name in names:
      op = made_by(v, name)
      if op is None:
        return None
      v = op.operands[0]
    return op

  for op in block.ops:
    if op.name == "stablehlo.divide" and is_one(op.operands[0]):
      add = made_by(op.operands[1], "stablehlo.add")
      for one, other in ((add.operands, add.operands[::-1]) if add is not None else ()):
        neg = chain(other, "stablehlo.exponential", "stablehlo.negate")
        if is_one(one) and neg is not None and add.result_types[0] == neg.result_types[0]:
          op.rewrite = (lax.logistic, [neg.operands[0]])
          break
    elif op.name == "stablehlo.select":
      pred, both, tail = (made_by(op.operands[0], "stablehlo.compare"), made_by(op.operands[1], "stablehlo.add"),
                          made_by(op.operands[2], "stablehlo.add"))
      diff = made_by(pred.operands[0], "stablehlo.subtract") if pred is not None else None
      if (diff is None or both is None or tail is None or pred.operands[0] != pred.operands[1]
          or pred.attrs["comparison_direction"].value != "NE" or not same_pair(both.operands, diff.operands)):
        continue
      for amax, log in (tail.operands, tail.operands[::-1]):
        m, abs_ = made_by(amax, "stablehlo.maximum"), chain(log, "stablehlo.log_plus_one", "stablehlo.exponential",
                                                            "stablehlo.negate", "stablehlo.abs")
        if m is not None and abs_ is not None and same_pair(m.operands, diff.operands) \
            and abs_.operands[0] == diff.results[0]:
          op.rewrite = (jnp.logaddexp, list(diff.operands))
          break
