"""TF1 graphs: v1 control flow and ref variables lowered onto the v2 machinery.

A TF1 graph expresses loops and conditionals with dataflow ops: a loop is a *frame*
of `Enter` → `Merge` → (`LoopCond`, `Switch`) → body → `NextIteration` nodes, left by
`Exit`; a conditional is a set of `Switch` nodes on one predicate whose two sides meet
again in `Merge` nodes. The interpreter runs acyclic graphs, so this pass recovers
the structure and rewrites it, once at conversion time:

* each loop frame becomes a `While` node whose `cond`/`body` are new library
  functions (`Library.add`), so `ops/control_flow.py` runs it (fori_loop when the
  trip count follows from constants, else lax.while_loop);
* each conditional becomes an `If` node with a `then_branch`/`else_branch`, run by
  lax.cond (or just the taken branch when the predicate is a constant). The gradient of a cond
  (`tf.gradients`) is a later cond on the same predicate reading the first one's branch values:
  a second If, to which the first passes those values as extra outputs (`_cond_regions`).

Innermost structures are rewritten first; nested frames are rewritten inside their
parent's body. A ref-typed output feeding an input that is not a ref (`w/read =
Identity(w)`) gets a `_ReadRef`, so ref variables behave as resource variables (a cond
that returns a ref returns its value, which `_ReadRef` passes through).

v1 stacks carry the in-graph gradient of a v1 loop (`tf.gradients` through
`tf.compat.v1.while_loop`): the forward loop pushes each step's intermediates onto a stack
made outside it, the gradient loop pops them. Here a stack becomes a TensorList that both
loops carry as a loop variable (`_thread_stacks`), pushed and popped at every step even when a cond
of the loop pushes it in one branch; stacks of nested loops are refused.
"""
from __future__ import annotations

import itertools

import numpy as np

from jaxport.convert.graph import VARIANT, FuncAttr, GraphFunction, Library, Node, dependency_order
from jaxport.errors import JaxportError, UnsupportedOperationsError

ENTER = frozenset({"Enter", "RefEnter"})
EXIT = frozenset({"Exit", "RefExit"})
NEXT = frozenset({"NextIteration", "RefNextIteration"})
MERGE = frozenset({"Merge", "RefMerge"})
SWITCH = frozenset({"Switch", "RefSwitch"})
V1_CONTROL_FLOW = ENTER | EXIT | NEXT | MERGE | SWITCH | {"LoopCond"}
REF_VARIABLES = frozenset({"VariableV2", "Variable"})
STACKS = frozenset({"StackV2", "StackPushV2", "StackPopV2", "StackCloseV2"})

_ids = itertools.count()


class V1ControlFlowError(JaxportError, NotImplementedError):
  """A v1 control-flow pattern this pass cannot recover."""

  def __init__(self, message: str):
    super().__init__(f"{message}. Rebuild the graph with control flow v2 "
                     "(tf.compat.v1.enable_control_flow_v2()) if you can, which jaxport converts directly.")


def has_v1_structure(graph: GraphFunction) -> bool:
  ops = {n.op for n in graph.nodes.values()}
  return bool(ops & (V1_CONTROL_FLOW | REF_VARIABLES | STACKS | {"TensorArrayGradV3"}))


def lower_v1_graph(graph: GraphFunction, library: Library) -> GraphFunction:
  """`graph` with its v1 loops and conds rewritten into While/If nodes (a new GraphFunction).

  Graphs without v1 control flow or ref variables come back unchanged.
  """
  if not has_v1_structure(graph):
    return graph
  nodes = _live_copy(graph)
  _thread_stacks(nodes)
  outputs = _insert_ref_reads(nodes, list(graph.outputs))
  _link_tensor_array_gradients(nodes)
  frames, parents = _assign_frames(nodes)
  nodes = _rewrite_scope(nodes, "", frames, parents, library)
  return GraphFunction(graph.name, nodes, list(graph.inputs), outputs, list(graph.control_outputs))


# --------------------------------------------------------------------------- helpers


