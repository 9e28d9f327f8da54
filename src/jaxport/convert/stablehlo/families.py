"""Imports every op family so their handlers register."""
from jaxport.convert.stablehlo import control, custom_call, elementwise, shape  # noqa: F401
from jaxport.convert.stablehlo import index  # noqa: F401
from jaxport.convert.stablehlo import contraction  # noqa: F401
from jaxport.convert.stablehlo import reduce  # noqa: F401
from jaxport.convert.stablehlo import random  # noqa: F401
from jaxport.convert.stablehlo import misc  # noqa: F401
