"""How the backend cuts a decode into llama_decode calls, and what a failed call means.
Pure, so tested without a model."""

from __future__ import annotations

from ..errors import ContextOverflowError, DecodeError, SpecdecError


def aligned_bounds(start: int, end: int, size: int, n_last: int) -> list[int]:
    """Chunk bounds from `start` (a multiple of `size`) to `end` at every multiple of `size`
    between; a last chunk shorter than `n_last` (the rows whose logits are wanted) joins the
    one before it. Positions only decide the cuts, so a prompt is cut the same way whatever
    was cached before `start`."""
    bounds = [start, *range(start + size, end, size), end]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < n_last:
        del bounds[-2]
    return bounds


def chunk_bounds(n_tokens: int, n_batch: int, n_last: int) -> list[int]:
    """Cut a long input into chunks of at most n_batch, the last holding at least `n_last`
    tokens (the rows whose logits are wanted). Equal chunks where they can be: a small
    chunk is decoded at a poor rate per token."""
    n_chunks = -(-n_tokens // n_batch)
    bounds = [n_tokens * i // n_chunks for i in range(n_chunks + 1)]
    if bounds[-1] - bounds[-2] >= n_last:
        return bounds
    first = n_tokens % n_batch or n_batch  # cut from the end: a full last chunk
    return [0, *range(first, n_tokens + 1, n_batch)]


def decode_failure(status: int, position: int, n_ctx: int) -> SpecdecError:
    """What a non-zero llama_decode status means (llama.h): 1 no KV-cache slot for the batch,
    2 aborted, -1 an invalid batch, below -1 an error inside llama.cpp."""
    where = f"at position {position} (context {n_ctx} tokens)"
    if status == 1:
        return ContextOverflowError(
            f"llama.cpp found no room in the KV cache for the batch {where}.",
            "Raise --ctx-size or shorten the prompt.",
        )
    if status == 2:
        return DecodeError(f"llama.cpp aborted the decode {where}.", "Run it again.")
    if status == -1:
        return DecodeError(
            f"llama.cpp rejected the batch as invalid {where}: a token outside the model's "
            "vocabulary?",
            "Without --force, drafters must share the target's vocabulary.",
        )
    return DecodeError(
        f"llama.cpp failed to decode {where} (status {status}).",
        "Run with --verbose to see llama.cpp's log.",
    )