def _live_copy(graph: GraphFunction) -> dict[str, Node]:
  """Copies of the nodes the outputs depend on (loop back edges included), plus the inputs."""
  keep: set[str] = set()
  stack = [n for n, _ in graph.outputs] + list(graph.control_outputs) + list(graph.inputs)
  while stack:
    name = stack.pop()
    if name in keep or name not in graph.nodes:
      continue
    keep.add(name)
    node = graph.nodes[name]
    stack.extend(src for src, _ in node.inputs)
    stack.extend(node.control_inputs)
  return {name: _copy(graph.nodes[name]) for name in graph.nodes if name in keep}


def _copy(node: Node, **changes) -> Node:
  fields = dict(name=node.name, op=node.op, inputs=list(node.inputs), control_inputs=list(node.control_inputs),
                attrs=dict(node.attrs), node_def=node.node_def)
  fields.update(changes)
  return Node(**fields)


def _placeholder(name: str, dtype=None) -> Node:
  return Node(name, "Placeholder", [], [], {"dtype": dtype})


def _topo_order(nodes: dict[str, Node]) -> list[str]:
  """Every node in dependency order, ignoring loop back edges (NextIteration → Merge)."""
  return dependency_order(nodes, lambda name: _deps(nodes, nodes[name]))


def _deps(nodes: dict[str, Node], node: Node) -> list[str]:
  deps = [src for src, _ in node.inputs] + node.control_inputs
  return [d for d in deps if d in nodes and nodes[d].op not in NEXT]


def _insert_ref_reads(nodes: dict[str, Node], outputs: list) -> list:
  """Puts a `_ReadRef` wherever a ref output feeds an input that is not a ref, and on ref
  outputs of the graph (a Session fetches a ref's value). Returns the outputs."""
  from jaxport.convert import _tf_compat
  defs = {op: _tf_compat.op_def(op) for op in {n.op for n in nodes.values()}}
  ref_out = {name for name, n in nodes.items()
             if defs[n.op] is not None and any(a.is_ref for a in defs[n.op].output_arg)}
  if not ref_out:
    return outputs

  def read(src: str, idx: int) -> tuple[str, int]:
    name = f"{src}/_jaxport_read_{idx}"
    if name not in nodes:
      nodes[name] = Node(name, "_ReadRef", [(src, idx)], [], {})
    return name, 0

  for node in list(nodes.values()):
    op_def = defs.get(node.op)
    if op_def is None:
      continue
    args = list(op_def.input_arg)
    for k, (src, idx) in enumerate(node.inputs):
      arg = args[min(k, len(args) - 1)] if args else None
      if src in ref_out and not (arg is not None and arg.is_ref):
        node.inputs[k] = read(src, idx)
  return [read(*ref) if ref[0] in ref_out else ref for ref in outputs]


_FLOW_WRITES = frozenset({"TensorArrayWriteV3", "TensorArrayScatterV3", "TensorArraySplitV3"})
_FLOW_READS = _FLOW_WRITES | {"TensorArrayReadV3", "TensorArrayGatherV3", "TensorArrayConcatV3"}
_PASS_THROUGH = ENTER | EXIT | NEXT | MERGE | SWITCH | {"Identity", "AddN"}


def _source(nodes: dict[str, Node], ref: tuple[str, int]) -> tuple[Node | None, int]:
  """The node behind `ref`, seen through Identity and control-flow forwarding."""
  seen = set()
  while ref[0] in nodes and ref[0] not in seen:
    seen.add(ref[0])
    node = nodes[ref[0]]
    if node.op not in _PASS_THROUGH or not node.inputs:
      return node, ref[1]
    ref = node.inputs[0]
  return None, 0


def _flow_kind(nodes: dict[str, Node], ref: tuple[str, int]) -> str | None:
  """Whether a TensorArray flow carries a forward array ("forward") or a gradient array ("grad")."""
  node, _ = _source(nodes, ref)
  if node is None:
    return None
  if node.op == "TensorArrayV3":
    return "forward"
  if node.op == "TensorArrayGradV3":
    return "grad"
  if node.op in _FLOW_WRITES:
    handle, _ = _source(nodes, node.inputs[0])
    return "grad" if handle is not None and handle.op == "TensorArrayGradV3" else "forward"
  return None


