"""A request's text as the target's prompt tokens, and the checks on it."""

from __future__ import annotations

from pathlib import Path

from ..decoding.backend import Backend, encode_chat
from ..errors import BadUsageError, ContextOverflowError, ModelFileError


def chat_messages(user_text: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user_text}]


def prompt_tokens(
    target: Backend, text: str, *, system: str | None, raw: bool, tools: list[dict] | None = None
) -> list[int]:
    """Raw text as-is (with the model's BOS), or the user message through the chat template
    (with the `tools` the answer may call, in OpenAI's shape)."""
    if raw:
        return target.tokenize(text, add_special=True)
    return encode_chat(target, chat_messages(text, system), tools)


def fill_in_middle_tokens(target: Backend, prefix: str, suffix: str) -> list[int]:
    """The prompt that asks a code model for what goes between `prefix` and `suffix`, as
    llama-server's /infill lays it out: [BOS] <prefix mark> prefix <suffix mark> suffix
    <middle mark>."""
    marks = target.fill_in_middle()
    if marks is None:
        raise ModelFileError(
            "this model was not trained to fill in the middle: its vocabulary has no "
            "fill-in-the-middle tokens.",
            "Leave the suffix out, or use a code model trained for it (Qwen2.5-Coder, "
            "CodeLlama, StarCoder2).",
        )
    info = target.vocab_info()
    return [
        *([info.bos] if info.add_bos and info.bos >= 0 else []),
        marks.prefix,
        *target.tokenize(prefix, add_special=False),
        marks.suffix,
        *target.tokenize(suffix, add_special=False),
        marks.middle,
    ]


def read_prediction(path: Path) -> str:
    """The text of a --predict or /predict file: what the answer is expected to repeat."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise BadUsageError(
            f"cannot read the prediction {path}: {reason or error}.",
            "Pass a readable text file: the text the answer is expected to mostly repeat.",
        ) from None
    if not text.strip():
        raise BadUsageError(f"the prediction {path} is empty.", "Pass a file with text in it.")
    return text


def prediction_tokens(target: Backend, text: str | None) -> tuple[int, ...]:
    return tuple(target.tokenize(text, add_special=False)) if text else ()


def check_prompt_fits(prompt: list[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}.",
            "Raise --ctx-size or shorten the input.",
        )
