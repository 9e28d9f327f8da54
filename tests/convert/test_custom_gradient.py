"""@tf.custom_gradient becomes a jax.custom_vjp (config: convert_custom_gradient)."""
import jax
import numpy as np
import tensorflow as tf

import jaxport

X = np.random.RandomState(0).normal(size=(5,)).astype(np.float32)


def forward(x):
  @tf.custom_gradient
  def inner(x):
    e = tf.exp(x)

    def grad(dy):
      return dy * tf.sin(x) + e   # deliberately not the true gradient

    return tf.reduce_sum(e), grad

  return inner(x) * 2.0


def _tf_grad(fn, x):
  x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.function(fn)(x)
  return tape.gradient(y, x).numpy()


def test_custom_gradient_is_used():
  f = jaxport.convert_functional(forward, X)
  np.testing.assert_allclose(f(X), forward(X), rtol=1e-6)
  expected = _tf_grad(forward, X)
  np.testing.assert_allclose(expected, 2 * np.sin(X) + np.exp(X), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(f)(X), expected, rtol=1e-5)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(X), expected, rtol=1e-5)


def test_flag_off_differentiates_the_forward_pass():
  with jaxport.override_config("convert_custom_gradient", False):
    f = jaxport.convert_functional(forward, X)
  np.testing.assert_allclose(jax.grad(f)(X), 2 * np.exp(X), rtol=1e-5)


def test_custom_gradient_reading_a_variable_and_clipping():
  scale = tf.Variable(3.0, name="scale")

  def fn(x):
    @tf.custom_gradient
    def clip_grad(x):
      def grad(dy):
        return tf.clip_by_value(dy * scale, -1.0, 1.0)
      return tf.identity(x), grad

    return tf.reduce_sum(clip_grad(x) * x)

  jax_fn, params = jaxport.convert(fn, X)
  grad = jax.grad(lambda x: jax_fn(params, x)[0])(X)
  np.testing.assert_allclose(grad, _tf_grad(fn, X), rtol=1e-5)
  # The variable is read from params at gradient time.
  grad2 = jax.grad(lambda x: jax_fn({**params, "scale": np.float32(0.01)}, x)[0])(X)
  np.testing.assert_allclose(grad2, X + np.clip(X * 0.01, -1, 1), rtol=1e-5)


def test_vmap_of_custom_gradient():
  f = jaxport.convert_functional(forward, X)
  xs = np.stack([X, X + 1, X - 1])
  np.testing.assert_allclose(jax.vmap(jax.grad(f))(xs), np.stack([_tf_grad(forward, x) for x in xs]), rtol=1e-5)


def test_many_boundaries_traced_together_keep_their_own_gradients():
  """Several custom gradients (traced in one tf.function at conversion): each keeps its own inputs,
  captures and None gradients, including two that read the same forward tensor."""
  def fn(x, y):
    shared = tf.exp(x)

    @tf.custom_gradient
    def scaled(a):
      def grad(dy):
        return dy * shared          # reads a forward tensor another boundary reads too
      return a * 2.0, grad

    @tf.custom_gradient
    def mixed(a, b):
      def grad(dy):
        return dy * tf.cos(b), None   # no gradient for b
      return a * b, grad

    @tf.custom_gradient
    def offset(a):
      def grad(dy):
        return dy + tf.reduce_sum(shared)
      return tf.sin(a), grad

    return tf.reduce_sum(scaled(x) + mixed(x, y) + offset(y)) + tf.reduce_sum(shared * y)

  y = X[::-1].copy()
  f = jaxport.convert_functional(fn, X, y)
  np.testing.assert_allclose(f(X, y), fn(X, y), rtol=1e-5)
  xt, yt = tf.constant(X), tf.constant(y)
  with tf.GradientTape() as tape:
    tape.watch([xt, yt])
    out = tf.function(fn)(xt, yt)
  expected = [g.numpy() for g in tape.gradient(out, [xt, yt])]
  for got, want in zip(jax.grad(f, argnums=(0, 1))(X, y), expected):
    np.testing.assert_allclose(got, want, rtol=1e-5)
  for got, want in zip(jax.jit(jax.grad(f, argnums=(0, 1)))(X, y), expected):
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _grow(x):
  return tf.while_loop(lambda i, acc: tf.reduce_max(acc) < 10.0, lambda i, acc: (i + 1, acc * 2.0 + x), (0, x))[1]


