"""Every source × target pair on CPU, for every dtype and every layout each source can have.

Each case checks the values and dtype against the framework's own view of the result, and
whether memory is shared against the promise below (by buffer address read with the
frameworks' own APIs, by `jaxport.interop.shares_memory`, by `explain`, and by `copy=False`).
"""
import jax
import numpy as np
import pytest

from jaxport import interop
import interop_support as S

TARGETS = ("numpy", "jax", "torch", "tf")
CONVERT = {"numpy": interop.to_numpy, "jax": interop.to_jax, "torch": interop.to_torch,
           "tf": interop.to_tf}
# The layouts each target's importer takes without a copy (the promise this test checks).
SHARED_LAYOUTS = {
    "numpy": set(S.LAYOUTS["numpy"]),
    "torch": {"contiguous", "transposed", "broadcast", "strided", "unaligned"},
    "jax": {"contiguous", "transposed"},
    "tf": {"contiguous"},
}


def promised_zero_copy(source: str, layout: str, target: str, dtype: str, x64: bool) -> bool:
  if source == target:
    return True
  if target == "jax" and dtype in S.WIDE and not x64:
    return False  # narrowed to 32 bits
  if dtype in S.FLOAT8 and "tf" in (source, target):
    return False  # TF neither exports nor imports float8 over DLPack
  return layout in SHARED_LAYOUTS[target]


def _cases():
  for source, layouts in S.LAYOUTS.items():
    for layout in layouts:
      for target in TARGETS:
        for dtype in S.DTYPES:
          jax_side = "jax" in (source, target)
          x64s = (True, False) if jax_side and dtype in S.WIDE and source != "jax" else \
              (dtype in S.WIDE and jax_side,)
          for x64 in x64s:
            yield pytest.param(source, layout, target, dtype, x64,
                               id=f"{source}-{layout}-{target}-{dtype}" + ("-x64" if x64 else ""))


@pytest.mark.parametrize("source,layout,target,dtype,x64", list(_cases()))
def test_pair(source, layout, target, dtype, x64):
  with jax.enable_x64(x64):
    expected = S.values(S.DTYPES[dtype])
    x = S.make(source, layout, expected)
    logical = S.logical(layout, expected)
    y = CONVERT[target](x)

    narrowed = target == "jax" and not x64 and dtype in S.WIDE
    want = logical.astype(np.dtype(jax.dtypes.canonicalize_dtype(logical.dtype))) if narrowed \
        else logical
    assert S.framework_of(y) == target
    assert S.dtype_of(y) == want.dtype
    assert S.same_values(S.to_host(y), want)
    assert S.same_values(S.to_host(x), logical), "the source changed"

    zero_copy = promised_zero_copy(source, layout, target, dtype, x64)
    assert (S.address(y) == S.address(x)) == zero_copy
    assert interop.shares_memory(x, y) == zero_copy
    assert interop.explain(x, target).zero_copy == zero_copy
    if zero_copy:
      assert S.address(CONVERT[target](x, copy=False)) == S.address(x)
    else:
      with pytest.raises(BufferError):
        CONVERT[target](x, copy=False)

    if target == "numpy" and source in ("jax", "tf") and zero_copy:
      assert not y.flags.writeable, "a view of an immutable buffer must be read-only"
