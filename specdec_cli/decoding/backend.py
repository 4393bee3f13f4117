"""The protocol the engine needs from a model, and the cache bookkeeping shared by all backends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from ..structured import Structure
from .constraint import Constraint
from .sampling import top_probability

Decoded = TypeVar("Decoded")  # what a decode gives back: logit rows, or their choices


@dataclass(frozen=True)
class VocabInfo:
    """What llama.cpp compares to decide whether two models can draft for each other."""

    vocab_type: int
    n_vocab: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


@dataclass(frozen=True)
class FillInMiddle:
    """The control tokens a code model was trained to fill in the middle with: the text
    before the gap after `prefix`, the text after it after `suffix`, then `middle`, after
    which the model writes what goes in the gap."""

    prefix: int
    suffix: int
    middle: int


class DecodeStopped(Exception):
    """A decode given up between two of its chunks, because its caller asked (stoppable)."""


_stop_checks = threading.local()


@contextmanager
def stoppable(should_stop: Callable[[], bool]) -> Iterator[None]:
    """While inside, a decode on this thread that takes several chunks (a prompt, a drafter
    catching up on one) asks `should_stop` before each chunk after its first and raises
    DecodeStopped if so: what it decoded stays cached and counted. serve stops a request
    whose client left so within one chunk wherever it is; a decode of one chunk (a step, a
    verification) always finishes, and the engine stops between its rounds."""
    outer = getattr(_stop_checks, "check", None)
    _stop_checks.check = should_stop
    try:
        yield
    finally:
        _stop_checks.check = outer


def raise_if_stopped() -> None:
    """For a backend, before each chunk of a decode after the first: see stoppable."""
    check = getattr(_stop_checks, "check", None)
    if check is not None and check():
        raise DecodeStopped


class Choices(Protocol):
    """The greedy choice (argmax) of each of a decode's logit rows, by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, row: int) -> int: ...

    def confidence(self, row: int) -> float:
        """The raw softmax probability of the row's choice: how sure a drafter is (asked of
        choices decoded `with_confidence`)."""
        ...


class ArgmaxRows:
    """Choices taken on the host from logit rows, each when first read: a verdict reads
    rows only up to the first draft token the target rejects, and each row alone (15-30 µs
    for 152k floats; one argmax over 8 such rows took 1.6x eight single ones, numpy 2.4)."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, row: int) -> int:
        return int(np.argmax(self._rows[row]))

    def confidence(self, row: int) -> float:
        return top_probability(self._rows[row], self[row])


@runtime_checkable
class Decoder(Protocol):
    """What the engine and the drafters need of a model: decode into a KV cache, roll it
    back, and read the tokens that come out.

    `cached` is the list of tokens whose keys and values are in the cache, in order; it only
    grows, but where it is truncated, which `truncations` counts: while the same list has the
    same count, the tokens it held it holds still (CacheAgreement); `tokens_decoded` counts
    every token the model has evaluated (cache reuse shows in it).
    """

    n_vocab: int
    n_ctx: int
    cached: list[int]
    truncations: int
    tokens_decoded: int

    @property
    def prompt_with_drafts(self) -> bool:
        """Whether a prompt decoded with draft rows after it gives the logits it gives alone
        (exact mode on the invariant prompt kernels): then its first round may verify a
        draft."""
        ...

    def decode(self, tokens: Sequence[int], n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        """Append `tokens` to the cache; return logits for the last `n_logit_rows` of them.

        `prompt`: they end a request's prompt (the rest is cached); an exact backend then
        computes them exactly as it would with nothing cached (llama/backend.py). The rows may
        be views into the backend's buffers, valid until the next call.
        """
        ...

    @property
    def chooses_on_device(self) -> bool:
        """Whether `decode_choices` takes each row's argmax on the device that computes the
        logits (a GPU), so that the rows never come to the host; where not, callers take it
        from `decode`'s rows (choices_for_suffix)."""
        ...

    def decode_choices(
        self,
        tokens: Sequence[int],
        n_rows: int,
        prompt: bool = False,
        with_confidence: bool = False,
    ) -> Choices:
        """As `decode`, but only the argmax of each of the last `n_rows` rows, valid until
        the next call; `with_confidence`: and each one's probability (a drafter's step)."""
        ...

    def truncate(self, n_keep: int) -> None:
        """Drop every cached token from position `n_keep` on."""
        ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_end_of_generation(self, token: int) -> bool: ...

    def constrain(self, structure: Structure) -> Constraint:
        """A constraint for answers of this `structure` over this vocabulary, at its start
        (raises StructureError if the backend cannot build it)."""
        ...


