"""Op rules: Bessel functions J0, J1, Y0, Y1 and K0, K0e, K1, K1e (`tf.math.special.bessel_j0`, ...).

TF's CPU kernels evaluate Eigen's Cephes-derived approximations (BesselFunctionsImpl.h), with one
algorithm for float and a more accurate one for double; half precision is computed in float and
rounded. The rules follow the same algorithm per dtype (the same polynomials, operation order, branch
points and special values: Y at x <= 0 is -inf, float's Y1(0) NaN, K at x <= 0 is inf, J and Y at
+-inf NaN), with every product rounded before it is summed, as TF's kernels do. What remains are XLA's
sin, cos, exp, log and float rsqrt against Eigen's: float32 within a few ulps of TF, float64 J and Y bit
for bit here, K within a few ulps. Every branch is evaluated on inputs made safe for it, and only the
selected one is kept.

Gradients are TF's registered ones (math_grad.py), e.g. J1' = J0 - J1 / x with 0.5 at x = 0, each
written with these functions so that higher derivatives follow too.

Known differences: TF has no CPU kernel for bfloat16; here it is computed in float and rounded, as
Eigen's bfloat16 overloads do.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_PI_4 = 0.7853981633974483096
_3PI_4 = 2.35619449019234492885
_2_PI = 0.636619772367581343075535
_SQRT_2_PI = 7.9788456080286535587989e-1
# Squares of the first zeros of J0 and J1, factored out of their approximations near 0.
_J0_ZERO1_SQUARED, _J0_ZERO2_SQUARED = 5.78318596294678452118, 3.04712623436620863991e1
_J1_ZERO1_SQUARED, _J1_ZERO2_SQUARED = 1.46819706421238932572e1, 4.92184563216946036703e1


def _add(a, b):
  """a + b with neither operand fused into it: a product that feeds only an addition is contracted to a
  fused multiply-add by XLA's CPU and GPU compilers, which TF's kernels (rounding every product) are not.
  The selects give each operand a second use, which LLVM does not contract; the value is a + b."""
  total = a + b
  return jnp.where(a != a, a, jnp.where(b != b, b, total))


def _madd(a, b, c):
  """a * b + c, the product rounded first (Eigen's pmadd on scalars and AVX packets without FMA)."""
  return _add(a * b, c)


def _rsqrt(x):
  """1 / sqrt(x) for x > 0 (or NaN) as Eigen's kernels compute it: in float XLA's rsqrt (closest to Eigen's
  packets: an estimate and a Newton step), in double a correctly rounded sqrt and division (the select
  keeps XLA from rewriting that to its rsqrt, 1 ulp off in about a third of cases)."""
  if x.dtype != np.float64:
    return lax.rsqrt(x)
  root = jnp.sqrt(x)
  return 1 / jnp.where(root == root, root, x)


def _polevl(x, coeffs):
  """Horner's rule, highest degree first (Cephes' polevl)."""
  result = jnp.full_like(x, coeffs[0])
  for c in coeffs[1:]:
    result = _madd(result, x, c)
  return result


def _chbevl(x, coeffs):
  """A Chebyshev series by Clenshaw's recurrence, as Cephes' chbevl (x in [-2, 2])."""
  b0, b1, b2 = jnp.full_like(x, coeffs[0]), jnp.zeros_like(x), jnp.zeros_like(x)
  for c in coeffs[1:]:
    b2, b1 = b1, b0
    b0 = _madd(x, b1, c) - b2
  return 0.5 * (b0 - b2)


def _ratio(x, numerator, denominator):
  return _polevl(x, numerator) / _polevl(x, denominator)


def _where_safe(use, x, safe):
  """`x` where `use` holds, else `safe`: a branch evaluated only where it is selected sees no input
  that makes it NaN or infinite (and so cannot spoil values or gradients where it is not)."""
  return jnp.where(use, x, jnp.asarray(safe, x.dtype))


# --------------------------------------------------------------------------- coefficients (Cephes)

# Modulus and phase of J0 / Y0 and J1 / Y1 beyond 2 (float).
_MO0_F = (-6.838999669318810e-2, 1.864949361379502e-1, -2.145007480346739e-1, 1.197549369473540e-1,
          -3.560281861530129e-3, -4.969382655296620e-2, -3.355424622293709e-6, 7.978845717621440e-1)
_PH0_F = (3.242077816988247e+1, -3.630592630518434e+1, 1.756221482109099e+1, -4.974978466280903e+0,
          1.001973420681837e+0, -1.939906941791308e-1, 6.490598792654666e-2, -1.249992184872738e-1)
_MO1_F = (6.913942741265801e-2, -2.284801500053359e-1, 3.138238455499697e-1, -2.102302420403875e-1,
          5.435364690523026e-3, 1.493389585089498e-1, 4.976029650847191e-6, 7.978845453073848e-1)
_PH1_F = (-4.497014141919556e+1, 5.073465654089319e+1, -2.485774108720340e+1, 7.222973196770240e+0,
          -1.544842782180211e+0, 3.503787691653334e-1, -1.637986776941202e-1, 3.749989509080821e-1)
_J0_F = (-6.068350350393235e-8, 6.388945720783375e-6, -3.969646342510940e-4, 1.332913422519003e-2,
         -1.729150680240724e-1)
_Y0_F = (9.454583683980369e-8, -9.413212653797057e-6, 5.344486707214273e-4, -1.584289289821316e-2,
         1.707584643733568e-1)
_J1_F = (-4.878788132172128e-9, 6.009061827883699e-7, -4.541343896997497e-5, 1.937383947804541e-3,
         -3.405537384615824e-2)
_Y1_F = (8.061978323326852e-9, -9.496460629917016e-7, 6.719543806674249e-5, -2.641785726447862e-3,
         4.202369946500099e-2)

# Hankel asymptotic expansions of order 0 and 1 beyond 5 (double): P = PP / PQ, Q = QP / QQ.
_PP0 = (7.96936729297347051624e-4, 8.28352392107440799803e-2, 1.23953371646414299388e0,
        5.44725003058768775090e0, 8.74716500199817011941e0, 5.30324038235394892183e0,
        9.99999999999999997821e-1)
_PQ0 = (9.24408810558863637013e-4, 8.56288474354474431428e-2, 1.25352743901058953537e0,
        5.47097740330417105182e0, 8.76190883237069594232e0, 5.30605288235394617618e0,
        1.00000000000000000218e0)
_QP0 = (-1.13663838898469149931e-2, -1.28252718670509318512e0, -1.95539544257735972385e1,
        -9.32060152123768231369e1, -1.77681167980488050595e2, -1.47077505154951170175e2,
        -5.14105326766599330220e1, -6.05014350600728481186e0)
_QQ0 = (1.0, 6.43178256118178023184e1, 8.56430025976980587198e2, 3.88240183605401609683e3,
        7.24046774195652478189e3, 5.93072701187316984827e3, 2.06209331660327847417e3,
        2.42005740240291393179e2)
_PP1 = (7.62125616208173112003e-4, 7.31397056940917570436e-2, 1.12719608129684925192e0,
        5.11207951146807644818e0, 8.42404590141772420927e0, 5.21451598682361504063e0,
        1.00000000000000000254e0)
_PQ1 = (5.71323128072548699714e-4, 6.88455908754495404082e-2, 1.10514232634061696926e0,
        5.07386386128601488557e0, 8.39985554327604159757e0, 5.20982848682361821619e0,
        9.99999999999999997461e-1)
_QP1 = (5.10862594750176621635e-2, 4.98213872951233449420e0, 7.58238284132545283818e1,
        3.66779609360150777800e2, 7.10856304998926107277e2, 5.97489612400613639965e2,
        2.11688757100572135698e2, 2.52070205858023719784e1)
_QQ1 = (1.0, 7.42373277035675149943e1, 1.05644886038262816351e3, 4.98641058337653607651e3,
        9.56231892404756170795e3, 7.99704160447350683650e3, 2.82619278517639096600e3,
        3.36093607810698293419e2)

# Rational approximations up to 5 (double).
_J0_RP = (-4.79443220978201773821e9, 1.95617491946556577543e12, -2.49248344360967716204e14,
          9.70862251047306323952e15)
_J0_RQ = (1.0, 4.99563147152651017219e2, 1.73785401676374683123e5, 4.84409658339962045305e7,
          1.11855537045356834862e10, 2.11277520115489217587e12, 3.10518229857422583814e14,
          3.18121955943204943306e16, 1.71086294081043136091e18)
_Y0_YP = (1.55924367855235737965e4, -1.46639295903971606143e7, 5.43526477051876500413e9,
          -9.82136065717911466409e11, 8.75906394395366999549e13, -3.46628303384729719441e15,
          4.42733268572569800351e16, -1.84950800436986690637e16)
_Y0_YQ = (1.0, 1.04128353664259848412e3, 6.26107330137134956842e5, 2.68919633393814121987e8,
          8.64002487103935000337e10, 2.02979612750105546709e13, 3.17157752842975028269e15,
          2.50596256172653059228e17)
_J1_RP = (-8.99971225705559398224e8, 4.52228297998194034323e11, -7.27494245221818276015e13,
          3.68295732863852883286e15)
_J1_RQ = (1.0, 6.20836478118054335476e2, 2.56987256757748830383e5, 8.35146791431949253037e7,
          2.21511595479792499675e10, 4.74914122079991414898e12, 7.84369607876235854894e14,
          8.95222336184627338078e16, 5.32278620332680085395e18)
_Y1_YP = (1.26320474790178026440e9, -6.47355876379160291031e11, 1.14509511541823727583e14,
          -8.12770255501325109621e15, 2.02439475713594898196e17, -7.78877196265950026825e17)
_Y1_YQ = (1.0, 5.94301592346128195359e2, 2.35564092943068577943e5, 7.34811944459721705660e7,
          1.87601316108706159478e10, 3.88231277496238566008e12, 6.20557727146953693363e14,
          6.87141087355300489866e16, 3.97270608116560655612e18)

# Chebyshev series of I0e and I1e on [0, 8] (double; float uses the last 18 and 17).
_I0E_A = (-4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
          1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
          -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
          9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-9,
          -1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7,
          1.11738753912010371815e-6, -4.41673835845875056359e-6, 1.64484480707288970893e-5,
          -5.75419501008210370398e-5, 1.88502885095841655729e-4, -5.76375574538582365885e-4,
          1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
          -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2,
          1.71620901522208775349e-1, -3.04682672343198398683e-1, 6.76795274409476084995e-1)
_I1E_A = (2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
          -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
          3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
          -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-9,
          9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7,
          -8.56872026469545474066e-7, 3.47025130813767847674e-6, -1.32731636560394358279e-5,
          4.78156510755005422638e-5, -1.61760815825896745588e-4, 5.12285956168575772895e-4,
          -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
          2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1,
          -1.76416518357834055153e-1, 2.52587186443633654823e-1)

# Chebyshev series of K0 and K1: A on (0, 2], B beyond (double; float uses the last 7 and 10).
_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-9, 2.53479107902614945675e-7, 2.28621210311945178607e-5,
         1.26461541144692592338e-3, 3.59799365153615016266e-2, 3.44289899924628486886e-1,
         -5.35327393233902768720e-1)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-9, 8.57403401741422608519e-9, -4.66048989768794782956e-8,
         2.76681363944501510342e-7, -1.83175552271911948767e-6, 1.39498137188764993662e-5,
         -1.28495495816278026384e-4, 1.56988388573005337491e-3, -3.14481013119645005427e-2,
         2.44030308206595545468e0)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-8, -2.43340614156596823496e-6,
         -1.73028895751305206302e-4, -6.97572385963986435018e-3, -1.22611180822657148235e-1,
         -3.53155960776544875667e-1, 1.52530022733894777053e0)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-9, -1.03457624656780970260e-8, 5.74108412545004946722e-8,
         -3.50196060308781257119e-7, 2.40648494783721712015e-6, -1.93619797416608296024e-5,
         1.95215518471351631108e-4, -2.85781685962277938680e-3, 1.03923736576817238437e-1,
         2.72062619048444266945e0)


