"""The op registry (`jaxport.convert.registry`) and tier resolution (`jaxport.convert.tiers`)."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import jaxport
from jaxport import config
from jaxport.convert import _tf_compat, registry, tiers
from jaxport.convert.registry import Tier, ops_where, register, rules, supported_ops

TESTS = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- every rule has a test


def test_every_registered_op_is_named_in_a_test():
  """An op's rule and its test are found by its name: each op type appears as a word in some test."""
  this = pathlib.Path(__file__).resolve()
  words = {w for p in TESTS.rglob("*.py") if p.resolve() != this for w in re.findall(r"\w+", p.read_text())}
  untested = sorted(op for op in supported_ops() if op not in words)
  assert not untested, f"{len(untested)} registered ops are named in no test under tests/: {untested}"


def test_every_op_name_is_a_literal_string_at_its_registration():
  """`register(f"Resize{op}")` would hide the op from grep: its module must spell `"OpName"`."""
  hidden = []
  for op, rule in sorted(rules().items()):
    source = pathlib.Path(sys.modules[rule.fn.__module__].__file__).read_text()
    if f'"{op}"' not in source:
      hidden.append(f"{op} ({rule.fn.__module__})")
  assert not hidden, f"op names not written as literal strings in their module: {hidden}"


def test_rules_live_in_the_ops_package():
  modules = {rule.fn.__module__ for rule in rules().values()}
  assert all(m.startswith("jaxport.convert.ops.") for m in modules), sorted(modules)


# --------------------------------------------------------------------------- register


def test_register_refuses_a_duplicate_op():
  supported_ops()   # the families are registered first
  before = rules()
  with pytest.raises(ValueError, match=r"'Sin' already has a rule: jaxport\.convert\.ops\.math"):
    register("Sin")(lambda ctx, x: x)
  assert registry.get_rule("Sin") is before["Sin"]


def test_refused_registration_registers_nothing():
  supported_ops()
  try:
    with pytest.raises(ValueError, match="'Sin' already has a rule"):
      register("JaxportTestOnlyOp", "Sin")(lambda ctx, x: x)
    assert "JaxportTestOnlyOp" not in supported_ops()
  finally:
    registry._RULES.pop("JaxportTestOnlyOp", None)


def test_register_records_the_properties():
  rule = registry.get_rule("AssignAddVariableOp")
  assert rule.op_type == "AssignAddVariableOp" and rule.writes_state and rule.structural
  assert rule.stateful   # writing state implies stateful
  sin = registry.get_rule("Sin")
  assert (sin.needs_rng, sin.writes_state, sin.stateful, sin.structural, sin.tier) == (
      False, False, False, False, Tier.NATIVE)


# --------------------------------------------------------------------------- ops_where

STATEFUL_RANDOM = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
                   "RandomShuffle", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2"}
SEED_PLUMBING = {"StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg", "StatelessRandomGetAlg"}


def test_ops_where_needs_rng():
  rng_ops = ops_where(needs_rng=True)
  assert STATEFUL_RANDOM <= rng_ops, sorted(STATEFUL_RANDOM - rng_ops)
  assert not {op for op in rng_ops if op.startswith("Stateless")}   # functions of their seed
  assert not SEED_PLUMBING & rng_ops, sorted(SEED_PLUMBING & rng_ops)
  assert SEED_PLUMBING <= supported_ops()
  assert rng_ops <= ops_where(stateful=True)
  assert not {"Sin", "MatMul", "Const"} & rng_ops


def test_seeded_streams_are_the_philox_kernels_tf_seeds():
  # the random ops' stateful draws; candidate samplers and fractional pools draw from rng alone
  assert ops_where(seeded_stream=True) == {"RandomUniform", "RandomUniformInt", "RandomStandardNormal",
                                           "TruncatedNormal", "Multinomial", "RandomShuffle", "RandomGamma",
                                           "RandomPoisson", "RandomPoissonV2"}
  assert ops_where(seeded_stream=True) <= ops_where(needs_rng=True)


