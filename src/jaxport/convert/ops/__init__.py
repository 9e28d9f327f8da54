"""Op rules, one module per op family. Importing this package registers them all."""
from jaxport.convert.ops import bessel, fft, linalg_decompose, linalg_special  # noqa: F401
from jaxport.convert.ops import detection, draw_boxes, fractional_pool, image_color, image_transform  # noqa: F401
from jaxport.convert.ops import candidate_sampling, stateless_random, stateless_samplers  # noqa: F401
from jaxport.convert.ops import v1_control, v1_state, v1_tensor_array  # noqa: F401
from jaxport.convert.ops import counting, ctc, inplace, isotonic, layout, morphology, search  # noqa: F401
from jaxport.convert.ops import segment, unique  # noqa: F401
from jaxport.convert.ops import lookup, ragged, rnn_cells, sparse, sparse_segment, sparse_structure  # noqa: F401
from jaxport.convert.ops import feature_cross, quantization, random_generator, string_hash, top_k  # noqa: F401
from jaxport.convert.ops import (array, control_flow, core, gather_scatter, image, linalg, math,  # noqa: F401
                                 nn, optimizers, random, reduction, state, state_scatter, tensor_list, xla,
                                 xla_call_module)
