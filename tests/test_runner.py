"""`run`, `chat` and `serve` as adapters over the engine and one pair lifecycle, on fake
models (loading.ModelLoader): what reaches stdout and stderr, the JSON record, --verify,
Ctrl-C, serve's wiring, and the comparison behind --verify. No llama.cpp: these run wherever
the package imports."""

from __future__ import annotations

import io
import json
import queue
import threading
from pathlib import Path

import httpx
import numpy as np
from fakes import FakeBackend, decode_request, table_model

from specdec_cli.commands.chat_loop import ChatRequest, run_chat
from specdec_cli.commands.runner import RunRequest, run_once
from specdec_cli.decoding.comparison import compare_outputs
from specdec_cli.decoding.engine import Generation, GenerationSettings
from specdec_cli.errors import EXIT_INTERRUPTED
from specdec_cli.request import HardwareOptions
from specdec_cli.serve.launch import Listening, ServeOptions, ServeRequest, serve

END = 26  # spells nothing; 'a'..'z' before it, every other byte after it (cost probes
# tokenise code and prose)
PIECES = {
    **{t: bytes([ord("a") + t]) for t in range(26)},
    END: b"",
    **{27 + i: bytes([b]) for i, b in enumerate(b for b in range(256) if not 97 <= b <= 122)},
}
N_VOCAB = len(PIECES)
TARGET, DRAFTER = Path("target.gguf"), Path("drafter.gguf")


class ChatFake(FakeBackend):
    """A fake with a chat template: the messages' contents, one after another."""

    def chat_template(self) -> str | None:
        return "{% for m in messages %}{{ m.content }}{% endfor %}"

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return "".join(message["content"] for message in messages)


class InterruptedAfter(FakeBackend):
    """Ctrl-C arrives during the target's `decodes`-th decode."""

    decodes = 6

    def decode(self, tokens, n_logit_rows, prompt=False):
        if self.decode_calls + 1 >= self.decodes:
            raise KeyboardInterrupt
        return super().decode(tokens, n_logit_rows, prompt)


def target_model(seed: int = 3):
    return table_model(N_VOCAB, seed=seed, context=2)


def loader_for(target: FakeBackend, drafter: FakeBackend | None = None):
    """A ModelLoader handing out these backends, and the paths it was asked for."""
    asked: list[tuple[str, bool]] = []

    def load(path: Path, *, drafter: bool, n_ctx: int, hardware: HardwareOptions):
        asked.append((path.name, drafter))
        return drafter_backend if drafter else target

    drafter_backend = drafter
    load.asked = asked  # type: ignore[attr-defined]
    return load


def greedy_alone(prompt: str, max_tokens: int) -> list[int]:
    """The reference: the same target, fresh, with no drafter."""
    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    tokens = target.tokenize(prompt, add_special=True)
    settings = GenerationSettings(max_tokens=max_tokens)
    return Generation(target, tokens, settings, drafter=None).run().tokens


def spelled(tokens: list[int]) -> str:
    return b"".join(PIECES[t] for t in tokens).decode("utf-8", errors="replace")


def test_run_prints_one_json_record_with_the_target_alones_answer(capsys):
    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    drafter = target.twin()
    request = decode_request(target=TARGET, draft=DRAFTER, drafter_mode="fixed", max_tokens=20)
    loader = loader_for(target, drafter)
    code = run_once(
        RunRequest(request, "abc", raw=True, verify=True), json_output=True, loader=loader
    )
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    record = json.loads(out)
    expected = greedy_alone("abc", 20)
    assert record["tokens"] == expected and record["text"] == spelled(expected)
    assert record["verify"]["identical"] is True
    assert record["stats"]["drafted"] > 0 and record["stats"]["accepted"] > 0
    assert record["settings"]["draft"] == str(DRAFTER)
    assert loader.asked == [("target.gguf", False), ("drafter.gguf", True)]


def answer_plainly(target: FakeBackend, capsys, verify: bool = False) -> tuple[int, str, str]:
    """`specdec run --raw abc -n 16` (--verify) as a pipeline sees it: exit code, stdout,
    stderr."""
    decode = decode_request(target=TARGET, max_tokens=16)
    request = RunRequest(decode, "abc", raw=True, verify=verify)
    code = run_once(request, json_output=False, loader=loader_for(target))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_streams_only_the_answer_to_stdout(capsys):
    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    code, out, err = answer_plainly(target, capsys)
    assert code == 0
    assert out == spelled(greedy_alone("abc", 16)) + "\n"
    assert err == ""  # stats go to a terminal only