def _link_tensor_array_gradients(nodes: dict[str, Node]) -> None:
  """TF keeps one gradient array per (array, source) that many ops write, ordered by flows
  that may be the forward array's; here flows carry the data, so an op on a gradient handle
  whose flow is still the forward one starts from zeros, and the `AddN` of flows sums them (as does
  the `Add` that sums them over a gradient loop's steps, from a scalar zero)."""
  for node in nodes.values():
    if node.op in _FLOW_READS:
      handle, _ = _source(nodes, node.inputs[0])
      if handle is not None and handle.op == "TensorArrayGradV3" and _flow_kind(nodes, node.inputs[-1]) == "forward":
        node.attrs["_fresh_gradient"] = True
    elif node.op in ("AddN", "Add", "AddV2") and any(_flow_kind(nodes, ref) is not None for ref in node.inputs):
      node.op = "_TensorArrayFlowAddN"   # Add: a loop's sum of a gradient array's flows, from a scalar 0


def _assign_frames(nodes: dict[str, Node]) -> tuple[dict[str, str], dict[str, str]]:
  """The loop frame of every node ("" at the top) and each frame's parent frame."""
  frames: dict[str, str] = {}
  parents: dict[str, str] = {}
  depth = {"": 0}
  for name in _topo_order(nodes):
    node = nodes[name]
    ins = [frames[src] for src, _ in node.inputs if src in frames and nodes[src].op not in NEXT]
    if not ins:
      ins = [frames[c] for c in node.control_inputs if c in frames]
    outer = max(ins, key=lambda f: depth[f]) if ins else ""
    if node.op in ENTER:
      frame = node.attrs.get("frame_name")
      parents.setdefault(frame, outer)
      depth.setdefault(frame, depth[outer] + 1)
      frames[name] = frame
    elif node.op in EXIT:
      frames[name] = parents.get(outer, "")
    else:
      frames[name] = outer
  return frames, parents


def _inside(frame: str, ancestor: str, parents: dict[str, str]) -> bool:
  while frame:
    if frame == ancestor:
      return True
    frame = parents.get(frame, "")
  return ancestor == ""


def _consumers(nodes: dict[str, Node]) -> dict[str, list[str]]:
  found: dict[str, list[str]] = {}
  for name, node in nodes.items():
    for src in {s for s, _ in node.inputs} | set(node.control_inputs):
      found.setdefault(src, []).append(name)
  return found


class _Closure:
  """Maps references to values outside a new function onto extra placeholder inputs."""

  def __init__(self, fn_nodes: dict[str, Node], tag: str):
    self.fn_nodes, self.tag = fn_nodes, tag
    self.refs: list[tuple[str, int]] = []    # outside tensors, in input order
    self.names: list[str] = []

  def ref(self, src: str, idx: int) -> tuple[str, int]:
    if src in self.fn_nodes:
      return src, idx
    if (src, idx) not in self.refs:
      name = f"{src}:{idx}/_{self.tag}_capture"
      self.refs.append((src, idx))
      self.names.append(name)
      self.fn_nodes[name] = _placeholder(name)
    return self.names[self.refs.index((src, idx))], 0

  def fix(self, node: Node, remap: dict) -> None:
    """Redirects `node`'s inputs through `remap`, captures outside values, drops outside control deps."""
    node.inputs = [self.ref(*remap.get(ref, ref)) for ref in node.inputs]
    node.control_inputs = [remap.get(c, c) for c in node.control_inputs]
    node.control_inputs = [c for c in node.control_inputs if c is not None and c in self.fn_nodes]


def _replace_references(nodes: dict[str, Node], removed: set[str], stand_in: str) -> None:
  """Control dependencies on removed nodes now wait for `stand_in`."""
  for node in nodes.values():
    if any(c in removed for c in node.control_inputs):
      kept = [c for c in node.control_inputs if c not in removed]
      node.control_inputs = kept + ([stand_in] if stand_in not in kept and stand_in != node.name else [])
    for src, _ in node.inputs:
      if src in removed:
        raise V1ControlFlowError(f"node {node.name!r} reads {src!r} from inside a v1 loop or cond without "
                                 "an Exit or Merge; jaxport cannot recover this structure")


# --------------------------------------------------------------------------- stacks


