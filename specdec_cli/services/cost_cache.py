"""Measured decode costs, kept between runs per pair, hardware and kernels (for a day)."""

from __future__ import annotations

import time
from dataclasses import astuple
from pathlib import Path

from ..decoding.costs import CatchUpPrice, CostModel, table_problems
from ..decoding.modes import measure_pair_costs
from ..json_cache import read_json_cache, update_json_cache
from ..models.loading import ModelPair
from ..paths import cache_dir
from ..request import HardwareOptions

COSTS_MAX_AGE_SECONDS = 24 * 3600
# A run writes back what it learned only after this many timed decodes: fewer say little.
COSTS_MIN_DECODES = 16


def costs_cache() -> Path:
    return cache_dir() / "decode-costs.json"


def pair_costs(pair: ModelPair, hardware: HardwareOptions, kernels: str | None = None) -> CostModel:
    """Decode timings of this pair on this machine, as the last run left them (cached, for a
    day since that run), else probed (a few seconds). A probe is cached only if it passes
    its checks (adaptive.probe_problems); either way the run corrects its own copy with
    every decode, and `remember_costs` writes the corrected table back."""
    cache = costs_cache()
    key = costs_key(pair, hardware, kernels)
    cached = _cached_costs(read_json_cache(cache).get(key)) if key else None
    if cached is not None:
        return cached
    costs = measure_pair_costs(pair.target, pair.drafter, pair.drafts_by_text(pair.drafter))
    if key and costs.trusted:
        entry = _cost_entry(costs)
        costs.started_at = entry["measured_at"]  # a later entry is another process's
        update_json_cache(cache, lambda entries: entries.update({key: entry}))
    return costs


def remember_costs(
    pair: ModelPair, hardware: HardwareOptions, costs: CostModel, kernels: str | None = None
) -> None:
    """Write the table a run ended with back to the cache, so the next run starts from it.
    Merged under the cache's lock: another process's keys stay, and if it wrote this key
    since this run read it, each cost is the mean of both (both measured this machine now).
    A table that fails the shape checks, or a run that timed few decodes, is not written."""
    key = costs_key(pair, hardware, kernels)
    if not key or not costs.learn or costs.decodes_observed < COSTS_MIN_DECODES:
        return
    healed = costs.healed()
    if table_problems(healed.verify_seconds):
        return
    entry = _cost_entry(healed)

    def merge(entries: dict) -> None:
        theirs = _cached_costs(entries.get(key))
        if theirs is not None and entries[key]["measured_at"] > costs.started_at:
            for n, seconds in theirs.verify_seconds.items():
                if str(n) in entry["verify_seconds"]:
                    entry["verify_seconds"][str(n)] = (
                        entry["verify_seconds"][str(n)] + seconds
                    ) / 2
            entry["draft_step"] = (entry["draft_step"] + theirs.draft_step) / 2
            if "catch_up" in entry and theirs.catch_up_price is not None:
                pairs = zip(entry["catch_up"], astuple(theirs.catch_up_price), strict=True)
                entry["catch_up"] = [(a + b) / 2 for a, b in pairs]
        entries[key] = entry

    update_json_cache(costs_cache(), merge)


def _cost_entry(costs: CostModel) -> dict:
    entry = {
        "measured_at": time.time(),
        "verify_seconds": {str(n): s for n, s in sorted(costs.verify_seconds.items())},
        "draft_step": costs.draft_step,
        "origin": costs.origin,
    }
    if costs.catch_up_price is not None:  # seconds fixed, and a token
        entry["catch_up"] = list(astuple(costs.catch_up_price))
    return entry


def _cached_costs(entry: object) -> CostModel | None:
    """A cache entry as a starting table; None if it is missing, old or malformed."""
    if not isinstance(entry, dict):
        return None
    try:
        measured_at = float(entry["measured_at"])
        if time.time() - measured_at >= COSTS_MAX_AGE_SECONDS:
            return None
        table = {int(n): float(s) for n, s in entry["verify_seconds"].items()}
        step = float(entry["draft_step"])
        price = entry.get("catch_up")  # absent: written before it was measured
        catch_up = None if price is None else CatchUpPrice(*(float(s) for s in price))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not table or min(table.values()) <= 0 or step < 0:
        return None
    if catch_up is not None and min(catch_up.fixed, catch_up.per_token) < 0:
        return None
    origin = f"cache ({entry.get('origin', 'probe')})"
    return CostModel(table, step, catch_up, origin=origin, started_at=measured_at)


def costs_key(pair: ModelPair, hardware: HardwareOptions, kernels: str | None = None) -> str | None:
    """What decode costs depend on: both model files (path, size, time) and where each takes
    its greedy choices (the probe reads choices as a greedy run does, and only tokens come
    back from a device that takes them), threads, GPU layers and the kernels (exact or fast,
    and which build: library.kernel_signature)."""
    parts = []
    for backend in (pair.target, pair.drafter):
        if backend is None:
            parts.append("-")
        elif backend.path is None:
            return None  # not a model file: nothing to recognise it by next time
        else:
            stat = backend.path.stat()
            choices = "device" if backend.chooses_on_device else "host"
            parts.append(f"{backend.path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}:{choices}")
    if kernels is None:
        from ..llama import library

        kernels = library.kernel_signature(hardware.exact)
    parts.append(f"{hardware.placement()}:exact={hardware.exact}:{kernels}")
    return "|".join(parts)
