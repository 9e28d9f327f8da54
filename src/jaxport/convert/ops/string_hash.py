"""Hash buckets of integers written as text: `StringToHashBucketFast(AsString(ids))`, natively.

Keras' `Hashing` layer on integer ids, and `tf.lookup.StaticVocabularyTable`'s out-of-vocabulary
buckets on integer keys, write each id in decimal (`AsString`) and hash the text. JAX has no
strings, but it needs none here: `AsString` of an integer or bool tensor becomes `DecimalText`, a
string tensor that remembers its numbers, and the hash ops read its bytes from those numbers in
integer jnp ops (FarmHash's Fingerprint64 for the Fast op, SipHash-2-4 for the Strong one, as
TF's kernels), exactly and under jit, vmap and export. Any other string reaches these ops from
the host callback tier, and they hand it back there.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import host_callback
from jaxport.convert.ops import philox as ph
from jaxport.convert.ops._util import is_concrete, jax_dtype, text
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError, X64OverflowError

# The longest decimal text of a 64-bit integer: "-9223372036854775808" or "18446744073709551615".
MAX_DIGITS = 20


class DecimalText(host_callback.HostTensor):
  """`AsString` of an integer or bool tensor: the host computes its strings when a callback needs
  them, and the hash rules read its bytes from `numbers` without leaving JAX."""
  __slots__ = ("numbers",)

  def __init__(self, node: str, numbers):
    super().__init__(node, tuple(np.shape(numbers)), leaves=[numbers], compute=_decimal_strings)
    self.numbers = numbers


def _decimal_strings(numbers) -> np.ndarray:
  numbers = np.asarray(numbers)
  if numbers.dtype == np.bool_:
    return np.where(numbers, b"true", b"false").astype(object)
  return np.vectorize(lambda n: str(int(n)).encode(), otypes=[object])(numbers)


def _writes_decimal(node) -> bool:
  """The node is `AsString` of an integer or bool tensor with the default format."""
  attrs = node.attrs
  dtype = attrs.get("T")
  return (dtype is not None and np.dtype(dtype).kind in "iub"
          and attrs.get("precision", -1) == -1 and attrs.get("width", -1) == -1
          and not attrs.get("scientific", False) and not attrs.get("shortest", False)
          and not text(attrs.get("fill", b"")))


def _host_handed_as_string(node) -> bool:
  return not _writes_decimal(node)


@register("AsString", host_nodes=_host_handed_as_string)
def as_string(ctx, x):
  if not _writes_decimal(ctx.node):
    return host_callback.hand_to_host(ctx, x)
  if is_concrete(x):
    return _decimal_strings(x)   # a constant string array, as a folded callback gives
  return DecimalText(ctx.name, x)


def _hash_rule(hash_fn):
  def rule(ctx, strings):
    if not isinstance(strings, DecimalText):
      return host_callback.hand_to_host(ctx, strings)
    key = tuple(int(k) for k in ctx.attr("key", ()))
    num_buckets = int(ctx.attr("num_buckets"))
    if num_buckets < 1:
      raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: num_buckets must be at least 1 (TF's kernel "
                             f"refuses {num_buckets}).")
    check_bucket_range(ctx, num_buckets)
    return _bucket(hash_fn, key, num_buckets, jax_dtype(np.int64), strings.numbers)
  return rule


def check_bucket_range(ctx, modulus: int) -> None:
  """Raises X64OverflowError when bucket ids below `modulus` would not fit the int64 JAX holds (int32
  while x64 is off): they would wrap."""
  if modulus - 1 > np.iinfo(jax_dtype(np.int64)).max:
    raise X64OverflowError(
        f"{ctx.op} node {ctx.name!r} hashes into {modulus} buckets, but JAX holds int64 in 32 bits while "
        "jax_enable_x64 is off, so bucket ids would wrap. Enable it (jax.config.update('jax_enable_x64', "
        "True)) or use at most 2**31 buckets.")


# --------------------------------------------------------------------------- text as bytes


def decimal_text(numbers):
  """The decimal text of integer `numbers` (or "true"/"false" of bools): its bytes as `_WORDS`
  little-endian uint64 words (zero past the end) and its lengths; inside `ph.wide()`.

  Only elementwise ops: a jaxpr traced in x64 mode may be lowered by a caller's jit without it,
  where gathers and argmax would change their index types.
  """
  if numbers.dtype == jnp.bool_:
    texts = [_text_words(b"false"), _text_words(b"true")]
    words = [jnp.where(numbers, t, f) for f, t in zip(*texts)]
    return words, jnp.where(numbers, np.uint64(4), np.uint64(5))
  negative = (numbers < 0) if jnp.issubdtype(numbers.dtype, jnp.signedinteger) else jnp.zeros(numbers.shape, bool)
  bits = ph.u64(jnp, numbers)
  magnitude = jnp.where(negative, ~bits + np.uint64(1), bits)   # exact for the most negative int64
  n_digits = np.uint64(1) + sum((magnitude >= np.uint64(10**k)).astype(jnp.uint64) for k in range(1, MAX_DIGITS))
  # the digits right-aligned in MAX_DIGITS bytes with leading '0's, which moving the text to the
  # front drops (the bytes after MAX_DIGITS are zero)
  padded, rest = [jnp.zeros_like(magnitude) for _ in range(_WORDS)], magnitude
  for position in reversed(range(MAX_DIGITS)):
    byte = rest % np.uint64(10) + np.uint64(ord("0"))
    rest = rest // np.uint64(10)
    padded[position // 8] = padded[position // 8] | (byte << np.uint64(8 * (position % 8)))
  words = _shift_down(padded, np.uint64(MAX_DIGITS) - n_digits)
  shifted = [(w << np.uint64(8)) | (_shifted_out(words, i)) for i, w in enumerate(words)]   # room for '-'
  signed = [jnp.where(negative, w, u) for w, u in zip(shifted, words)]
  signed[0] = signed[0] | jnp.where(negative, np.uint64(ord("-")), np.uint64(0))
  return signed, n_digits + negative.astype(jnp.uint64)


_WORDS = 4   # 32 bytes: the longest text (20 bytes) and any 8-byte read inside it


def _text_words(text: bytes) -> list[np.uint64]:
  data = text.ljust(8 * _WORDS, b"\0")
  return [np.uint64(int.from_bytes(data[8 * i:8 * i + 8], "little")) for i in range(_WORDS)]


def _shifted_out(words, i: int):
  """The top byte of the word before word `i` (what moves into it when the text moves up a byte)."""
  return words[i - 1] >> np.uint64(56) if i else np.uint64(0)


def _shift_down(words, count):
  """The text with its first `count` bytes (per element, < 8 * _WORDS) dropped."""
  whole, part = count // np.uint64(8), (count % np.uint64(8)) * np.uint64(8)
  zero = jnp.zeros_like(words[0])
  out = []
  for i in range(_WORDS):
    low = _first([(whole == q, words[i + q]) for q in range(_WORDS - i)], zero)
    high = _first([(whole == q, words[i + q + 1]) for q in range(_WORDS - i - 1)], zero)
    carried = jnp.where(part == 0, zero, high << (np.uint64(64) - jnp.maximum(part, np.uint64(1))))
    out.append((low >> part) | carried)
  return out


def _first(cases, default):
  """The value of the first true condition of `cases` [(condition, value)], else `default` (a chain of
  `where`s: `jnp.select` lowers through argmax)."""
  out = default
  for condition, value in reversed(cases):
    out = jnp.where(condition, value, out)
  return out


def _fetch(words, offset, width: int = 8):
  """The little-endian `width`-byte word of the text at per-element byte `offset` (uint64; an
  offset past the text, as when it wraps below 0, reads zeros: those lanes are never selected)."""
  offset = jnp.where(offset > np.uint64(8 * _WORDS), np.uint64(8 * _WORDS - 1), offset)
  word = _shift_down(words, offset)[0]
  return word if width == 8 else word & np.uint64((1 << (8 * width)) - 1)


def _rotate(value, shift: int):
  """`value` rotated right by `shift` bits."""
  return (value >> np.uint64(shift)) | (value << np.uint64(64 - shift))


# --------------------------------------------------------------------------- FarmHash Fingerprint64

_K0, _K1, _K2 = (np.uint64(k) for k in (0xC3A5C85C97CB3127, 0xB492B66FBE98F273, 0x9AE16A3B2F90404F))


def shift_mix(value):
  """FarmHash's ShiftMix (also TF's FingerprintCat64's)."""
  return value ^ (value >> np.uint64(47))


