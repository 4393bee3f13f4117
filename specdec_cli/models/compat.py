"""Can this drafter draft for this target by token ids? The same checks as llama.cpp's
`common_speculative_are_compatible` (common/speculative.cpp). A drafter that fails them
drafts by text instead (decoding/text_drafter.py)."""

from __future__ import annotations

from ..decoding.backend import Backend, VocabInfo
from ..errors import IncompatibleModelsError
from .gguf_meta import FIRST_COMPARED_TOKEN

MAX_VOCAB_SIZE_DIFFERENCE = 128

_FIX = (
    "Pick a drafter of the same model family (`specdec models` shows which fit), or pass --force."
)


def vocabulary_difference(target: Backend, drafter: Backend) -> str | None:
    """The first difference that keeps the drafter from drafting by token ids, if any."""
    try:
        check_compatible(target, drafter)
    except IncompatibleModelsError as error:
        return error.message
    return None


def check_compatible(target: Backend, drafter: Backend) -> None:
    """Raise IncompatibleModelsError naming the first difference, if any."""
    t, d = target.vocab_info(), drafter.vocab_info()
    if t.vocab_type != d.vocab_type:
        raise IncompatibleModelsError(
            f"the drafter's tokenizer type ({d.vocab_type}) differs from the target's "
            f"({t.vocab_type}).",
            _FIX,
        )
    difference = special_token_difference(t, d)
    if difference:
        raise IncompatibleModelsError(difference, _FIX)
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatibleModelsError(
            f"the drafter's vocabulary has {d.n_vocab} tokens, the target's {t.n_vocab} "
            f"(at most {MAX_VOCAB_SIZE_DIFFERENCE} apart).",
            _FIX,
        )
    for token in range(FIRST_COMPARED_TOKEN, min(t.n_vocab, d.n_vocab)):
        target_text, drafter_text = target.token_text(token), drafter.token_text(token)
        if target_text != drafter_text:
            raise IncompatibleModelsError(
                f"token {token} is {target_text!r} for the target but {drafter_text!r} "
                "for the drafter: the vocabularies differ.",
                _FIX,
            )


def special_token_difference(t: VocabInfo, d: VocabInfo) -> str | None:
    """Whether both models add BOS (EOS) to a text must agree, and then which token it is;
    an id that neither model adds never reaches a prompt, so it may differ (llama.cpp's rule)."""
    for token in ("bos", "eos"):
        adds_t, adds_d = getattr(t, f"add_{token}"), getattr(d, f"add_{token}")
        if adds_t != adds_d:
            return (
                f"the drafter {'adds' if adds_d else 'does not add'} {token.upper()} to a text "
                f"but the target {'does' if adds_t else 'does not'}."
            )
        id_t, id_d = getattr(t, token), getattr(d, token)
        if adds_t and id_t != id_d:
            return (
                f"the drafter's {token.upper()} token is {id_d}, the target's {id_t}, and both "
                "add it to every text."
            )
    return None