def _thread_stacks(nodes: dict[str, Node]) -> None:
  """Rewrites each v1 stack into a TensorList carried by the loop that pushes onto it (out through an
  Exit) and by the loop that pops from it: plain loop variables, which `_rewrite_loop` handles."""
  stacks = [n for n in nodes.values() if n.op == "StackV2"]
  if not stacks:
    return
  frames, parents = _assign_frames(nodes)
  conds = {frames[n.name]: n.name for n in nodes.values() if n.op == "LoopCond"}
  stack_ops = {n.name for n in nodes.values() if n.op in STACKS}
  for name in [n.name for n in nodes.values() if n.op == "ControlTrigger"]:
    if set(nodes[name].control_inputs) <= stack_ops:   # f_sync/b_sync: the lists' data order the steps
      _drop_control_node(nodes, name)
  for node in nodes.values():
    if node.op == "StackCloseV2":   # the lists need no closing; what waited for it still waits
      node.op, node.inputs, node.attrs = "NoOp", [], {}
  consumers = _consumers(nodes)
  for stack in stacks:
    push_enter, push, pop_enter, pop = _push_and_pop(nodes, consumers, frames, parents, conds, stack)
    for ref in [(n, k) for n in consumers.get(push.name, []) for k, r in enumerate(nodes[n].inputs)
                if r == (push.name, 0)]:   # StackPushV2 passes its element on
      nodes[ref[0]].inputs[ref[1]] = push.inputs[1]
    if _only_orders(nodes, consumers, pop.name):   # a TensorArray's flow, pushed to order its gradient
      for node in (stack, push_enter, pop_enter):
        del nodes[node.name]
      nodes[push.name] = _copy(push, op="NoOp", inputs=[], attrs={})
      dtype = pop.attrs.get("elem_type")
      nodes[pop.name] = Node(pop.name, "Const", [], list(pop.control_inputs),
                             {"value": np.zeros((), dtype), "dtype": dtype})
      continue
    dtype = stack.attrs.get("elem_type")
    shape = _const(nodes, f"{stack.name}/_jaxport_element_shape", np.int32(-1))
    limit = _const(nodes, f"{stack.name}/_jaxport_max_elements", np.int32(-1))
    nodes[stack.name] = _copy(stack, op="EmptyTensorList", inputs=[shape, limit],
                              attrs={"element_dtype": dtype, "shape_type": np.dtype(np.int32)})
    pushed = _loop_variable(nodes, push_enter, conds[frames[push.name]])
    nodes[push.name] = _copy(push, op="TensorListPushBack", inputs=[pushed, push.inputs[1]],
                             attrs={"element_dtype": dtype, "_outside_cond": True})
    _close_loop_variable(nodes, push_enter, (push.name, 0), exit_needed=True)
    pop_enter.inputs = [(f"{push_enter.name}/_jaxport_exit", 0)]
    popped = _loop_variable(nodes, pop_enter, conds[frames[pop.name]])
    pop_list = f"{pop.name}/_jaxport_pop"
    nodes[pop_list] = Node(pop_list, "TensorListPopBack", [popped, shape], list(pop.control_inputs),
                           {"element_dtype": dtype, "_outside_cond": True})
    nodes[pop.name] = Node(pop.name, "Identity", [(pop_list, 1)], [], {"T": dtype})
    _close_loop_variable(nodes, pop_enter, (pop_list, 0), exit_needed=False)


def _push_and_pop(nodes, consumers, frames, parents, conds, stack: Node):
  """The Enter and StackPushV2 of the loop that pushes onto `stack`, and those of the loop that pops."""
  uses = [nodes[c] for c in consumers.get(stack.name, []) if nodes[c].op != "NoOp"]
  if frames[stack.name] or any(parents.get(frames[u.name]) != "" for u in uses if u.op in ENTER):
    _refuse_stack(stack, "its loops are nested in other loops")
  found = {}
  for enter in uses:
    users, handle = _through_switches(nodes, consumers, enter) if enter.op in ENTER else ([], None)
    if len(users) == 1 and users[0].inputs[0][0] == handle and users[0].op in ("StackPushV2", "StackPopV2"):
      found.setdefault(users[0].op, []).append((enter, users[0]))
    elif any(u.op in ENTER for u in users):
      _refuse_stack(stack, "its loops are nested in other loops")
    else:
      _refuse_stack(stack, "it is not used as one push and one pop")
  if sorted(found) != ["StackPopV2", "StackPushV2"] or any(len(v) != 1 for v in found.values()):
    _refuse_stack(stack, "it is not used as one push and one pop")
  (push_enter, push), = found["StackPushV2"]
  (pop_enter, pop), = found["StackPopV2"]
  if any(frames[e.name] not in conds for e in (push_enter, pop_enter)):
    _refuse_stack(stack, "it is not pushed and popped by while loops")
  return push_enter, push, pop_enter, pop


