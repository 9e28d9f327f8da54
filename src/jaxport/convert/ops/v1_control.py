"""Op rules: TF1 (v1) control-flow ops and stacks, recorded in the registry like every other op.

`convert/v1_control_flow.py` rewrites every v1 loop and conditional into `While`/`If`
nodes, and every v1 stack into lists those loops carry, before anything runs, so these rules are never called on a graph that converted;
reaching one means a node escaped that rewrite.
"""
from jaxport.convert.registry import register
from jaxport.convert.v1_control_flow import V1ControlFlowError


@register("Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
          "NextIteration", "RefNextIteration", "LoopCond", "StackV2", "StackPushV2", "StackPopV2", "StackCloseV2",
          structural=True)
def v1_control_op(ctx, *inputs):
  raise V1ControlFlowError(f"{ctx.op} node {ctx.name!r} is not part of a v1 loop, cond or loop gradient the "
                           "rewrite recovered")
