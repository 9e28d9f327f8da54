"""Imports every op family so their handlers register."""
from jaxport.convert.stablehlo import control, custom_call, elementwise, shape  # noqa: F401