def _hash_len16(u, v, mul):
  a = shift_mix((u ^ v) * mul)
  b = shift_mix((v ^ a) * mul)
  return b * mul


def fingerprint64(data, length):
  """FarmHash's Fingerprint64 (farmhashna::Hash64) of texts (`decimal_text`) up to 32 bytes long."""
  mul = _K2 + length * np.uint64(2)
  # 8 to 16 bytes
  a = _fetch(data, jnp.zeros_like(length), 8) + _K2
  b = _fetch(data, length - np.uint64(8), 8)
  long16 = _hash_len16(_rotate(b, 37) * mul + a, (_rotate(a, 25) + b) * mul, mul)
  # 4 to 7 bytes
  a32 = _fetch(data, jnp.zeros_like(length), 4)
  mid = _hash_len16(length + (a32 << np.uint64(3)), _fetch(data, length - np.uint64(4), 4), mul)
  # 1 to 3 bytes
  first = _fetch(data, jnp.zeros_like(length), 1)
  middle = _fetch(data, length >> np.uint64(1), 1)
  last = _fetch(data, length - np.uint64(1), 1)
  y, z = first + (middle << np.uint64(8)), length + (last << np.uint64(2))
  short = shift_mix(y * _K2 ^ z * _K0) * _K2
  # 17 to 32 bytes
  a = _fetch(data, jnp.zeros_like(length), 8) * _K1
  b = _fetch(data, jnp.full_like(length, 8), 8)
  c = _fetch(data, length - np.uint64(8), 8) * mul
  d = _fetch(data, length - np.uint64(16), 8) * _K2
  long32 = _hash_len16(_rotate(a + b, 43) + _rotate(c, 30) + d, a + _rotate(b + _K2, 18) + c, mul)
  return _first([(length > 16, long32), (length >= 8, long16), (length >= 4, mid), (length > 0, short)], _K2)


