"""llama.cpp's grammar engine as the engine's `Constraint`: GBNF for a structure (its own,
llama.cpp's JSON grammar, or a JSON schema converted), and the sampler that allows tokens."""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from ..decoding.constraint import forced_draft_tokens
from ..structured import Structure, StructureError, StructureKind
from .library import llama_cpp

if TYPE_CHECKING:
    from .vocabulary import VocabularyMixin


def grammar_text(structure: Structure) -> str:
    """The GBNF for a structure: its own, llama.cpp's JSON grammar, or the schema converted
    by llama-cpp-python's converter (structured.py refuses what it would ignore)."""
    if structure.kind == StructureKind.GRAMMAR:
        return structure.text
    if structure.kind == StructureKind.JSON_OBJECT:
        return JSON_GBNF
    try:
        grammar = json_schema_to_gbnf(structure.text)
    except (AssertionError, KeyError, ValueError, TypeError, NotImplementedError) as error:
        raise StructureError(f"the JSON schema cannot be turned into a grammar: {error}") from None
    if not (structure.before or structure.after):
        return grammar
    inner = re.sub(r"^root ::=", "schema-root ::=", grammar, count=1, flags=re.MULTILINE)
    parts = [_gbnf_literal(structure.before)] if structure.before else []
    parts.append("schema-root")
    if structure.after:
        parts.append(_gbnf_literal(structure.after))
    return f"root ::= {' '.join(parts)}\n{inner}"


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals escape as JSON's do (\n, \", \\)


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


class GrammarConstraint:
    """A llama.cpp grammar sampler asked token by token (decoding/constraint.py): it sets
    the logit of each token the grammar forbids to -inf."""

    def __init__(self, sampler, owner: VocabularyMixin) -> None:
        self._sampler = sampler
        self._owner = owner  # the grammar reads the model's vocabulary: keep it alive

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        candidates = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(llama_cpp.llama_token_data_p), len(ids), -1, False
        )
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(candidates))
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        # llama.cpp aborts the process on a token its grammar forbids: ask first (25 us).
        if not self.allowed(np.array([token], dtype=np.int32))[0]:
            raise StructureError(f"token {token} is not allowed by the grammar here.")
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def copy(self) -> GrammarConstraint:
        return GrammarConstraint(llama_cpp.llama_sampler_clone(self._sampler), self._owner)

    def forced_tokens(self, written: str = "", seen: Collection[int] = ()) -> list[int]:
        owner = self._owner
        characters, ends = owner.character_tokens(), owner.end_tokens()
        return forced_draft_tokens(self, characters, owner.plain_spelling, written, ends, seen)

    def __del__(self) -> None:
        if getattr(self, "_sampler", None):
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None
