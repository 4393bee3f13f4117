"""A scripted Backend for testing the engine without llama.cpp, and models to script it with.

A model here is just `logits_fn(prefix) -> n_vocab floats`, where `prefix` is every token
so far (prompt included). `FakeBackend` plays one with the same cache bookkeeping as a real
backend, and counts what it decodes so tests can check that only new tokens are decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specdec_cli.decoding.backend import ArgmaxRows, Choices, FillInMiddle, VocabInfo, kept_prefix
from specdec_cli.decoding.drafters import Draft, Drafter, DraftSource, ModelDrafter, Outcome
from specdec_cli.decoding.sampling import Distribution, SamplingSettings, TokenChooser
from specdec_cli.errors import ModelFileError
from specdec_cli.request import DecodeRequest, HardwareOptions
from specdec_cli.structured import Structure, StructureError

LogitsFn = Callable[[tuple[int, ...]], np.ndarray]


class FakeBackend:
    """Implements the Backend protocol with scripted logits.

    Logits are cached per prefix (the statistical tests decode the same few prefixes tens
    of thousands of times), so `logits_fn` must be a pure function of the prefix.
    """

    def __init__(
        self,
        logits_fn: LogitsFn,
        n_vocab: int,
        n_ctx: int = 512,
        end_of_generation: Iterable[int] = (),
        pieces: Mapping[int, bytes] | Sequence[bytes] | None = None,
        specials: Iterable[int] = (),
        bos: int | None = None,
        constraints: Callable[[Structure], Any] | None = None,
    ) -> None:
        """`specials`: control tokens, spelled by their piece but with no text (token_bytes
        b"") and read from a text only with parse_special; `bos`: added to a text's start
        with add_special; `constraints`: what `constrain` builds (none: it refuses)."""
        self.path: Path | None = None
        self.prompt_with_drafts = False  # as llama.cpp's own kernels
        self.chooses_on_device = False  # its choices are the argmax of its rows
        self.logits_fn = logits_fn
        self.n_vocab = n_vocab
        self.n_ctx = self.n_ctx_train = n_ctx
        self.cached: list[int] = []
        self.truncations = 0
        self.decode_seconds = 0.0
        self.end_of_generation = frozenset(end_of_generation)
        if pieces is None:
            pieces = letter_pieces(n_vocab, self.end_of_generation)
        self.pieces = dict(pieces) if isinstance(pieces, Mapping) else dict(enumerate(pieces))
        self.specials = frozenset(specials)
        self.bos = bos
        self.constraints = constraints
        self.decode_calls = 0
        self.tokens_decoded = 0
        self.exact = False  # scripted logits are the same whatever the batch
        self.max_cached = 0
        self._rows: dict[tuple[int, ...], np.ndarray] = {}
        self._batches: dict[tuple[tuple[int, ...], int], np.ndarray] = {}

    def logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        row = self._rows.get(prefix)
        if row is None:
            row = np.asarray(self.logits_fn(prefix), dtype=np.float32)
            if row.shape != (self.n_vocab,):
                raise ValueError(f"logits_fn gave shape {row.shape}, want ({self.n_vocab},)")
            row.flags.writeable = False
            self._rows[prefix] = row
        return row

    def decode(self, tokens: Sequence[int], n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        if not 1 <= n_logit_rows <= len(tokens):
            raise ValueError(f"asked for {n_logit_rows} rows from a batch of {len(tokens)}")
        if len(self.cached) + len(tokens) > self.n_ctx:
            raise RuntimeError(
                f"context overflow: {len(self.cached)} cached + {len(tokens)} > n_ctx {self.n_ctx}"
            )
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise ValueError(f"a token in {list(tokens)} is outside the vocabulary")
        self.decode_calls += 1
        self.tokens_decoded += len(tokens)
        self.cached.extend(int(t) for t in tokens)
        self.max_cached = max(self.max_cached, len(self.cached))
        key = (tuple(self.cached), n_logit_rows)
        rows = self._batches.get(key)
        if rows is None:
            full, end = key[0], len(key[0])
            rows = np.stack([self.logits(full[: p + 1]) for p in range(end - n_logit_rows, end)])
            rows.flags.writeable = False
            self._batches[key] = rows
        return rows

    def decode_choices(
        self,
        tokens: Sequence[int],
        n_rows: int,
        prompt: bool = False,
        with_confidence: bool = False,
    ) -> Choices:
        return ArgmaxRows(self.decode(tokens, n_rows, prompt))

    def truncate(self, n_keep: int) -> None:
        del self.cached[n_keep:]
        self.truncations += 1

    def prompt_reuse(self, prompt: Sequence[int]) -> int:
        return kept_prefix(self.cached, prompt, 1)

    def resize_context(self, n_ctx: int) -> None:
        self.n_ctx, self.cached = n_ctx, []

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        """Greedy longest match against the pieces (the control tokens' only with
        parse_special), after the BOS with add_special."""
        data = text.encode()
        out = [self.bos] if add_special and self.bos is not None else []
        by_length = sorted(
            (
                (p, t)
                for t, p in self.pieces.items()
                if p and (parse_special or t not in self.specials)
            ),
            key=lambda pt: (-len(pt[0]), pt[1]),
        )
        while data:
            for piece, token in by_length:
                if data.startswith(piece):
                    out.append(token)
                    data = data[len(piece) :]
                    break
            else:
                raise ValueError(f"cannot tokenize {data!r}")
        return out

    def token_bytes(self, token: int) -> bytes:
        return b"" if token in self.specials else self.pieces.get(token, b"")

    def token_spelling(self, token: int) -> bytes:
        return self.pieces.get(token, b"")

    def is_end_of_generation(self, token: int) -> bool:
        return token in self.end_of_generation

    def constrain(self, structure: Structure):
        if self.constraints is None:
            raise StructureError("a FakeBackend has no grammar engine.")
        return self.constraints(structure)

    def vocab_info(self) -> VocabInfo:
        eos = min(self.end_of_generation, default=-1)
        bos = -1 if self.bos is None else self.bos
        return VocabInfo(
            vocab_type=2,
            n_vocab=self.n_vocab,
            bos=bos,
            eos=eos,
            add_bos=self.bos is not None,
            add_eos=False,
        )

    def fill_in_middle(self) -> FillInMiddle | None:
        return None  # as a chat model's vocabulary

    def token_text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        return None

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        raise ModelFileError("a FakeBackend has no chat template.", "Use --raw prompts.")

    def describe(self) -> dict:
        return {"path": None, "description": "FakeBackend", "n_vocab": self.n_vocab}

    def close(self) -> None:
        pass

    def twin(self, logits_fn: LogitsFn | None = None, **changes) -> FakeBackend:
        """A fresh backend with the same vocabulary (a drafter for this one)."""
        kwargs: dict[str, Any] = dict(
            n_vocab=self.n_vocab,
            n_ctx=self.n_ctx,
            end_of_generation=self.end_of_generation,
            pieces=self.pieces,
            specials=self.specials,
            bos=self.bos,
        )
        kwargs.update(changes)
        return FakeBackend(logits_fn or self.logits_fn, **kwargs)


def letter_pieces(n_vocab: int, end_of_generation: Iterable[int] = ()) -> dict[int, bytes]:
    """Token i spells one letter ('a', 'b', ...); end-of-generation tokens spell nothing."""
    eog = set(end_of_generation)
    return {t: b"" if t in eog else bytes([ord("a") + t % 26]) for t in range(n_vocab)}


# --- models -----------------------------------------------------------------------------------


def table_model(n_vocab: int, seed: int, context: int | None = 1, scale: float = 2.0) -> LogitsFn:
    """Random logits that depend on the last `context` tokens (all of them when None).

    Each distinct context gets its own N(0, scale) logits, reproducible from `seed`.
    """

    def logits(prefix: tuple[int, ...]) -> np.ndarray:
        key = prefix if context is None else prefix[-context:]
        rng = np.random.default_rng([seed, len(key), *key])
        return rng.normal(0.0, scale, n_vocab)

    return logits


def scripted_model(
    next_token: Callable[[tuple[int, ...]], int], n_vocab: int, margin: float = 10.0
) -> LogitsFn:
    """Logits with one clear winner, `next_token(prefix)`, `margin` above the rest."""

    def logits(prefix: tuple[int, ...]) -> np.ndarray:
        row = np.zeros(n_vocab)
        row[next_token(prefix)] = margin
        return row

    return logits


def sequence_model(
    script: Sequence[int], prompt_len: int, n_vocab: int, after: int = 0
) -> LogitsFn:
    """Greedy output is exactly `script` after a prompt of `prompt_len` tokens, then `after`."""

    def next_token(prefix: tuple[int, ...]) -> int:
        i = len(prefix) - prompt_len
        return script[i] if 0 <= i < len(script) else after

    return scripted_model(next_token, n_vocab)


def negated(model: LogitsFn) -> LogitsFn:
    """A model very unlike `model`: its likeliest tokens become the least likely."""
    return lambda prefix: -np.asarray(model(prefix))


def blended(model: LogitsFn, other: LogitsFn, weight: float) -> LogitsFn:
    """(1 - weight) * model + weight * other: a drafter somewhat like the target."""
    return lambda prefix: (
        (1.0 - weight) * np.asarray(model(prefix)) + weight * np.asarray(other(prefix))
    )


def always_wrong(model: LogitsFn, n_vocab: int) -> LogitsFn:
    """A model whose argmax is never `model`'s: greedy drafts from it are always rejected."""

    def logits(prefix: tuple[int, ...]) -> np.ndarray:
        wrong = (int(np.argmax(model(prefix))) + 1) % n_vocab
        row = np.zeros(n_vocab)
        row[wrong] = 10.0
        return row

    return logits


GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=0.9, top_k=6, top_p=0.95, min_p=0.02)


def table_target(n_ctx: int = 512, **kwargs) -> FakeBackend:
    """Ten tokens, random logits keyed by the last two: the engine tests' usual target."""
    return FakeBackend(table_model(10, seed=7, context=2), n_vocab=10, n_ctx=n_ctx, **kwargs)


# --- drafters ---------------------------------------------------------------------------------


def model_drafter(
    target: FakeBackend,
    logits_fn: LogitsFn | None = None,
    min_confidence: float = 0.0,
    **backend_changes,
) -> ModelDrafter:
    """A ModelDrafter over a twin of `target` (the same model unless `logits_fn` is given)."""
    return ModelDrafter(target.twin(logits_fn, **backend_changes), min_confidence=min_confidence)


@dataclass
class RecordingDrafter:
    """Wraps a drafter and keeps every draft it proposed."""

    inner: Drafter
    drafts: list[Draft]

    def __init__(self, inner: Drafter) -> None:
        self.inner, self.drafts = inner, []

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        chooser: TokenChooser,
    ) -> Draft:
        draft = self.inner.propose(context, max_tokens, sampling, chooser)
        self.drafts.append(draft)
        return draft

    def observe(self, outcome: Outcome) -> None:
        self.inner.observe(outcome)

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        self.inner.begin(prompt_length, prediction)