def _tail(coeffs, n_float, double):
  return coeffs if double else coeffs[-n_float:]


# --------------------------------------------------------------------------- J0, Y0, J1, Y1


def _j0(x, double):
  y = jnp.abs(x)
  near = y <= (5 if double else 2)
  ys = _where_safe(near, y, 1)
  z = ys * ys
  if double:
    rational = _madd(ys, ys, -_J0_ZERO1_SQUARED) * _madd(ys, ys, -_J0_ZERO2_SQUARED)
    near_value = jnp.where(y < 1e-5, _madd(z, -0.25, 1), rational * _ratio(z, _J0_RP, _J0_RQ))
    return jnp.where(near, near_value, _hankel(_where_safe(~near, y, 8), 0, _PI_4, negate_q=True))
  polynomial = _madd(ys, ys, -_J0_ZERO1_SQUARED) * _polevl(z, _J0_F)
  near_value = jnp.where(y < 1e-3, _madd(z, -0.25, 1), polynomial)
  return jnp.where(near, near_value, _modulus_phase(_where_safe(~near, y, 4), _MO0_F, _PH0_F, _PI_4, jnp.cos))


def _y0(x, double):
  inside = x > 0
  near = x <= (5 if double else 2)
  xs = _where_safe(near & inside, x, 1)
  z = xs * xs
  if double:
    near_value = _madd(_2_PI * jnp.log(xs), _j0(xs, double), _ratio(z, _Y0_YP, _Y0_YQ))
    far_value = _hankel(_where_safe(~near, x, 8), 0, _PI_4, negate_q=False)
  else:
    polynomial = _madd(xs, xs, -0.43221455686510834878) * _polevl(z, _Y0_F)   # a root of Cephes' R
    near_value = _add(polynomial, _2_PI * (jnp.log(xs) * _j0(xs, double)))
    far_value = _modulus_phase(_where_safe(~near, x, 4), _MO0_F, _PH0_F, _PI_4, jnp.sin)
  return jnp.where(near, jnp.where(inside, near_value, -jnp.inf), far_value)


