"""StableHLO rng_bit_generator (bit-exact against XLA) and the keyless rng, plus jax.random round trips."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxport
from hlo_support import as_fn, exported
from jaxport.convert import stablehlo


def _interpreted(f, *args):
  module, exp = exported(f, *args)
  return as_fn(module), exp, module


def _same(got, want):
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)


def _check_exact(f, *args):
  """The interpreted module gives XLA's bits under jit; eager with NumPy args (constants: NumPy where the
  interpreter can) integer results too, float ones to an ulp (compiled, XLA fuses a multiply-add)."""
  g, exp, module = _interpreted(f, *args)
  want = exp.call(*args)
  _same(jax.jit(g)(*args), want)
  for got in (g(*args),):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-7)
                 if np.asarray(b).dtype.kind == "f" else np.testing.assert_array_equal(a, b), got, want)
  return g, module


RBG_KEY = np.asarray(jax.random.key_data(jax.random.key(42, impl="rbg")))   # ui32[4]


@pytest.mark.parametrize("algorithm", ["RNG_DEFAULT", "RNG_THREE_FRY", "RNG_PHILOX"])
@pytest.mark.parametrize("dtype, shape", [(np.uint32, (2, 3)), (np.uint8, (5,)), (np.uint16, (3, 1, 2))])
def test_rng_bit_generator_is_bit_exact(algorithm, dtype, shape):
  f = lambda k: lax.rng_bit_generator(k, shape, dtype, algorithm=lax.RandomAlgorithm[algorithm])
  g, module = _check_exact(f, RBG_KEY[:4])
  assert "stablehlo.rng_bit_generator" in module.op_names()


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_keys_bits_normal_split(impl):
  key = np.asarray(jax.random.key_data(jax.random.key(7, impl=impl)))
  wrap = lambda k: jax.random.wrap_key_data(k, impl=impl)
  _check_exact(lambda k: jax.random.bits(wrap(k), (4,)), key)
  _check_exact(lambda k: jax.random.normal(wrap(k), (2, 3)), key)
  _check_exact(lambda k: jax.random.key_data(jax.random.split(wrap(k), 3)), key)


def test_rbg_under_vmap():
  keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(i, impl="rbg"))) for i in range(3)])
  f = lambda k: jax.random.uniform(jax.random.wrap_key_data(k, impl="rbg"), (4,))
  g, _, _ = _interpreted(f, keys[0])
  _same(jax.vmap(g)(keys), jax.vmap(f)(keys))


THREEFRY_KEY = np.asarray(jax.random.key_data(jax.random.key(3)))


def test_threefry_jax_random_round_trips_exactly():
  wrap = jax.random.wrap_key_data
  _check_exact(lambda k: jax.random.normal(wrap(k), (2, 3)), THREEFRY_KEY)
  _check_exact(lambda k: jax.random.key_data(jax.random.split(wrap(k), 4)), THREEFRY_KEY)
  _check_exact(lambda k: jax.random.bits(wrap(k), (5,), jnp.uint8), THREEFRY_KEY)
  _check_exact(lambda k: jax.random.uniform(wrap(k), (3,), minval=-2.0, maxval=1.0), THREEFRY_KEY)


@pytest.mark.parametrize("algorithm", ["RNG_THREE_FRY", "RNG_PHILOX"])
def test_64_bit_bits_with_x64(algorithm):
  f = lambda k: lax.rng_bit_generator(k, (3,), np.uint64, algorithm=lax.RandomAlgorithm[algorithm])
  with jax.enable_x64(True):
    _check_exact(f, RBG_KEY[:4])


def test_64_bit_bits_without_x64_are_exact_and_come_back_narrowed():
  """The op runs in scoped x64 mode; its ui64 result reaches a caller without x64 narrowed, as JAX narrows."""
  module = stablehlo.load_module("""
    func.func @main(%s: tensor<2xui64>) -> tensor<3xui64> {
      %0, %1 = stablehlo.rng_bit_generator %s, algorithm = THREE_FRY
          : (tensor<2xui64>) -> (tensor<2xui64>, tensor<3xui64>)
      return %1 : tensor<3xui64>
    }""")
  if jax.config.jax_enable_x64:
    pytest.skip("x64 is on")
  state = np.array([1, 2], np.uint64)
  with jax.enable_x64(True):
    want = np.asarray(stablehlo.call_module(module, [state])[0])
  assert want.dtype == np.uint64 and np.any(want >> np.uint64(32))
  got = stablehlo.call_module(module, [state])[0]
  assert got.dtype == np.uint32
  np.testing.assert_array_equal(got, (want & np.uint64(0xFFFFFFFF)).astype(np.uint32))


def test_philox_with_a_three_word_state_matches_tensorflow():
  tf = pytest.importorskip("tensorflow")
  fn = tf.function(lambda s: tf.random.stateless_uniform([2, 5], s, alg="philox"), jit_compile=True,
                   autograph=False)
  module = stablehlo.load_module(fn.experimental_get_compiler_ir(tf.TensorSpec([2], tf.int32))(
      stage="stablehlo_serialized"))
  ops = module.op_names()
  assert "stablehlo.rng_bit_generator" in ops
  assert not stablehlo.unsupported_ops(module), stablehlo.unsupported_ops(module)
  seed = np.array([12, -34], np.int32)
  want = fn(tf.constant(seed)).numpy()
  _same(stablehlo.call_module(module, [seed])[0], want)   # a constant seed: the ui64 state stays NumPy
  with jax.enable_x64(True):   # a traced seed: the ui64 arithmetic needs x64
    _same(jax.jit(lambda s: stablehlo.call_module(module, [s])[0])(seed), want)


def test_three_word_philox_state_advances_by_blocks():
  # 7 ui32 values take two 128-bit Philox blocks: the counter moves by 2, carrying into the high word.
  module = stablehlo.load_module("""
    func.func @main(%s: tensor<3xui64>) -> (tensor<3xui64>, tensor<7xui32>) {
      %0, %1 = stablehlo.rng_bit_generator %s, algorithm = PHILOX : (tensor<3xui64>) -> (tensor<3xui64>, tensor<7xui32>)
      return %0, %1 : tensor<3xui64>, tensor<7xui32>
    }""")
  state = np.array([5, 2**64 - 1, 9], np.uint64)
  new, bits = stablehlo.call_module(module, [state])   # a constant state: NumPy all the way, x64 or not
  assert isinstance(new, np.ndarray) and isinstance(bits, np.ndarray)
  np.testing.assert_array_equal(new, np.array([5, 1, 10], np.uint64))
  assert bits.shape == (7,) and bits.dtype == np.uint32
  run = jax.jit(lambda s: stablehlo.call_module(module, [s]))
  with jax.enable_x64(True):   # a traced ui64 state
    new64, bits64 = run(jnp.asarray(state))
    np.testing.assert_array_equal(new64, new)
    np.testing.assert_array_equal(bits64, bits)
  if not jax.config.jax_enable_x64:   # traced ui32 word pairs, as jax's rbg keys travel without x64
    pairs = state.view(np.uint32).reshape(3, 2)
    new32, bits32 = run(jnp.asarray(pairs))
    np.testing.assert_array_equal(new32, new.view(np.uint32).reshape(3, 2))
    np.testing.assert_array_equal(bits32, bits)


# --------------------------------------------------------------------------- keyless stablehlo.rng

KEYLESS = """
  func.func @main() -> (tensor<1000xf32>, tensor<1000xi32>, tensor<2x500xf32>) {
    %a = stablehlo.constant dense<2.0> : tensor<f32>
    %b = stablehlo.constant dense<5.0> : tensor<f32>
    %lo = stablehlo.constant dense<-3> : tensor<i32>
    %hi = stablehlo.constant dense<4> : tensor<i32>
    %s = stablehlo.constant dense<1000> : tensor<1xi64>
    %s2 = stablehlo.constant dense<[2, 500]> : tensor<2xi64>
    %0 = stablehlo.rng %a, %b, %s, distribution = UNIFORM
        : (tensor<f32>, tensor<f32>, tensor<1xi64>) -> tensor<1000xf32>
    %1 = stablehlo.rng %lo, %hi, %s, distribution = UNIFORM
        : (tensor<i32>, tensor<i32>, tensor<1xi64>) -> tensor<1000xi32>
    %2 = stablehlo.rng %a, %b, %s2, distribution = NORMAL
        : (tensor<f32>, tensor<f32>, tensor<2xi64>) -> tensor<2x500xf32>
    return %0, %1, %2 : tensor<1000xf32>, tensor<1000xi32>, tensor<2x500xf32>
  }"""


def test_keyless_rng_draws_from_the_call_rng():
  module = stablehlo.load_module(KEYLESS)
  run = jax.jit(lambda key: stablehlo.call_module(module, [], rng=key))
  uniform, ints, normal = run(jax.random.key(0))
  assert uniform.dtype == np.float32 and ints.dtype == np.int32 and normal.shape == (2, 500)
  assert 2.0 <= float(uniform.min()) and float(uniform.max()) < 5.0
  assert set(np.unique(ints)) == set(range(-3, 4))
  assert abs(float(normal.mean()) - 2.0) < 0.5 and abs(float(normal.std()) - 5.0) < 0.5
  _same(list(run(jax.random.key(0))), [uniform, ints, normal])   # a key decides the values
  assert not np.array_equal(run(jax.random.key(1))[0], uniform)


def test_keyless_rng_without_a_key_says_how_to_pass_one():
  module = stablehlo.load_module(KEYLESS)
  with pytest.raises(jaxport.errors.MissingInputError, match="rng="):
    stablehlo.call_module(module, [])


def test_tensorflow_keyless_random_ops():
  tf = pytest.importorskip("tensorflow")
  fn = tf.function(lambda: (tf.random.uniform([4], 1, 2), tf.random.normal([3])), jit_compile=True,
                   autograph=False)
  module = stablehlo.load_module(fn.experimental_get_compiler_ir()(stage="stablehlo_serialized"))
  assert "stablehlo.rng" in module.op_names()
  missing = stablehlo.unsupported_ops(module)
  assert not missing, missing
  u, n = stablehlo.call_module(module, [], rng=jax.random.key(0))
  assert u.shape == (4,) and n.shape == (3,) and 1 <= float(u.min()) and float(u.max()) < 2


def test_shape_polymorphic_rng_bit_generator():
  # A symbolic output shape lowers to the custom_call @stablehlo.dynamic_rng_bit_generator.
  f = lambda k, x: lax.rng_bit_generator(k, x.shape, jnp.uint32)[1]
  n, = jax.export.symbolic_shape("n")
  exp = jax.export.export(jax.jit(f), platforms=["cpu"])(jax.ShapeDtypeStruct((4,), jnp.uint32),
                                                         jax.ShapeDtypeStruct((n,), jnp.float32))
  module = stablehlo.load_module(exp.mlir_module_serialized)
  assert not stablehlo.unsupported_ops(module), stablehlo.unsupported_ops(module)
  x = np.zeros(5, np.float32)
  _same(jax.jit(lambda k, x: stablehlo.call_module(module, [k, x])[0])(RBG_KEY[:4], x), exp.call(RBG_KEY[:4], x))


def test_scoped_x64_arithmetic_stays_64_bit():
  """JAX without x64 writes uint64/float64 where the code asked for them in `jax.enable_x64` (jaxport's
  Philox does): the interpreter computes them in 64 bits too; narrowed, the high words were lost."""
  assert not jax.config.jax_enable_x64

  def f(x):
    with jax.enable_x64(True):
      wide = x.astype(jnp.uint64) * jnp.uint64(0xD2511F53)   # a full 64-bit product
      high = (wide >> jnp.uint64(32)).astype(jnp.uint32)
      halves = jnp.asarray(x, jnp.float64) / 3.0
      return high, (halves * 3.0 - x).astype(jnp.float32)

  x = np.array([0xFFFFFFFF, 123456789, 7], np.uint32)
  g, exp, _ = _interpreted(f, x)
  want = exp.call(x)
  assert want[0].dtype == np.uint32 and np.any(np.asarray(want[0]))
  for got in (g(x), jax.jit(g)(x)):
    _same(got, want)
    assert [np.asarray(o).dtype for o in got] == [np.uint32, np.float32]   # the caller's dtypes
