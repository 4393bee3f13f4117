"""What decoding under a grammar costs on this machine: one full mask over the target's
vocabulary, one token asked about, and, over whole constrained answers, the share of the
time spent asking the grammar against the target's own steps.

    .venv/bin/python docs/measurements/experiments/constraint_costs.py [TARGET.gguf] [--drafter DRAFTER.gguf]

Every answer is also decoded speculatively (with the drafter, by token ids or by text)
and compared token for token with the target alone's under the same grammar.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from specdec_cli.services.tool_calls import Function, forced_call
from specdec_cli.decoding.backend import encode_chat
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.modes import DrafterMode, build_drafter, measure_pair_costs
from specdec_cli.errors import IncompatibleModelsError
from specdec_cli.models.compat import check_compatible
from specdec_cli.llama.backend import LlamaBackend
from specdec_cli.structured import Structure

MODELS = Path.home() / ".cache" / "specdec" / "models"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "languages", "employed"],
}
INVOICE = {
    "type": "object",
    "properties": {
        "invoice": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["item", "amount"],
            },
        },
        "total": {"type": "number"},
    },
    "required": ["invoice", "date", "lines", "total"],
}
WORKLOADS = [
    ("person", "Describe a fictional software developer as JSON.", Structure.json_schema(PERSON)),
    (
        "invoice",
        "Extract the invoice as JSON: Invoice A-1043, 2024-03-02. 2 x keyboard at 45.50, "
        "1 x monitor at 189.00, shipping 12.00. Total 292.00.",
        Structure.json_schema(INVOICE),
    ),
    ("any json", "List three prime numbers and their squares as a JSON object.",
     Structure.json_object()),
]  # fmt: skip
TOOLS = [
    Function("get_weather", "The weather now in a city", {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    Function("search_files", "Search the project's files for a string", {
        "type": "object", "properties": {"query": {"type": "string"},
                                         "max_results": {"type": "integer"}},
        "required": ["query"]}),
]  # fmt: skip
TOOL_WORKLOADS = [
    ("tool call (required)", "What's the weather in Paris right now?"),
    ("tool call (required)", "Find where the function parse_header is defined in the project."),
]


class TimedConstraint:
    """Wraps a constraint and adds up the time and the tokens asked about."""

    def __init__(self, inner, clock: dict) -> None:
        self.inner, self.clock = inner, clock

    def allowed(self, ids):
        began = time.perf_counter()
        result = self.inner.allowed(ids)
        self.clock["seconds"] += time.perf_counter() - began
        self.clock["asked"] += len(ids)
        return result

    def accept(self, token):
        began = time.perf_counter()
        self.inner.accept(token)
        self.clock["seconds"] += time.perf_counter() - began

    def copy(self):
        began = time.perf_counter()
        twin = TimedConstraint(self.inner.copy(), self.clock)
        self.clock["seconds"] += time.perf_counter() - began
        return twin

    def forced_tokens(self, written="", seen=()):
        began = time.perf_counter()
        tokens = self.inner.forced_tokens(written, seen)
        self.clock["seconds"] += time.perf_counter() - began
        return tokens


def mask_costs(target: LlamaBackend) -> None:
    ids = np.arange(target.n_vocab, dtype=np.int32)
    print(f"one full mask over {target.n_vocab} tokens, and one token asked about:")
    for text in ["", '{"', '{"name": "Ada', '{"name": "Ada", "age": 3']:
        constraint = target.constrain(Structure.json_schema(PERSON))
        for token in target.tokenize(text, add_special=False) if text else []:
            constraint.accept(token)
        began = time.perf_counter()
        allowed = constraint.allowed(ids)
        full = time.perf_counter() - began
        began = time.perf_counter()
        for token in ids[:200]:
            constraint.allowed(ids[token : token + 1])
        one = (time.perf_counter() - began) / 200
        print(f"  after {text!r:18} {full * 1e3:6.1f} ms  (allowed {int(allowed.sum())}), "
              f"one token {one * 1e6:5.1f} us")  # fmt: skip


def answer(target, prompt, structure, drafter, max_tokens: int):
    clock = {"seconds": 0.0, "asked": 0}
    constrain = target.constrain
    target.constrain = lambda s: TimedConstraint(constrain(s), clock)
    try:
        settings = GenerationSettings(max_tokens=max_tokens, structure=structure)
        finished = Generation(target, prompt, settings, drafter=drafter).run()
    finally:
        del target.constrain
    return finished, clock


def decode_seconds(finished) -> float:
    """After the first token (the prompt's decode, the same for both)."""
    return finished.stats.seconds - (finished.stats.first_token_seconds or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    target = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    parser.add_argument("target", nargs="?", default=target)
    parser.add_argument("--drafter", default=MODELS / "smollm2-135m.gguf")
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    target = LlamaBackend(Path(args.target), n_ctx=2048, exact=True)
    draft_model = LlamaBackend(Path(args.drafter), n_ctx=2048)
    try:
        check_compatible(target, draft_model)
        by_text = False
    except IncompatibleModelsError:
        by_text = True
    costs = measure_pair_costs(target, draft_model, by_text)
    mask_costs(target)
    step = costs.verify(1)
    print(f"target step (exact, one token): {step * 1e3:.1f} ms; drafter "
          f"{Path(args.drafter).name} {'by text' if by_text else 'by ids'}")  # fmt: skip
    print("| workload | tokens | target alone s | grammar s (share) | tokens asked per token "
          "| combined s | speedup | decode-only speedup | forced rounds | identical |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    tools = [f.template_entry() for f in TOOLS]
    jobs = [(name, text, structure, None) for name, text, structure in WORKLOADS]
    jobs += [(name, text, forced_call(TOOLS), tools) for name, text in TOOL_WORKLOADS]
    for name, text, structure, offered in jobs:
        prompt = encode_chat(target, [{"role": "user", "content": text}], offered)
        answer(target, prompt, structure, None, 8)  # warm-up: caches, the grammar's paths
        alone, clock = answer(target, prompt, structure, None, args.n)
        drafter = build_drafter(DrafterMode.COMBINED, target, draft_model, costs.fresh(), by_text)
        drafted, _ = answer(target, prompt, structure, drafter, args.n)
        if str(alone.finish_reason) == "stop" and offered is None:
            json.loads(alone.text)  # it parses (a tool call: between its tags)
        tokens = len(alone.tokens) + alone.stats.end_tokens
        print(f"| {name} | {tokens} | {alone.stats.seconds:.2f} | {clock['seconds']:.3f} "
              f"({clock['seconds'] / alone.stats.seconds:.1%}) | {clock['asked'] / tokens:.1f} "
              f"| {drafted.stats.seconds:.2f} | {alone.stats.seconds / drafted.stats.seconds:.2f}x "
              f"| {decode_seconds(alone) / decode_seconds(drafted):.2f}x "
              f"| {drafted.stats.draft_sources.get('forced', 0)} of {drafted.stats.target_passes} "
              f"| {drafted.tokens == alone.tokens} |")  # fmt: skip


if __name__ == "__main__":
    main()