def _j1(x, double):
  y = jnp.abs(x)
  near = y <= (5 if double else 2)
  xs = _where_safe(near, x, 1)
  z = xs * xs
  if double:
    rational = _ratio(z, _J1_RP, _J1_RQ) * xs
    near_value = rational * _madd(xs, xs, -_J1_ZERO1_SQUARED) * _madd(xs, xs, -_J1_ZERO2_SQUARED)
    far_value = _hankel(_where_safe(~near, y, 8), 1, _3PI_4, negate_q=True)
  else:
    near_value = _madd(xs, xs, -_J1_ZERO1_SQUARED) * (xs * _polevl(z, _J1_F))
    far_value = _modulus_phase(_where_safe(~near, y, 4), _MO1_F, _PH1_F, _3PI_4, jnp.cos)
  return jnp.where(near, near_value, jnp.where(x < 0, -far_value, far_value))


def _y1(x, double):
  inside = x > 0
  near = x <= (5 if double else 2)
  xs = _where_safe(near & inside, x, 1)
  z = xs * xs
  if double:
    rational = _ratio(z, _Y1_YP, _Y1_YQ)
    far_value = _hankel(_where_safe(~near, x, 8), 1, _3PI_4, negate_q=False)
    outside = -jnp.inf
  else:
    rational = _madd(xs, xs, -4.66539330185668857532) * _polevl(z, _Y1_F)
    far_value = _modulus_phase(_where_safe(~near, x, 4), _MO1_F, _PH1_F, _3PI_4, jnp.sin)
    outside = jnp.where(x < 0, -jnp.inf, jnp.nan)   # float: -1/x + j1 * log(x) at 0 is NaN
  near_value = _madd(rational, xs, _2_PI * _madd(_j1(xs, double), jnp.log(xs), -1 / xs))
  return jnp.where(near, jnp.where(inside, near_value, outside), far_value)


