"""The tiny GGUF models load in llama.cpp and behave as the other tests assume.

Timing note: build_tiny_models writes all nine models in about 0.1 s (F32, ~0.5 MB each);
loading one in llama.cpp takes a few milliseconds.
"""

from __future__ import annotations

import gguf
import llama_cpp
import numpy as np
import pytest
from kquants import quantize_q4_K, quantize_q5_K, quantize_q6_K
from tiny_gguf import (
    BOS_ID,
    BYTE_OFFSET,
    DEFAULT_VOCAB,
    EOS_ID,
    IM_END,
    build_tiny_models,
    byte_token_id,
)


@pytest.mark.parametrize(
    ("quantize", "qtype", "rms_error"),
    [
        (quantize_q4_K, gguf.GGMLQuantizationType.Q4_K, 0.10),
        (quantize_q5_K, gguf.GGMLQuantizationType.Q5_K, 0.05),
        (quantize_q6_K, gguf.GGMLQuantizationType.Q6_K, 0.03),
    ],
    ids=["q4_K", "q5_K", "q6_K"],
)
def test_kquant_blocks_read_back_as_the_weights(quantize, qtype, rms_error):
    """gguf-py's reader (ggml's layouts) decodes the test quantisers' blocks to the weights."""
    weights = np.random.default_rng(5).standard_normal((16, 512)).astype(np.float32)
    decoded = gguf.quants.dequantize(quantize(weights), qtype)
    relative = np.sqrt(((decoded - weights) ** 2).mean() / (weights**2).mean())
    assert relative < rms_error


QUANTISED_TARGETS = {  # each tiny target's tensors, in the types its tests count on
    "kquant_target": {"output.weight": "Q6_K", "blk.1.ffn_down.weight": "Q6_K",
                      "blk.0.ffn_down.weight": "Q4_K", "blk.0.attn_q.weight": "Q4_K"},
    "q5_k_target": {"output.weight": "Q6_K", "blk.1.ffn_down.weight": "Q6_K",
                    "blk.0.ffn_down.weight": "Q5_K", "blk.0.attn_q.weight": "Q5_K"},
    "q8_0_target": {"output.weight": "Q8_0", "blk.1.ffn_down.weight": "Q8_0",
                    "blk.0.attn_q.weight": "Q8_0", "token_embd.weight": "F32"},
    "q5_0_target": {"output.weight": "Q5_0", "blk.1.ffn_down.weight": "Q5_0",
                    "blk.0.attn_q.weight": "Q5_0", "token_embd.weight": "F32"},
}  # fmt: skip


@pytest.mark.parametrize("name", QUANTISED_TARGETS)
def test_each_quantised_target_has_its_matrices_in_its_types(tiny_models, name):
    reader = gguf.GGUFReader(getattr(tiny_models, name))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {tensor: types[tensor] for tensor in QUANTISED_TARGETS[name]} == QUANTISED_TARGETS[name]


PROMPTS = (
    b"Once upon a time there was a model that",
    b"def hello(world): return the value",
)
N_STEPS = 40


def load(path, **kwargs):
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=256, verbose=False, logits_all=True, n_threads=2, **kwargs
    )


def greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """One token at a time; returns the tokens and the top-2 logit margins."""
    model.reset()
    model.eval(prompt)
    out, margins = [], []
    for _ in range(n):
        logits = np.array(model.scores[model.n_tokens - 1])
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        token = int(logits.argmax())
        out.append(token)
        model.eval([token])
    return out, margins


def teacher_forced_argmax(model, prompt: list[int], path: list[int]) -> list[int]:
    """The model's argmax before each token of `path`, evaluated in one batch."""
    model.reset()
    model.eval(prompt + path)
    start = len(prompt) - 1
    return [int(np.argmax(model.scores[start + i])) for i in range(len(path))]


@pytest.fixture(scope="module")
def target(tiny_models):
    return load(tiny_models.target)


@pytest.fixture(scope="module")
def greedy_paths(target):
    paths = []
    for text in PROMPTS:
        prompt = target.tokenize(text)
        out, margins = greedy(target, prompt, N_STEPS)
        paths.append((prompt, out, margins))
    return paths


def test_the_models_are_small_and_all_load(tiny_models, tmp_path):
    # How long building them takes is the machine's business (no wall-clock bound here).
    assert build_tiny_models(tmp_path).target.stat().st_size < 2_000_000
    for name, path in vars(tiny_models).items():
        model = load(path)
        assert model.n_vocab() >= len(DEFAULT_VOCAB), name
        assert model.token_bos() == BOS_ID and model.token_eos() == EOS_ID, name
        assert model.n_ctx() == 256


