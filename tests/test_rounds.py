"""Rounds (models/rounds.py) with a fake decode: when a round runs, who is in it, what a
failed pass does, and the turns taken between rounds. Threads meet on the rounds' own
condition and on events, never on sleeps (timeouts only catch a hang)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from specdec_cli.llama.rounds import Part, Rounds


class FakePass:
    """Records each round's parts; logits are the tokens themselves, so a part can tell
    its own rows came back."""

    def __init__(self) -> None:
        self.passes: list[list[tuple[int, list[int]]]] = []
        self.fail_next = False

    def __call__(self, parts: list[Part]) -> None:
        self.passes.append([(part.seq, list(part.tokens)) for part in parts])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the pass failed")
        for part in parts:
            part.logits = np.array(part.tokens, dtype=np.float32)[:, None]


class Submitter(threading.Thread):
    def __init__(self, rounds: Rounds, seq: int, tokens: list[int]) -> None:
        super().__init__()
        self.rounds, self.seq, self.tokens = rounds, seq, tokens
        self.logits: np.ndarray | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.logits = self.rounds.submit(self.seq, self.tokens)
        except BaseException as error:
            self.error = error


def waits_for_a_round(rounds: Rounds, seq: int) -> bool:
    """Once `seq`'s rows are handed in (or a pass ran): whether they wait, no pass run. A
    submit registers its rows and decides whether to run the round in one step, so a
    round that should not run yet would show here."""
    with rounds._changed:
        rounds._changed.wait_for(lambda: seq in rounds._waiting or rounds._busy, timeout=60)
        return seq in rounds._waiting and not rounds._busy and rounds.stats.rounds == 0


def test_a_round_waits_for_every_sequence_taking_part_and_holds_them_all():
    fake = FakePass()
    rounds = Rounds(fake)
    rounds.join(0)
    rounds.join(1)
    first = Submitter(rounds, 1, [5, 6])
    assert waits_for_a_round(rounds, 1)  # sequence 0 takes part and has not sent its rows
    second = Submitter(rounds, 0, [7])
    first.join()
    second.join()
    assert fake.passes == [[(0, [7]), (1, [5, 6])]]  # one pass, sequence after sequence
    assert first.logits is not None and first.logits[:, 0].tolist() == [5, 6]
    assert second.logits is not None and second.logits[:, 0].tolist() == [7]
    assert rounds.alongside(0) == (1, 2) and rounds.alongside(1) == (1, 1)
    assert rounds.stats.rounds == 1 and rounds.stats.largest == 2 and rounds.stats.rows == 3


def test_a_sequence_that_leaves_no_longer_holds_a_round_up():
    fake = FakePass()
    rounds = Rounds(fake)
    rounds.join(0)
    rounds.join(1)
    waiting = Submitter(rounds, 0, [1])
    assert waits_for_a_round(rounds, 0)
    rounds.leave(1)  # its request ended (or failed) without another pass
    waiting.join()
    assert fake.passes == [[(0, [1])]]
    assert rounds.alongside(0) == (0, 0)  # alone now


def test_a_failed_pass_is_every_part_s_error_and_the_next_round_runs():
    fake = FakePass()
    rounds = Rounds(fake)
    rounds.join(0)
    rounds.join(1)
    fake.fail_next = True
    both = [Submitter(rounds, 0, [1]), Submitter(rounds, 1, [2])]
    for thread in both:
        thread.join()
    assert all(isinstance(t.error, RuntimeError) for t in both)
    again = [Submitter(rounds, 0, [3]), Submitter(rounds, 1, [4])]
    for thread in again:
        thread.join()
    assert all(t.error is None for t in again) and len(fake.passes) == 2


def test_a_turn_waits_for_a_running_decode_and_a_ready_round_goes_first():
    order: list[str] = []
    rounds = Rounds(lambda parts: (order.append("round"), FakePass()(parts))[1])
    inside, release = threading.Event(), threading.Event()

    def hold_a_turn() -> None:
        with rounds.turn():
            order.append("turn")
            inside.set()
            release.wait()

    def take_a_turn() -> None:
        with rounds.turn():
            order.append("later turn")

    holder = threading.Thread(target=hold_a_turn)
    holder.start()
    assert inside.wait(60)
    ready = Submitter(rounds, 0, [9])  # ready, but the context is busy with the turn
    with rounds._changed:
        rounds._changed.wait_for(lambda: 0 in rounds._waiting, timeout=60)
    late = threading.Thread(target=take_a_turn)  # asks while the round is ready
    late.start()
    with rounds._changed:
        rounds._changed.wait_for(lambda: rounds._turns_waiting == 1, timeout=60)
    release.set()
    for thread in (holder, ready, late):
        thread.join()
    assert order == ["turn", "round", "later turn"]
    assert rounds.stats.turns == 2


def test_a_sequence_cannot_wait_for_two_rounds_at_once():
    rounds = Rounds(FakePass())
    rounds.join(0)
    rounds.join(1)
    waiting = Submitter(rounds, 0, [1])
    assert waits_for_a_round(rounds, 0)
    with pytest.raises(RuntimeError, match="already waits"):
        rounds.submit(0, [2])
    rounds.leave(1)
    waiting.join()


def test_a_turn_waiting_beside_rounds_that_are_always_ready_gets_the_next_one():
    # Two sequences generate without pause; a prompt's chunk asks for a turn while their
    # round runs. Once it ends the chunk goes, before their next round, however fast they
    # hand in their next rows.
    order: list[str] = []
    in_round, release = threading.Event(), threading.Event()

    def first_round_waits(parts: list[Part]) -> None:
        order.append("round")
        if len(order) == 1:
            in_round.set()
            release.wait()
        FakePass()(parts)

    rounds = Rounds(first_round_waits)
    rounds.join(0)
    rounds.join(1)

    def generate(seq: int) -> None:
        for token in range(3):
            rounds.submit(seq, [token])
        rounds.leave(seq)

    def prompt_chunk() -> None:
        with rounds.turn():
            order.append("turn")

    generating = [threading.Thread(target=generate, args=(seq,)) for seq in (0, 1)]
    for thread in generating:
        thread.start()
    assert in_round.wait(60)
    chunk = threading.Thread(target=prompt_chunk)
    chunk.start()
    with rounds._changed:
        rounds._changed.wait_for(lambda: rounds._turns_waiting == 1, timeout=60)
    release.set()
    for thread in (*generating, chunk):
        thread.join()
    assert order == ["round", "turn", "round", "round"]


class PoolSubmitter(Submitter):
    def __init__(self, rounds: Rounds, seq: int, tokens: list[int], pool: int) -> None:
        self.pool = pool
        super().__init__(rounds, seq, tokens)

    def run(self) -> None:
        try:
            self.logits = self.rounds.submit(self.seq, self.tokens, self.pool, 1)
        except BaseException as error:
            self.error = error


def test_the_drafters_steps_share_a_round_before_the_targets_verification():
    target, drafters = FakePass(), FakePass()
    rounds = Rounds(target)
    pool = rounds.add_pool(drafters)
    for seq in (0, 1, 2):
        rounds.join(seq)
    verifying = Submitter(rounds, 0, [5, 6])
    assert waits_for_a_round(rounds, 0)
    stepping = [PoolSubmitter(rounds, seq, [seq], pool) for seq in (1, 2)]
    for thread in stepping:
        thread.join()  # the two steps ran together, while 0's verification waited
    assert drafters.passes == [[(1, [1]), (2, [2])]] and target.passes == []
    rest = [Submitter(rounds, seq, [seq]) for seq in (1, 2)]
    for thread in [verifying, *rest]:
        thread.join()
    assert target.passes == [[(0, [5, 6]), (1, [1]), (2, [2])]]
    assert rounds.stats.drafter_rounds == 1 and rounds.stats.drafter_parts == 2
    assert rounds.stats.rounds == 1  # the drafters' round is not the target's
