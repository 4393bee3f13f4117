"""Drafting by text with a drafter of another vocabulary (decoding/text_drafter.py).

Both models here are scripted by text: each spells a fixed answer after its prompt, one
piece at a time, in its own vocabulary. The target's answer is what it is; the drafter's
may differ in places, so drafts are rejected where they part, at multi-byte characters
and merged whitespace included. Whatever the drafter writes, the answer must be the target
alone's, and the drafter's stream must spell the accepted text.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from fakes import ComparisonsCounted, FakeBackend, SlicesTaken

from specdec_cli.decoding.adaptive import AdaptiveDrafter
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.drafters import NgramDrafter
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.decoding.modes import build_drafter
from specdec_cli.decoding.sampling import SamplingSettings
from specdec_cli.decoding.text_drafter import TargetText, TextDrafter, utf8_complete
from specdec_cli.decoding.verification import SamplingRule

IM_START, IM_END = b"<|im_start|>", b"<|im_end|>"


def vocabulary(pieces: list[bytes]) -> dict[int, bytes]:
    """Token 0 ends a turn, 1 starts one (control tokens), then every byte, then `pieces`
    (of two bytes or more: no two tokens spell the same)."""
    out = {0: IM_END, 1: IM_START}
    out.update({2 + b: bytes([b]) for b in range(256)})
    out.update({258 + i: piece for i, piece in enumerate(pieces)})
    return out


# The target knows words with their leading space and whole characters; the drafter
# spaces and words apart, and "é" and "€" only as bytes. So whitespace merges into the next
# token in one vocabulary and not the other, and characters split across tokens.
TARGET_PIECES = [
    " the",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " lazy",
    " dog",
    "\n    ",
    "def",
    " f",
    "(x",
    "):",
    " return",
    " x",
    " +",
    " 1",
    " café",
    " costs",
    " 5",
    "€",
    "é",
    "é ",
    "ab",
    "cd",
]
DRAFTER_PIECES = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "    ",
    "def",
    "f(x):",
    "return",
    "caf",
    "costs",
    "ab",
    "the quick",
]


def pieces_of(words: list[str]) -> list[bytes]:
    return [w.encode() for w in words]


def text_model(pieces: Mapping[int, bytes], text: bytes, end: int, n_vocab: int, shortest=False):
    """Writes `text`, greedily, one piece at a time (the longest piece that fits; the
    shortest with `shortest`: a model that does not write as its tokenizer would): after a
    prefix that spells its beginning, what follows; after one that parts from it, what
    follows the latest place where the prefix's longest ending occurs in it (an n-gram
    model of `text`); `end` where the text ends."""
    candidates = sorted(
        ((p, t) for t, p in pieces.items() if p and t not in (0, 1)), key=lambda pt: len(pt[0])
    )
    if not shortest:
        candidates.reverse()

    def rest_after(spelled: bytes) -> bytes:
        if text.startswith(spelled):
            return text[len(spelled) :]
        for n in range(min(len(spelled), 24), 0, -1):
            at = text.rfind(spelled[-n:])
            if at >= 0:
                return text[at + n :]
        return b"z"

    def logits(prefix: tuple[int, ...]) -> np.ndarray:
        rest = rest_after(b"".join(pieces.get(t, b"") for t in prefix))
        row = np.zeros(n_vocab)
        token = end if not rest else next(t for p, t in candidates if rest.startswith(p))
        row[token] = 10.0
        return row

    return logits


PROMPT_TEXT = b"<|im_start|>user\nwrite<|im_end|>\n<|im_start|>assistant\n"
ANSWERS = {
    "prose": " the quick brown fox jumps over the lazy dog. the lazy dog.",
    "code": "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 1\n",
    "utf8": " café costs 5€. café costs 5€. éé é über über",
}
# Where the drafter's own answer parts from the target's.
DRAFTER_ANSWERS = {
    "prose": " the quick brown fox jumps over the dog. the lazy dog.",
    "code": "def f(x):\n    return x + 2\n\ndef f(x):\n    return x + 1\n",
    "utf8": " café costs 5€. cafè costs 5€. éé é über über",
}


def make_pair(
    answer: str,
    drafter_answer: str,
    drafter_ctx=512,
    drafter_bos=None,
    shortest=False,
    drafter_class=FakeBackend,
):
    target_vocab = vocabulary(pieces_of(TARGET_PIECES))
    drafter_vocab = vocabulary(pieces_of(DRAFTER_PIECES))
    if drafter_bos is not None:
        drafter_vocab[drafter_bos] = b"<s>"
    n_t, n_d = max(target_vocab) + 1, max(drafter_vocab) + 1
    target_text = PROMPT_TEXT + answer.encode()
    drafter_text = PROMPT_TEXT + drafter_answer.encode()
    target = FakeBackend(
        text_model(target_vocab, target_text, 0, n_t, shortest),
        n_t,
        n_ctx=2048,
        end_of_generation={0},
        pieces=target_vocab,
        specials={0, 1},
    )
    drafter = drafter_class(
        text_model(drafter_vocab, drafter_text, 0, n_d),
        n_d,
        n_ctx=drafter_ctx,
        end_of_generation={0},
        pieces=drafter_vocab,
        specials={0, 1} | ({drafter_bos} if drafter_bos is not None else set()),
        bos=drafter_bos,
    )
    return target, drafter


def prompt_of(target: FakeBackend) -> list[int]:
    return target.tokenize(PROMPT_TEXT.decode(), add_special=True, parse_special=True)


def generate(target, drafter, max_tokens=200, **settings):
    target.truncate(0)
    prompt = prompt_of(target)
    gen = GenerationSettings(max_tokens=max_tokens, draft_max=8, **settings)
    return Generation(target, prompt, gen, drafter).run()


def text_drafter(target, drafter) -> TextDrafter:
    bos = drafter.vocab_info().bos
    return TextDrafter(drafter, target, drafter_bos=bos if bos >= 0 else None)


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_text_drafts_give_the_target_alones_answer(case):
    target, drafter = make_pair(ANSWERS[case], DRAFTER_ANSWERS[case])
    alone = generate(target, None)
    assert alone.text == ANSWERS[case]
    drafted = generate(target, text_drafter(target, drafter))
    assert drafted.tokens == alone.tokens
    assert drafted.text == alone.text
    assert drafted.stats.accepted > 0.5 * drafted.stats.generated  # the drafter mostly agrees
    assert drafted.stats.accepted < drafted.stats.drafted  # and parts where its answer does


def test_a_target_that_writes_unlike_its_tokenizer_is_still_followed():
    # the target spells with its shortest pieces: text drafts, cut by its tokenizer into its
    # longest pieces, are mostly rejected, and the answer is still its own
    target, drafter = make_pair(ANSWERS["prose"], ANSWERS["prose"], shortest=True)
    alone = generate(target, None)
    drafted = generate(target, text_drafter(target, drafter))
    assert drafted.tokens == alone.tokens


def test_the_control_drafter_that_always_agrees_is_kept_whole():
    target, drafter = make_pair(ANSWERS["code"], ANSWERS["code"])
    drafted = generate(target, text_drafter(target, drafter))
    assert drafted.stats.accepted == drafted.stats.drafted > 0
    assert drafted.text == ANSWERS["code"]


def test_whitespace_that_ends_the_text_is_held_back_for_the_drafter_to_merge():
    # The target writes "\n    " as one token; the drafter spells indentation "   " + " return"
    # (a BPE's way) and, like a model that only ever saw "    " at a line's end, writes
    # nonsense after it. Held back, the four spaces are the drafter's to spell again.
    answer = "def f(x):\n    return x + 1\n" * 3
    target_vocab = vocabulary(pieces_of(TARGET_PIECES))
    drafter_vocab = vocabulary(
        pieces_of(["\n", "   ", "    ", " return", " x", " +", " 1", "def", " f(x):"])
    )
    line_end_spaces = next(t for t, p in drafter_vocab.items() if p == b"    ")
    n_t, n_d = max(target_vocab) + 1, max(drafter_vocab) + 1
    target = FakeBackend(
        text_model(target_vocab, PROMPT_TEXT + answer.encode(), 0, n_t),
        n_t,
        n_ctx=2048,
        end_of_generation={0},
        pieces=target_vocab,
        specials={0, 1},
    )
    # its first line differs, so the target's correction ends a round at "\n    "
    drafter_answer = "def f(x): return x + 1\n" + "def f(x):\n    return x + 1\n" * 2
    drafter_model = text_model(drafter_vocab, PROMPT_TEXT + drafter_answer.encode(), 0, n_d)

    three_spaces = next(t for t, p in drafter_vocab.items() if p == b"   ")

    def lost_after_line_end_spaces(prefix):
        row = np.array(drafter_model(prefix))
        if prefix and prefix[-1] == line_end_spaces:
            row[:] = 0.0
            row[2 + ord("z")] = 10.0
        elif int(np.argmax(row)) == line_end_spaces:  # it writes "   " + " return" itself
            row[:] = 0.0
            row[three_spaces] = 10.0
        return row

    drafter = FakeBackend(
        lost_after_line_end_spaces,
        n_d,
        end_of_generation={0},
        pieces=drafter_vocab,
        specials={0, 1},
    )
    text = text_drafter(target, drafter)
    drafted = generate(target, text)
    assert drafted.text == answer
    # after the correction its next draft goes on right (without the hold-back, the
    # drafter reads "    " as its own token and its next draft is rejected: 37 of 49 kept)
    assert drafted.stats.accepted >= 0.85 * drafted.stats.drafted


def test_the_prompts_control_tokens_are_read_as_the_drafters_own():
    target, drafter = make_pair(ANSWERS["prose"], ANSWERS["prose"])
    text = text_drafter(target, drafter)
    generate(target, text, max_tokens=4)
    assert text.stream.tokens[:1] == [1]  # <|im_start|>, not its 12 bytes
    assert text.stream.tokens.count(0) == 1  # one <|im_end|>


def test_the_drafters_end_of_turn_only_ends_a_draft():
    # the drafter ends its answer early: its end of turn is not proposed, the target goes on
    target, drafter = make_pair(ANSWERS["prose"], " the quick brown fox")
    alone = generate(target, None)
    drafted = generate(target, text_drafter(target, drafter))
    assert drafted.tokens == alone.tokens
    assert 0 not in drafted.tokens


def test_a_drafter_with_a_bos_starts_its_stream_with_it():
    target, drafter = make_pair(ANSWERS["code"], ANSWERS["code"], drafter_bos=600)
    text = text_drafter(target, drafter)
    drafted = generate(target, text)
    assert drafted.text == ANSWERS["code"]
    assert text.stream.tokens[0] == 600
    assert drafter.cached[:1] == [600]
    assert drafted.stats.accepted > 0


def test_a_targets_bos_is_not_read_as_text():
    target, drafter = make_pair(ANSWERS["code"], ANSWERS["code"])
    target.bos = 2 + ord("Q")  # a BOS that would spell "Q"
    text = TextDrafter(drafter, target, target_bos=target.bos)
    prompt = [target.bos, *prompt_of(target)]
    target.truncate(0)
    settings = GenerationSettings(max_tokens=20, draft_max=8)
    Generation(target, prompt, settings, text).run()
    assert not text.text.data.startswith(b"Q")
    assert text.text.data.startswith(PROMPT_TEXT)


def long_answer(n_lines: int, drafter: bool) -> str:
    lines = []
    for i in range(n_lines):
        word = "café" if i % 3 else "cafè" if drafter and i % 4 == 0 else "café"
        euro = "€" if not drafter or i % 5 else "5"
        lines.append(f" the quick {word} costs 5{euro}. ab cd\n")
    return "".join(lines)


def test_the_drafters_stream_spells_the_accepted_text_after_a_thousand_tokens():
    target, drafter = make_pair(long_answer(90, False), long_answer(90, True), drafter_ctx=4096)
    target.n_ctx = 4096
    text = text_drafter(target, drafter)
    drafted = generate(target, text, max_tokens=1000)
    alone = generate(target, None, max_tokens=1000)
    assert len(drafted.tokens) == 1000
    assert drafted.tokens == alone.tokens
    assert drafted.stats.accepted < drafted.stats.drafted  # rejections happened
    # in step: the stream spells the accepted text (up to what its last draft added) and
    # the drafter's cache holds a prefix of the stream
    accepted = text.text.data
    spelled = bytes(text.stream.spelling)
    common = min(len(spelled), len(accepted))
    assert spelled[: common - 64] == bytes(accepted[: common - 64])
    assert drafter.cached == text.stream.tokens[: len(drafter.cached)]
    assert utf8_complete(accepted) == len(accepted)


def test_a_long_text_draft_compares_the_drafters_cache_only_from_where_its_stream_changed():
    # every step compared the whole stream with the drafter's cache (250 µs at 32k tokens)
    target, drafter = make_pair(
        long_answer(90, False), long_answer(90, True), 4096, drafter_class=ComparisonsCounted
    )
    target.n_ctx = 4096
    text = text_drafter(target, drafter)
    drafted = generate(target, text, max_tokens=1000)
    assert drafted.tokens == generate(target, None, max_tokens=1000).tokens
    assert drafted.stats.accepted < drafted.stats.drafted and text.steps > 300
    assert drafter.comparisons <= 1


def test_the_target_text_reads_only_what_the_engines_list_gained():
    target, _ = make_pair(ANSWERS["prose"], ANSWERS["prose"])
    prompt = prompt_of(target)
    answer = target.tokenize(ANSWERS["prose"], add_special=False)
    context = SlicesTaken(prompt + answer[:3])
    text = TargetText(target)
    text.sync(context, len(prompt))
    context += answer[3:]
    context.slices.clear()
    assert not text.sync(context, len(prompt))
    assert context.slices == [] and bytes(text.data).endswith(ANSWERS["prose"].encode())
    copy = SlicesTaken(context)  # another list: compared with the text so far
    assert not text.sync(copy, len(prompt)) and copy.slices[0] == slice(None, len(context))


def test_a_drafter_whose_context_fills_first_starts_again_from_recent_text():
    answer = long_answer(40, False)
    target, drafter = make_pair(answer, answer, drafter_ctx=256)
    target.n_ctx = 4096
    text = text_drafter(target, drafter)
    drafted = generate(target, text, max_tokens=600)
    alone = generate(target, None, max_tokens=600)
    assert drafted.tokens == alone.tokens
    assert drafter.max_cached <= 256
    assert text.stream.base > 0  # it started again
    late = drafted.stats.accepted
    assert late > 0.5 * drafted.stats.generated  # and kept drafting well


def test_seeded_sampling_with_the_invariant_rule_ignores_the_drafter():
    target, drafter = make_pair(ANSWERS["prose"], DRAFTER_ANSWERS["prose"])
    sampling = SamplingSettings(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    for seed in range(5):
        kwargs = dict(sampling=sampling, seed=seed, rule=SamplingRule.INVARIANT)
        alone = generate(target, None, max_tokens=40, **kwargs)
        drafted = generate(target, text_drafter(target, drafter), max_tokens=40, **kwargs)
        assert drafted.tokens == alone.tokens


def test_the_adaptive_planner_drafts_by_text():
    target, drafter = make_pair(ANSWERS["code"], ANSWERS["code"])
    costs = CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8, 16: 3.0, 32: 6.0}, 0.1, learn=False)
    adaptive = build_drafter("combined", target, drafter, costs, by_text=True)
    assert isinstance(adaptive, AdaptiveDrafter) and isinstance(adaptive.model, TextDrafter)
    drafted = generate(target, adaptive)
    assert drafted.text == ANSWERS["code"]
    assert drafted.stats.draft_sources["text"] > 0


def test_an_ngram_only_planner_never_touches_the_drafter():
    target, drafter = make_pair(ANSWERS["code"], ANSWERS["code"])
    costs = CostModel({1: 1.0, 2: 1.1, 8: 1.8}, 0.1, learn=False)
    adaptive = AdaptiveDrafter(costs, ngram=NgramDrafter())
    generate(target, adaptive)
    assert drafter.decode_calls == 0


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"abc", 3),
        ("é".encode()[:1], 0),
        (b"a" + "€".encode()[:2], 1),
        ("€".encode(), 3),
        (b"", 0),
        ("a😀".encode()[:4], 1),
        ("a😀".encode(), 5),
    ],
)
def test_utf8_complete_counts_whole_characters(data, whole):
    assert utf8_complete(data) == whole