def _through_switches(nodes, consumers, enter: Node) -> tuple[list[Node], str]:
  """The users of a stack's Enter, seen through the Switches of the conds (in the loop) that push or
  pop it in a branch; those Switches are removed: the push and the pop run at every step, outside
  the conds (the cond gives the value pushed, zeros when its branch is not taken)."""
  handle = enter.name
  users = [nodes[c] for c in consumers.get(handle, [])]
  while len(users) == 1 and users[0].op in SWITCH and users[0].inputs[0][0] == handle:
    if handle != enter.name:
      del nodes[handle]
    handle = users[0].name
    users = [nodes[c] for c in consumers.get(handle, [])]
  if handle != enter.name:
    del nodes[handle]
  return users, handle


def _only_orders(nodes, consumers, name: str) -> bool:
  """Whether `name`'s value is only waited for: read by control edges, or by Identities only waited for."""
  for user in consumers.get(name, []):
    node = nodes[user]
    if any(src == name for src, _ in node.inputs) and not (node.op == "Identity" and _only_orders(nodes, consumers, user)):
      return False
  return True


def _drop_control_node(nodes: dict[str, Node], name: str) -> None:
  del nodes[name]
  for node in nodes.values():
    if name in node.control_inputs:
      node.control_inputs = [c for c in node.control_inputs if c != name]


def _refuse_stack(stack: Node, why: str) -> None:
  error = UnsupportedOperationsError({"StackV2": [stack.name]})
  error.add_note(f"This v1 stack carries the in-graph gradient of a v1 while loop (tf.gradients through "
                 f"tf.compat.v1.while_loop), but {why}. Convert the forward graph and take jax.grad of it "
                 "instead, or build the graph with control flow v2 (tf.compat.v1.enable_control_flow_v2()).")
  raise error


def _const(nodes: dict[str, Node], name: str, value) -> tuple[str, int]:
  nodes[name] = Node(name, "Const", [], [], {"value": np.asarray(value), "dtype": np.asarray(value).dtype})
  return name, 0


def _loop_variable(nodes: dict[str, Node], enter: Node, loop_cond: str) -> tuple[str, int]:
  """Turns the loop-invariant `enter` into a loop variable's Enter → Merge → Switch; returns the
  variable's value inside the body."""
  enter.attrs = {**enter.attrs, "is_constant": False, "T": VARIANT}
  base = enter.name
  nodes[f"{base}/_jaxport_merge"] = Node(f"{base}/_jaxport_merge", "Merge",
                                         [(enter.name, 0), (f"{base}/_jaxport_next", 0)], [], {"T": VARIANT})
  nodes[f"{base}/_jaxport_switch"] = Node(f"{base}/_jaxport_switch", "Switch",
                                          [(f"{base}/_jaxport_merge", 0), (loop_cond, 0)], [], {"T": VARIANT})
  nodes[f"{base}/_jaxport_body"] = Node(f"{base}/_jaxport_body", "Identity", [(f"{base}/_jaxport_switch", 1)], [],
                                        {"T": VARIANT})
  return f"{base}/_jaxport_body", 0


def _close_loop_variable(nodes: dict[str, Node], enter: Node, value: tuple[str, int], exit_needed: bool) -> None:
  base = enter.name
  nodes[f"{base}/_jaxport_next"] = Node(f"{base}/_jaxport_next", "NextIteration", [value], [], {"T": VARIANT})
  if exit_needed:
    nodes[f"{base}/_jaxport_exit"] = Node(f"{base}/_jaxport_exit", "Exit", [(f"{base}/_jaxport_switch", 0)], [],
                                          {"T": VARIANT})


# --------------------------------------------------------------------------- scopes


def _rewrite_scope(nodes: dict[str, Node], frame: str, frames, parents, library: Library) -> dict[str, Node]:
  """Rewrites the child loop frames of `frame` among `nodes`, then the conds left at this level."""
  children = sorted({frames[n] for n in nodes if n in frames and parents.get(frames[n]) == frame
                     and frames[n] != frame})
  for child in children:
    _rewrite_loop(nodes, child, frames, parents, library)
  _rewrite_conds(nodes, library)
  return nodes


