"""The llama.cpp runtime: the only package that imports llama_cpp.

library.py     the process's llama.cpp: logs, devices, kernels, the decode thread
exactness.py   each backend's batch-invariant kernels behind one switch (CPU, CUDA)
device_choices.py  greedy choices taken by the device that computes the logits
backend.py     LlamaBackend: one model, its context, decodes and cached state
sequences.py   several sequences in one context, decoded together in rounds (rounds.py)
vocabulary.py  tokens, the chat template; grammar.py: llama.cpp's grammar as a constraint
batches.py     how decodes are cut and padded; model_file.py: loading, requantising
devices.py     where layers go: this machine's devices or RPC workers (rpc.py)
"""
