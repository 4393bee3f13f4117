"""OpenAI's response shapes for chat completions and completions: whole bodies and streamed
chunks, usage (with specdec's own counts), ids, the finish reasons and the model card. Pure
data, as serve_protocol.py's requests."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ..decoding.engine import Finished, GenerationStats
from ..services import tool_calls

FINISH_REASONS = {"stop": "stop", "stop_string": "stop", "length": "length", "context": "length"}


@dataclass(frozen=True)
class TokenLogprobs:
    """An answer token's log-probability (decoding/logprobs.py), the token spelled as the
    vocabulary spells it, with its alternatives'."""

    spelling: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    """Text an answer released, and the log-probabilities of the tokens since the last
    delta (where the request asked for them)."""

    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class Answer:
    """What one request produced, for the response body and the log line; `logprobs`:
    every answer token's, where the request asked for them."""

    finished: Finished
    prompt_tokens: int
    cached_tokens: int
    logprobs: tuple[TokenLogprobs, ...] | None = None

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.finished.finish_reason)


def usage(answer: Answer) -> dict:
    stats: GenerationStats = answer.finished.stats
    completion = stats.generated
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens,
        },
        # specdec's extension: what speculative decoding did for this answer.
        "specdec": {
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance": round(stats.acceptance, 4),
            "target_passes": stats.target_passes,
            "tokens_per_pass": round(stats.tokens_per_pass, 4),
            "tokens_per_second": round(stats.tokens_per_second, 3),
            "seconds": round(stats.seconds, 4),
            "draft_sources": dict(stats.draft_sources),
        },
    }