# --------------------------------------------------------------------------- SipHash-2-4


def siphash(data, length, key: tuple[int, int]):
  """SipHash-2-4 with a 128-bit key (TF's StrongKeyedHash) of texts (`decimal_text`) up to 24 bytes long."""
  k0, k1 = np.uint64(key[0] % 2**64), np.uint64(key[1] % 2**64)   # int64 attrs, two's complement
  v = [k0 ^ np.uint64(0x736F6D6570736575), k1 ^ np.uint64(0x646F72616E646F6D),
       k0 ^ np.uint64(0x6C7967656E657261), k1 ^ np.uint64(0x7465646279746573)]
  v = [jnp.broadcast_to(w, length.shape) for w in v]
  full_blocks = length >> np.uint64(3)
  for block in range(MAX_DIGITS // 8 + 1):   # the full blocks and the last one
    word = data[block]   # zero past the end, as SipHash pads
    last = word | (length << np.uint64(56))
    message = jnp.where(full_blocks == block, last, word)
    taken = full_blocks >= block
    v = [jnp.where(taken, new, old) for new, old in zip(_sip_block(v, message), v)]
  v[2] = v[2] ^ np.uint64(0xFF)
  for _ in range(4):
    v = _sip_round(v)
  return v[0] ^ v[1] ^ v[2] ^ v[3]


def _sip_block(v, message):
  v = list(v)
  v[3] = v[3] ^ message
  v = _sip_round(_sip_round(v))
  v[0] = v[0] ^ message
  return v


def _sip_round(v):
  v0, v1, v2, v3 = v
  v0 = v0 + v1
  v1 = _rotate(v1, 64 - 13) ^ v0   # SipHash rotates left
  v0 = _rotate(v0, 32)
  v2 = v2 + v3
  v3 = _rotate(v3, 64 - 16) ^ v2
  v0 = v0 + v3
  v3 = _rotate(v3, 64 - 21) ^ v0
  v2 = v2 + v1
  v1 = _rotate(v1, 64 - 17) ^ v2
  v2 = _rotate(v2, 32)
  return [v0, v1, v2, v3]


# --------------------------------------------------------------------------- the hash ops


def _fast(data, length, key):
  return fingerprint64(data, length)


def _strong(data, length, key):
  return siphash(data, length, key)


def _bucket(hash_fn, key, num_buckets: int, out_dtype, numbers):
  with ph.wide():
    if is_concrete(numbers):
      numbers = jnp.asarray(numbers)
    return _bucket_jit(hash_fn, key, num_buckets, out_dtype, numbers)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _bucket_jit(hash_fn, key, num_buckets, out_dtype, numbers):
  data, length = decimal_text(numbers)
  return (hash_fn(data, length, key) % np.uint64(num_buckets)).astype(out_dtype)


register("StringToHashBucketFast")(_hash_rule(_fast))
register("StringToHashBucketStrong")(_hash_rule(_strong))
