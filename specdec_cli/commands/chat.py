"""A multi-turn conversation over a model pair: history as tokens, cache reuse, trimming, commands.

No terminal code here. `chat_loop.py` reads lines and handles Ctrl-C; `render_chat.ChatView` draws.

Each turn renders the whole conversation through the target's chat template and runs one
`Generation` over all of it. The backends compare that token list with what their KV caches
hold (`backend.logits_for_suffix`), so only the new turn is decoded (in exact mode also
the last partial prompt chunk and the previous answer: see LlamaBackend's prompt chunks,
which keep the answer independent of what is cached). To make the prefix
match exactly, the history is kept as tokens: the previous prompt plus the tokens the model
generated, followed by the newly rendered text (not a re-tokenisation of the old reply,
which could split differently).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..decoding.backend import Backend, encode_template_text
from ..decoding.drafters import Drafter, ModelDrafter
from ..decoding.engine import (
    Finished,
    FinishReason,
    Generation,
    GenerationSettings,
    GenerationStats,
)
from ..decoding.history import HistoryIndex
from ..decoding.modes import use_history
from ..errors import BadUsageError, ModelFileError, SpecdecError
from ..models.loading import ModelPair
from ..services.history_file import HistoryFile
from ..services.prompting import check_prompt_fits, prediction_tokens, read_prediction
from ..structured import StructureKind, structure_from_file

COMMANDS: dict[str, str] = {
    "/help": "this list",
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (/system alone removes it)",
    "/draft K": "draft at most K tokens per round (0: the target alone)",
    "/temp T": "sampling temperature (0: greedy)",
    "/predict FILE": "the next answer is expected to mostly repeat FILE (drafts follow it)",
    "/schema FILE": "answers are JSON matching this JSON schema (/schema alone: free again)",
    "/grammar FILE": "answers follow this GBNF grammar (/grammar alone: free again)",
    "/stats": "totals for the session, and what each turn decoded",
    "/save FILE": "write the transcript (.json: JSON, anything else: Markdown)",
    "/exit": "leave (Ctrl-D and Ctrl-C at the prompt do too)",
}


# The commands that constrain every answer from then on, and what their file holds.
CONSTRAINTS = {"schema": StructureKind.JSON_SCHEMA, "grammar": StructureKind.GRAMMAR}


class CommandError(BadUsageError):
    """A slash command that cannot be parsed; the session goes on."""


@dataclass(frozen=True)
class Command:
    name: str  # "help", "reset", "system", "draft", "temp", "stats", "save", "exit", ...
    # Its type follows the name: str (or None) for system, schema and grammar, str for save
    # and predict, int for draft, float for temp; parse_command guarantees it, which a union
    # would hide from the checker.
    value: Any = None


def parse_command(line: str) -> Command | None:
    """The command on `line`, or None when the line is a message for the model.

    A message that starts with "/" is sent by doubling the slash ("//etc/hosts ...").
    """
    line = line.strip()
    if not line.startswith("/") or line.startswith("//"):
        return None
    name, _, arg = line[1:].partition(" ")
    name, arg = name.lower(), arg.strip()
    if name in ("help", "reset", "stats", "exit", "quit", "?"):
        if arg:
            raise CommandError(f"/{name} takes no argument.", "Type it alone.")
        return Command({"quit": "exit", "?": "help"}.get(name, name))
    if name == "system" or name in CONSTRAINTS:
        return Command(name, arg or None)
    if name == "save":
        if not arg:
            raise CommandError("/save needs a file name.", "Try /save chat.md or /save chat.json.")
        return Command("save", arg)
    if name == "predict":
        if not arg:
            raise CommandError("/predict needs a file name.", "Try /predict app.py.")
        return Command("predict", arg)
    if name == "draft":
        if not arg.isdigit():
            raise CommandError(f"/draft needs a whole number, not {arg!r}.", "Try /draft 8.")
        return Command("draft", int(arg))
    if name == "temp":
        try:
            value = float(arg)
        except ValueError:
            value = -1.0
        if not value >= 0.0:  # also refuses nan
            raise CommandError(f"/temp needs a number >= 0, not {arg!r}.", "Try /temp 0.7.")
        return Command("temp", value)
    raise CommandError(f"unknown command /{name}.", "Type /help for the list.")


def user_text(line: str) -> str:
    """The message a non-command line sends (a doubled leading slash stands for one)."""
    line = line.strip()
    return line[1:] if line.startswith("//") else line


@dataclass(frozen=True)
class Exchange:
    user: str
    assistant: str
    interrupted: bool = False


@dataclass(frozen=True)
class TurnRecord:
    """What one turn cost, measured at the backends."""

    prompt_tokens: int  # the whole conversation so far, as fed to the target
    reused_tokens: int  # of which the target's KV cache already held
    reply_tokens: int
    target_decoded: int | None  # tokens the target evaluated this turn (None: backend can't say)
    drafter_decoded: int | None
    dropped_exchanges: int
    finish_reason: FinishReason
    stats: GenerationStats


@dataclass
class _Known:
    """The token history of the last turn and the template text it stands for."""

    text: str
    tokens: list[int]


class Turn:
    """One reply in progress. Iterate `events()`; call `stop()` if you stop early."""

    def __init__(
        self,
        session: ChatSession,
        generation: Generation,
        user: str,
        rendered: str,
        dropped: int,
        reused: int,
    ) -> None:
        self.generation = generation
        self.user = user
        self.dropped = dropped
        self.record: TurnRecord | None = None
        self.rendered = rendered  # the conversation through the template, up to this reply
        self.reused = reused  # prompt tokens the target's cache already held
        self.decoded_before = session.decoded_counts()
        self._session = session

    def events(self):
        for event in self.generation.events():
            if isinstance(event, Finished):
                self._finish(event)
            yield event

    def stop(self) -> Finished:
        """End the turn with what was produced so far; the conversation keeps it."""
        finished = self.generation.interrupted()
        self._session.resync_caches()
        self._finish(finished)
        return finished

    def _finish(self, finished: Finished) -> None:
        if self.record is None:
            self.record = self._session.finish_turn(self, finished)


class ChatSession:
    """The conversation, the models, the settings and the session's totals."""

    def __init__(
        self,
        pair: ModelPair,
        settings: GenerationSettings,
        system: str | None = None,
        drafter: Drafter | None = None,
        history: HistoryIndex | None = None,
        history_file: HistoryFile | None = None,
    ) -> None:
        """`drafter` defaults to the pair's draft model drafting --draft-max tokens a round.
        Each turn goes to `history` once (HistoryIndex.add_turn: the new part of the prompt and
        the answer, what an adaptive drafter drafts from, also after /reset or a regenerated
        turn) and, with --history, to `history_file`."""
        self.pair = pair
        self.history = history if history is not None else HistoryIndex()
        self.history_file = history_file
        self.history_problem: str | None = None  # why the last answer was not stored
        use_history(drafter, self.history)
        self.settings = settings
        self.system = system or None
        self.exchanges: list[Exchange] = []  # every exchange since the last /reset
        self.window_start = 0  # exchanges before this were dropped to fit the context
        self.records: list[TurnRecord] = []
        self.totals = GenerationStats()
        if drafter is None and pair.drafter is not None:
            drafter = ModelDrafter(pair.drafter)
        self._drafter = drafter
        self._known: _Known | None = None
        if pair.target.chat_template() is None:
            name = pair.target.path.name if pair.target.path else "the target"
            raise ModelFileError(
                f"{name} has no chat template in its metadata, so it cannot hold a conversation.",
                "Use a chat/instruct model, or `specdec run --raw` for plain completion.",
            )

    @property
    def has_drafter(self) -> bool:
        return self._drafter is not None

    @property
    def drafting(self) -> bool:
        return self._drafter is not None and self.settings.draft_max > 0

    # -- commands --------------------------------------------------------------------------

    def reset(self) -> None:
        self.exchanges.clear()
        self.window_start = 0

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    def set_draft_max(self, k: int) -> None:
        if k > 0 and self._drafter is None:
            raise CommandError("nothing drafts in this session.", "Start it without --no-draft.")
        self.settings = replace(self.settings, draft_max=k)

    def set_temperature(self, t: float) -> None:
        self.settings = replace(
            self.settings, sampling=replace(self.settings.sampling, temperature=t)
        )

    def constrain(self, command: str, path: str | None) -> None:
        """Every answer from now on follows the JSON schema (`command` "schema") or the
        grammar ("grammar") in the file at `path` (None: answers are free again). The file
        is read and its grammar built now, so a bad one is refused here and the session
        goes on (each answer then builds its own from the same structure)."""
        if path is None:
            self.settings = replace(self.settings, structure=None)
            return
        structure = structure_from_file(CONSTRAINTS[command], Path(path), f"/{command}")
        self.pair.target.constrain(structure)  # raises StructureError if it cannot be built
        self.settings = replace(self.settings, structure=structure)

    # -- turns -----------------------------------------------------------------------------

    def messages(self, user: str | None = None) -> list[dict[str, str]]:
        """The messages in the context window (system first), plus `user` if given."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for exchange in self.exchanges[self.window_start :]:
            messages.append({"role": "user", "content": exchange.user})
            messages.append({"role": "assistant", "content": exchange.assistant})
        if user is not None:
            messages.append({"role": "user", "content": user})
        return messages

    def reply(self, user: str) -> Turn:
        """Start the answer to `user`. Drops the oldest exchanges if the context is short;
        raises ContextOverflowError if the message alone does not fit."""
        n_ctx = self.pair.target.n_ctx
        # Keep room for the answer, but never so much that a long --max-tokens forgets
        # the whole conversation every turn.
        room = min(self.settings.max_tokens, n_ctx // 2)
        dropped = 0
        while True:
            rendered, prompt = self._prompt(user)
            if len(prompt) + room <= n_ctx or self.window_start == len(self.exchanges):
                break
            self.window_start += 1
            dropped += 1
        check_prompt_fits(prompt, n_ctx)
        reused = self.pair.target.prompt_reuse(prompt)
        drafter = self._drafter if self.drafting else None
        settings, self.settings = self.settings, replace(self.settings, prediction=())
        generation = Generation(self.pair.target, prompt, settings, drafter=drafter)
        return Turn(self, generation, user, rendered, dropped, reused)

    def predict(self, path: str) -> int:
        """The next answer is expected to mostly repeat the file at `path`; returns its
        length in tokens."""
        tokens = prediction_tokens(self.pair.target, read_prediction(Path(path)))
        self.settings = replace(self.settings, prediction=tokens)
        return len(tokens)

    def _prompt(self, user: str) -> tuple[str, list[int]]:
        target = self.pair.target
        rendered = target.format_chat(self.messages(user))
        known = self._known
        if known is not None and rendered.startswith(known.text):
            tail = rendered[len(known.text) :]
            return rendered, known.tokens + encode_template_text(target, tail)
        # First turn, or the history changed (reset, new system message, dropped turns).
        return rendered, encode_template_text(target, rendered)

    def finish_turn(self, turn: Turn, finished: Finished) -> TurnRecord:
        """Called by the turn once: keep the exchange, count what it cost."""
        generation = turn.generation
        reply = finished.text
        if finished.finish_reason != FinishReason.INTERRUPTED:
            self._remember(generation.prompt, finished.tokens)
        self.exchanges.append(
            Exchange(turn.user, reply, finished.finish_reason == FinishReason.INTERRUPTED)
        )
        # The reply's tokens stand for its text only if they spell it exactly (not when a
        # stop string cut the text, or a character was left incomplete).
        spelled = b"".join(self.pair.target.token_bytes(t) for t in finished.tokens)
        if spelled == reply.encode("utf-8"):
            self._known = _Known(turn.rendered + reply, generation.prompt + finished.tokens)
        else:
            self._known = None
        after = self.decoded_counts()
        decoded = [
            None if b is None or a is None else a - b
            for b, a in zip(turn.decoded_before, after, strict=True)
        ]
        record = TurnRecord(
            prompt_tokens=len(generation.prompt),
            reused_tokens=turn.reused,
            reply_tokens=len(finished.tokens),
            target_decoded=decoded[0],
            drafter_decoded=decoded[1],
            dropped_exchanges=turn.dropped,
            finish_reason=finished.finish_reason,
            stats=finished.stats,
        )
        self.records.append(record)
        self.totals.merge(finished.stats)
        return record

    def _remember(self, prompt: list[int], answer: list[int]) -> None:
        document = self.history.add_turn(prompt, answer)
        if self.history_file is not None:
            self.history_problem = self.history_file.append(document)
            if self.history_problem:
                self.history_file = None  # unwritable: the session goes on without it

    def decoded_counts(self) -> tuple[int, int | None]:
        """Tokens each backend has evaluated so far (None: the session has no drafter)."""
        drafter = self.pair.drafter
        return self.pair.target.tokens_decoded, None if drafter is None else drafter.tokens_decoded

    def resync_caches(self) -> None:
        """After an interruption, drop any KV entries past what each backend lists as cached
        (a Ctrl-C that lands between llama_decode and the bookkeeping after it)."""
        for backend in (self.pair.target, self.pair.drafter):
            if backend is not None:
                backend.truncate(len(backend.cached))

    # -- the transcript --------------------------------------------------------------------

    def transcript(self) -> dict:
        return {
            "system": self.system,
            "messages": [
                message
                for e in self.exchanges
                for message in (
                    {"role": "user", "content": e.user},
                    {"role": "assistant", "content": e.assistant}
                    | ({"interrupted": True} if e.interrupted else {}),
                )
            ],
            "settings": {
                "max_tokens": self.settings.max_tokens,
                "draft_max": self.settings.draft_max if self.has_drafter else 0,
                "sampling": asdict(self.settings.sampling),
                "seed": self.settings.seed,
            },
            "models": {
                "target": _path_text(self.pair.target),
                "draft": None if self.pair.drafter is None else _path_text(self.pair.drafter),
            },
            "totals": self.totals.as_dict(),
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        record = self.transcript()
        text = (
            json.dumps(record, ensure_ascii=False, indent=2) + "\n"
            if path.suffix.lower() == ".json"
            else transcript_markdown(record)
        )
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as error:
            raise SpecdecError(
                f"could not write {path}: {error.strerror}.", "Check the folder exists."
            ) from None
        return path


def _path_text(backend: Backend) -> str:
    return "" if backend.path is None else str(backend.path)


def transcript_markdown(record: dict) -> str:
    lines = ["# specdec chat", ""]
    models = record["models"]
    drafter = f", drafter `{models['draft']}`" if models["draft"] else ""
    lines.append(f"Target `{models['target']}`{drafter}")
    lines.append("")
    if record["system"]:
        lines += ["**System:** " + record["system"], ""]
    for message in record["messages"]:
        heading = "## You" if message["role"] == "user" else "## Assistant"
        if message.get("interrupted"):
            heading += " (interrupted)"
        lines += [heading, "", message["content"], ""]
    return "\n".join(lines)