def _loop_until_large(x):
  """A custom gradient around a data-dependent while loop (as TFP's Bessel functions have)."""
  @tf.custom_gradient
  def grow(x):
    y = _grow(x)

    def grad(dy):
      return dy * 3.0 * y / (x + 1.0)   # reads the loop's result: computed inside the boundary
    return y, grad

  return tf.reduce_sum(grow(x) * x)


def test_a_custom_gradient_over_a_while_loop_differentiates_in_reverse_and_forward_mode():
  """The forward computation runs inside the boundary: reverse mode never linearizes the loop (JAX
  cannot transpose a while loop), forward mode differentiates it."""
  x = np.array([0.5, 1.0, 2.0], np.float32)
  f = jaxport.convert_functional(_loop_until_large, x)
  np.testing.assert_allclose(f(x), tf.function(_loop_until_large)(x), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(x), tf.function(_loop_until_large)(x), rtol=1e-6)
  expected = _tf_grad(_loop_until_large, x)
  np.testing.assert_allclose(jax.grad(f)(x), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(x), expected, rtol=1e-6)
  xs = np.stack([x, x + 1.0])
  np.testing.assert_allclose(jax.vmap(jax.grad(f))(xs), np.stack([_tf_grad(_loop_until_large, v) for v in xs]),
                             rtol=1e-6)
  # Forward mode differentiates the forward computation (TF's ForwardAccumulator would transpose the
  # recorded gradient instead): the loop's own derivative, as TF computes it without the boundary.
  t = np.array([1.0, -1.0, 0.5], np.float32)
  xt, tt = tf.constant(x), tf.constant(t)
  with tf.autodiff.ForwardAccumulator(xt, tt) as acc:
    out = tf.function(lambda v: tf.reduce_sum(_grow(v) * v))(xt)
  np.testing.assert_allclose(jax.jvp(f, (x,), (t,))[1], acc.jvp(out), rtol=1e-5)


def test_a_custom_gradient_whose_forward_reads_a_variable_and_a_tensor_from_outside():
  """The forward graph reads a variable, a tensor computed outside the boundary and an intermediate the
  gradient captures; the variable's recorded gradient reaches params, and the intermediate is also used
  outside the boundary."""
  w = tf.Variable(np.linspace(0.5, 1.5, 3, dtype=np.float32), name="w")

  def fn(x):
    shift = tf.reduce_mean(x) * 0.1

    @tf.custom_gradient
    def layer(x):
      h = tf.tanh(x * w + shift)

      def grad(dy, variables):
        return dy * (1.0 - h * h) * w * 0.5, [tf.reduce_sum(dy * x, axis=0) * 2.0]
      return h, grad

    out = layer(x)
    return tf.reduce_sum(out * out) + tf.reduce_sum(tf.tanh(x * w + shift))

  x = np.random.RandomState(1).normal(size=(4, 3)).astype(np.float32)
  jax_fn, params = jaxport.convert(fn, x)
  loss = lambda p, v: jax_fn(p, v)[0]
  np.testing.assert_allclose(loss(params, x), tf.function(fn)(x), rtol=1e-6)
  xt = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    out = tf.function(fn)(xt)
  want_x, want_w = tape.gradient(out, [xt, w])
  for g in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
    got_p, got_x = g(params, x)
    np.testing.assert_allclose(got_x, want_x.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_p["w"], want_w.numpy(), rtol=1e-5, atol=1e-6)
