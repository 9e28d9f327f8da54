"""Op rules, one module per op family. Importing this package registers them all."""
from jaxport.convert.ops import (array, control_flow, core, image, linalg, math, nn, random,  # noqa: F401
                                 reduction, state, tensor_list, xla, xla_call_module)
