"""Token-mask kernels: apply a grammar's packed bitmask to logits, and sample under it.

Bitmask format everywhere: ``int32[B, ceil(V/32)]``; bit ``i`` of word ``j`` allows token
``32*j + i``. CUDA tensors go through Triton kernels; CPU tensors through a torch implementation
with the same semantics (the Triton kernels also run on CPU under ``TRITON_INTERPRET=1``, which is
how the tests check them without a GPU). Only torch and triton are needed.
"""

from .ops import apply_bitmask_, sample
from .params import SampleResult, SamplingTensors

__all__ = ["apply_bitmask_", "sample", "SampleResult", "SamplingTensors"]
