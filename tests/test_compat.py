"""The drafter/target compatibility rule, on stand-in vocabularies."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from specdec_cli.decoding.backend import VocabInfo
from specdec_cli.errors import IncompatibleModelsError
from specdec_cli.models.compat import check_compatible

BASE = VocabInfo(vocab_type=2, n_vocab=40, bos=1, eos=2, add_bos=False, add_eos=False)


@dataclass
class Vocabulary:
    """Just what check_compatible reads from a backend."""

    info: VocabInfo

    def vocab_info(self) -> VocabInfo:
        return self.info

    def token_text(self, token: int) -> str:
        return f"tok{token}"


def check(target: VocabInfo, drafter: VocabInfo) -> None:
    check_compatible(Vocabulary(target), Vocabulary(drafter))  # type: ignore[arg-type]


def test_special_ids_that_neither_model_adds_may_differ():
    check(BASE, replace(BASE, bos=11, eos=12))


@pytest.mark.parametrize("token", ["bos", "eos"])
def test_a_special_token_both_add_must_be_the_same(token):
    adding = replace(BASE, **{f"add_{token}": True})
    check(adding, adding)
    with pytest.raises(IncompatibleModelsError, match=f"{token.upper()} token is 11"):
        check(adding, replace(adding, **{token: 11}))


@pytest.mark.parametrize("token", ["bos", "eos"])
def test_adding_a_special_token_must_agree(token):
    with pytest.raises(IncompatibleModelsError, match=f"drafter adds {token.upper()}"):
        check(BASE, replace(BASE, **{f"add_{token}": True}))


def test_tokenizer_type_must_agree():
    with pytest.raises(IncompatibleModelsError, match="tokenizer type"):
        check(BASE, replace(BASE, vocab_type=1))