@dataclass
class FixedDrafter:
    """Proposes the same tokens every round (as point masses), up to `max_tokens`."""

    tokens: list[int]

    def propose(self, context, max_tokens, sampling, chooser) -> Draft:
        tokens = self.tokens[:max_tokens]
        dists = [Distribution.point(t) for t in tokens]
        return Draft(list(tokens), dists, DraftSource.NGRAM)  # point masses, as an n-gram's

    def observe(self, outcome: Outcome) -> None:
        pass

    def begin(self, prompt_length: int, prediction: Sequence[int]) -> None:
        pass


# --- constraints ------------------------------------------------------------------------------


class RuleConstraint:
    """A constraint from a rule: `allows(accepted, token)`, where `accepted` is every token
    accepted so far. Counts the ids it was asked about (`asked`, shared by its copies)."""

    def __init__(
        self,
        allows: Callable[[tuple[int, ...], int], bool],
        asked=None,
        forced: Callable[[tuple[int, ...]], list[int]] = lambda _accepted: [],
    ) -> None:
        """`forced(accepted)`: what forced_tokens says (a guess the engine may draft)."""
        self.allows, self.forced = allows, forced
        self.accepted: tuple[int, ...] = ()
        self.asked = asked if asked is not None else [0]

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        self.asked[0] += len(ids)
        return np.array([self.allows(self.accepted, int(t)) for t in ids], dtype=bool)

    def accept(self, token: int) -> None:
        assert self.allows(self.accepted, token), f"accepted {token}, which is not allowed"
        self.accepted = (*self.accepted, token)

    def copy(self) -> RuleConstraint:
        twin = RuleConstraint(self.allows, self.asked, self.forced)
        twin.accepted = self.accepted
        return twin

    def forced_tokens(self, written: str = "", seen=()) -> list[int]:
        return self.forced(self.accepted)


