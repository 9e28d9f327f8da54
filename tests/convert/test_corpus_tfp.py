"""A corpus of TF Probability 0.25 programs: log_prob and stateless samples of the common families,
bijector flows, a GP marginal likelihood, HMC/NUTS steps and sample_chain.

Each converts, matches TF eager and under `jax.jit` (samples from stateless seeds bit for bit where
the draw is one of TF's stateless RNG ops), and takes `jax.grad` against `tf.GradientTape`.
"""
import numpy as np
import pytest
import tensorflow as tf

tfp = pytest.importorskip("tensorflow_probability", reason="tensorflow-probability==0.25 is not installed")

from corpus_support import sampled  # noqa: E402
from library_corpus import check_program  # noqa: E402

tfd, tfb = tfp.distributions, tfp.bijectors
N = 6
SEED = tf.constant([3, 7], tf.int32)   # a stateless seed: TFP draws with TF's stateless RNG ops


def _x(shape=(N,), low=-2.0, high=2.0, seed=0):
  return np.random.RandomState(seed).uniform(low, high, shape).astype(np.float32)


def _var(value, name):
  return tf.Variable(np.asarray(value, np.float32), name=name)


# --- log_prob of the common families (parameters as variables: grads w.r.t. params and x) -------
def normal():
  loc, scale = _var([0.5], "loc"), _var([1.5], "scale")
  return lambda x: tfd.Normal(loc, scale).log_prob(x), (_x(),), {}


def student_t():
  df, loc, scale = _var(4.0, "df"), _var(0.2, "loc"), _var(1.3, "scale")
  return lambda x: tfd.StudentT(df, loc, scale).log_prob(x), (_x(),), {}


def gamma():
  conc, rate = _var(2.5, "concentration"), _var(1.5, "rate")
  return lambda x: tfd.Gamma(conc, rate).log_prob(x), (_x(low=0.2, high=3.0),), {}


def beta():
  a, b = _var(2.0, "a"), _var(3.0, "b")
  return lambda x: tfd.Beta(a, b).log_prob(x), (_x(low=0.05, high=0.95),), {}


def laplace_logistic():
  loc, scale = _var(0.3, "loc"), _var(0.8, "scale")
  return lambda x: (tfd.Laplace(loc, scale).log_prob(x), tfd.Logistic(loc, scale).log_prob(x)), (_x(),), {}


def poisson():
  rate = _var(2.5, "rate")
  counts = np.array([0, 1, 2, 3, 5, 8], np.float32)
  return lambda x: tfd.Poisson(rate=rate).log_prob(x), (counts,), {}


def categorical():
  logits = _var(_x((N, 4), seed=1), "logits")
  return lambda k: tfd.Categorical(logits=logits).log_prob(k), (np.array([0, 1, 2, 3, 1, 0], np.int32),), {}


def mvn_tril():
  loc = _var(_x((3,), seed=2), "loc")
  raw = _var(_x((3, 3), seed=3) * 0.3, "scale_raw")
  fn = lambda x: tfd.MultivariateNormalTriL(loc, tfb.FillScaleTriL().forward(
      tfb.FillTriangular().inverse(raw + 2.0 * tf.eye(3)))).log_prob(x)
  return fn, (_x((N, 3), seed=4),), {}


def dirichlet():
  conc = _var([1.5, 2.0, 3.0], "concentration")
  x = np.random.RandomState(5).dirichlet([1.0, 1.0, 1.0], N).astype(np.float32)
  return lambda p: tfd.Dirichlet(conc).log_prob(p), (x,), {}


def mixture():
  logits, locs, scales = _var([0.2, -0.3], "logits"), _var([-1.0, 1.0], "locs"), _var([0.6, 0.9], "scales")
  fn = lambda x: tfd.MixtureSameFamily(tfd.Categorical(logits=logits), tfd.Normal(locs, scales)).log_prob(x)
  return fn, (_x(),), {}


# --- Stateless samples (compared bit for bit where the draw is a stateless RNG op) ---------------
def normal_sample():
  return lambda loc: tfd.Normal(loc, 2.0).sample(5, seed=SEED), (_x((3,)),), dict(exact=True, grad=False)


def uniform_categorical_sample():
  fn = lambda logits: (tfd.Uniform(-1.0, 3.0).sample(4, seed=SEED),
                       tfd.Categorical(logits=logits).sample(7, seed=SEED))
  return fn, (_x((2, 5)),), dict(exact=True, grad=False)


