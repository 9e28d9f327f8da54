"""Op rules: TF1 ref variables (`VariableV2`) and the ops that write through refs.

A ref variable is a `VariableRef` keyed by its node name (a graph-level `VarHandleOp` by
its shared name), so its value comes from `params` and its updates reach
`new_params`. `v1_control_flow` puts a `_ReadRef` wherever a ref feeds an op
that takes a value (`w/read = Identity(w)`). The ref forms of the scatters and of the
optimizers' `Apply*` ops run the rules of their `Resource*` twins and return the ref.
"""
from __future__ import annotations

from jaxport.convert.graph import Node
from jaxport.convert.interpreter import OpContext, VariableRef
from jaxport.convert.ops import optimizers, state_scatter  # noqa: F401  (the twins, registered first)
from jaxport.convert.registry import get_rule, register


@register("VariableV2", "Variable", structural=True)
def variable(ctx):
  return VariableRef(ctx.name)   # TF1 names variables by node (loaders give them unique shared names)


@register("_ReadRef", structural=True)
def read_ref(ctx, ref):
  """The value behind a ref (put in by `v1_control_flow`); a value (a cond's ref output) passes."""
  return ctx.runtime.read_variable(ref) if isinstance(ref, VariableRef) else ref


@register("RefIdentity", structural=True)
def ref_identity(ctx, ref):
  return ref


@register("Assign", writes_state=True, structural=True)
def assign(ctx, ref, value):
  old = ctx.runtime.state.get(ref.key)
  ctx.runtime.state[ref.key] = value if old is None else value.astype(old.dtype)   # initializers may create
  return ref


@register("AssignAdd", writes_state=True, structural=True)
def assign_add(ctx, ref, delta):
  old = ctx.runtime.read_variable(ref)
  ctx.runtime.assign_variable(ref, (old + delta).astype(old.dtype))
  return ref


@register("AssignSub", writes_state=True, structural=True)
def assign_sub(ctx, ref, delta):
  old = ctx.runtime.read_variable(ref)
  ctx.runtime.assign_variable(ref, (old - delta).astype(old.dtype))
  return ref


def _as_resource_op(ctx, *inputs):
  """Runs the rule of `Resource<op>` on the same inputs, then returns the ref (the op's output)."""
  twin = "Resource" + ctx.op
  rule = get_rule(twin)
  if rule is None:
    raise NotImplementedError(f"{ctx.op} {ctx.name!r}: jaxport has no rule for {twin}, which it runs for {ctx.op}")
  node = ctx.node
  rule(OpContext(Node(node.name, twin, node.inputs, node.control_inputs, node.attrs), ctx.runtime), *inputs)
  return inputs[0]


def _register_ref_twins(*op_types: str) -> None:
  """Registers ops that run their `Resource*` twin's rule, with the twin's row-index input (so padded
  unique ids under jit end in a ref scatter as they do in a resource one)."""
  for op in op_types:
    twin = get_rule("Resource" + op)
    register(op, writes_state=True, structural=True,
             scatter_indices=None if twin is None else twin.scatter_indices)(_as_resource_op)


_register_ref_twins("ScatterUpdate", "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv", "ScatterMax",
                    "ScatterMin", "ScatterNdUpdate", "ScatterNdAdd", "ScatterNdSub", "ScatterNdMax", "ScatterNdMin")

_register_ref_twins("ApplyGradientDescent", "ApplyProximalGradientDescent", "SparseApplyProximalGradientDescent",
                    "ApplyMomentum", "SparseApplyMomentum", "ApplyAdam", "ApplyAdaMax",
                    "ApplyAdagrad", "SparseApplyAdagrad", "ApplyAdagradV2", "SparseApplyAdagradV2",
                    "ApplyProximalAdagrad", "SparseApplyProximalAdagrad", "ApplyAdagradDA", "SparseApplyAdagradDA",
                    "ApplyAdadelta", "SparseApplyAdadelta", "ApplyRMSProp", "SparseApplyRMSProp",
                    "ApplyCenteredRMSProp", "SparseApplyCenteredRMSProp", "ApplyFtrl", "SparseApplyFtrl",
                    "ApplyFtrlV2", "SparseApplyFtrlV2", "ApplyAddSign", "ApplyPowerSign")
