"""Triton kernels of reasonrl_fast (one file per kernel).

Importing this package needs `triton`; everything else in reasonrl_fast works without it.
The kernels run on CUDA tensors, and on CPU tensors in Triton's interpreter
(`TRITON_INTERPRET=1`, set before triton is imported), which is how CI tests them.
"""