def _rewrite_loop(nodes: dict[str, Node], frame: str, frames, parents, library: Library) -> None:
  members = {n: node for n, node in nodes.items() if n in frames and _inside(frames[n], frame, parents)}
  direct = {n: node for n, node in members.items() if frames[n] == frame}
  consumers = _consumers(members)
  enters = [n for n in direct.values() if n.op in ENTER]
  loop_enters = [e for e in enters if not e.attrs.get("is_constant")]
  const_enters = [e for e in enters if e.attrs.get("is_constant")]
  loop_conds = [n for n in direct.values() if n.op == "LoopCond"]
  if len(loop_conds) != 1:
    raise V1ControlFlowError(f"v1 loop frame {frame!r} has {len(loop_conds)} LoopCond nodes, expected 1")
  loop_cond = loop_conds[0]
  merges, nexts, switches = [], [], []
  for enter in loop_enters:
    merge = next((members[c] for c in consumers.get(enter.name, []) if members[c].op in MERGE), None)
    if merge is None:
      raise V1ControlFlowError(f"loop variable Enter {enter.name!r} of frame {frame!r} feeds no Merge")
    nxt = next((members[s] for s, _ in merge.inputs if s in members and members[s].op in NEXT), None)
    switch = next((members[c] for c in consumers.get(merge.name, []) if members[c].op in SWITCH
                   and members[c].inputs[1] == (loop_cond.name, 0)), None)
    if nxt is None or switch is None:
      raise V1ControlFlowError(f"loop variable {merge.name!r} of frame {frame!r} has no NextIteration or Switch")
    merges.append(merge)
    nexts.append(nxt)
    switches.append(switch)

  tag = f"v1_loop{next(_ids)}"
  skip = {n.name for n in enters + nexts + switches + [loop_cond]}
  fn_nodes: dict[str, Node] = {}
  for name, node in members.items():
    if name not in skip:
      fn_nodes[name] = _copy(node)
  for merge in merges:
    fn_nodes[merge.name] = _placeholder(merge.name, merge.attrs.get("T"))
  for enter in const_enters:
    fn_nodes[enter.name] = _placeholder(enter.name, enter.attrs.get("T"))
  remap = {}
  for merge, switch in zip(merges, switches):
    remap[(switch.name, 1)] = (merge.name, 0)
    remap[switch.name] = merge.name
  closure = _Closure(fn_nodes, tag)
  for name in list(fn_nodes):
    closure.fix(fn_nodes[name], remap)
  pred = closure.ref(*remap.get(loop_cond.inputs[0], loop_cond.inputs[0]))
  next_values = [closure.ref(*remap.get(n.inputs[0], n.inputs[0])) for n in nexts]
  for name in closure.names:
    frames[name] = frame
  fn_nodes = _rewrite_scope(fn_nodes, frame, frames, parents, library)

  invariants = [e.name for e in const_enters] + closure.names
  arg_names = [m.name for m in merges] + invariants
  cond_fn = GraphFunction(f"__{tag}_cond", fn_nodes, arg_names, [pred])
  body_fn = GraphFunction(f"__{tag}_body", fn_nodes, arg_names, next_values + [(n, 0) for n in invariants])
  library.add(cond_fn)
  library.add(body_fn)

  while_name = f"{frame}/_jaxport_{tag}"
  outside_controls = sorted({c for e in enters for c in e.control_inputs if c not in members})
  nodes[while_name] = Node(while_name, "While",
                           [e.inputs[0] for e in loop_enters] + [e.inputs[0] for e in const_enters] + closure.refs,
                           outside_controls,
                           {"cond": FuncAttr(cond_fn.name, {}), "body": FuncAttr(body_fn.name, {}),
                            "T": [m.attrs.get("T") for m in merges]})
  frames[while_name] = parents.get(frame, "")
  for name in members:
    del nodes[name]
  exits = {}
  for name, node in nodes.items():
    if node.op in EXIT and node.inputs and node.inputs[0][0] in {s.name for s in switches}:
      i = [s.name for s in switches].index(node.inputs[0][0])
      exits[name] = Node(name, "Identity", [(while_name, i)], [], {"T": node.attrs.get("T")})
  nodes.update(exits)
  _replace_references({n: v for n, v in nodes.items() if n != while_name}, set(members), while_name)