def _modulus_phase(y, modulus, phase, shift, trig):
  """Float, y > 2: sqrt(1/y) M(1/y) * trig(y + (1/y) P(1/y^2) - shift)."""
  q = 1 / y
  amplitude = _rsqrt(y) * _polevl(q, modulus)
  return amplitude * trig(_madd(q, _polevl(q * q, phase), -shift) + y)


def _hankel(y, order, shift, negate_q):
  """Double, y > 5: sqrt(2 / (pi y)) (P cos(y - shift) - (5/y) Q sin(y - shift)) for J, and
  (P sin(y - shift) + (5/y) Q cos(y - shift)) for Y."""
  numerator, denominator = (_PP0, _PQ0) if order == 0 else (_PP1, _PQ1)
  q_numerator, q_denominator = (_QP0, _QQ0) if order == 0 else (_QP1, _QQ1)
  s = 25 / (y * y)
  p, q = _ratio(s, numerator, denominator), _ratio(s, q_numerator, q_denominator)
  phase = y - shift
  if negate_q:
    value = _madd(p, jnp.cos(phase), (-5 / y) * (q * jnp.sin(phase)))
  else:
    value = _madd(p, jnp.sin(phase), (5 / y) * (q * jnp.cos(phase)))
  return value * (_SQRT_2_PI * _rsqrt(y))


# --------------------------------------------------------------------------- K0, K0e, K1, K1e


