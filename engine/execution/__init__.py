"""Model execution: the decoder, its config, the ModelRunner, attention backends, CUDA graphs, devices."""
