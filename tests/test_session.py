"""Sizing the context when --ctx-size is not given."""

from __future__ import annotations

import pytest
from fakes import FakeBackend, table_model

from specdec_cli.session import (
    MIN_CONTEXT,
    HardwareOptions,
    ModelPair,
    context_size,
    fit_context,
)


@pytest.mark.parametrize(
    ("needed", "trained", "size"),
    [
        (100, 32768, MIN_CONTEXT),  # a short answer still gets the floor
        (1500, 32768, 1536),  # rounded up to llama.cpp's steps of 256
        (9000, 4096, 4096),  # never past what the model was trained for
        (100, 512, 512),  # not even for the floor
        (1500, 0, 1536),  # a model that does not say
    ],
)
def test_context_size(needed, trained, size):
    assert context_size(needed, trained) == size


def fake_pair(trained: int) -> ModelPair:
    target = FakeBackend(table_model(10, seed=1), n_vocab=10, n_ctx=MIN_CONTEXT)
    target.n_ctx_train = trained
    return ModelPair(target, target.twin())


def test_both_models_get_the_context_the_text_needs():
    pair = fake_pair(trained=32768)
    pair.target.decode([1, 2, 3], 1)
    fit_context(pair, HardwareOptions(), needed=3000)
    assert pair.target.n_ctx == pair.drafter.n_ctx == 3072
    assert pair.target.cached == []


def test_the_users_ctx_size_is_kept():
    pair = fake_pair(trained=32768)
    fit_context(pair, HardwareOptions(ctx_size=MIN_CONTEXT), needed=3000)
    assert pair.target.n_ctx == pair.drafter.n_ctx == MIN_CONTEXT