def gamma_sample():
  fn = lambda conc: tfd.Gamma(conc, 1.0).sample(4, seed=SEED)
  return fn, (_x((3,), low=0.5, high=3.0),), dict(grad=False, exact=True)


def gamma_reparameterized():
  """Samples differentiated with respect to the concentration (TFP's implicit reparameterization)."""
  rate = _var([1.0, 2.0, 0.5], "rate")
  fn = lambda conc: tfd.Gamma(conc, rate).sample(4, seed=SEED)
  return fn, (_x((3,), low=0.2, high=3.0),), {}


def poisson_sample():
  fn = lambda rate: tfd.Poisson(rate=rate).sample(4, seed=SEED)
  return fn, (_x((3,), low=0.5, high=4.0),), dict(grad=False, exact=True)


def binomial_sample():
  fn = lambda probs: tfd.Binomial(5.0, probs=probs).sample(4, seed=SEED)
  return fn, (_x((3,), low=0.1, high=0.9),), dict(grad=False, exact=True)


def truncated_normal_sample():
  fn = lambda loc: tfd.TruncatedNormal(loc, 1.0, -1.0, 2.0).sample(4, seed=SEED)
  return fn, (_x((3,)),), dict(grad=False)


def mvn_sample():
  fn = lambda loc: tfd.MultivariateNormalDiag(loc, [1.0, 2.0, 0.5]).sample(4, seed=SEED)
  return fn, (_x((3,)),), dict(grad=False)


# --- Special functions ----------------------------------------------------------------------------
def bessel_ive():
  """A Bessel function: a series summed by a while loop to convergence, under tf.custom_gradient."""
  return lambda z: tfp.math.bessel_ive(1.5, z), (_x(low=0.1, high=3.0),), {}


def log_bessel_kve():
  return lambda z: tfp.math.log_bessel_kve(0.5, z), (_x(low=0.1, high=3.0),), {}


KVE_UNDER_JIT = ("values: XLA:CPU computes kve's loop to convergence other than TF's CPU kernels, ulps the loop "
                 "amplifies. On these inputs TF's own XLA build is 2.3e-5 from TF's graph; jaxport under jit 2.9e-5 "
                 "(7.1e-6 from TF's XLA build), op by op (eager_jit off) 3.2e-5, its primitives being XLA's too. Two "
                 "measured ways XLA's float32 arithmetic departs from Eigen's: it contracts every multiply-add inside a "
                 "fusion into an FMA (no XLA flag turns that off, a reduce_precision between them does not stop it; "
                 "`a*b + c` under jit is the fused result on all of 1e5 float32 inputs built to show it), and its "
                 "exp/log differ by an ulp on ~15% of inputs (see ILL_CONDITIONED). Its gradient (a custom gradient "
                 "over that loop) matches")


# --- Bijector flows ------------------------------------------------------------------------------
def bijector_flow():
  shift, log_scale = _var(_x((2,), seed=6), "shift"), _var(_x((2,), seed=7) * 0.3, "log_scale")
  tril = _var(np.eye(2) + 0.2 * np.tril(_x((2, 2), seed=8), -1), "tril")
  flow = tfb.Chain([tfb.Shift(shift), tfb.ScaleMatvecTriL(tril), tfb.Scale(log_scale=log_scale),
                    tfb.Tanh(), tfb.Softplus()])
  dist = tfd.TransformedDistribution(tfd.MultivariateNormalDiag(tf.zeros(2)), tfb.Invert(tfb.Invert(flow)))

  def fn(z):   # log_prob at the flow's own samples: the inverse round-trips through every bijector
    x = flow.forward(z)
    return dist.log_prob(x), x, flow.inverse_log_det_jacobian(x, 1)
  return fn, (_x((N, 2)),), {}


def real_nvp():
  w = _var(_x((1, 2), seed=9) * 0.5, "w")

  def shift_and_log_scale(x, n):
    h = tf.tanh(tf.matmul(x, w))
    return h[..., :n], 0.5 * h[..., n:]

  flow = tfb.RealNVP(num_masked=1, shift_and_log_scale_fn=shift_and_log_scale)
  dist = tfd.TransformedDistribution(tfd.MultivariateNormalDiag(tf.zeros(2)), flow)
  return lambda x: (dist.log_prob(x), flow.forward(x)), (_x((N, 2)),), {}