# --------------------------------------------------------------------------- conds


def _canonical(nodes: dict[str, Node], ref: tuple[str, int]) -> tuple[str, int]:
  """A predicate seen through Identity nodes (`cond/pred_id`)."""
  while ref[1] == 0 and ref[0] in nodes and nodes[ref[0]].op == "Identity":
    ref = nodes[ref[0]].inputs[0]
  return ref


def _rewrite_conds(nodes: dict[str, Node], library: Library) -> None:
  while True:
    groups: dict[tuple[str, int], list[str]] = {}
    for name, node in nodes.items():
      if node.op in SWITCH:
        groups.setdefault(_canonical(nodes, node.inputs[1]), []).append(name)
    if not groups:
      return
    order = _topo_order(nodes)
    regions = [r for pred, names in groups.items() for r in _cond_regions(nodes, order, pred, set(names))]
    innermost = [r for r in regions if not any(nodes[n].op in SWITCH for n in r["side"])]
    if not innermost:
      raise V1ControlFlowError("could not find an innermost v1 cond among Switch nodes "
                               f"{sorted(n for names in groups.values() for n in names)[:5]}")
    for region in innermost:
      _rewrite_cond(nodes, region, library)


def _cond_regions(nodes, order, pred, switches: set[str]) -> list[dict]:
  """The conds on `pred`: their switches, the side (0 else, 1 then) of every branch node, their merges.

  `tf.gradients` of a v1 cond builds a second cond on the same predicate, whose nodes read the first
  one's branch values directly (TF's dead tensors keep them consistent). It starts after the first
  one's merges, so each node gets a *level*, the number of merges on `pred` before it: a node that
  reads the branch of a lower level's cond stays in its own level's cond, and that read becomes an
  output of the earlier cond (`_rewrite_cond`'s exports), so neither If waits for the other.
  """
  side: dict[str, int] = {}
  merges: list[str] = []
  origin: dict[str, str] = {}   # node -> a switch it comes from (to split conds sharing a predicate)
  level: dict[str, int] = {}
  parent = {s: s for s in switches}

  def find(s):
    while parent[s] != s:
      s = parent[s]
    return s

  def union(a, b):
    parent[find(a)] = find(b)

  for name in order:
    node = nodes[name]
    level[name] = max((level.get(d, 0) for d in [src for src, _ in node.inputs] + node.control_inputs), default=0)
    if name in switches:
      continue
    found: list[tuple[int | None, str]] = []   # (side, or None for a control edge from a switch; origin)
    for src, idx in node.inputs:
      if src in switches:
        found.append((idx, src))
      elif src in side:
        found.append((side[src], origin[src]))
    for c in node.control_inputs:
      if c in switches:
        found.append((None, c))
      elif c in side:
        found.append((side[c], origin[c]))
    sides = {b for b, _ in found if b is not None}
    if not sides or node.attrs.get("_outside_cond"):   # a v1 stack's push or pop: every step, whatever the branch
      continue
    if len(sides) == 2:
      if node.op not in MERGE:
        raise V1ControlFlowError(f"node {node.name!r} reads both branches of a v1 cond but is not a Merge")
      for _, s in found[1:]:
        union(found[0][1], s)
      merges.append(name)
      origin[name] = found[0][1]
      level[name] += 1
      continue
    top = max(level[s] for _, s in found)
    own = [s for _, s in found if level[s] == top]   # lower levels: reads of an earlier cond's branch
    for s in own[1:]:
      union(own[0], s)
    side[name] = sides.pop()
    origin[name] = own[0]
  regions: dict[str, dict] = {}
  for s in switches:
    regions.setdefault(find(s), {"pred": pred, "switches": [], "side": {}, "merges": []})["switches"].append(s)
  for name, b in side.items():
    regions[find(origin[name])]["side"][name] = b
  for name in merges:
    regions[find(origin[name])]["merges"].append(name)
  return list(regions.values())


