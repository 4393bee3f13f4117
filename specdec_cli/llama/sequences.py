"""Several sequences in one llama.cpp context: a backend split into views, one per sequence,
whose rows are decoded together in rounds (rounds.py), padded or left ragged
(batches.round_widths)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from . import library
from .batches import decode_failure, round_widths
from .context_state import ContextState
from .library import (
    DRAFT_ROUND_ROWS,
    EXACT_BATCH_ROWS,
    _llama_decode,
    llama_cpp,
)
from .rounds import Part, Rounds

if TYPE_CHECKING:
    from .backend import LlamaBackend

# A round's lane: a sequence's view, its part (None: padding only) and its rows' count.
Lane = tuple["LlamaBackend", Part | None, int]


class SequencesMixin(ContextState):
    """Several KV sequences in one context (serve --parallel): LlamaBackend's `split` and
    the rounds its views decode together."""

    def split(
        self,
        n_sequences: int,
        pass_cost: Callable[[int], float] | None = None,
        rounds: Rounds | None = None,
    ) -> list[LlamaBackend]:
        """A backend for each of `n_sequences` KV sequences of one new context, each of this
        context's size (serve --parallel). Their generated rows are decoded together in
        rounds (rounds.py); a prompt is decoded alone, in its own llama_decode calls.

        Exact mode stays exact (docs/multi-sequence-exactness.md): a stream of cells per
        sequence (kv_unified off), kept in position order as alone; prompts alone; in a
        round each sequence's rows together, padded or left ragged (`_decode_round`), and
        batch-invariant kernels for all the round's rows. This backend keeps the model and
        the context, and is not decoded with any more. `pass_cost`: seconds for a decode of
        n rows of one sequence, by which a round's parts are padded or left ragged;
        without it, padded.

        With `rounds` (another split context's: the target's), this one's sequences are the
        slots' drafters: their steps join those rounds as a pool of their own, several
        requests' steps in one decode (`_decode_drafter_round`), in one cache for all
        (kv_unified: a drafter's logits need not be exact)."""
        per_sequence, solo_batch = self.n_ctx, self.n_batch
        self._close_context()
        # its views' rows come back from rounds shared with other sequences, as logits
        self._wants_device_choices = False
        rows = EXACT_BATCH_ROWS if rounds is None else DRAFT_ROUND_ROWS
        self._n_batch_wanted = max(solo_batch, n_sequences * rows)  # a full round
        self._open_context(per_sequence * n_sequences, n_sequences, unified=rounds is not None)
        self.n_ctx = per_sequence
        self._pass_cost = pass_cost
        if rounds is None:
            self._rounds_of_views, pool = Rounds(self._decode_round), 0
        else:
            self._rounds_of_views, pool = rounds, rounds.add_pool(self._decode_drafter_round)
        self._views = {seq: self._view(seq, solo_batch, pool) for seq in range(n_sequences)}
        return list(self._views.values())

    def _view(self, seq: int, n_batch: int, pool: int) -> LlamaBackend:
        view = cast("LlamaBackend", copy.copy(self))
        view.n_batch = n_batch  # its own decodes are cut as alone
        view._owns_model = view._owns_context = False
        view._seq, view._rounds, view._pool = seq, self._rounds_of_views, pool
        view._turn = self._rounds_of_views.turn
        view.cached, view._aligned_prompt_end, view._children = [], 0, []
        view.tokens_decoded = view.decode_calls = 0
        view._init_batch()
        self._children.append(view)
        return view

    def alongside(self) -> tuple[int, int]:
        """The other requests this sequence's next rows will share a pass with: how many,
        and the most rows one of them decodes ((0, 0) for a backend of its own)."""
        return (0, 0) if self._rounds is None else self._rounds.alongside(self._seq)

    @property
    def rounds(self) -> Rounds | None:
        """The rounds a split context's views share (None for a backend of its own)."""
        return self._rounds

    def _decode_round(self, parts: list[Part]) -> int:
        """Every part's rows in one llama_decode, sequence after sequence. llama.cpp computes
        a batch of a non-unified cache in equal shares of consecutive sequences
        (batches.equal_split_sizes): a sequence between two of the round's that has
        none of its own gets padding rows (sequences 0 and 2 alone cost two computes, 2.0x
        one row, on the Zen 5; with 1's padding, one), and the parts are padded to the
        widest (one compute) or left ragged (a compute for the wider parts' further rows),
        whichever the pass's costs say is cheaper (round_widths). Padding rows' logits
        are not asked for, and their cells are removed afterwards. How many there were."""
        by_seq = {part.seq: part for part in parts}
        first, last = min(by_seq), max(by_seq)
        rows = [len(by_seq[seq].tokens) if seq in by_seq else 0 for seq in range(first, last + 1)]
        widths = round_widths(rows, self._pass_cost, self.n_batch)
        lanes = self._round_lanes(by_seq, range(first, last + 1), widths)
        return self._decode_lanes(lanes, filler=parts[0].tokens[-1], invariant=self.exact)

    def _decode_drafter_round(self, parts: list[Part]) -> int:
        """The drafters' parts one after another in one llama_decode, llama.cpp's own
        kernels: a unified cache makes one compute of them whatever their widths, so none
        is padded."""
        lanes: list[Lane] = [(self._views[part.seq], part, len(part.tokens)) for part in parts]
        return self._decode_lanes(lanes, filler=0, invariant=False)

    def _decode_lanes(self, lanes: list[Lane], filler: int, invariant: bool) -> int:
        """One llama_decode of the lanes, one after another, each padded with `filler` rows
        to its width; each part gets the logits of its last `n_logits` rows (0: all), and
        its view the tokens; padding cells are removed again. How many padding rows there
        were."""
        starts = self._fill_round_batch(lanes, filler)
        n = self._batch.n_tokens
        # every row of the round, invariant or none
        library._exactness.set_invariant_rows(max(EXACT_BATCH_ROWS, n) if invariant else 0)
        began = time.perf_counter()
        status = _llama_decode(self._ctx, self._batch)
        for (view, part, _), start in zip(lanes, starts, strict=True):
            real = 0 if part is None or status != 0 else len(part.tokens)
            llama_cpp.llama_memory_seq_rm(self._memory, view._seq, len(view.cached) + real, -1)
            if real:
                assert part is not None
                wanted = part.n_logits or real
                part.logits = self._output_rows(start + real - wanted, wanted)
                view.cached.extend(part.tokens)
                view.tokens_decoded += real
                view.decode_calls += 1
        self.decode_seconds += time.perf_counter() - began
        if status != 0:
            position = min(len(view.cached) for view, _, _ in lanes)
            raise decode_failure(status, position, self.n_ctx)
        return n - sum(len(part.tokens) for _, part, _ in lanes if part is not None)

    def _fill_round_batch(self, lanes: list[Lane], filler: int) -> list[int]:
        """The batch holds the lanes one after another, each padded with `filler` rows
        (logits not asked for) to its width, a part's last `n_logits` rows (0: all) asked
        for; where each lane starts."""
        n = sum(width for _, _, width in lanes)
        if n > self.n_batch:
            raise ValueError(f"{n} rows of {len(lanes)} sequences exceed a batch of {self.n_batch}")
        starts, start = [], 0
        for view, part, width in lanes:
            rows = slice(start, start + width)
            tokens = list(part.tokens) if part is not None else []
            wanted = (part.n_logits or len(tokens)) if part is not None else 0
            base = len(view.cached)
            self._batch_token[rows] = [*tokens, *[filler] * (width - len(tokens))]
            self._batch_pos[rows] = np.arange(base, base + width)
            asked = [0] * (len(tokens) - wanted) + [1] * wanted
            self._batch_logits[rows] = asked + [0] * (width - len(tokens))
            for row in range(start, start + width):
                self._batch.seq_id[row][0] = view._seq
            starts.append(start)
            start += width
        self._batch.n_tokens = n
        return starts

    def _round_lanes(self, by_seq: dict[int, Part], seqs: range, widths: list[int]) -> list[Lane]:
        """The round's sequences in order, with their rows' count: each part's, and padding
        for the sequences between them that have room for it."""
        lanes: list[Lane] = []
        for seq, width in zip(seqs, widths, strict=True):
            view = self._views[seq]
            if seq in by_seq:
                lanes.append((view, by_seq[seq], width))
            elif len(view.cached) + width <= view.n_ctx:
                lanes.append((view, None, width))
        return lanes

    def _output_rows(self, batch_row: int, n_rows: int) -> np.ndarray:
        """A copy of the logits of `n_rows` rows from `batch_row` on, all asked for: they
        follow each other in llama.cpp's output buffer (padding rows have no output)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_row)
        return np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab)).copy()