# --- A GP marginal likelihood --------------------------------------------------------------------
def gp_marginal_likelihood():
  amplitude, length = _var(1.2, "amplitude"), _var(0.7, "length_scale")
  noise = _var(0.1, "noise")
  points = _x((8, 1), seed=10)

  def fn(y):
    kernel = tfp.math.psd_kernels.ExponentiatedQuadratic(amplitude, length)
    return tfd.GaussianProcess(kernel, index_points=points, observation_noise_variance=noise).log_prob(y)
  return fn, (_x((8,), seed=11),), {}


def gp_noiseless():
  """A noiseless GP on close points: its kernel matrix has condition number ~6e6 in float32."""
  data = _x((6, 2), 0.1, 0.9)

  def fn(y):
    kernel = tfp.math.psd_kernels.ExponentiatedQuadratic(1.0, 0.5)
    return tfd.GaussianProcess(kernel, index_points=data[:, :1]).log_prob(y)
  return fn, (data[:, 0],), dict(grad=False)


def mvn_near_singular():
  """An MVN whose covariance is a noiseless GP's kernel matrix given as data (condition ~6e6): the
  log-density hangs on the Cholesky factor's every rounding."""
  data = _x((6, 2), 0.1, 0.9)
  cov = np.exp(-2.0 * (data[:, :1] - data[:, :1].T) ** 2).astype(np.float32)

  def fn(cov, y):
    return tfd.MultivariateNormalTriL(tf.zeros(6), tf.linalg.cholesky(cov + 1e-6 * tf.eye(6))).log_prob(y)
  return fn, (cov, data[:, 0]), {}


ILL_CONDITIONED = ("the kernel matrix (condition ~6e6) amplifies 1-ulp differences of exp: XLA's float32 exp "
                   "and TF's (Eigen's polynomial) differ by an ulp on ~15% of inputs, 2 of the 36 kernel "
                   "entries here, which moves the log-likelihood by ~4e-3 relative; given TF's kernel "
                   "matrix, the Cholesky (TF's operation order up to 7x7) and the rest agree to 2e-7")


# --- MCMC ----------------------------------------------------------------------------------------
def _target(x):
  return tfd.MultivariateNormalDiag([0.5, -0.5], [1.0, 2.0]).log_prob(x)


def hmc_step():
  kernel = tfp.mcmc.HamiltonianMonteCarlo(_target, step_size=0.3, num_leapfrog_steps=3)

  def fn(state):
    results = kernel.bootstrap_results(state)
    new_state, new_results = kernel.one_step(state, results, seed=SEED)
    return new_state, new_results.log_accept_ratio
  return fn, (_x((2,)),), dict(grad=False)


def nuts_step():
  kernel = tfp.mcmc.NoUTurnSampler(_target, step_size=0.3, max_tree_depth=3)

  def fn(state):
    new_state, results = kernel.one_step(state, kernel.bootstrap_results(state), seed=SEED)
    return new_state, results.leapfrogs_taken
  return fn, (_x((2,)),), dict(grad=False)


def sample_chain():
  kernel = tfp.mcmc.HamiltonianMonteCarlo(_target, step_size=0.3, num_leapfrog_steps=2)

  def fn(state):
    return tfp.mcmc.sample_chain(5, state, kernel=kernel, num_burnin_steps=2, trace_fn=lambda _, r: r.is_accepted,
                                 seed=SEED)
  return fn, (_x((2,)),), dict(grad=False)


XFAIL = {   # name: (precise cause, the error it raises)
    "gp_noiseless": (ILL_CONDITIONED, AssertionError),
    "log_bessel_kve": (KVE_UNDER_JIT, AssertionError),
}
CORPUS = {f.__name__: f for f in [
    normal, student_t, gamma, beta, laplace_logistic, poisson, categorical, mvn_tril, dirichlet, mixture,
    normal_sample, uniform_categorical_sample, gamma_sample, gamma_reparameterized, poisson_sample, binomial_sample,
    truncated_normal_sample, mvn_sample, bessel_ive, log_bessel_kve,
    bijector_flow, real_nvp, gp_marginal_likelihood, gp_noiseless, mvn_near_singular,
    hmc_step, nuts_step, sample_chain,
]}
IN_CI = ["normal", "gamma", "mvn_tril", "normal_sample", "bijector_flow", "gp_marginal_likelihood", "mvn_near_singular",
         "hmc_step"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(
    [pytest.param(f, id=k, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[k][0], raises=XFAIL[k][1])]
                  if k in XFAIL else []) for k, f in CORPUS.items()], in_ci=IN_CI))
def test_tfp_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "TFP", fn, *args, **options)