def _k_near(x, double, order):
  """K0(x) (order 0) or K1(x) (order 1) for x in (0, 2], through I0 or I1 (their series up to 8)."""
  i_series = _tail(_I0E_A if order == 0 else _I1E_A, 18 if order == 0 else 17, double)
  k_series = _chbevl(_madd(x, x, -2), _tail(_K0_A if order == 0 else _K1_A, 7, double))
  i_scaled = _chbevl(_madd(0.5, x, -2), i_series)
  if order == 0:
    return _madd(jnp.exp(x) * i_scaled, -jnp.log(0.5 * x), k_series)
  return _madd(jnp.exp(x) * (x * i_scaled), jnp.log(0.5 * x), k_series / x)


def _k(x, double, order, scaled):
  """K0, K1 or (`scaled`) exp(x) K0, exp(x) K1; beyond 2 from exp(x) K(x) = series(8/x - 2) / sqrt(x)."""
  inside, near = x > 0, x <= 2
  xs = _where_safe(near & inside, x, 1)
  near_value = _k_near(xs, double, order)
  if scaled:
    near_value = near_value * jnp.exp(xs)
  xf = _where_safe(~near, x, 4)
  series = _chbevl(8 / xf - 2, _tail(_K0_B if order == 0 else _K1_B, 10, double))
  if scaled:
    far_value = series * _rsqrt(xf)
  elif order == 0:
    far_value = jnp.exp(-xf) * series * _rsqrt(xf)
  else:
    far_value = jnp.exp(-xf) * (series * _rsqrt(xf))
  return jnp.where(near, jnp.where(inside, near_value, jnp.inf), far_value)


# --------------------------------------------------------------------------- per dtype, with TF's gradients


def _by_dtype(algorithm):
  """`algorithm(x, double)` in x's dtype: double for float64, float for float32; half types in float."""
  def evaluate(x):
    if x.dtype == np.float64:
      return algorithm(x, True)
    if x.dtype == np.float32:
      return algorithm(x, False)
    return algorithm(x.astype(np.float32), False).astype(x.dtype)
  return evaluate


bessel_j0 = jax.custom_jvp(_by_dtype(_j0))
bessel_j1 = jax.custom_jvp(_by_dtype(_j1))
bessel_y0 = jax.custom_jvp(_by_dtype(_y0))
bessel_y1 = jax.custom_jvp(_by_dtype(_y1))
bessel_k0 = jax.custom_jvp(_by_dtype(lambda x, double: _k(x, double, 0, scaled=False)))
bessel_k0e = jax.custom_jvp(_by_dtype(lambda x, double: _k(x, double, 0, scaled=True)))
bessel_k1 = jax.custom_jvp(_by_dtype(lambda x, double: _k(x, double, 1, scaled=False)))
bessel_k1e = jax.custom_jvp(_by_dtype(lambda x, double: _k(x, double, 1, scaled=True)))


def _defjvp(fn, derivative):
  """TF's gradient: tangent * derivative(x, fn(x))."""
  @fn.defjvp
  def jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = fn(x)
    return y, t * derivative(x, y)


def _j1_derivative(x, y):
  at_zero = x == 0
  return jnp.where(at_zero, jnp.asarray(0.5, x.dtype), bessel_j0(x) - y / _where_safe(~at_zero, x, 1))


_defjvp(bessel_j0, lambda x, y: -bessel_j1(x))
_defjvp(bessel_j1, _j1_derivative)
_defjvp(bessel_y0, lambda x, y: -bessel_y1(x))
_defjvp(bessel_y1, lambda x, y: bessel_y0(x) - y / x)   # NaN at 0, as TF's
_defjvp(bessel_k0, lambda x, y: -bessel_k1(x))
_defjvp(bessel_k0e, lambda x, y: y - bessel_k1e(x))
_defjvp(bessel_k1, lambda x, y: -bessel_k0(x) - y / x)
_defjvp(bessel_k1e, lambda x, y: _add(y * (1 - 1 / x), -bessel_k0e(x)))


def _register(op_type: str, fn):
  # Marked for export: `jax.export` keeps the values of a custom_jvp but not its derivative.
  marked = export_marks.marked(f"{op_type.lower()}_special")(fn)

  @register(op_type, elementwise=True)
  def rule(ctx, x):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: expected a float input, got {x.dtype}")
    return marked(x)


for _op, _fn in {"BesselJ0": bessel_j0, "BesselJ1": bessel_j1, "BesselY0": bessel_y0, "BesselY1": bessel_y1,
                 "BesselK0": bessel_k0, "BesselK0e": bessel_k0e, "BesselK1": bessel_k1,
                 "BesselK1e": bessel_k1e}.items():
  _register(_op, _fn)