def _rewrite_cond(nodes: dict[str, Node], region: dict, library: Library) -> None:
  switches = [n for n in region["switches"] if n in nodes]
  side, merges = region["side"], region["merges"]
  tag = f"v1_cond{next(_ids)}"
  operands: list[tuple[str, int]] = []
  for s in switches:
    if nodes[s].inputs[0] not in operands:
      operands.append(nodes[s].inputs[0])
  consumers = _consumers(nodes)
  wants_index = [m for m in merges if any((m, 1) in nodes[c].inputs for c in consumers.get(m, []))]
  inside = set(side) | set(merges) | set(switches)
  exports = list(dict.fromkeys(ref for name in side for c in consumers.get(name, []) if c not in inside
                               for ref in nodes[c].inputs if ref[0] == name))   # read by a later cond

  branches, closures = [], []
  shared_refs: list[tuple[str, int]] = []
  for b in (0, 1):
    fn_nodes = {name: _copy(nodes[name]) for name, s in side.items() if s == b}
    args = [f"{src}:{idx}/_{tag}_arg" for src, idx in operands]
    for a in args:
      fn_nodes[a] = _placeholder(a)
    remap = {}
    for s in switches:
      remap[(s, b)] = (args[operands.index(nodes[s].inputs[0])], 0)
      remap[s] = None
    closure = _Closure(fn_nodes, f"{tag}_{b}")
    for name in list(fn_nodes):
      if name in side:
        closure.fix(fn_nodes[name], remap)
    outs = []
    for m in merges:
      ref = next(r for r in nodes[m].inputs if (r[0] in switches and r[1] == b) or side.get(r[0]) == b)
      out = closure.ref(*remap.get(ref, ref))
      if nodes[m].op == "RefMerge":   # a branch returning a ref returns its value
        fn_nodes[f"{m}/_{tag}_{b}_read"] = Node(f"{m}/_{tag}_{b}_read", "_ReadRef", [out], [], {})
        out = (f"{m}/_{tag}_{b}_read", 0)
      outs.append(out)
    for m in wants_index:
      const = f"{m}/_{tag}_index"
      fn_nodes[const] = Node(const, "Const", [], [], {"value": np.int32(b), "dtype": np.dtype(np.int32)})
      outs.append((const, 0))
    for src, idx in exports:   # the other branch has no such value: the If fills in zeros (`_one_sided`)
      if side[src] != b:
        src, idx = _const(fn_nodes, f"{src}:{idx}/_{tag}_{b}_stand_in", np.float32(0))
      outs.append((src, idx))
    branches.append((fn_nodes, args, outs))
    closures.append(closure)
    shared_refs += [r for r in closure.refs if r not in shared_refs]

  names = []
  for b, ((fn_nodes, args, outs), closure) in enumerate(zip(branches, closures)):
    captures = []
    for ref in shared_refs:   # both branches take every captured value, in one order
      if ref in closure.refs:
        captures.append(closure.names[closure.refs.index(ref)])
      else:
        name = f"{ref[0]}:{ref[1]}/_{tag}_{b}_unused"
        fn_nodes[name] = _placeholder(name)
        captures.append(name)
    fn = GraphFunction(f"__{tag}_{'then' if b else 'else'}", fn_nodes, args + captures, outs)
    library.add(fn)
    names.append(fn.name)

  if_name = f"{merges[0] if merges else switches[0]}/_jaxport_{tag}"
  first_export = len(merges) + len(wants_index)
  nodes[if_name] = Node(if_name, "If", [region["pred"]] + operands + shared_refs, [],
                        {"then_branch": FuncAttr(names[1], {}), "else_branch": FuncAttr(names[0], {}),
                         "Tout": [nodes[m].attrs.get("T") for m in merges] + [np.dtype(np.int32)] * len(wants_index)
                         + [None] * len(exports),
                         "_one_sided": {first_export + j: side[src] for j, (src, _) in enumerate(exports)}})
  removed = set(side) | set(switches)
  through = {(s, k): nodes[s].inputs[0] for s in switches for k in (0, 1)}   # a later cond reads a switch
  through.update({ref: (if_name, first_export + j) for j, ref in enumerate(exports)})
  for name in removed:
    del nodes[name]
  for j, m in enumerate(merges):
    nodes[m] = Node(m, "Identity", [(if_name, j)], [], {"T": nodes[m].attrs.get("T")})
  for k, m in enumerate(wants_index):
    through[(m, 1)] = (if_name, len(merges) + k)
  for node in nodes.values():
    if node.name != if_name:
      node.inputs = [through.get(ref, ref) for ref in node.inputs]
  _replace_references({n: v for n, v in nodes.items() if n != if_name}, removed, if_name)
