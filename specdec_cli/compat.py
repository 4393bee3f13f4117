"""Can this drafter draft for this target? The same checks as llama.cpp's
`common_speculative_are_compatible` (common/speculative.cpp)."""

from __future__ import annotations

from .backend import Backend
from .errors import IncompatibleModelsError

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5  # ids below are control tokens that families renumber freely

_FIX = (
    "Pick a drafter of the same model family (`specdec models` shows which fit), or pass --force."
)


def check_compatible(target: Backend, drafter: Backend) -> None:
    """Raise IncompatibleModelsError naming the first difference, if any."""
    t, d = target.vocab_info(), drafter.vocab_info()
    if t.vocab_type != d.vocab_type:
        raise IncompatibleModelsError(
            f"the drafter's tokenizer type ({d.vocab_type}) differs from the target's "
            f"({t.vocab_type}).",
            _FIX,
        )
    for field in ("bos", "eos", "add_bos", "add_eos"):
        if getattr(t, field) != getattr(d, field):
            raise IncompatibleModelsError(
                f"the drafter's {field} ({getattr(d, field)}) differs from the target's "
                f"({getattr(t, field)}).",
                _FIX,
            )
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatibleModelsError(
            f"the drafter's vocabulary has {d.n_vocab} tokens, the target's {t.n_vocab} "
            f"(at most {MAX_VOCAB_SIZE_DIFFERENCE} apart).",
            _FIX,
        )
    for token in range(FIRST_CHECKED_TOKEN, min(t.n_vocab, d.n_vocab)):
        target_text, drafter_text = target.token_text(token), drafter.token_text(token)
        if target_text != drafter_text:
            raise IncompatibleModelsError(
                f"token {token} is {target_text!r} for the target but {drafter_text!r} "
                "for the drafter: the vocabularies differ.",
                _FIX,
            )
