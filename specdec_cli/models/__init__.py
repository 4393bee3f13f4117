"""Model files: the registry, downloads, GGUF metadata, llama.cpp (its only user here), workers."""
