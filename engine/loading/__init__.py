"""Finding and loading weights: Hugging Face folders, GGUF files, the embedded default model."""