def test_ctrl_c_keeps_the_partial_answer_and_exits_130(capsys):
    target = InterruptedAfter(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    code, out, err = answer_plainly(target, capsys)
    assert code == EXIT_INTERRUPTED
    whole = spelled(greedy_alone("abc", 16))
    assert out.strip() and whole.startswith(out.strip()) and out.strip() != whole
    assert "interrupted" in err and "partial" in err


class InterruptedInVerify(FakeBackend):
    """Ctrl-C arrives in the second prompt decode: --verify's target-alone pass."""

    prompt_decodes = 0

    def decode(self, tokens, n_logit_rows, prompt=False):
        self.prompt_decodes += prompt
        if self.prompt_decodes == 2:
            raise KeyboardInterrupt
        return super().decode(tokens, n_logit_rows, prompt)


def test_ctrl_c_ends_the_run_at_once_without_a_verify_pass(capsys):
    target = InterruptedAfter(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    code, out, err = answer_plainly(target, capsys, verify=True)
    assert code == EXIT_INTERRUPTED
    assert "partial" in err and "identical" not in err and "differ" not in err
    assert target.decode_calls + 1 == target.decodes  # no target-alone pass after Ctrl-C


def test_ctrl_c_in_the_verify_pass_keeps_the_whole_answer_and_exits_130(capsys):
    target = InterruptedInVerify(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    code, out, err = answer_plainly(target, capsys, verify=True)
    assert code == EXIT_INTERRUPTED
    assert out == spelled(greedy_alone("abc", 16)) + "\n"
    assert "--verify did not finish" in err


def test_serve_loads_through_the_loader_and_answers_as_the_target_alone():
    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    loader = loader_for(target, target.twin())
    decode = decode_request(target=TARGET, draft=DRAFTER, drafter_mode="fixed", max_tokens=12)
    request = ServeRequest(decode, ServeOptions(port=0, history_tokens=0))
    started: queue.Queue[Listening | BaseException] = queue.Queue()
    exit_codes: list[int] = []

    def run() -> None:
        try:
            exit_codes.append(serve(request, loader, on_listening=started.put))
        except BaseException as error:  # reported to the test, not lost in the thread
            started.put(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    listening = started.get(timeout=120)
    assert isinstance(listening, Listening), listening
    try:
        body = {"prompt": "abc", "max_tokens": 12, "temperature": 0}
        response = httpx.post(listening.url + "/v1/completions", json=body, timeout=120)
    finally:
        listening.stop()
        thread.join(120)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == spelled(greedy_alone("abc", 12))
    assert response.json()["usage"]["completion_tokens"] == 12
    assert loader.asked == [("target.gguf", False), ("drafter.gguf", True)]
    assert not thread.is_alive() and exit_codes == [0]


def test_piped_chat_answers_each_line_and_keeps_the_conversation(capsys):
    target = ChatFake(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    request = ChatRequest(decode_request(target=TARGET, max_tokens=6))
    code = run_chat(
        request, stdin=io.StringIO("abc\nde\n/exit\nnever read\n"), loader=loader_for(target)
    )
    out, _ = capsys.readouterr()
    assert code == 0
    first = spelled(greedy_alone("abc", 6))
    second = spelled(greedy_alone("abc" + first + "de", 6))  # the template joins the turns
    assert out.split() == [first, second]


def test_a_chat_model_without_a_template_is_one_clear_error(capsys):
    import pytest

    from specdec_cli.errors import ModelFileError

    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    with pytest.raises(ModelFileError, match="no chat template"):
        run_chat(ChatRequest(decode_request(target=TARGET)), stdin=io.StringIO("hi\n"),
                 loader=loader_for(target))  # fmt: skip


def test_the_comparison_finds_where_answers_part_and_how_close_it_was():
    target = FakeBackend(target_model(), N_VOCAB, end_of_generation=[END], pieces=PIECES)
    prompt = target.tokenize("abc", add_special=True)
    plain = greedy_alone("abc", 10)
    assert compare_outputs(target, prompt, plain, plain).identical
    other = [*plain[:4], (plain[4] + 1) % END, *plain[5:]]
    comparison = compare_outputs(target, prompt, other, plain)
    assert not comparison.identical and comparison.first_difference == 4
    row = np.sort(np.asarray(target_model()(tuple(prompt + plain[:4]))))
    assert comparison.top2_margin is not None
    assert abs(comparison.top2_margin - float(row[-1] - row[-2])) < 1e-5
    assert comparison.as_dict()["first_difference"] == 4
