"""Tiny llama-architecture GGUF models, written on the fly for integration tests.

Every model is a 2-layer llama (d_model 64, 4 query heads, `n_head_kv` key/value heads,
FFN 128, context 512, rope) with random F32 (or F16) weights and a small SentencePiece
("llama") vocabulary; the quantised targets (d_model 256, FFN 512: K-quants take rows of 256)
have their matrices in Q4_K (or Q5_K) and Q6_K as a Q4_K_M (Q5_K_M) file mixes them
(tests/kquants.py), or in Q8_0 or Q5_0 (gguf-py's quantiser):

    id 0            <unk>        UNKNOWN
    id 1            <s>          CONTROL  (bos, added by default)
    id 2            </s>         CONTROL  (eos)
    id 3 + b        <0xBB>       BYTE     for every byte b in 0..255 (ids 3..258)
    id 259 ...      NORMAL       "▁", printable ASCII characters, then every prefix of
                                 "▁" + word for a list of common English words
    last two ids    <|im_start|>, <|im_end|>  CONTROL (for the ChatML-like chat template;
                                 llama.cpp treats <|im_end|> as end-of-generation too)

There are no non-ASCII pieces, so "é" or "日本" always go through byte fallback and a
single character spans several tokens.

Weights are drawn per tensor from `numpy.random.default_rng([seed, tensor_index])`, so
a model whose vocabulary only appends tokens (see `padded_vocab`) keeps the exact rows of
the smaller one. A drafter made with `perturb_from=<target seed>` gets the target's
weights plus `noise` times each tensor's standard deviation of Gaussian noise.

The output matrix is scaled by `logit_scale` (logits have roughly that standard
deviation; default 16), so greedy choices have wide top-2 margins (median ~4 logits on
the target) and don't flip between llama.cpp's batched and one-token kernels. Rows of
output.weight are zero for <unk>, <s> and <|im_start|> (never generated), scaled by
`eos_scale` for </s> and <|im_end|> (default 1.0: an ordinary random row, so EOS is
possible but rare, about 1e-5 per step on the target and 5e-4 on the soft target), and
scaled by 0.6 for byte tokens (so generated text is mostly words).

Measured with llama.cpp (2 prompts x 40 teacher-forced greedy steps on the target's
path): close drafter ~80% agreement, padded drafter ~75% (it can also propose its extra
ids >= the target's n_vocab), unrelated and GQA drafters 0%.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from kquants import quantize_q4_K, quantize_q5_K, quantize_q6_K

SPIECE_SPACE = "\u2581"  # "▁"

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_OFFSET = 3  # byte b is token id BYTE_OFFSET + b
N_BYTES = 256
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A Hermes-style template (tool tests): the tools in the system turn, earlier calls
# between the tags, a tool's answer as a `tool` turn.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call:{% for t in tools %} "
    '{{ t.function.name }}{% endfor %}. Write <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    '{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "'
    '{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the of and to in is it that for on was with as he be at by this had not are but from "
    "or have an they which one you were her all she there would their we him been has when "
    "who will more no if out so said what up its about into than them can only other new "
    "some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right "
    "used take three hello world code function return value print def class import list "
    "string number data model token draft speed fast test"
)
COMMON_WORDS = tuple(_WORDS.split())


def byte_token_id(b: int) -> int:
    return BYTE_OFFSET + b


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, text: str) -> int:
        return self.tokens.index(text)


def make_vocab(
    words: Sequence[str] = COMMON_WORDS,
    *,
    chat_tokens: bool = True,
    extra_tokens: Sequence[str] = (),
) -> Vocab:
    """Build the SentencePiece vocabulary described in the module docstring.

    Scores grow with piece length, so the SPM merger prefers longer pieces; every prefix of
    "▁word" is in the vocabulary, which is what lets the bigram merges reach the word.
    `extra_tokens` are appended (NORMAL) after the chat tokens.
    """
    T = gguf.TokenType
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    scores: list[float] = [0.0, 0.0, 0.0]
    for b in range(N_BYTES):
        tokens.append(f"<0x{b:02X}>")
        types.append(T.BYTE)
        scores.append(0.0)
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece in seen:
            return
        seen.add(piece)
        tokens.append(piece)
        types.append(T.NORMAL)
        scores.append(-1000.0 + 10.0 * len(piece) - 0.001 * len(tokens))

    add(SPIECE_SPACE)
    for ch in string.ascii_letters + string.digits + string.punctuation:
        add(ch)
        add(SPIECE_SPACE + ch)
    for word in words:
        piece = SPIECE_SPACE + word
        for end in range(2, len(piece) + 1):
            add(piece[:end])
    if chat_tokens:
        for special in (IM_START, IM_END):
            tokens.append(special)
            types.append(T.CONTROL)
            scores.append(0.0)
            seen.add(special)
    for piece in extra_tokens:
        add(piece)
    return Vocab(tuple(tokens), tuple(scores), tuple(int(t) for t in types))


DEFAULT_VOCAB = make_vocab()


def incompatible_vocab() -> Vocab:
    """Same size and special/byte layout as DEFAULT_VOCAB, different pieces after the bytes."""
    base = DEFAULT_VOCAB
    tokens = list(base.tokens)
    normal = [i for i, t in enumerate(base.types) if t == gguf.TokenType.NORMAL]
    # Same set of strings (so tokenization still works), but every normal piece moves.
    moved = [tokens[i] for i in normal][::-1]
    for i, piece in zip(normal, moved, strict=True):
        tokens[i] = piece
    return Vocab(tuple(tokens), base.scores, base.types)


FILL_IN_MIDDLE = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # Qwen2.5-Coder's


def fill_in_middle_vocab() -> Vocab:
    """DEFAULT_VOCAB with a code model's fill-in-the-middle control tokens appended, which
    llama.cpp finds by their text."""
    base, n = DEFAULT_VOCAB, len(FILL_IN_MIDDLE)
    control = int(gguf.TokenType.CONTROL)
    return Vocab(
        base.tokens + FILL_IN_MIDDLE, base.scores + (0.0,) * n, base.types + (control,) * n
    )


def padded_vocab(n_extra: int) -> Vocab:
    """DEFAULT_VOCAB with `n_extra` NORMAL tokens appended (same ids for everything else)."""
    return make_vocab(extra_tokens=[f"{SPIECE_SPACE}extra{i}" for i in range(n_extra)])


@dataclass(frozen=True)
class TinyConfig:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx: int = 512
    rms_eps: float = 1e-5
    rope_freq_base: float = 10000.0


def _weights(
    seed: int,
    cfg: TinyConfig,
    n_vocab: int,
    logit_scale: float,
    vocab: Vocab,
    eos_scale: float,
    byte_scale: float = 0.6,
) -> dict[str, np.ndarray]:
    """Random weights in numpy (out_features, in_features) layout, as GGUFWriter wants."""
    d, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
    counter = iter(range(1_000_000))

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        rng = np.random.default_rng([seed, next(counter)])
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = normal((n_vocab, d), 1.0)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(d, np.float32)
        # Large q/k so attention is not uniform: positions and content both matter.
        w[p + "attn_q.weight"] = normal((cfg.n_head * hd, d), 2.0 / np.sqrt(d))
        w[p + "attn_k.weight"] = normal((cfg.n_head_kv * hd, d), 2.0 / np.sqrt(d))
        w[p + "attn_v.weight"] = normal((cfg.n_head_kv * hd, d), 1.0 / np.sqrt(d))
        w[p + "attn_output.weight"] = normal((d, cfg.n_head * hd), 1.0 / np.sqrt(d))
        w[p + "ffn_norm.weight"] = np.ones(d, np.float32)
        w[p + "ffn_gate.weight"] = normal((cfg.n_ff, d), 1.0 / np.sqrt(d))
        w[p + "ffn_up.weight"] = normal((cfg.n_ff, d), 1.0 / np.sqrt(d))
        w[p + "ffn_down.weight"] = normal((d, cfg.n_ff), 1.0 / np.sqrt(cfg.n_ff))
    w["output_norm.weight"] = np.ones(d, np.float32)
    out = normal((n_vocab, d), logit_scale / np.sqrt(d))
    row_scale = np.ones(n_vocab, np.float32)
    T = gguf.TokenType
    for i, (text, typ) in enumerate(zip(vocab.tokens, vocab.types, strict=True)):
        if i >= n_vocab:
            break
        if typ == T.BYTE:
            row_scale[i] = byte_scale
        elif i == EOS_ID or text == IM_END:
            row_scale[i] = eos_scale
        elif typ in (T.CONTROL, T.UNKNOWN):
            row_scale[i] = 0.0
    w["output.weight"] = out * row_scale[:, None]
    return w


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    vocab: Vocab = DEFAULT_VOCAB,
    perturb_from: int | None = None,
    noise: float = 0.0,
    logit_scale: float = 16.0,
    eos_scale: float = 1.0,
    byte_scale: float = 0.6,
    chat_template: bool | str = True,
    config: TinyConfig = TinyConfig(),
    dtype: type[np.floating] = np.float32,
    quant: str | None = None,
    name: str = "tiny-llama",
) -> Path:
    """Write a tiny llama GGUF to `path` and return it.

    Weights come from `seed`; with `perturb_from=S` they are model S's weights plus
    Gaussian noise (`noise` times each tensor's std, drawn from `seed`). Norm weights are
    perturbed too. `chat_template` is True (ChatML-like), False (none) or a template string.
    `dtype` is np.float32 or np.float16 for the matrices (norms stay F32); `quant` writes
    them quantised instead (the token embeddings stay F32): "q4_k_m" as a Q4_K_M file does
    (Q6_K for the output matrix and the last layer's ffn_down, Q4_K for the others), "q5_k_m"
    the same with Q5_K for Q4_K, "q8_0" and "q5_0" all in Q8_0 or Q5_0.
    """
    path = Path(path)
    n_vocab = len(vocab)
    base_seed = seed if perturb_from is None else perturb_from
    weights = _weights(base_seed, config, n_vocab, logit_scale, vocab, eos_scale, byte_scale)
    if perturb_from is not None and noise > 0:
        for k, (tname, arr) in enumerate(sorted(weights.items())):
            rng = np.random.default_rng([seed, 7919, k])
            std = 1.0 if arr.ndim == 1 else float(arr[arr != 0].std())
            delta = rng.standard_normal(arr.shape, dtype=np.float32) * np.float32(noise * std)
            if tname == "output.weight":
                # Keep the zeroed rows zero so control tokens stay impossible.
                delta *= (arr != 0).any(axis=1, keepdims=True)
            weights[tname] = arr + delta

    arch = "llama"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(config.n_ctx)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.n_ff)
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.n_head_kv)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    writer.add_rope_dimension_count(config.n_embd // config.n_head)
    writer.add_rope_freq_base(config.rope_freq_base)
    writer.add_vocab_size(n_vocab)
    if quant is not None:
        writer.add_file_type(QUANT_FILE_TYPES[quant])
    else:
        writer.add_file_type(
            gguf.LlamaFileType.MOSTLY_F16 if dtype == np.float16 else gguf.LlamaFileType.ALL_F32
        )

    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(CHATML_TEMPLATE if chat_template is True else chat_template)

    for tname, arr in weights.items():
        if quant is not None and arr.ndim > 1 and tname != "token_embd.weight":
            blocks, qtype = _quantised(tname, arr, quant, config)
            writer.add_tensor(tname, blocks, raw_dtype=qtype)
            continue
        if arr.ndim > 1:
            arr = arr.astype(dtype)
        writer.add_tensor(tname, np.ascontiguousarray(arr))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


QUANT_FILE_TYPES = {
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "q5_k_m": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
}


def _quantised(
    tname: str, arr: np.ndarray, quant: str, config: TinyConfig
) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    Q = gguf.GGMLQuantizationType
    if quant in ("q8_0", "q5_0"):
        qtype = Q.Q8_0 if quant == "q8_0" else Q.Q5_0
        return gguf.quants.quantize(arr, qtype), qtype
    six_bit = ("output.weight", f"blk.{config.n_layer - 1}.ffn_down.weight")
    if tname in six_bit:
        return quantize_q6_K(arr), Q.Q6_K
    if quant == "q5_k_m":
        return quantize_q5_K(arr), Q.Q5_K
    return quantize_q4_K(arr), Q.Q4_K


TARGET_SEED = 0
# the quantised targets, in TinyModels' field order: file name -> `quant`
QUANTISED = {
    "kquant_target": "q4_k_m",
    "q5_k_target": "q5_k_m",
    "q8_0_target": "q8_0",
    "q5_0_target": "q5_0",
}
CLOSE_DRAFTER_NOISE = 0.02
SOFT_LOGIT_SCALE = 4.0


@dataclass(frozen=True)
class TinyModels:
    target: Path  # seed 0, n_head_kv 4, F32, ChatML-like chat template
    close_drafter: Path  # target's weights + small noise: greedy agreement high, not total
    unrelated_drafter: Path  # other seed, same vocabulary: low agreement
    incompatible: Path  # same size, token texts differ from id 259 on
    oversized: Path  # DEFAULT_VOCAB + 200 tokens: size differs by > 128 (incompatible)
    padded_drafter: Path  # close drafter + 16 extra tokens appended: compatible by size
    gqa_drafter: Path  # other seed, n_head_kv 2, F16 weights, same vocabulary
    soft_target: Path  # the target's weights with logit_scale 4: flatter distributions
    soft_drafter: Path  # the close drafter's weights with logit_scale 4
    kquant_target: Path  # other seed, d_model 256, FFN 512, Q4_K and Q6_K matrices
    q5_k_target: Path  # the K-quant target's weights in Q5_K and Q6_K
    q8_0_target: Path  # the K-quant target's weights in Q8_0
    q5_0_target: Path  # the K-quant target's weights in Q5_0
    # Other seed, one KV head for its four query heads: exact mode's attention takes specdec's
    # kernel (patch 0002), which models with fewer query heads to a KV head do not
    mqa_target: Path
    # The target's weights but </s> and <|im_end|> never generated (eos_scale 0): every answer
    # runs to its max_tokens, for tests that need a long one whatever the kernels' last bits.
    # Named target.gguf too (in endless/), so a server of it lists the model as "target".
    endless_target: Path


def build_tiny_models(directory: str | Path) -> TinyModels:
    """Write the standard set of tiny models into `directory` (about 0.1 s)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = write_tiny_llama(d / "target.gguf", seed=TARGET_SEED, name="tiny-target")
    close = write_tiny_llama(
        d / "close_drafter.gguf",
        seed=101,
        perturb_from=TARGET_SEED,
        noise=CLOSE_DRAFTER_NOISE,
        chat_template=False,
        name="tiny-close",
    )
    unrelated = write_tiny_llama(
        d / "unrelated_drafter.gguf", seed=7, chat_template=False, name="tiny-unrelated"
    )
    incompatible = write_tiny_llama(
        d / "incompatible.gguf", seed=11, vocab=incompatible_vocab(), name="tiny-incompatible"
    )
    oversized = write_tiny_llama(
        d / "oversized.gguf", seed=13, vocab=padded_vocab(200), name="tiny-oversized"
    )
    padded = write_tiny_llama(
        d / "padded_drafter.gguf",
        seed=101,
        perturb_from=TARGET_SEED,
        noise=CLOSE_DRAFTER_NOISE,
        vocab=padded_vocab(16),
        chat_template=False,
        name="tiny-padded",
    )
    gqa = write_tiny_llama(
        d / "gqa_drafter.gguf",
        seed=23,
        config=TinyConfig(n_head_kv=2),
        dtype=np.float16,
        chat_template=False,
        name="tiny-gqa",
    )
    soft_target = write_tiny_llama(
        d / "soft_target.gguf",
        seed=TARGET_SEED,
        logit_scale=SOFT_LOGIT_SCALE,
        name="tiny-soft-target",
    )
    soft_drafter = write_tiny_llama(
        d / "soft_drafter.gguf",
        seed=101,
        perturb_from=TARGET_SEED,
        noise=CLOSE_DRAFTER_NOISE,
        logit_scale=SOFT_LOGIT_SCALE,
        chat_template=False,
        name="tiny-soft-drafter",
    )
    quantised = {  # one seed, rows of 256: the row-wise kernels' block sizes
        name: write_tiny_llama(
            d / f"{name}.gguf",
            seed=29,
            config=TinyConfig(n_embd=256, n_ff=512),
            quant=quant,
            name=f"tiny-{name}",
        )
        for name, quant in QUANTISED.items()
    }
    return TinyModels(
        target,
        close,
        unrelated,
        incompatible,
        oversized,
        padded,
        gqa,
        soft_target,
        soft_drafter,
        *quantised.values(),
        write_tiny_llama(
            d / "mqa_target.gguf", seed=31, config=TinyConfig(n_head_kv=1), name="tiny-mqa"
        ),
        write_tiny_llama(
            d / "endless" / "target.gguf", seed=TARGET_SEED, eos_scale=0.0, name="tiny-endless"
        ),
    )
