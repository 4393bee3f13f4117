"""The host's share of an answer: the seconds specdec spends per target pass and per token
after the prompt's pass, outside llama_decode (planning, lookups, comparing the context with the cache, reading
logits, argmax), for the target alone and each drafting mode. On a CPU a step of a real
model takes tens of milliseconds and this share hides in it; on a GPU a 7B step takes 3.8 ms
and a 1.5B one 1.9 ms (H200, docs/gpus.md), so every 100 µs here is 3-5% of the answer.

Tiny llama models written as the tests write them (tests/tiny_gguf.py), with Qwen2's 151,936
tokens so that a logits row is a real one's size; the drafter never agrees with the target.
Drafting modes plan with the H200's 7B-shape cost table, fixed, so they draft as they would
there. Each configuration runs interleaved with the others, medians of REPEATS.

With --null the models are decoders that compute nothing (NullDecoder): only specdec's own
work is timed, without the cold caches a CPU decode leaves behind it (on a GPU the weights
never pass through the host's caches), and a context's length costs nothing to decode. With
--device-choices too, the target sends back a greedy verdict's tokens rather than its rows,
as a GPU taking the choices does (llama/device_choices.py); with the tiny models,
SPECDEC_DEVICE_CHOICES=1 has their CPU take them, inside the decode.

    .venv/bin/python docs/measurements/experiments/host_costs.py [--null [--device-choices]]
        [PROMPT_TOKENS...]
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import specdec_cli.llama.backend as llama_backend  # noqa: E402
from specdec_cli.bench.bench_configs import OracleDrafter  # noqa: E402
from specdec_cli.decoding.costs import CostModel  # noqa: E402
from specdec_cli.decoding.engine import (  # noqa: E402
    Finished,
    Generation,
    GenerationSettings,
    Round,
)
from specdec_cli.decoding.modes import build_drafter  # noqa: E402
from specdec_cli.llama.backend import LlamaBackend  # noqa: E402
from tiny_gguf import DEFAULT_VOCAB, TinyConfig, padded_vocab, write_tiny_llama  # noqa: E402

QWEN2_VOCAB = 151_936
ANSWER_TOKENS = 64
CONTEXT = 16384
REPEATS = 5
MODES = ("alone", "oracle", "model", "combined", "ngram")
# H200, CUDA 13.0, the 7B shape with exact kernels: seconds by rows, and a 0.5B drafter step
H200_7B = {1: 3.82e-3, 2: 4.04e-3, 4: 5.51e-3, 8: 8.23e-3, 16: 15.57e-3, 32: 30.32e-3}
H200_DRAFT_STEP = 1.14e-3

seconds_in_decode = 0.0
llama_decode = llama_backend._llama_decode


def timed_llama_decode(ctx, batch):
    global seconds_in_decode
    start = time.perf_counter()
    status = llama_decode(ctx, batch)
    seconds_in_decode += time.perf_counter() - start
    return status


class NullDecoder:
    """A decoder that computes nothing: each row it returns is zeros but for the token it
    answers at that position (`answer(position)`), so the target's answer, and whether a
    drafter agrees with it, are scripted. Its time counts as decoding."""

    prompt_with_drafts = False
    chooses_on_device = False  # --device-choices: a greedy verdict's tokens come back alone

    def __init__(self, answer) -> None:
        self.answer = answer
        self.n_vocab, self.n_ctx = QWEN2_VOCAB, 1 << 20
        self.cached: list[int] = []
        self.truncations = self.tokens_decoded = 0
        self._rows = np.zeros((64, QWEN2_VOCAB), dtype=np.float32)
        self._set: list[tuple[int, int]] = []

    def decode(self, tokens, n_logit_rows: int, prompt: bool = False) -> np.ndarray:
        global seconds_in_decode
        start = time.perf_counter()
        self.cached.extend(tokens)
        self.tokens_decoded += len(tokens)
        for row, column in self._set:
            self._rows[row, column] = 0.0
        end = len(self.cached)
        self._set = [(i, self.answer(end - n_logit_rows + i)) for i in range(n_logit_rows)]
        for row, column in self._set:
            self._rows[row, column] = 1.0
        seconds_in_decode += time.perf_counter() - start
        return self._rows[:n_logit_rows]

    def decode_choices(self, tokens, n_rows: int, prompt=False, with_confidence=False) -> list[int]:
        """The tokens it answers at those positions, as a GPU's greedy sampler sends them
        back (llama/device_choices.py)."""
        global seconds_in_decode
        start = time.perf_counter()
        self.cached.extend(tokens)
        self.tokens_decoded += len(tokens)
        end = len(self.cached)
        chosen = [self.answer(end - n_rows + i) for i in range(n_rows)]
        seconds_in_decode += time.perf_counter() - start
        return chosen

    def truncate(self, n_keep: int) -> None:
        del self.cached[n_keep:]
        self.truncations += 1

    def token_bytes(self, token: int) -> bytes:
        return b"x"

    def is_end_of_generation(self, token: int) -> bool:
        return False

    def constrain(self, structure):
        raise NotImplementedError


def null_models(device_choices: bool) -> tuple[NullDecoder, NullDecoder]:
    target = NullDecoder(lambda position: 300 + position * 7 % 1000)
    target.chooses_on_device = device_choices
    return target, NullDecoder(lambda position: 301 + position * 7 % 1000)  # never right


def models(directory: Path) -> tuple[LlamaBackend, LlamaBackend]:
    vocab = padded_vocab(QWEN2_VOCAB - len(DEFAULT_VOCAB))
    config = TinyConfig(n_ctx=CONTEXT)
    paths = [directory / "target.gguf", directory / "drafter.gguf"]
    for seed, path in enumerate(paths):
        write_tiny_llama(path, seed=seed, vocab=vocab, config=config)
    return tuple(LlamaBackend(str(p), n_ctx=CONTEXT, n_threads=2, exact=True) for p in paths)


def answer(target, drafter, prompt, mode, reference=()):
    """One answer from empty caches: its host seconds from the end of its first pass (the
    prompt's) to its end, and its stats."""
    global seconds_in_decode
    target.truncate(0)
    drafter.truncate(0)
    costs = CostModel(dict(H200_7B), H200_DRAFT_STEP, learn=False)
    if mode == "alone":
        planner = None
    elif mode == "oracle":
        planner = OracleDrafter(tuple(reference), costs)
    else:
        planner = build_drafter(mode, target, drafter, costs)
    generation = Generation(target, prompt, GenerationSettings(max_tokens=ANSWER_TOKENS), planner)
    start = None
    for event in generation.events():
        if start is None and isinstance(event, Round):
            start, seconds_in_decode = time.perf_counter(), 0.0
        if isinstance(event, Finished):
            return time.perf_counter() - start - seconds_in_decode, event
    raise AssertionError("events() ends with Finished")


def main() -> None:
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    lengths = [int(a) for a in sys.argv[1:] if a not in flags] or [200, 2000, 6000, 12000]
    llama_backend._llama_decode = timed_llama_decode
    with tempfile.TemporaryDirectory() as directory:
        if "--null" in flags:
            target, drafter = null_models("--device-choices" in flags)
        else:
            target, drafter = models(Path(directory))
        print("| prompt | mode | passes after the prompt's | host µs per pass | per token |")
        print("| --- | --- | --- | --- | --- |")
        for length in lengths:
            rng = np.random.default_rng(length)
            prompt = [int(t) for t in rng.integers(300, QWEN2_VOCAB - 1, length)]
            reference = answer(target, drafter, prompt, "alone")[1].tokens
            for mode in MODES:  # warm-up
                answer(target, drafter, prompt, mode, reference)
            runs = {mode: [] for mode in MODES}
            for _ in range(REPEATS):
                for mode in MODES:
                    runs[mode].append(answer(target, drafter, prompt, mode, reference))
            for mode in MODES:
                host = statistics.median(seconds for seconds, _ in runs[mode])
                stats = runs[mode][0][1].stats
                passes, tokens = stats.target_passes - 1, stats.generated - 1
                print(
                    f"| {length} | {mode} | {passes} | {host / passes * 1e6:.0f} "
                    f"| {host / tokens * 1e6:.0f} |"
                )


if __name__ == "__main__":
    main()