def test_vocab_layout_and_byte_fallback(target):
    assert target.n_vocab() == len(DEFAULT_VOCAB)
    assert target.detokenize([byte_token_id(0x41)]) == b"A"
    assert target.detokenize([byte_token_id(0xC3)]) == b"\xc3"
    words = target.tokenize(b"the world", add_bos=False)
    assert all(t > BYTE_OFFSET + 255 for t in words)
    assert target.detokenize(words) == b" the world"
    english = (
        b"The people of the state made good time, and after that the world was still very "
        b"long. They could not know how much work there would be for those men."
    )
    ids = target.tokenize(english)
    assert ids[0] == BOS_ID
    assert len(set(ids)) > 30
    assert target.detokenize(ids[1:]) == b" " + english
    # Characters outside the vocabulary spelled in bytes.
    text = "héllo wörld 日本"
    ids = target.tokenize(text.encode())
    assert ids[0] == BOS_ID
    byte_ids = [t for t in ids if BYTE_OFFSET <= t < BYTE_OFFSET + 256]
    # é and ö are 2 bytes each, 日 and 本 3 bytes each.
    assert len(byte_ids) == 2 + 2 + 3 + 3
    e_acute = [byte_token_id(b) for b in "é".encode()]
    assert any(ids[i : i + 2] == e_acute for i in range(len(ids)))
    assert target.detokenize(ids[1:]).decode() == " " + text


def test_greedy_generation_is_varied_confident_and_the_same_batched(target, greedy_paths):
    for _prompt, out, margins in greedy_paths:
        assert len(out) == N_STEPS
        assert len(set(out)) >= 20, out
        assert max(out.count(t) for t in set(out)) <= 8, out
        assert EOS_ID not in out[:5]
        assert np.median(margins) > 1.0
    # 20 tokens through the high-level API too.
    text = target(PROMPTS[0].decode(), max_tokens=20, temperature=0.0)["choices"][0]["text"]
    assert len(text.split()) >= 5
    # Batched as verification batches them, the same tokens.
    for prompt, out, _ in greedy_paths:
        assert teacher_forced_argmax(target, prompt, out) == out


def agreement(path, greedy_paths) -> float:
    model = load(path)
    hits = []
    for prompt, out, _ in greedy_paths:
        pred = teacher_forced_argmax(model, prompt, out)
        hits += [p == t for p, t in zip(pred, out, strict=True)]
    return float(np.mean(hits))


def test_the_close_drafter_agrees_often_not_always_the_unrelated_rarely(tiny_models, greedy_paths):
    rate = agreement(tiny_models.close_drafter, greedy_paths)
    assert 0.6 <= rate < 1.0, rate
    assert agreement(tiny_models.unrelated_drafter, greedy_paths) <= 0.2
    assert agreement(tiny_models.gqa_drafter, greedy_paths) <= 0.2


def token_texts(model) -> list[str]:
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    return [
        llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8") for i in range(model.n_vocab())
    ]


def test_incompatible_vocabularies(tiny_models, target):
    reference = token_texts(target)
    incompatible = token_texts(load(tiny_models.incompatible))
    assert len(incompatible) == len(reference)
    assert incompatible[: BYTE_OFFSET + 256] == reference[: BYTE_OFFSET + 256]
    assert sum(a != b for a, b in zip(incompatible[5:], reference[5:], strict=True)) > 100

    oversized = token_texts(load(tiny_models.oversized))
    assert len(oversized) - len(reference) > 128
    assert oversized[: len(reference)] == reference

    padded = token_texts(load(tiny_models.padded_drafter))
    assert 0 < len(padded) - len(reference) <= 128
    assert padded[: len(reference)] == reference


def test_chat_template_and_end_of_turn(target):
    vocab = llama_cpp.llama_model_get_vocab(target.model)
    im_end = DEFAULT_VOCAB.id_of(IM_END)
    assert llama_cpp.llama_vocab_is_eog(vocab, im_end)
    assert llama_cpp.llama_vocab_is_eog(vocab, EOS_ID)
    assert "tokenizer.chat_template" in target.metadata
    reply = target.create_chat_completion(
        messages=[{"role": "user", "content": "hello world"}], max_tokens=8, temperature=0.0
    )
    assert reply["choices"][0]["message"]["content"]