def test_ops_where_writes_state_is_exactly_the_assign_training_scatter_and_generator_ops():
  assigns = {op for op in supported_ops() if re.fullmatch(r"Assign\w*VariableOp", op)}
  assert assigns == {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}
  writers = assigns | {op for op in supported_ops()   # TF1 ref forms (`ApplyAdam`, `ScatterAdd`, `Assign`) too
                       if re.fullmatch(r"(Resource)?(Sparse)?Apply\w+|(Resource)?Scatter(Nd)?(Update|Add|Sub|Mul|Div|Max|Min)"
                                       r"|ResourceStridedSliceAssign|Assign(Add|Sub)?|Rng(ReadAnd)?Skip"
                                       r"|Stateful(Uniform(Int|FullInt)?|StandardNormalV2|TruncatedNormal)", op)}
  assert {"ResourceApplyAdam", "ResourceSparseApplyAdagradV2", "ResourceScatterAdd", "RngReadAndSkip"} <= writers
  assert ops_where(writes_state=True) == writers
  assert ops_where(writes_state=True, structural=True) == writers
  assert ops_where(writes_state=True, needs_rng=True) == frozenset()


def test_ops_where_without_properties_is_every_op():
  assert ops_where() == supported_ops()
  assert {"While", "If", "ReadVariableOp", "TensorListReserve"} <= ops_where(structural=True)
  assert ops_where(tier=Tier.NATIVE) <= supported_ops()


# The hand-written list constant folding used before `size_bounded` (the floor of the property).
SIZE_BOUNDED_FLOOR = {
    "Shape", "ShapeN", "Size", "Rank", "BroadcastArgs", "BroadcastGradientArgs", "ConcatOffset",
    "Reshape", "Squeeze", "ExpandDims", "Transpose", "Pack", "Unpack", "ConcatV2", "Concat", "Split",
    "SplitV", "Slice", "StridedSlice", "GatherV2", "Gather", "GatherNd", "Select", "SelectV2", "Cast",
    "ReverseV2", "Roll", "Unique", "TopKV2", "Add", "AddV2", "AddN", "Sub", "Mul", "Div", "RealDiv",
    "DivNoNan", "FloorDiv", "FloorMod", "Mod", "TruncateDiv", "TruncateMod", "Maximum", "Minimum", "Neg",
    "Abs", "Sign", "Floor", "Ceil", "Round", "Rint", "Sqrt", "Rsqrt", "Square", "SquaredDifference",
    "Reciprocal", "Inv", "Pow", "Exp", "Expm1", "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Sigmoid",
    "Erf", "Atan2", "Relu", "Relu6", "Elu", "Selu", "Softplus", "Softmax", "LogSoftmax", "IsNan",
    "IsInf", "IsFinite", "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
    "LogicalAnd", "LogicalOr", "LogicalNot", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Invert",
    "LeftShift", "RightShift", "Sum", "Prod", "Max", "Min", "Mean", "All", "Any", "ArgMax", "ArgMin",
    "Cumsum", "Cumprod", "ZerosLike", "OnesLike", "MatMul", "BatchMatMul", "BatchMatMulV2",
    "BatchMatMulV3", "Einsum",
}


def test_ops_where_size_bounded():
  bounded = ops_where(size_bounded=True)
  assert SIZE_BOUNDED_FLOOR <= bounded, sorted(SIZE_BOUNDED_FLOOR - bounded)
  # Their result's size is set by their inputs' values, not sizes.
  unbounded = {"Fill", "BroadcastTo", "Tile", "Pad", "PadV2", "MirrorPad", "Range", "OneHot", "Bitcast"}
  assert unbounded <= supported_ops()
  assert not unbounded & bounded, sorted(unbounded & bounded)
  assert not registry.get_rule("Fill").size_bounded


@pytest.mark.parametrize("props", [{"bogus": 1}, {"fn": None}, {"op_type": "Sin"}])
def test_ops_where_rejects_unknown_properties(props):
  with pytest.raises(TypeError, match="unknown op property"):
    ops_where(**props)


# --------------------------------------------------------------------------- tiers


@pytest.fixture
def xla_kernels():
  """TF registers its XLA kernels lazily (see test_op_tier_sees_xla_kernels_in_a_fresh_process)."""
  _tf_compat.register_xla_kernels()
  tiers._kernel_devices.cache_clear()
  yield
  tiers._kernel_devices.cache_clear()


# Ops with no native rule that TF can both lower to XLA and run on the host.
NO_RULE_CANDIDATES = ["Cross", "TridiagonalMatMul", "RandomGammaGrad"]


def _xla_op_without_rule() -> str:
  for op in NO_RULE_CANDIDATES:
    if registry.get_rule(op) is None and tiers.has_xla_kernel(op) and tiers.has_host_kernel(op):
      return op
  pytest.fail(f"every candidate of {NO_RULE_CANDIDATES} now has a rule or lacks a kernel: add one")


def _tier(op):
  return tiers.op_tier(op, config.snapshot())


