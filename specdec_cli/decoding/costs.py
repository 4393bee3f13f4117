"""What decodes cost on this machine: the table the planner prices drafts with, probed at
the start and corrected by every decode the engine times."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np

from .backend import Decoder
from .policy import (
    CATCH_UP_COST,
    CATCH_UP_LEARN_MIN,
    COST_WINDOW,
    DRAFT_STEP_WINDOW,
    MEASURED_SIZES,
    MIN_ROW_SHARE,
    PROBE_AGREEMENT,
    PROBE_BATCH_SLACK,
    PROBE_JITTER,
    PROBE_REPEATS,
    PROBE_SHRINK,
    RATIO_LIMITS,
    TABLE_SIZES,
)


@dataclass
class CostModel:
    """Seconds for one target decode of n tokens, and for one drafter step.

    `verify_seconds` is the table the run starts from (a probe, or the cache): a prior. On
    CPUs it is far from linear (8 tokens cost 6x one token, 16 barely more than 8, as
    llama.cpp switches kernels), so it is interpolated, not fitted with a line. Each decode
    the engine times then corrects it: a size measured in this run costs the median of its
    recent decodes, and any other size costs the prior's value scaled by the measured/prior
    ratio of the measured sizes around it (interpolated; the nearest one's beyond them). A
    table that is wrong by a factor (probed while the machine was busy) heals from a few
    decodes, and a size never tried keeps the prior's shape at the measured level.

    `catch_up_price` says what a drafter step that first reads the tokens it lacks (the
    prompt, the text since its last draft) costs beyond the step (`catch_up`): probed, its
    price per token then learned from the run's large catch-ups. None: never measured, each
    token priced at CATCH_UP_COST of a step."""

    verify_seconds: dict[int, float]
    draft_step: float
    catch_up_price: CatchUpPrice | None = None
    learn: bool = True  # refine from each round's timings
    origin: str = "probe"  # where the starting table came from (shown with it)
    trusted: bool = True  # False: a probe that failed its checks (see probe_problems)
    # When this starting table was measured (wall clock; a cache entry's measured_at).
    started_at: float = field(default_factory=time.time)
    _observed: dict[int, deque] = field(default_factory=dict, init=False, repr=False)
    _medians: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _counts: Counter = field(default_factory=Counter, init=False, repr=False)
    _steps: deque = field(
        default_factory=lambda: deque(maxlen=DRAFT_STEP_WINDOW), init=False, repr=False
    )
    _start_step: float = field(default=0.0, init=False, repr=False)
    _catch_ups: deque = field(
        default_factory=lambda: deque(maxlen=DRAFT_STEP_WINDOW), init=False, repr=False
    )
    _start_catch_up: CatchUpPrice | None = field(default=None, init=False, repr=False)
    _dense: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._start_step = self.draft_step
        self._start_catch_up = self.catch_up_price

    def verify(self, n_tokens: int) -> float:
        return max(1e-6, float(self._dense_table(n_tokens)[n_tokens - 1]))

    def _dense_table(self, up_to: int) -> np.ndarray:
        if self._dense is None or up_to > len(self._dense):
            self._dense = self._interpolate(max(up_to, 64))
        return self._dense

    def verify_sizes(self, up_to: int) -> list[float]:
        """verify(n) for n = 1..up_to, at once (the planner weighs every draft length each
        round: one call per length cost a slot of serve --parallel 0.5 ms a round)."""
        return np.maximum(1e-6, self._dense_table(up_to)[:up_to]).tolist()

    def _interpolate(self, up_to: int) -> np.ndarray:
        sizes = sorted(self._observed)
        prior = _interpolate_table(self.verify_seconds, max(up_to, *sizes, 1))
        if not sizes:
            return prior[:up_to]
        ratios = [self._medians[n] / max(prior[n - 1], 1e-9) for n in sizes]
        ratios = np.clip(ratios, *RATIO_LIMITS)
        wanted = np.arange(1, up_to + 1)
        return prior[:up_to] * np.interp(wanted, sizes, ratios)

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        if self.learning and seconds > 0:
            recent = self._observed.setdefault(n_tokens, deque(maxlen=COST_WINDOW))
            recent.append(seconds)
            self._medians[n_tokens] = float(np.median(recent))
            self._counts[n_tokens] += 1
            self._dense = None

    @property
    def learning(self) -> bool:
        """Whether the next decode's timing will refine the table."""
        return self.learn

    def observe_draft_step(self, seconds: float) -> None:
        if self.learning and seconds > 0:
            self._steps.append(seconds)
            self.draft_step = float(np.median(self._steps))

    def catch_up(self, n_tokens: int) -> float:
        """Seconds the drafter's reading `n_tokens` it lacks adds to its next step."""
        if n_tokens <= 0:
            return 0.0
        price = self.catch_up_price or CatchUpPrice(0.0, CATCH_UP_COST * self.draft_step)
        return price.fixed + n_tokens * price.per_token

    def observe_catch_up(self, n_tokens: int, seconds: float) -> None:
        """A drafter step that first read `n_tokens` it lacked took `seconds`: its price per
        token (the fixed part stays the probe's)."""
        if self.learning and n_tokens >= CATCH_UP_LEARN_MIN and seconds > 0:
            fixed = self.catch_up_price.fixed if self.catch_up_price else 0.0
            self._learn_catch_up([max(0.0, seconds - self.draft_step - fixed) / n_tokens])

    def _learn_catch_up(
        self, per_token: Sequence[float], fixed_from: CatchUpPrice | None = None
    ) -> None:
        """The price per token: the median of the recent ones, these last (the fixed part is
        this table's, else `fixed_from`'s, else nothing)."""
        self._catch_ups.extend(per_token)
        price = self.catch_up_price or fixed_from or CatchUpPrice(0.0, 0.0)
        self.catch_up_price = replace(price, per_token=float(np.median(self._catch_ups)))

    def observations(self, n_tokens: int) -> int:
        """Decodes of n tokens timed so far in this run."""
        return self._counts[n_tokens]

    @property
    def decodes_observed(self) -> int:
        return sum(self._counts.values())

    def table(self) -> dict[int, float]:
        """The target's cost now, at the sizes a probe measures (and the prior's own)."""
        sizes = sorted({*TABLE_SIZES, *self.verify_seconds})
        return {n: self.verify(n) for n in sizes}

    def fresh(self) -> CostModel:
        """The same starting table with nothing learned yet (a new answer's own copy)."""
        return CostModel(
            dict(self.verify_seconds),
            self._start_step,
            self._start_catch_up,
            self.learn,
            self.origin,
            self.trusted,
            self.started_at,
        )

    def absorb(self, other: CostModel) -> None:
        """Pool another model's timed decodes into this one's (bench: every run's)."""
        for n, samples in other._observed.items():
            for seconds in samples:
                self.observe_verify(n, seconds)
        self._counts.update({n: c - len(other._observed[n]) for n, c in other._counts.items()})
        for seconds in other._steps:
            self.observe_draft_step(seconds)
        if self.learning and other._catch_ups:
            self._learn_catch_up(other._catch_ups, other.catch_up_price)

    def healed(self) -> CostModel:
        """What this run learned, as a starting table for the next."""
        return CostModel(
            self.table(), self.draft_step, self.catch_up_price, self.learn, "learned", self.trusted
        )

    def as_dict(self) -> dict:
        """The table the run started from, the one it has now, and how many decodes of each
        size corrected it."""
        return {
            "origin": self.origin,
            "started": _cost_record(self.verify_seconds, self._start_step, self._start_catch_up),
            "now": _cost_record(self.table(), self.draft_step, self.catch_up_price),
            "observed": {str(n): c for n, c in sorted(self._counts.items())},
        }


def _alone() -> tuple[int, int]:
    return 0, 0


@dataclass
class SharedPassCosts(CostModel):
    """The costs of a request whose rows share each target pass with other requests' rows
    (serve --parallel): n rows cost what they add to the pass. `alongside()` says how many
    others share it; each is priced at one row, though it may draft too (priced at its
    width, rows up to it would look free, each request drafted to the widest, and four
    clients on the Zen 5 ran at 0.6x their pace without drafts).

    With v the table of a pass's cost by its rows (a pass of 4 sequences' rows costs about
    what 4 rows of one cost: docs/multi-sequence-exactness.md), beside L others its first
    row adds v(L + 1) - v(L), and its further rows, padded, a row for every request
    (v((L + 1) n) - v(L + 1) for n rows) or, ragged, a compute of their own (v(n - 1)):
    the lesser, as the round is shaped (llama/batches.round_widths). Where 4 rows cost 1.7x
    one, a plain step adds little to a shared pass, and a draft must promise far more than
    alone to be worth its rows. (Priced instead for the server's throughput, its first row
    at its share of the pass, v(L + 1) / (L + 1), a copying request beside one other
    drafted and ran 2x faster, but the other ran 1.1-1.3x slower and the two finished
    later than with drafts this scarce: Zen 5, docs/multi-sequence-exactness.md.)

    It learns only from rounds it has to itself, as CostModel does: beside others, a
    round lasts as long as their drafting and the whole pass, which is not the cost of its
    own rows (a lone request on a multi-slot server plans as on a server of one slot)."""

    alongside: Callable[[], tuple[int, int]] = _alone

    @property
    def learning(self) -> bool:
        return self.learn and self.alongside()[0] <= 0

    def verify(self, n_tokens: int) -> float:
        return self.verify_sizes(n_tokens)[-1]

    def verify_sizes(self, up_to: int) -> list[float]:
        others, _ = self.alongside()
        if others <= 0:
            return super().verify_sizes(up_to)
        alone = [0.0, *super().verify_sizes((others + 1) * up_to)]  # alone[n]: n rows
        lanes = others + 1
        # What its first row adds; never less than MIN_ROW_SHARE of a one-row decode.
        first = max(alone[lanes] - alone[others], MIN_ROW_SHARE * alone[1])
        prices = []
        for n in range(1, up_to + 1):
            padded = alone[lanes * n] - alone[lanes]
            ragged = alone[n - 1]  # a compute of its n - 1 further rows
            prices.append(first + max(0.0, min(padded, ragged)))
        return prices


def shared_pass_costs(
    costs: CostModel, alongside: Callable[[], tuple[int, int]]
) -> SharedPassCosts:
    """`costs`' starting table, priced as SharedPassCosts."""
    return SharedPassCosts(
        dict(costs.verify_seconds),
        costs.draft_step,
        costs.catch_up_price,
        learn=costs.learn,
        origin=costs.origin,
        trusted=costs.trusted,
        started_at=costs.started_at,
        alongside=alongside,
    )


@dataclass(frozen=True)
class CatchUpPrice:
    """What a drafter step that first reads n tokens costs beyond a step: fixed + n x
    per_token. On a CPU a token costs 0.15-0.4 of a step, and the fixed part 0 to 0.6 of one
    (2-core Xeon, 2026-12-07: SmolLM2 0-3 ms + 1.7-2.0 ms a token, step 11-12 ms; Qwen 0.5B
    21-22 ms + 4.9-5.1 ms a token, step 34-36 ms). On a GPU a batch costs little more than
    a step, but another kernel than a step's (llama.cpp's
    MMQ past 8 rows: a 0.5B drafter on the H200, 1.2 ms a step, 3.8 ms for 9-16 rows, 32 µs
    a row beyond): priced per token alone, as on a CPU, a prompt's catch-up kept model drafts
    from starting at all (docs/gpus.md, "The planner on a GPU")."""

    fixed: float
    per_token: float

    def as_dict(self) -> dict:
        return {
            "fixed_ms": round(1000 * float(self.fixed), 3),
            "token_ms": round(1000 * float(self.per_token), 4),
        }


def _cost_record(table: dict[int, float], step: float, catch_up: CatchUpPrice | None) -> dict:
    return {
        "target_decode_ms": {str(n): round(1000 * s, 2) for n, s in sorted(table.items())},
        "draft_step_ms": round(1000 * step, 2),
        "catch_up": None if catch_up is None else catch_up.as_dict(),
    }


def _interpolate_table(table: dict[int, float], up_to: int) -> np.ndarray:
    """Seconds for 1..up_to tokens from a table over some sizes: straight lines between
    them, the last slope beyond them."""
    sizes = sorted(table)
    seconds = [table[n] for n in sizes]
    wanted = np.arange(1, up_to + 1)
    dense = np.interp(wanted, sizes, seconds)
    if len(sizes) > 1:
        slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
        beyond = wanted > sizes[-1]
        dense[beyond] = seconds[-1] + slope * (wanted[beyond] - sizes[-1])
    return dense


@dataclass
class ProbeTimings:
    """A probe's raw timings: seconds per repetition, for each target size and the drafter:
    its step, and by how many tokens it first read, a step that caught up (not checked: its
    price only decides when model drafts may start, and the run's catch-ups correct it)."""

    verify: dict[int, list[float]]
    draft_step: list[float]
    catch_up: dict[int, list[float]] = field(default_factory=dict)

    def merged(self, other: ProbeTimings) -> ProbeTimings:
        return ProbeTimings(
            {n: [*s, *other.verify.get(n, [])] for n, s in self.verify.items()},
            [*self.draft_step, *other.draft_step],
            {n: [*s, *other.catch_up.get(n, [])] for n, s in self.catch_up.items()},
        )

    def catch_up_price(self, pick: Callable[[Sequence[float]], float]) -> CatchUpPrice | None:
        """A line through the catch-ups' costs beyond a step, from the samples `pick` takes
        (one size timed: through nothing at 0 tokens)."""
        if not self.catch_up or not self.draft_step:
            return None
        step = pick(self.draft_step)
        sizes = sorted(self.catch_up)
        beyond = [max(0.0, pick(self.catch_up[n]) - step) for n in sizes]
        if len(sizes) == 1:
            return CatchUpPrice(0.0, beyond[0] / sizes[0])
        per_token = max(0.0, (beyond[-1] - beyond[0]) / (sizes[-1] - sizes[0]))
        return CatchUpPrice(max(0.0, beyond[0] - per_token * sizes[0]), per_token)


def probe_problems(timings: ProbeTimings) -> list[str]:
    """Why a probe's timings cannot be trusted (none: they can). Something else running
    during a probe shows as samples that disagree, or a batch dearer than its tokens
    decoded one by one, or a longer batch cheaper than a shorter one."""
    problems = []
    for n, samples in sorted(timings.verify.items()):
        if not _agree(samples):
            problems.append(f"{n} tokens: repeated timings disagree ({_ms(samples)})")
    if timings.draft_step and not _agree(timings.draft_step):
        problems.append(f"drafter step: repeated timings disagree ({_ms(timings.draft_step)})")
    table = {n: float(np.median(s)) for n, s in timings.verify.items()}
    return problems + table_problems(table)


def table_problems(table: dict[int, float]) -> list[str]:
    """Shape checks of a cost table: costs grow with n, within a tolerance, and n tokens
    cost no more than about n one-token decodes."""
    problems = []
    sizes = sorted(table)
    for smaller, larger in pairwise(sizes):
        if table[larger] + PROBE_JITTER < (1 - PROBE_SHRINK) * table[smaller]:
            problems.append(f"{larger} tokens cost less than {smaller}")
    one = table.get(1)
    for n in sizes:
        if one is not None and n > 1 and table[n] > PROBE_BATCH_SLACK * n * one + PROBE_JITTER:
            problems.append(f"{n} tokens cost more than {n} one-token decodes")
    return problems


def _agree(samples: Sequence[float]) -> bool:
    return max(samples) <= PROBE_AGREEMENT * min(samples) + PROBE_JITTER


def _ms(samples: Sequence[float]) -> str:
    return "/".join(f"{1000 * s:.0f}" for s in samples) + " ms"


def conservative_table(timings: ProbeTimings) -> dict[int, float]:
    """From timings that failed the checks: each size's fastest sample (something else
    running only ever slows a decode), made to grow with n and capped at n one-token
    decodes, so no draft length starts out looking hopeless."""
    table: dict[int, float] = {}
    for n in sorted(timings.verify):
        fastest = min(timings.verify[n])
        if table:
            fastest = max(fastest, max(table.values()))
        if 1 in table:
            fastest = min(fastest, n * table[1])
        table[n] = fastest
    return table


def measure_costs(
    target: Decoder,
    drafter: Decoder | None,
    probe: Sequence[int],
    drafter_probe: Sequence[int] | None = None,
) -> CostModel:
    """Time the decodes that matter on this machine, on a throwaway probe text, and check
    the timings (see probe_problems). A probe that fails is taken again; if that fails too,
    the run starts from a conservative table built from both, marked untrusted (not to be
    cached) and healed by the run's own decodes."""
    drafter_probe = probe if drafter_probe is None else drafter_probe
    first = _probe(target, drafter, probe, drafter_probe)
    problems = probe_problems(first)
    if not problems:
        return _probed(first, "probe")
    second = _probe(target, drafter, probe, drafter_probe)
    if not probe_problems(second):
        return _probed(second, "probe, second try")
    both = first.merged(second)
    step = min(both.draft_step) if both.draft_step else 0.0
    origin = f"probe failed its checks twice ({problems[0]}): conservative table"
    catch_up = both.catch_up_price(min)
    return CostModel(conservative_table(both), step, catch_up, origin=origin, trusted=False)


def _probed(timings: ProbeTimings, origin: str) -> CostModel:
    table = {n: float(np.median(s)) for n, s in timings.verify.items()}
    step = float(np.median(timings.draft_step)) if timings.draft_step else 0.0
    catch_up = timings.catch_up_price(lambda samples: float(np.median(samples)))
    return CostModel(table, step, catch_up, origin=origin)


def _probe(
    target: Decoder, drafter: Decoder | None, probe: Sequence[int], drafter_probe: Sequence[int]
) -> ProbeTimings:
    context = list(probe[: len(probe) - max(MEASURED_SIZES)])
    room = min(target.n_ctx, len(probe)) - len(context)
    verify = {
        n: _decode_seconds(target, context, probe[len(context) : len(context) + n])
        for n in MEASURED_SIZES
        if n <= room
    }
    step, catch_up = [], {}
    if drafter is not None:  # one step after about as much text as the target's context
        cut = max(1, min(len(drafter_probe) - 1, len(context)))
        step = _decode_seconds(
            drafter, drafter_probe[:cut], drafter_probe[cut : cut + 1], drafter=True
        )
        # the same step reading CATCH_UP_LEARN_MIN tokens first, and all that text but one
        sizes = {n for n in (CATCH_UP_LEARN_MIN, cut - 1) if CATCH_UP_LEARN_MIN <= n < cut}
        catch_up = {
            n: _decode_seconds(
                drafter, drafter_probe[: cut - n], drafter_probe[cut - n : cut + 1], 1, True
            )
            for n in sorted(sizes)
        }
    for backend in (target, drafter):
        if backend is not None:
            backend.truncate(0)
    return ProbeTimings(verify, step, catch_up)


def _decode_seconds(
    backend: Decoder,
    context: Sequence[int],
    tail: Sequence[int],
    rows: int | None = None,
    drafter: bool = False,
) -> list[float]:
    """Decodes of `tail` after `context`, timed: every row (a verification) or the last
    `rows`, read as a greedy run reads them (on a backend that takes choices on its device,
    the choices: a drafter's with their probabilities; so the run starts on the same graphs)."""

    def read(tokens: Sequence[int], n_rows: int) -> None:
        if backend.chooses_on_device:
            backend.decode_choices(tokens, n_rows, with_confidence=drafter)
        else:
            backend.decode(tokens, n_rows)

    if backend.cached[: len(context)] != list(context):
        backend.truncate(0)
        read(context, 1)
    samples = []
    for _ in range(PROBE_REPEATS):
        backend.truncate(len(context))
        began = time.perf_counter()
        read(tail, rows or len(tail))
        samples.append(time.perf_counter() - began)
    return samples
