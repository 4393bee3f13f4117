"""A model's vocabulary in llama.cpp: tokens and their text, end-of-generation tokens, the
chat template, and llama.cpp's grammar over the vocabulary (grammar.py)."""

from __future__ import annotations

import ctypes

import jinja2  # llama-cpp-python's chat formatter renders with it
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ..decoding.backend import FillInMiddle, VocabInfo
from ..decoding.constraint import Constraint, plain_spelling
from ..errors import ChatTemplateError, ModelFileError
from ..structured import Structure, StructureError
from .context_state import ContextState
from .grammar import GrammarConstraint, grammar_text
from .library import llama_cpp


class VocabularyMixin(ContextState):
    """A model's vocabulary, its chat template and its grammar constraint."""

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if n < 0:
            capacity = -n
            buffer = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special, parse_special
            )
        return list(buffer[:n])

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, special=False)
        return piece

    def token_spelling(self, token: int) -> bytes:
        spelling = self._spellings.get(token)
        if spelling is None:
            spelling = self._spellings[token] = self._piece(token, special=True)
        return spelling

    def _piece(self, token: int, special: bool) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 256, 0, special)
        return buffer.raw[: max(n, 0)]

    def is_end_of_generation(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            vocab_type=int(llama_cpp.llama_vocab_type(v)),
            n_vocab=self.n_vocab,
            bos=int(llama_cpp.llama_vocab_bos(v)),
            eos=int(llama_cpp.llama_vocab_eos(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )

    def fill_in_middle(self) -> FillInMiddle | None:
        v = self._vocab
        marks = [
            int(llama_cpp.llama_vocab_fim_pre(v)),
            int(llama_cpp.llama_vocab_fim_suf(v)),
            int(llama_cpp.llama_vocab_fim_mid(v)),
        ]
        return FillInMiddle(*marks) if min(marks) >= 0 else None  # LLAMA_TOKEN_NULL: -1

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    # -- prompts ---------------------------------------------------------------------------

    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Render messages (and tools, where given) through the GGUF's own chat template,
        as llama-cpp-python does."""
        template = self.chat_template()
        if template is None:
            raise ModelFileError(
                f"{self.path.name} has no chat template in its metadata.",
                "Pass --raw to send the prompt as plain text.",
            )
        info = self.vocab_info()
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(info.eos) if info.eos >= 0 else "",
            bos_token=self.token_text(info.bos) if info.bos >= 0 else "",
        )
        try:
            # Typed as OpenAI-style message TypedDicts; plain role/content dicts are what it reads.
            return formatter(messages=messages, tools=tools).prompt  # type: ignore[arg-type]
        except jinja2.TemplateError as error:  # e.g. "roles must alternate"
            raise ChatTemplateError(
                f"The model's chat template refused these messages: {error}",
                "Check the roles and their order (many templates want user and assistant "
                "turns to alternate).",
            ) from None

    # -- structured outputs ----------------------------------------------------------------

    def character_tokens(self) -> dict[int, str]:
        """The printable ASCII characters and newline that are a token of their own."""
        if self._characters is None:
            self._characters = {}
            for character in [chr(c) for c in range(32, 127)] + ["\n"]:
                ids = self.tokenize(character, add_special=False)
                if len(ids) == 1:
                    self._characters[ids[0]] = character
        return self._characters

    def plain_spelling(self, text: str) -> list[int]:
        """A grammar's text in this vocabulary's tokens, its tags as plain text."""
        return plain_spelling(text, self._tokenize_special, self._added_text)

    def _tokenize_special(self, text: str) -> list[int]:
        return self.tokenize(text, add_special=False, parse_special=True)

    def _added_text(self, token: int) -> str | None:
        added = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        attributes = llama_cpp.llama_vocab_get_attr(self._vocab, token)
        return self.token_text(token) if attributes & added else None

    def end_tokens(self) -> list[int]:
        """The tokens a chat answer ends with, the turn's end first."""
        ends = (llama_cpp.llama_vocab_eot(self._vocab), llama_cpp.llama_vocab_eos(self._vocab))
        return list(dict.fromkeys(int(t) for t in ends if t >= 0))

    def constrain(self, structure: Structure) -> Constraint:
        """llama.cpp's grammar engine over this vocabulary, at the grammar's start."""
        grammar = grammar_text(structure).encode("utf-8")
        sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar, b"root")
        if not sampler:
            raise StructureError(
                "llama.cpp could not parse the grammar.",
                "Check it against llama.cpp's GBNF (grammars/README.md); --verbose shows where.",
            )
        return GrammarConstraint(sampler, owner=self)