@runtime_checkable
class Backend(Decoder, Protocol):
    """A loaded model: the engine's side (Decoder), and what the commands need besides:
    its file, its vocabulary and chat template, its context, prompt reuse."""

    n_ctx_train: int  # the context length the model was trained for (0: unknown)
    # seconds in its decodes, logits back on the host included: the rest of an answer's time
    # is the host's (bench reports the share)
    decode_seconds: float

    @property
    def path(self) -> Path | None:
        """The model file; None for a backend not loaded from one (tests)."""
        ...

    def prompt_reuse(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of `prompt` a prompt decode keeps from the cache (at most
        all but the last: its logits are wanted)."""
        ...

    def resize_context(self, n_ctx: int) -> None:
        """A new, empty context of `n_ctx` tokens."""
        ...

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        """`add_special`: add the model's BOS/EOS as it would to a text; `parse_special`:
        read special tokens written in the text (<|im_start|>) as themselves."""
        ...

    def token_spelling(self, token: int) -> bytes:
        """The token's text with control tokens spelled out (b"<|im_start|>"), where
        token_bytes gives them no text: how a drafter of another vocabulary reads a prompt."""
        ...

    def vocab_info(self) -> VocabInfo: ...

    def fill_in_middle(self) -> FillInMiddle | None:
        """The vocabulary's fill-in-the-middle tokens; None where it has none."""
        ...

    def token_text(self, token: int) -> str:
        """The token's text as stored in the vocabulary (used for compatibility checks)."""
        ...

    def chat_template(self) -> str | None:
        """The model's own chat template, or None if it has none."""
        ...

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """`messages` (and the `tools` the assistant may call, in OpenAI's shape) rendered
        through the chat template, ready for the assistant's reply."""
        ...

    def describe(self) -> dict:
        """What the model is, for reports: path, description, parameters, bytes, n_vocab, n_ctx."""
        ...

    def close(self) -> None:
        """Free the model now rather than when it is collected."""
        ...


@runtime_checkable
class SwitchableKernels(Protocol):
    """A backend whose kernels can be switched between batch-invariant (exact) and
    llama.cpp's own: bench compares both on one loaded model."""

    exact: bool


def encode_chat(
    backend: Backend, messages: list[dict], tools: list[dict] | None = None
) -> list[int]:
    """`messages` (and `tools`) through the model's chat template, as tokens."""
    return encode_template_text(backend, backend.format_chat(messages, tools))


def encode_template_text(backend: Backend, text: str) -> list[int]:
    # Rendered templates spell their own BOS and turn markers: read them, add nothing.
    return backend.tokenize(text, add_special=False, parse_special=True)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Every round of every answer asks this of
    the whole context, so it is compared as lists, in C: turning a 2,000-token list into an
    array took 60 µs a side, 3% of a one-token step of a 7B model on a GPU. A mismatch is
    found by halving, each half again compared in C."""
    n = min(len(a), len(b))
    left, right = _as_list(a, n), _as_list(b, n)
    if left == right:
        return n
    shared, differs = 0, n  # left[:shared] == right[:shared]; left[:differs] differs
    while differs - shared > 1:
        middle = (shared + differs) // 2
        if left[shared:middle] == right[shared:middle]:
            shared = middle
        else:
            differs = middle
    return shared


def _as_list(tokens: Sequence[int], n: int) -> list:
    """The first `n` tokens as a list, copied only where they are not one already."""
    if type(tokens) is list and len(tokens) == n:
        return tokens
    return list(tokens[:n])


def kept_prefix(cached: Sequence[int], tokens: Sequence[int], n_rows: int, known: int = 0) -> int:
    """How much of a cache holding `cached` serves `tokens` when logits are wanted for its last
    `n_rows`: the common prefix, short of those rows (they must be decoded). `known`: leading
    tokens the caller knows they share, not compared again."""
    known = min(known, len(cached), len(tokens))
    if known:
        shared = known + common_prefix_length(cached[known:], tokens[known:])
    else:
        shared = common_prefix_length(cached, tokens)
    return min(shared, len(tokens) - n_rows)


class CacheAgreement:
    """What one caller knows of a decoder's cache without comparing it again: after its last
    `logits_for_suffix` the cache held the caller's first `length` tokens, and holds them
    still while the decoder keeps the same `cached` list, truncated no more since. The
    caller keeps those tokens as they were, or says from where they changed (`changed_from`).
    Comparing a 12,000-token context with the cache, every round, took 90-125 µs on a 2-core
    Xeon: 2-3% of a 7B step on a GPU; this way a round compares its draft's tokens only."""

    def __init__(self) -> None:
        self._cache: list[int] | None = None
        self._truncations = -1
        self.length = 0

    def known(self, decoder: Decoder) -> int:
        """The leading tokens the cache certainly shares with the caller's (0: unknown)."""
        same = decoder.cached is self._cache and decoder.truncations == self._truncations
        return self.length if same else 0

    def record(self, decoder: Decoder, length: int) -> None:
        """The cache now holds the caller's first `length` tokens."""
        self._cache, self._truncations = decoder.cached, decoder.truncations
        self.length = length

    def changed_from(self, position: int) -> None:
        """The caller's tokens from `position` on are no longer those the cache was told of."""
        self.length = min(self.length, position)


def logits_for_suffix(
    backend: Decoder,
    tokens: Sequence[int],
    n_rows: int,
    prompt: bool = False,
    agreement: CacheAgreement | None = None,
) -> np.ndarray:
    """Bring the cache to `tokens` and return logits for its last `n_rows` positions.

    Only the part of `tokens` not already cached is decoded; a cache that ran ahead
    (rejected drafts, an edited chat history) is truncated first. `prompt`: `tokens` is a
    request's prompt (see Backend.decode). `agreement`: the caller's, for a caller that
    calls again with the same tokens grown: what it vouches for is not compared again.
    """
    return _decode_suffix(
        backend, tokens, n_rows, agreement, lambda new: backend.decode(new, n_rows, prompt)
    )


def choices_for_suffix(
    backend: Decoder,
    tokens: Sequence[int],
    n_rows: int,
    prompt: bool = False,
    agreement: CacheAgreement | None = None,
    with_confidence: bool = False,
) -> Choices:
    """As logits_for_suffix, but only each row's greedy choice (`with_confidence`: and its
    probability): taken by the device where the backend chooses there, else on the host from
    the rows."""
    if not backend.chooses_on_device:
        return ArgmaxRows(logits_for_suffix(backend, tokens, n_rows, prompt, agreement))
    return _decode_suffix(
        backend,
        tokens,
        n_rows,
        agreement,
        lambda new: backend.decode_choices(new, n_rows, prompt, with_confidence),
    )


def _decode_suffix(
    backend: Decoder,
    tokens: Sequence[int],
    n_rows: int,
    agreement: CacheAgreement | None,
    decode: Callable[[Sequence[int]], Decoded],
) -> Decoded:
    """The cache truncated to what serves `tokens`, the rest given to `decode`, and the
    caller's agreement told."""
    if not 1 <= n_rows <= len(tokens):
        raise ValueError(f"need 1..{len(tokens)} logit rows, asked for {n_rows}")
    known = agreement.known(backend) if agreement is not None else 0
    keep = kept_prefix(backend.cached, tokens, n_rows, known)
    if keep < len(backend.cached):
        backend.truncate(keep)
    decoded = decode(tokens[keep:])
    if agreement is not None:
        agreement.record(backend, len(tokens))
    return decoded