def test_native_op_is_native(xla_kernels):
  assert _tier("Sin") == Tier.NATIVE
  assert _tier("While") == Tier.NATIVE


def test_force_tier_stablehlo_moves_pure_math_not_structural_ops(xla_kernels):
  with jaxport.override_config("force_tier", "stablehlo"):
    assert _tier("Sin") == Tier.STABLEHLO
    assert _tier("MatMul") == Tier.STABLEHLO
    for op in ("While", "ReadVariableOp", "AssignVariableOp", "RandomUniform", "Const"):
      assert _tier(op) == Tier.NATIVE, op
  assert _tier("Sin") == Tier.NATIVE   # restored


def test_force_tier_callback_moves_pure_math(xla_kernels):
  with jaxport.override_config("force_tier", "callback"):
    assert _tier("Sin") == Tier.CALLBACK
    assert _tier("ReadVariableOp") == Tier.NATIVE


def test_op_without_rule_falls_back_stablehlo_then_callback_then_unsupported(xla_kernels):
  op = _xla_op_without_rule()
  assert _tier(op) == Tier.STABLEHLO
  with jaxport.override_config("allow_xla_lowering", False):
    assert _tier(op) == Tier.CALLBACK
    with jaxport.override_config("allow_host_callback", False):
      assert _tier(op) == Tier.UNSUPPORTED
  with jaxport.override_config("allow_host_callback", False):
    assert _tier(op) == Tier.STABLEHLO


@pytest.mark.parametrize("key,value", [(None, None), ("force_tier", "stablehlo"), ("force_tier", "callback")])
def test_op_unknown_to_tf_is_unsupported(xla_kernels, key, value):
  assert _tf_compat.op_def("JaxportNoSuchOp") is None
  if key is None:
    assert _tier("JaxportNoSuchOp") == Tier.UNSUPPORTED
  else:
    with jaxport.override_config(key, value):
      assert _tier("JaxportNoSuchOp") == Tier.UNSUPPORTED


def test_op_tier_sees_xla_kernels_in_a_fresh_process():
  code = textwrap.dedent("""
      import jaxport
      from jaxport import config
      from jaxport.convert import tiers
      with jaxport.override_config("force_tier", "stablehlo"):
        print(tiers.op_tier("Sin", config.snapshot()).value)
      print(tiers.op_tier("Cross", config.snapshot()).value)
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["stablehlo", "stablehlo"]



def test_ops_where_sees_a_rule_registered_after_it_was_asked():
  # ops_where's answers are kept (conversion asks per node); registering a rule forgets them.
  before = ops_where(needs_rng=True)
  assert "JaxportTestOnlyRngOp" not in before and ops_where(needs_rng=True) is before
  try:
    register("JaxportTestOnlyRngOp", needs_rng=True)(lambda ctx, x: x)
    assert "JaxportTestOnlyRngOp" in ops_where(needs_rng=True)
  finally:
    registry._RULES.pop("JaxportTestOnlyRngOp", None)
    registry._WHERE.clear()
  assert ops_where(needs_rng=True) == before


def test_row_indices_name_tf_indices_input():
  """`scatter_indices` and `gather_indices` (where padded Unique outputs may go) are TF's `indices`."""
  from tensorflow.python.framework import op_def_registry
  rules = registry.rules().items()
  scatters = {op: rule.scatter_indices for op, rule in rules if rule.scatter_indices is not None}
  gathers = {op: rule.gather_indices for op, rule in rules if rule.gather_indices is not None}
  assert {"ResourceScatterAdd", "ResourceScatterUpdate", "ResourceSparseApplyAdagradV2",
          "ResourceSparseApplyKerasMomentum", "ResourceSparseApplyFtrlV2"} <= set(scatters)
  assert {"ResourceGather", "GatherV2", "Gather"} <= set(gathers)
  for op, position in {**scatters, **gathers}.items():
    assert op_def_registry.get(op).input_arg[position].name == "indices", op
  assert not {op for op in ops_where(writes_state=True) if op.startswith("ResourceApply")} & set(scatters)


def test_elementwise_ops_are_size_bounded():
  elementwise = ops_where(elementwise=True)
  assert {"Mul", "AddV2", "Cast", "Maximum", "RealDiv", "Sqrt", "Less"} <= elementwise
  assert elementwise <= ops_where(size_bounded=True)
  assert not elementwise & {"Sum", "StridedSlice", "ReverseV2", "Transpose", "MatMul", "Softmax"}
