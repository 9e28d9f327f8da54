"""Op rules, one module per op family. Importing this package registers them all."""
from jaxport.convert.ops import (array, control_flow, core, gather_scatter, image, linalg, math,  # noqa: F401
                                 nn, random, reduction, state, tensor_list, xla, xla_call_module)
