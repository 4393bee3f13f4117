"""How the backend cuts a decode into llama_decode calls, and what a failed call means.
Pure, so tested without a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def equal_split_sizes(rows: Sequence[int], n_ubatch: int) -> list[int]:
    """The graph computes llama.cpp makes of one batch of several sequences in a cache of a
    stream per sequence (llama_batch_allocr::split_equal, sequential), `rows[i]` rows of
    the i-th of consecutive sequences, lane after lane: each compute takes the run of
    consecutive sequences that still have rows, from the first, and as many rows of each as
    the shortest of them has left (within `n_ubatch`). Their sizes, in order."""
    left = list(rows)
    sizes: list[int] = []
    while any(left):
        first = next(i for i, n in enumerate(left) if n)
        run = first
        while run + 1 < len(left) and left[run + 1]:
            run += 1
        lanes = range(first, run + 1)
        take = max(1, min(min(left[i] for i in lanes), n_ubatch // len(lanes)))
        for i in lanes:
            left[i] -= take
        sizes.append(take * len(lanes))
    return sizes


def round_widths(
    rows: Sequence[int], pass_cost: Callable[[int], float] | None, n_ubatch: int
) -> list[int]:
    """How many rows each lane of a round decodes (0 in `rows`: a sequence between two of
    the round's that has none of its own). Padded: every lane to the widest, one graph
    compute for all. Ragged: each its own, the lanes without rows padded to the narrowest,
    so that the first compute holds every lane and the rest the wider lanes' further rows
    (by the Zen 5's exact table, one lane of 9 beside three of 1 costs 1.3x + 2.2x one row
    ragged, 9.9x padded to 36 rows). Ragged where `pass_cost` (seconds for a compute of n
    rows of one sequence) says it is cheaper; padded without it."""
    widest = max(rows)
    padded = [widest] * len(rows)
    if pass_cost is None:
        return padded
    narrowest = min(n for n in rows if n)
    ragged = [n or narrowest for n in rows]

    def cost(widths: list[int]) -> float:
        return sum(pass_cost(size) for size in equal_split_sizes(widths, n_ubatch))

    return ragged if cost(ragged) < cost(padded) else padded
