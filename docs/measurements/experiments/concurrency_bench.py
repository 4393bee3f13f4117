"""Several clients at once against `specdec serve --parallel N` (issue 28): aggregate
throughput with 1, 2 and 4 clients, each request's latency against its solo run, and
whether every answer is the one it gets alone.

Starts the server itself (history off, so a repeated request drafts nothing from its
earlier answer) and sends the suite's prompts through OpenAI's chat API, streamed, greedy
unless --temp (then seeded). With C clients, C prompts are sent at once; a round of the
bench sends every group of C prompts in turn, and the rounds repeat --repeats times,
interleaved with the solo runs, after one warm-up.

Reported per client count: wall tokens/s (all completion tokens over the wall time from
the first request to the last answer, prompts included) and steady tokens/s (while every
request of the group was decoding), both as a ratio to one client; each request's latency
as a ratio to its own solo latency; how many answers differed from their solo answer; and
how many tokens each request drafted per target pass (the planner sizes drafts by what
they add to a shared pass).

    .venv/bin/python docs/measurements/experiments/concurrency_bench.py -- --draft tiny --target large
    .venv/bin/python docs/measurements/experiments/concurrency_bench.py --clients 1,4 -n 128 -- --no-draft --target large
    .venv/bin/python docs/measurements/experiments/concurrency_bench.py --url http://127.0.0.1:8080   # a running one

Also --short: a short request arriving while three long ones run, its latency against solo;
--copying: the same for an edit of a long file (a request that drafts much alone), with its
drafts a pass alone and beside the three, and the four's tokens per second.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

COPYING_PROMPT, COPYING_TOKENS = "edit-long-rename-function", 256  # --copying
STREAM = True  # --no-stream: whole answers (no steady rate, but no client work per token)
ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "specdec_cli" / "bench" / "prompts" / "suite.yaml"


@dataclass
class Result:
    text: str
    tokens: int
    started: float
    first: float  # first content chunk
    ended: float
    chunks: list[float]  # when each content chunk came (about one a token)
    drafted: int = 0  # usage.specdec's, where the server is specdec
    passes: int = 0

    @property
    def latency(self) -> float:
        return self.ended - self.started


def suite_prompts(count: int) -> list[str]:
    """The first prompt of each category in turn, `count` of them."""
    entries = yaml.safe_load(SUITE.read_text())["prompts"]
    by_category: dict[str, list[str]] = {}
    for entry in entries:
        if "text" in entry:
            by_category.setdefault(entry["category"], []).append(entry["text"])
    order = [p for group in zip(*by_category.values(), strict=False) for p in group]
    return order[:count]


def ask(
    url: str,
    prompt: str,
    max_tokens: int,
    temp: float,
    seed: int,
    on_first: threading.Event | None = None,
) -> Result:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temp,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temp > 0:
        body["seed"] = seed
    if not STREAM:
        return ask_whole(url, body)
    started = time.perf_counter()
    first, pieces, tokens, chunks, specdec = 0.0, [], 0, [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1200) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                specdec = chunk["usage"].get("specdec", {})
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    chunks.append(time.perf_counter())
                    first = first or chunks[-1]
                    if on_first is not None:
                        on_first.set()
                    pieces.append(text)
    ended = time.perf_counter()
    result = Result("".join(pieces), tokens, started, first or ended, ended, chunks)
    result.drafted = specdec.get("drafted", 0)
    result.passes = specdec.get("target_passes", 0)
    return result


def ask_whole(url: str, body: dict) -> Result:
    """One JSON answer (--no-stream): the client does no work per token."""
    started = time.perf_counter()
    body = {**body, "stream": False}
    del body["stream_options"]
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=1200).json()
    ended = time.perf_counter()
    usage = answer["usage"]
    text = answer["choices"][0]["message"]["content"]
    result = Result(text, usage["completion_tokens"], started, ended, ended, [])
    result.drafted = usage.get("specdec", {}).get("drafted", 0)
    result.passes = usage.get("specdec", {}).get("target_passes", 0)
    return result


def at_once(url: str, prompts: list[str], max_tokens: int, temp: float, seed: int):
    results: list[Result | None] = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = ask(url, prompts[i], max_tokens, temp, seed)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def rates(results: list[Result]) -> tuple[float, float]:
    """Wall tokens/s (first request to last answer), and steady decode tokens/s: content
    chunks (about a token each) that came while every request was decoding (from the last
    first chunk to the first answer's end), over that time."""
    start = min(r.started for r in results)
    end = max(r.ended for r in results)
    tokens = sum(r.tokens for r in results)
    window = (max(r.first for r in results), min(r.ended for r in results))
    inside = sum(window[0] < t <= window[1] for r in results for t in r.chunks)
    return tokens / (end - start), inside / max(window[1] - window[0], 1e-9)


def start_server(args: list[str], parallel: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "specdec_cli", "serve", "--port", "0"]
    command += ["--parallel", str(parallel), "--history-tokens", "0", *args]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, found.group(1)
    raise SystemExit("the server did not start")


def run(url: str, options: argparse.Namespace) -> dict:
    counts = [int(c) for c in options.clients.split(",")]
    prompts = suite_prompts(max(counts) * options.groups)
    seed = options.seed
    solo: dict[str, list[Result]] = {p: [] for p in prompts}
    together: dict[int, list[list[Result]]] = {c: [] for c in counts}
    at_once(url, prompts[:1], 8, options.temp, seed)  # warm-up
    for _ in range(options.repeats):
        for prompt in prompts:
            solo[prompt] += at_once(url, [prompt], options.max_tokens, options.temp, seed)
        for count in counts:
            for g in range(0, len(prompts), count):
                group = prompts[g : g + count]
                results = at_once(url, group, options.max_tokens, options.temp, seed)
                together[count].append(list(zip(group, results, strict=True)))
    solo_wall = statistics.median(
        rates([r for runs in solo.values() for r in runs[i : i + 1]])[0]
        for i in range(options.repeats)
    )
    report = {"prompts": len(prompts), "max_tokens": options.max_tokens, "clients": {}}
    solo_text = {p: runs[0].text for p, runs in solo.items()}
    solo_latency = {p: statistics.median(r.latency for r in runs) for p, runs in solo.items()}
    one_client = None
    for count in counts:
        walls, decodes, latency_ratios, differ, drafted, passes = [], [], [], 0, 0, 0
        for group in together[count]:
            wall, decode = rates([r for _, r in group])
            walls.append(wall)
            decodes.append(decode)
            for prompt, result in group:
                latency_ratios.append(result.latency / solo_latency[prompt])
                differ += result.text != solo_text[prompt]
                drafted += result.drafted
                passes += result.passes
        entry = {
            "wall_tokens_per_s": round(statistics.median(walls), 2),
            "steady_tokens_per_s": round(statistics.median(decodes), 2),
            "latency_vs_solo_median": round(statistics.median(latency_ratios), 2),
            "latency_vs_solo_worst": round(max(latency_ratios), 2),
            "answers_differing_from_solo": differ,
            "drafted_per_pass": round(drafted / passes, 2) if passes else None,
            "answers": len(latency_ratios),
        }
        if one_client is None:
            one_client = entry
        entry["wall_vs_one_client"] = round(
            entry["wall_tokens_per_s"] / one_client["wall_tokens_per_s"], 2
        )
        entry["steady_vs_one_client"] = (
            round(entry["steady_tokens_per_s"] / one_client["steady_tokens_per_s"], 2)
            if STREAM
            else None
        )
        report["clients"][count] = entry
    report["solo_wall_tokens_per_s"] = round(solo_wall, 2)
    if options.short:
        report["short_during_three_long"] = short_during_long(url, options)
    if options.copying:
        report["copying_during_three_long"] = copying_during_long(url, options)
    report["health"] = httpx.get(url + "/health").json()
    return report


def suite_prompt(prompt_id: str) -> str:
    entries = yaml.safe_load(SUITE.read_text())["prompts"]
    return next(entry["text"] for entry in entries if entry.get("id") == prompt_id)


def short_during_long(url: str, options: argparse.Namespace) -> dict:
    """A short request sent once three long ones are decoding: its latency against solo."""
    prompts = suite_prompts(4)
    return during_three_long(
        url, options, prompts[0], max(options.max_tokens // 4, 16), prompts[1:]
    )


def copying_during_long(url: str, options: argparse.Namespace) -> dict:
    """An edit of a long file (a request that drafts 8-9 tokens a pass alone) sent once
    three long ones are decoding (asked to explain at length, so that they outlast it): its
    latency against solo, and its drafts a pass."""
    longs = [f"{p} Explain in detail, step by step, at length." for p in suite_prompts(3)]
    return during_three_long(url, options, suite_prompt(COPYING_PROMPT), COPYING_TOKENS, longs)


def during_three_long(
    url: str, options: argparse.Namespace, prompt: str, tokens: int, longs_prompts: list[str]
) -> dict:
    """`prompt` (`tokens` long) sent once three long requests (`longs_prompts`) are decoding
    (each has its first token): its latency against solo (its prompt cached both times), how
    many tokens it drafted a pass alone and beside them, and the four's tokens over their
    wall time."""
    ratios, drafted_alone, drafted_busy, group_rates = [], [], [], []
    ask(url, prompt, tokens, options.temp, options.seed)  # its prompt cached, as below
    for _ in range(options.repeats):
        alone = ask(url, prompt, tokens, options.temp, options.seed)
        longs: list[Result] = []
        decoding = [threading.Event() for _ in longs_prompts]

        def long_one(text: str, first: threading.Event, into: list[Result] = longs) -> None:
            into.append(ask(url, text, options.max_tokens * 4, options.temp, options.seed, first))

        threads = [
            threading.Thread(target=long_one, args=(p, e))
            for p, e in zip(longs_prompts, decoding, strict=True)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for event in decoding:
            event.wait()
        busy = ask(url, prompt, tokens, options.temp, options.seed)
        for thread in threads:
            thread.join()
        ended = max(r.ended for r in [busy, *longs])
        group_rates.append(sum(r.tokens for r in [busy, *longs]) / (ended - started))
        ratios.append(busy.latency / alone.latency)
        drafted_alone.append(alone.drafted / max(alone.passes, 1))
        drafted_busy.append(busy.drafted / max(busy.passes, 1))
        assert busy.text == alone.text, "the answer changed beside the others"
    return {
        "latency_vs_solo": [round(r, 2) for r in ratios],
        "drafted_per_pass_alone": [round(d, 2) for d in drafted_alone],
        "drafted_per_pass_beside_three": [round(d, 2) for d in drafted_busy],
        "four_requests_tokens_per_s": [round(r, 1) for r in group_rates],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else one is started)")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--groups", type=int, default=1, help="groups of the largest count")
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--copying", action="store_true")
    parser.add_argument("--no-stream", action="store_true", help="whole answers: wall only")
    parser.add_argument("serve_args", nargs="*", help="after --: specdec serve's options")
    options = parser.parse_args()
    global STREAM
    STREAM = not options.no_stream
    process = None
    url = options.url
    if url is None:
        process, url = start_server(options.serve_args, options.parallel)
    try:
        print(json.dumps(run(url, options), indent=1))
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