# --- time ---------------------------------------------------------------------------------------


class ScriptedClock:
    """Stands in for time.perf_counter: time moves only when a TimedBackend decodes."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TimedBackend(FakeBackend):
    """A FakeBackend whose decode of n tokens takes `cost(n)` seconds on `clock`."""

    def __init__(
        self,
        logits_fn: LogitsFn,
        n_vocab: int,
        clock: ScriptedClock,
        cost: Callable[[int], float],
        **kwargs: Any,
    ) -> None:
        super().__init__(logits_fn, n_vocab, **kwargs)
        self.clock, self.cost = clock, cost

    def decode(self, tokens: Sequence[int], n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        seconds = self.cost(len(tokens))
        self.clock.advance(seconds)
        self.decode_seconds += seconds
        return super().decode(tokens, n_logit_rows, prompt)


class ComparisonsCounted(FakeBackend):
    """A backend that counts the times its whole cache is read (a comparison of the context
    with it); reading from a later position on is not counted."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.comparisons = 0

    @property
    def cached(self) -> list[int]:
        return self._cached

    @cached.setter
    def cached(self, tokens: list[int]) -> None:
        self._cached = CountedList(self, tokens)


class CountedList(list):
    def __init__(self, owner: ComparisonsCounted, tokens) -> None:
        super().__init__(tokens)
        self.owner = owner

    def __getitem__(self, index):
        if isinstance(index, slice) and index.start is None and (index.stop or 0) > 1:
            self.owner.comparisons += 1
        return super().__getitem__(index)

    def __eq__(self, other) -> bool:
        self.owner.comparisons += 1
        return super().__eq__(other)


class SlicesTaken(list):
    """A list that notes the slices read from it."""

    def __init__(self, tokens) -> None:
        super().__init__(tokens)
        self.slices: list[slice] = []

    def __getitem__(self, index):
        if isinstance(index, slice):
            self.slices.append(index)
        return super().__getitem__(index)


def table_cost(table: Mapping[int, float]) -> Callable[[int], float]:
    """Decode seconds from a table over some sizes, straight lines between them (and the
    last size's cost per token beyond them, as for a prompt)."""
    sizes = sorted(table)

    def cost(n: int) -> float:
        if n > sizes[-1]:
            return table[sizes[-1]] * n / sizes[-1]
        return float(np.interp(n, sizes, [table[s] for s in sizes]))

    return cost


def decode_request(**overrides: Any) -> DecodeRequest:
    """A DecodeRequest for the target alone on `m.gguf`, with defaults where a test does not
    care; `overrides` set fields by name."""
    fields: dict[str, Any] = {
        "target": Path("m.gguf"),
        "draft": None,
        "drafter_mode": "none",
        "system": None,
        "sampling": SamplingSettings(),
        "seed": None,
        "max_tokens": 8,
        "stop": (),
        "draft_max": 8,
        "hardware": HardwareOptions(),
    }
    return DecodeRequest(**{**fields, **overrides})


def gpu_like_drafter(n: int) -> float:
    """Seconds of a GPU-like drafter's decode of n tokens: a batch costs little more than a
    step (20 ms), but past 8 rows it takes another kernel (4 ms more), and each token adds
    1 ms (costs.CatchUpPrice(0.004, 0.001))."""
    return 0.020 + (0.004 if n > 8 else 0.0) + 0.001 * (n - 1)
