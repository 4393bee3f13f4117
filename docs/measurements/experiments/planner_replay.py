"""The planner on a GPU's measured costs, replayed on any machine: how much faster than the
target alone `--drafter model` answers when every decode costs what the H200 measured
(docs/gpus.md), and from which pass model drafts start, for each price of the drafter's
catch-up (the tokens it reads before its first draft: the prompt). Then `--drafter ngram`
and `combined` (the default) on an answer that copies its prompt, as an edit does, with a
model drafter that is never right: prompt lookup's share of "faster where text is
predictable" on a GPU.

The models are decoders that compute nothing (host_costs.NullDecoder) on a simulated clock
that moves only when they decode, by the H200's tables: the 7B shape's exact kernels, the
14B shape's llama.cpp kernels (its exact ones were not measured: up to 8 rows they cost
llama.cpp's on the other shapes, and past 8 a pass per 8 rows is assumed), and the 0.5B
drafter's llama.cpp kernels (a drafter is never exact). The drafter agrees with the target
always, or never. Host time is not counted. The target's prompt pass costs nothing (its cost
on a GPU was not measured; the planner's budget grows with it, so this is the harder case)
and is left out of both sides.

    .venv/bin/python docs/measurements/experiments/planner_replay.py
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_costs  # noqa: E402

from specdec_cli.decoding.costs import CatchUpPrice, CostModel, _interpolate_table  # noqa: E402
from specdec_cli.decoding.engine import Generation, GenerationSettings, Round  # noqa: E402
from specdec_cli.decoding.modes import build_drafter  # noqa: E402
from specdec_cli.decoding.policy import CATCH_UP_COST  # noqa: E402

# H200, CUDA 13.0, seconds by rows (docs/gpus.md; the 14B from issue 40's first measurement)
TARGETS = {
    "7B": host_costs.H200_7B,
    "14B": {1: 7.19e-3, 4: 10.46e-3, 8: 15.08e-3, 16: 30.2e-3, 32: 60.4e-3},
}
# The 0.5B drafter, llama.cpp's kernels; past 32 rows the slope from 16 to 32
DRAFTER_05B = {1: 1.21e-3, 2: 1.53e-3, 4: 1.61e-3, 8: 2.09e-3, 9: 3.81e-3, 16: 3.88e-3}
DRAFTER_05B |= {32: 4.40e-3, 64: 4.40e-3 + 32 * (4.40e-3 - 3.88e-3) / 16}
# Prices of the drafter's catch-up: CPU's constant (each token 0.4 of a step, nothing fixed);
# the probe's line through catch-ups of 16 and 42 tokens (Qwen's tokens of the probe text);
# and that line's price per token as a 200-token prompt's catch-up teaches the run.
DRAFTER_STEP = DRAFTER_05B[1]
_dense = _interpolate_table(DRAFTER_05B, 4096)
_probed_token = (_dense[42] - _dense[16]) / (42 - 16)
_probed = CatchUpPrice(_dense[16] - DRAFTER_STEP - 16 * _probed_token, _probed_token)
PRICES = {
    "CPU's constant": None,
    "probed": _probed,
    "a prompt's": CatchUpPrice(_probed.fixed, (_dense[200] - DRAFTER_STEP - _probed.fixed) / 200),
}
PROMPTS = (30, 200, 1000)
ANSWER_TOKENS = 256
clock = [0.0]


class TimedNullDecoder(host_costs.NullDecoder):
    """A NullDecoder whose decode of n tokens moves the clock by its table's cost of n (a
    prompt's pass: nothing)."""

    def __init__(self, answer, table: dict[int, float]) -> None:
        super().__init__(answer)
        self.seconds = _interpolate_table(table, 4096)

    def decode(self, tokens, n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        if not prompt:
            clock[0] += self.seconds[len(tokens) - 1]
        rows = super().decode(tokens, n_logit_rows, prompt)
        rows[rows == 1.0] = 30.0  # a sure drafter: its confidence is about 1
        return rows


def target_answer(position: int) -> int:
    return 300 + position * 7 % 1000


def answer(table, prompt_length: int, catch_up: CatchUpPrice | None, drafter_right: bool | None):
    """Seconds after the prompt's pass, and the pass that first drafted with the model."""
    target = TimedNullDecoder(target_answer, table)
    drafter = TimedNullDecoder(
        target_answer if drafter_right else (lambda p: target_answer(p) + 1), DRAFTER_05B
    )
    prompt = random_prompt(prompt_length)
    planner = None
    if drafter_right is not None:
        costs = CostModel(dict(table), DRAFTER_STEP, catch_up)
        planner = build_drafter("model", target, drafter, costs)
    generation = Generation(target, prompt, GenerationSettings(max_tokens=ANSWER_TOKENS), planner)
    start = first_model = None
    for event in generation.events():
        if isinstance(event, Round):
            if start is None:
                start = clock[0]
            elif event.source == "model" and first_model is None:
                first_model = generation.stats.target_passes
    return clock[0] - start, first_model


def random_prompt(length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(length).integers(300, 150000, length)]


def copying(table, prompt_length: int, mode: str | None) -> float:
    """Seconds after the prompt's pass of an answer that copies the prompt from its 10th
    token on, drafted in `mode` (None: the target alone)."""
    prompt = random_prompt(prompt_length)

    def copy(position: int) -> int:
        return prompt[10 + position - prompt_length]

    target = TimedNullDecoder(copy, table)
    drafter = TimedNullDecoder(lambda p: copy(p) + 1, DRAFTER_05B)
    planner = None
    if mode is not None:
        costs = CostModel(dict(table), DRAFTER_STEP, PRICES["probed"])
        planner = build_drafter(mode, target, drafter, costs)
    generation = Generation(target, prompt, GenerationSettings(max_tokens=ANSWER_TOKENS), planner)
    start = None
    for event in generation.events():
        if isinstance(event, Round) and start is None:
            start = clock[0]
    return clock[0] - start


def main() -> None:
    time.perf_counter = lambda: clock[0]  # the engine and the planner read this clock
    print(f"| target | drafter | prompt | {' | '.join(PRICES)} |")
    print("| --- | --- | --- |" + " --- |" * len(PRICES))
    for name, table in TARGETS.items():
        for right in (True, False):
            for prompt_length in PROMPTS:
                alone, _ = answer(table, prompt_length, None, None)
                cells = []
                for price in PRICES.values():
                    seconds, first = answer(table, prompt_length, price, right)
                    start = f"from pass {first}" if first else "no model draft"
                    cells.append(f"{alone / seconds:.2f}x, {start}")
                who = "always right" if right else "never right"
                print(f"| {name} | {who} | {prompt_length} | {' | '.join(cells)} |")
    for name, price in PRICES.items():
        print(f"{name}: {price.as_dict() if price else f'{CATCH_UP_COST} of a step a token'}")
    print("\n| target | prompt, copied by the answer | ngram | combined |")
    print("| --- | --- | --- | --- |")
    for name, table in TARGETS.items():
        for prompt_length in (300, 1000):
            alone = copying(table, prompt_length, None)
            ngram, combined = (copying(table, prompt_length, m) for m in ("ngram", "combined"))
            print(f"| {name} | {prompt_length} | {alone / ngram:.2f}x | {alone / combined:.2f}x |")


if __name__ == "__main__":
    main()