@dataclass(frozen=True)
class ResponseIds:
    """What every chunk of one response repeats."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseIds:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


class ChatShape:
    """chat.completion and its chunks: a role delta first, then content deltas."""

    prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def whole(self, ids: ResponseIds, answer: Answer) -> dict:
        message = {"role": "assistant", "content": answer.finished.text, "refusal": None}
        logprobs = None if answer.logprobs is None else _chat_logprobs(answer.logprobs)
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": answer.finish_reason,
        }
        return {**ids.head("chat.completion"), "choices": [choice], "usage": usage(answer)}

    def opening(self, ids: ResponseIds, with_usage: bool) -> list[dict]:
        return [self._chunk(ids, {"role": "assistant", "content": ""}, None, with_usage)]

    def delta(self, ids: ResponseIds, delta: Delta, with_usage: bool) -> dict | None:
        chunk = self._chunk(ids, {"content": delta.text}, None, with_usage)
        return _with_logprobs(chunk, _chat_logprobs(delta.logprobs)) if delta.logprobs else chunk

    def closing(self, ids: ResponseIds, answer: Answer, with_usage: bool) -> list[dict]:
        last = self._chunk(ids, {}, answer.finish_reason, with_usage)
        return [last, _usage_chunk(ids, self.chunk_object, answer)] if with_usage else [last]

    def _chunk(self, ids: ResponseIds, delta: dict, finish: str | None, with_usage: bool) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _with_usage_slot({**ids.head(self.chunk_object), "choices": [choice]}, with_usage)


def _chat_logprobs(tokens: tuple[TokenLogprobs, ...]) -> dict:
    def entry(spelling: bytes, logprob: float) -> dict:
        return {"token": _text(spelling), "logprob": logprob, "bytes": list(spelling)}

    content = [
        {**entry(t.spelling, t.logprob), "top_logprobs": [entry(*alt) for alt in t.top]}
        for t in tokens
    ]
    return {"content": content, "refusal": None}


def _with_logprobs(chunk: dict, logprobs: dict) -> dict:
    chunk["choices"][0]["logprobs"] = logprobs
    return chunk


def _text(spelling: bytes) -> str:
    return spelling.decode("utf-8", errors="replace")


class ToolCallShape(ChatShape):
    """chat.completion where the model may call tools: the calls it wrote (tool_calls.py)
    become `tool_calls` and finish_reason "tool_calls". Streamed, content goes out as it
    comes until a call may begin; the calls come at the end, each as OpenAI streams one
    (its index, id and name, then its arguments)."""

    def __init__(self, names: list[str], parallel: bool = True) -> None:
        self.names, self.parallel = names, parallel
        self._held = tool_calls.HeldText()
        self._unsent: tuple[TokenLogprobs, ...] = ()  # held text's tokens' logprobs

    def whole(self, ids: ResponseIds, answer: Answer) -> dict:
        body = super().whole(ids, answer)
        content, calls = self._split(answer.finished.text)
        if calls:
            choice = body["choices"][0]
            choice["message"]["content"] = content or None
            choice["message"]["tool_calls"] = [call.as_dict() for call in calls]
            choice["finish_reason"] = "tool_calls"
        return body

    def delta(self, ids: ResponseIds, delta: Delta, with_usage: bool) -> dict | None:
        self._unsent += delta.logprobs
        released = self._held.feed(delta.text)
        return super().delta(ids, self._sent(released), with_usage) if released else None

    def _sent(self, text: str) -> Delta:
        """`text` with every logprob not yet sent."""
        delta, self._unsent = Delta(text, self._unsent), ()
        return delta

    def closing(self, ids: ResponseIds, answer: Answer, with_usage: bool) -> list[dict]:
        content, calls = self._split(self._held.held)
        chunks = [self._chunk(ids, {"content": content}, None, with_usage)] if content else []
        for index, call in enumerate(calls):
            named = {"index": index, "id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": ""}}  # fmt: skip
            argued = {"index": index, "function": {"arguments": call.arguments}}
            chunks += [
                self._chunk(ids, {"tool_calls": [named]}, None, with_usage),
                self._chunk(ids, {"tool_calls": [argued]}, None, with_usage),
            ]
        finish = "tool_calls" if calls else answer.finish_reason
        chunks.append(self._chunk(ids, {}, finish, with_usage))
        if unsent := self._sent("").logprobs:  # the calls' tokens: with the first chunk
            _with_logprobs(chunks[0], _chat_logprobs(unsent))
        return [*chunks, _usage_chunk(ids, self.chunk_object, answer)] if with_usage else chunks

    def _split(self, text: str) -> tuple[str, list[tool_calls.ToolCall]]:
        content, calls = tool_calls.split_calls(text, self.names)
        return content, calls if self.parallel else calls[:1]


class TextShape:
    """text_completion, whole and in chunks."""

    prefix = "cmpl"
    chunk_object = "text_completion"

    def __init__(self) -> None:
        self._offset = 0  # the next token's place in the answer's text (text_offset)

    def whole(self, ids: ResponseIds, answer: Answer) -> dict:
        choice = self._choice(answer.finished.text, answer.finish_reason)
        if answer.logprobs is not None:
            choice["logprobs"] = self._logprobs(answer.logprobs)
        return {**ids.head("text_completion"), "choices": [choice], "usage": usage(answer)}

    def opening(self, ids: ResponseIds, with_usage: bool) -> list[dict]:
        return []

    def delta(self, ids: ResponseIds, delta: Delta, with_usage: bool) -> dict | None:
        chunk = {**ids.head(self.chunk_object), "choices": [self._choice(delta.text, None)]}
        if delta.logprobs:
            _with_logprobs(chunk, self._logprobs(delta.logprobs))
        return _with_usage_slot(chunk, with_usage)

    def closing(self, ids: ResponseIds, answer: Answer, with_usage: bool) -> list[dict]:
        chunk = {**ids.head(self.chunk_object), "choices": [self._choice("", answer.finish_reason)]}
        last = _with_usage_slot(chunk, with_usage)
        return [last, _usage_chunk(ids, self.chunk_object, answer)] if with_usage else [last]

    @staticmethod
    def _choice(text: str, finish: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def _logprobs(self, tokens: tuple[TokenLogprobs, ...]) -> dict:
        """The completions API's columns; each token's text_offset counts the characters
        of the tokens before it in the answer."""
        spelled = [_text(t.spelling) for t in tokens]
        offsets = []
        for text in spelled:
            offsets.append(self._offset)
            self._offset += len(text)
        return {
            "tokens": spelled,
            "token_logprobs": [t.logprob for t in tokens],
            # OpenAI's "up to logprobs+1": the alternatives and the token itself
            "top_logprobs": [
                {**{_text(alt): lp for alt, lp in t.top}, _text(t.spelling): t.logprob}
                for t in tokens
            ],
            "text_offset": offsets,
        }


def _with_usage_slot(chunk: dict, with_usage: bool) -> dict:
    """With include_usage every chunk carries "usage": null, all but the last."""
    return {**chunk, "usage": None} if with_usage else chunk


def _usage_chunk(ids: ResponseIds, kind: str, answer: Answer) -> dict:
    return {**ids.head(kind), "choices": [], "usage": usage(answer)}


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "specdec"}
