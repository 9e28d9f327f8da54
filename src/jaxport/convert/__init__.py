"""GraphDef → JAX conversion."""
from jaxport.convert.api import (ConvertedFunction, Variable, convert, convert_from_restored,
                                 convert_functional, convert_functional_from_restored,
                                 get_unsupported_operations)
from jaxport.convert.registry import register, supported_ops
