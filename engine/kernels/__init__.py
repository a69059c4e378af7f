"""CPU kernels: C decode and int4 matmul kernels, oneDNN matmuls, GGUF quantized weights."""
