"""Decoding under a constraint on scripted models: the masked choice is the target's own
choice among the allowed tokens, asked about lazily, and speculative decoding under the
constraint gives the target alone's answer under it."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import (
    FakeBackend,
    FixedDrafter,
    RecordingDrafter,
    RuleConstraint,
    blended,
    model_drafter,
    table_model,
)

from specdec_cli.decoding import constraint
from specdec_cli.decoding.adaptive import AdaptiveDrafter
from specdec_cli.decoding.constraint import (
    NoTokenAllowed,
    _best_ids,
    allowed_best,
    allowed_prefix,
    closing_layout,
    forced_draft_tokens,
    forced_path,
    forced_text,
    layout_guess,
    masked_distribution,
    plain_spelling,
)
from specdec_cli.decoding.costs import CostModel
from specdec_cli.decoding.drafters import NgramDrafter
from specdec_cli.decoding.engine import Generation, GenerationSettings, Round
from specdec_cli.decoding.policy import FORCED_FIRST_PRIOR
from specdec_cli.decoding.sampling import SamplingSettings, distribution
from specdec_cli.decoding.verification import SamplingRule
from specdec_cli.structured import Structure

GREEDY = SamplingSettings(temperature=0.0)
SAMPLINGS = [
    GREEDY,
    SamplingSettings(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),
    SamplingSettings(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0),
    SamplingSettings(temperature=0.7, top_k=300, top_p=0.95, min_p=0.02),  # more than allowed
]
EOS = 9
PROMPT = [0, 1, 2]
ANY = Structure.json_object()  # the fakes' constraint ignores what it is asked for


def fully_masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, row, -np.inf).astype(np.float32)


def set_constraint(allowed: np.ndarray) -> RuleConstraint:
    return RuleConstraint(lambda _accepted, token: bool(allowed[token]))


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("seed", range(12))
def test_the_masked_distribution_is_the_fully_masked_rows(sampling, seed):
    rng = np.random.default_rng(seed)
    n = 5000
    row = rng.normal(0, 3, n).astype(np.float32)
    if seed % 3 == 0:
        row = np.round(row).astype(np.float32)  # many ties: the order must still agree
    allowed = rng.random(n) < [0.5, 0.01, 0.002][seed % 3]
    allowed[rng.integers(n)] = True
    got = masked_distribution(row, sampling, set_constraint(allowed))
    want = distribution(fully_masked(row, allowed), sampling)
    got_ids, want_ids = got.ids[got.probs > 0], want.ids[want.probs > 0]
    assert allowed[got_ids].all()
    np.testing.assert_allclose(got.probs[got.probs > 0], want.probs[want.probs > 0], rtol=1e-12)
    # Which of several tied tokens top-k keeps is distribution's (argpartition's) choice;
    # without ties the tokens are the same ones.
    assert row[got_ids].tolist() == row[want_ids].tolist()
    if seed % 3:
        assert got_ids.tolist() == want_ids.tolist()


def test_the_favourite_is_the_only_token_asked_about_when_it_is_allowed():
    row = np.arange(1000, dtype=np.float32)
    constraint = RuleConstraint(lambda _a, token: token % 2 == 1)
    assert allowed_best(row, constraint, 1).tolist() == [999]
    assert constraint.asked[0] == 1
    constraint = RuleConstraint(lambda _a, token: token < 10)
    assert allowed_best(row, constraint, 3).tolist() == [9, 8, 7]
    assert constraint.asked[0] == 1000  # the allowed ones are last: everything was asked


def test_a_constraint_that_allows_nothing_says_so():
    with pytest.raises(NoTokenAllowed, match="allows no token"):
        allowed_best(np.zeros(50, dtype=np.float32), RuleConstraint(lambda _a, _t: False), 1)


def test_a_draft_ends_before_its_first_forbidden_token():
    constraint = RuleConstraint(lambda accepted, token: token != 7 or len(accepted) > 3)
    assert allowed_prefix([1, 2, 7, 7, 7], constraint) == 2
    assert allowed_prefix([1, 2, 3, 4, 7], constraint) == 5
    assert constraint.accepted == ()  # asked on a copy


def alternating(accepted: tuple[int, ...], token: int) -> bool:
    """Tokens alternate odd, even, odd ...; the end only after six of them."""
    if token == EOS:
        return len(accepted) >= 6
    return token % 2 == (len(accepted) + 1) % 2


def target_under_rule() -> FakeBackend:
    return FakeBackend(
        table_model(10, seed=5, context=2),
        10,
        end_of_generation={EOS},
        constraints=lambda _structure: RuleConstraint(alternating),
    )


def answer(target, settings, drafter=None):
    events = list(Generation(target, PROMPT, settings, drafter).events())
    return events[-1], [e for e in events if isinstance(e, Round)]


DRAFTERS = {
    "fixed, mostly forbidden": lambda target: FixedDrafter([2, 2, 3, 5, 7]),
    "close model": lambda target: model_drafter(
        target, blended(target.logits_fn, table_model(10, seed=6), 0.3)
    ),
}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize(
    "sampling, seed",
    [
        (GREEDY, None),
        (SamplingSettings(0.9, 6, 0.95, 0.02), 3),
        (SamplingSettings(1.0, 0, 1.0, 0), 11),
    ],
    ids=["greedy", "sampled-topk", "sampled-all"],
)
def test_speculative_under_a_constraint_is_the_target_alones_answer_under_it(
    drafter, sampling, seed
):
    settings = GenerationSettings(
        max_tokens=40, draft_max=5, sampling=sampling, seed=seed, structure=ANY
    )
    alone, _ = answer(target_under_rule(), settings)
    target = target_under_rule()
    drafted, rounds = answer(target, settings, DRAFTERS[drafter](target))
    assert drafted.tokens == alone.tokens
    assert sum(r.drafted for r in rounds) > 0
    emitted = [*alone.tokens, EOS] if str(alone.finish_reason) == "stop" else alone.tokens
    for i, token in enumerate(emitted):
        assert alternating(tuple(emitted[:i]), token), (i, emitted)
    free, _ = answer(target_under_rule(), GenerationSettings(40, 5, sampling=sampling, seed=seed))
    assert free.tokens != alone.tokens  # the control: the rule changes this model's answer


def test_drafts_are_cut_at_their_first_forbidden_token():
    target = target_under_rule()
    drafter = RecordingDrafter(FixedDrafter([1, 2, 2, 2]))  # odd, even, then even again
    settings = GenerationSettings(max_tokens=12, draft_max=4, sampling=GREEDY, structure=ANY)
    _, rounds = answer(target, settings, drafter)
    assert max(r.drafted for r in rounds) <= 2


def test_the_classic_rule_under_a_constraint_keeps_to_it():
    settings = GenerationSettings(
        max_tokens=40,
        draft_max=4,
        sampling=SamplingSettings(1.0, 0, 1.0, 0.0),
        seed=7,
        rule=SamplingRule.CLASSIC,
        structure=ANY,
    )
    target = target_under_rule()
    drafter = model_drafter(target, table_model(10, seed=8))
    finished, rounds = answer(target, settings, drafter)
    assert sum(r.drafted for r in rounds) > sum(r.accepted for r in rounds)  # some rejected
    for i, token in enumerate(finished.tokens):
        assert alternating(tuple(finished.tokens[:i]), token)


def guess(accepted):
    """Claimed forced text: every other round a guess of three tokens that fit the rule
    (odd, even, odd or the reverse), right or wrong for the model."""
    first = (len(accepted) + 1) % 2
    return [first + 2, 1 - first + 4, first + 6] if len(accepted) % 2 else []


def guessing_target():
    """A target under the alternating rule, which forces nothing but claims to (guess)."""
    return FakeBackend(
        table_model(10, seed=5, context=2), 10, end_of_generation={EOS},
        constraints=lambda _s: RuleConstraint(alternating, forced=guess),
    )  # fmt: skip


FORCING = GenerationSettings(max_tokens=40, draft_max=5, sampling=GREEDY, structure=ANY)


def test_forced_text_is_drafted_for_free_and_leaves_the_answer_as_it_was():
    alone, _ = answer(guessing_target(), FORCING)
    drafted, rounds = answer(guessing_target(), FORCING, FixedDrafter([1]))
    assert drafted.tokens == alone.tokens
    sources = {str(r.source) for r in rounds}
    assert "forced" in sources and "ngram" in sources  # the drafter drafts where nothing is
    assert drafted.stats.draft_sources["forced"] > 0
    _, plain = answer(guessing_target(), FORCING)  # the target alone drafts nothing, forced or not
    assert all(r.drafted == 0 for r in plain)


@pytest.mark.parametrize("rows_are_cheap", [True, False])
def test_the_planner_drafts_forced_text_where_its_rows_pay(rows_are_cheap):
    table = {1: 1.0, 8: 1.0} if rows_are_cheap else {1: 1.0, 2: 4.0}
    planner = AdaptiveDrafter(CostModel(table, 0.0, learn=False))
    alone, _ = answer(guessing_target(), FORCING)
    drafted, rounds = answer(guessing_target(), FORCING, planner)
    assert drafted.tokens == alone.tokens
    assert (drafted.stats.draft_sources["forced"] > 0) == rows_are_cheap
    if rows_are_cheap:  # it learned that half the guesses part at once
        assert planner.acceptance.forced_first.value < FORCED_FIRST_PRIOR


def test_forced_text_and_the_drafters_continuation_are_verified_in_one_pass():
    # This model alternates 1 and 8 under the rule; every other round the next two tokens
    # are claimed forced, rightly. Rows cost nothing: the planner takes the forced text and
    # drafts on after it with the n-gram source, the text so far repeating.
    def right(accepted):
        if len(accepted) % 2 == 0:
            return []
        following = 1 if accepted[-1] == 8 else 8
        return [following, 9 - following]

    def target():
        return FakeBackend(
            table_model(10, seed=5, context=2), 10, end_of_generation={EOS},
            constraints=lambda _s: RuleConstraint(alternating, forced=right),
        )  # fmt: skip

    planner = AdaptiveDrafter(CostModel({1: 1.0, 8: 1.0}, 0.0, learn=False), ngram=NgramDrafter())
    alone, _ = answer(target(), FORCING)
    drafted, rounds = answer(target(), FORCING, planner)
    assert drafted.tokens == alone.tokens
    assert any(str(r.source) == "forced" and r.accepted > 2 for r in rounds)


# ---- forced text, and the layout the grammar leaves free -----------------------------------


class PrefixConstraint:
    """A constraint over single characters: the text must stay a prefix of one of `texts`
    (a schema's JSON with its spacing left free, written out), then end (`end`)."""

    def __init__(self, texts: list[str], characters: dict[int, str], end: int = -1) -> None:
        self.texts, self.characters, self.end, self.text = texts, characters, end, ""

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        return np.array([self._allows(int(i)) for i in ids])

    def _allows(self, token: int) -> bool:
        if token == self.end:
            return self.text in self.texts
        return any(t.startswith(self.text + self.characters[token]) for t in self.texts)

    def accept(self, token: int) -> None:
        self.text += self.characters.get(token, "")

    def copy(self) -> PrefixConstraint:
        twin = type(self)(self.texts, self.characters, self.end)
        twin.text = self.text
        return twin

    def forced_tokens(self, written: str = "", seen=()) -> list[int]:
        ends = [self.end] if self.end >= 0 and self.drafts_the_end else []
        return forced_draft_tokens(self, self.characters, self.spell, written, ends, seen)

    drafts_the_end = True

    def spell(self, text: str) -> list[int]:
        ids = {c: i for i, c in self.characters.items()}
        return [ids[c] for c in text]


CHARACTERS = dict(enumerate(' \n{}":,abxyz0123'))
# {"a": 1, "b": 2} with a space, a newline and two spaces, or nothing after each ':' and ','
SPACES = ("", " ", "\n  ")
OBJECTS = [
    f'{{"a":{s1}1,{s2}"b":{s3}2}}' for s1 in SPACES for s2 in SPACES for s3 in SPACES
]  # fmt: skip


def test_forced_text_stops_where_the_layout_is_free_unless_the_text_so_far_lays_it_out():
    walker = PrefixConstraint(OBJECTS, CHARACTERS)
    assert forced_text(walker, CHARACTERS) == '{"a":'  # then a space, a newline or the value
    assert walker.text == ""  # asked on a copy
    compact = '{"x":9,"y":8}\n'
    assert forced_text(walker, CHARACTERS, compact) == '{"a":1,"b":2}'
    spaced = '{"x": 9, "y": 8}\n'
    assert forced_text(walker, CHARACTERS, spaced) == '{"a": 1, "b": 2}'
    indented = '{"x":\n  9,\n  "y":\n  8}\n'
    assert forced_text(walker, CHARACTERS, indented) == '{"a":\n  1,\n  "b":\n  2}'


def test_the_layout_guess_follows_the_most_recent_layout_and_never_chooses_content():
    assert layout_guess(' "', 'one: "x", two: "y", three:') == " "  # after ':' came ' '
    assert layout_guess(' "', 'old: "x", new:"y", three:') == '"'  # the most recent one
    assert layout_guess(" 1", "a: 1, b:") == " "
    assert layout_guess(" 1", "a:1, b:") == "1"  # no space came: the one other option
    assert layout_guess("12", "a: 1, b: 2, c: ") is None  # the value is free, not the layout
    assert layout_guess(' "', "a:\tb, c:") is None  # what came last time is not an option
    assert layout_guess(' "', "no colon before, c:") is None  # nothing to go by
    assert layout_guess(' "', "") is None


def test_forced_drafts_lay_out_the_free_spacing_as_the_prompt_and_answer_do(monkeypatch):
    # The target writes two objects spaced as the prompt's example is; the grammar leaves
    # the spacing free. Laid out as the text so far, forced drafts run through it.
    answer_text = '{"a": 1, "b": 2}'
    end = len(CHARACTERS)
    pieces = {i: c.encode() for i, c in CHARACTERS.items()} | {end: b""}
    prompt_text = 'xyz {"x": 3, "y": 0}:'
    ids = {c: i for i, c in CHARACTERS.items()}

    def writes_the_answer(prefix):
        written = len(prefix) - len(prompt_text)
        row = np.zeros(end + 1)
        row[ids[answer_text[written]] if written < len(answer_text) else end] = 10.0
        return row

    def forced_only(layout):
        monkeypatch.setattr(constraint, "layout_guess", layout)
        target = FakeBackend(
            writes_the_answer, end + 1, end_of_generation={end}, pieces=pieces,
            constraints=lambda _s: PrefixConstraint(OBJECTS, CHARACTERS, end),
        )  # fmt: skip
        prompt = [ids[c] for c in prompt_text]
        settings = GenerationSettings(max_tokens=40, draft_max=16, sampling=GREEDY, structure=ANY)
        events = list(Generation(target, prompt, settings, FixedDrafter([])).events())
        forced = [e for e in events if isinstance(e, Round) and str(e.source) == "forced"]
        return events[-1].text, sum(r.accepted for r in forced)

    laid_out = forced_only(layout_guess)
    unguessed = forced_only(lambda _options, _text: None)
    assert laid_out[0] == unguessed[0] == answer_text  # the same answer either way
    assert laid_out[1] >= unguessed[1] + 4, (laid_out, unguessed)  # the spaces, and more


# ---- forced text to the grammar's end, its whitespace, closing brackets, tags ---------------

TAGGED = dict(enumerate(' \n{}":a1</x>'))
TAG_END = len(TAGGED)
# a call's JSON, an optional space, then the grammar's own newline and closing tag
CALLS = ['{"a":1}\n</x>', '{"a":1} \n</x>']


def test_forced_text_runs_to_the_grammars_end_and_its_end_token():
    walker = PrefixConstraint(['{"a":1}', '{"a":1} '], CHARACTERS, end=len(CHARACTERS))
    forced = forced_path(walker, CHARACTERS, end_tokens=[len(CHARACTERS)])
    assert forced == constraint.ForcedText('{"a":1}', len(CHARACTERS))  # not the space after
    spelled = walker.spell('{"a":1}')
    assert walker.forced_tokens() == [*spelled, len(CHARACTERS)]  # none left out
    assert forced_path(walker, CHARACTERS).end is None  # no end token to end with
    unfinished = PrefixConstraint(['{"a":1}x', '{"a":1}y'], CHARACTERS, end=len(CHARACTERS))
    assert unfinished.forced_tokens() == spelled[:-1]  # more follows: the last one left out


def test_the_last_forced_token_is_kept_where_the_answer_wrote_it_on_its_own():
    walker = PrefixConstraint(['{"a":1}x', '{"a":1}y'], CHARACTERS)
    spelled = walker.spell('{"a":1}')
    assert walker.forced_tokens() == spelled[:-1]
    assert walker.forced_tokens(seen={spelled[-1]}) == spelled


def test_where_only_whitespace_may_come_the_grammars_own_is_the_one_before_more_text():
    walker = PrefixConstraint(CALLS, TAGGED, end=TAG_END)
    assert forced_text(walker, TAGGED) == '{"a":1}\n</x>'
    assert walker.forced_tokens()[-1] == TAG_END
    assert constraint.grammar_whitespace(walker, {" ": 0, "{": 2}, TAGGED) is None  # not all


def test_a_bracket_closes_as_the_last_of_its_kind_was_opened():
    assert closing_layout(" }", '{"a": 1') == "}"
    assert closing_layout(" }", '{ "a": 1') == " "
    assert closing_layout(" }", '{ "a": 1 ') == "}"
    assert closing_layout(" ]", '[ {"a": 1}') == " "
    assert closing_layout(' "', '{ "a":') is None  # a value may come: not only the layout
    assert closing_layout(" }", '"a": 1') is None  # nothing was opened
    assert closing_layout("\t}", '{ "a": 1') is None  # opened with what is not an option


def test_added_tokens_are_spelled_as_plain_text():
    pieces = {"</x>": 100, "<x>": 101, "</": 1, "x": 2, ">": 3, "<": 4, "a": 6, ">a": 7}

    def tokenize(text):  # longest match first, added tokens included
        tokens = []
        while text:
            piece = max((p for p in pieces if text.startswith(p)), key=len)
            tokens.append(pieces[piece])
            text = text[len(piece) :]
        return tokens

    def added(token):
        return {100: "</x>", 101: "<x>"}.get(token)

    assert tokenize("a</x>a") == [6, 100, 6]
    assert plain_spelling("a</x>a", tokenize, added) == [6, 1, 2, 7]  # '>a' as BPE would
    assert plain_spelling("<x>a</x>", tokenize, added) == [4, 2, 7, 1, 2, 3]
    assert plain_spelling("ax", tokenize, added) == [6, 2]


def call_writer(constraint: type[PrefixConstraint] = PrefixConstraint) -> FakeBackend:
    """A target that writes CALLS[0] after a one-token prompt and ends, every character of
    it forced by `constraint`."""
    ids = {c: i for i, c in TAGGED.items()}
    pieces = {i: c.encode() for i, c in TAGGED.items()} | {TAG_END: b""}

    def writes_the_call(prefix):
        row = np.zeros(TAG_END + 1)
        written = len(prefix) - 1
        row[ids[CALLS[0][written]] if written < len(CALLS[0]) else TAG_END] = 10.0
        return row

    return FakeBackend(
        writes_the_call, TAG_END + 1, end_of_generation={TAG_END}, pieces=pieces,
        constraints=lambda _s: constraint(CALLS, TAGGED, TAG_END),
    )  # fmt: skip


def call_rounds(target: FakeBackend) -> list[Round]:
    settings = GenerationSettings(max_tokens=40, draft_max=16, sampling=GREEDY, structure=ANY)
    events = list(Generation(target, [0], settings, FixedDrafter([])).events())
    assert events[-1].text == CALLS[0]
    return [e for e in events if isinstance(e, Round)]


def test_a_forced_draft_that_ends_the_answer_ends_it_in_the_same_pass():
    # The target writes a call and ends; each character is forced. With the end token in
    # the forced draft, the pass that verifies the closing tag also ends the answer.
    class EndNotDrafted(PrefixConstraint):
        drafts_the_end = False

    def passes(ends):
        return len(call_rounds(call_writer(PrefixConstraint if ends else EndNotDrafted)))

    assert passes(ends=True) == 2  # the prompt's pass, then the whole call and its end
    assert passes(ends=False) == 3  # the last character left out, then the end alone


@pytest.mark.parametrize("dear", [False, True])
def test_the_planner_takes_a_forced_draft_to_the_end_where_one_pass_costs_less(dear):
    # Rows cost 0.4 of a pass each: the rate-best part is shorter than the whole, but the
    # rest would need a pass of its own. Where a row costs more than a pass, it would not.
    step = 1.5 if dear else 0.4
    table = {n: 1.0 + step * (n - 1) for n in range(1, 10)}
    planner = AdaptiveDrafter(CostModel(table, 0.0, learn=False))
    forced = list(range(8))
    assert len(planner.plan_forced(forced).tokens) < len(forced) or dear
    taken = planner.plan_forced(forced, ends=True).tokens
    assert (taken == forced) == (not dear)


@pytest.mark.parametrize("with_drafts", [True, False])
def test_forced_text_rides_in_the_prompts_pass_where_the_target_computes_it_the_same(
    with_drafts,
):
    # Everything is forced from the start: where a prompt may be decoded with rows after it
    # (exact mode on the invariant kernels), the prompt's own pass verifies the whole call.
    target = call_writer()
    target.prompt_with_drafts = with_drafts
    rounds = call_rounds(target)
    assert len(rounds) == (1 if with_drafts else 2)
    assert (rounds[0].drafted > 0) == with_drafts


@pytest.mark.parametrize("end", [16, 256, 4096, 151936])  # the last: all the rest
def test_each_slice_of_a_big_row_is_its_place_in_one_total_order(end):
    """The slices allowed_best asks about, on a row of Qwen's size with many ties: ranked by
    descending logit, ties by ascending id, as a sort of the whole row ranks them."""
    rng = np.random.default_rng(end)
    row = np.round(rng.normal(0.0, 3.0, 151936), 1).astype(np.float32)  # rounded: ties
    ranked = np.lexsort((np.arange(len(row)), -row))
    start = end // 16
    assert _best_ids(row, start, end).tolist() == ranked[start:end].tolist()
