"""Resource variables: reads and the assignments that become `new_params`."""
import numpy as np

from jaxport.convert.interpreter import VariableRef
from jaxport.convert.ops._util import shape_value
from jaxport.convert.registry import register


@register("ReadVariableOp", structural=True)
def read_variable(ctx, ref):
  return ctx.runtime.read_variable(ref)


@register("VariableShape", size_bounded=True)
def variable_shape(ctx, ref):
  return shape_value(np.shape(ctx.runtime.read_variable(ref)), ctx.attr("out_type"))


@register("AssignVariableOp", writes_state=True, structural=True)
def assign_variable(ctx, ref, value):
  ctx.runtime.assign_variable(ref, value.astype(ctx.runtime.read_variable(ref).dtype))
  return ()


@register("AssignAddVariableOp", writes_state=True, structural=True)
def assign_add_variable(ctx, ref, delta):
  old = ctx.runtime.read_variable(ref)
  ctx.runtime.assign_variable(ref, (old + delta).astype(old.dtype))
  return ()


@register("AssignSubVariableOp", writes_state=True, structural=True)
def assign_sub_variable(ctx, ref, delta):
  old = ctx.runtime.read_variable(ref)
  ctx.runtime.assign_variable(ref, (old - delta).astype(old.dtype))
  return ()


@register("VarHandleOp", structural=True)
def var_handle(ctx):
  # Graph-level handles (TF1-style and restored graphs) are keyed by shared_name.
  return VariableRef(ctx.attr("shared_name") or ctx.name)


@register("VarIsInitializedOp", structural=True)
def var_is_initialized(ctx, ref):
  return np.bool_(True)


@register("ResourceGather", structural=True, gather_indices=1)
def resource_gather(ctx, ref, indices):
  """A gather from a variable along axis 0 (tf_keras Embedding)."""
  from jaxport.convert.ops.gather_scatter import gather_v2
  return gather_v2(ctx, ctx.runtime.read_variable(ref), indices, np.int32(0))


@register("ResourceGatherNd", structural=True)
def resource_gather_nd(ctx, ref, indices):
  from jaxport.convert.ops.gather_scatter import gather_nd
  return gather_nd(ctx, ctx.runtime.read_variable(ref), indices)
