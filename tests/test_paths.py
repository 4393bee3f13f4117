"""Where specdec keeps its files."""

from __future__ import annotations

from pathlib import Path

from specdec_cli.paths import cache_dir, config_dir


def test_specdec_home_holds_everything(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    assert cache_dir() == config_dir() == tmp_path / "home"


def test_without_it_the_xdg_folders_and_their_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert cache_dir() == tmp_path / "cache" / "specdec"
    assert config_dir() == tmp_path / "config" / "specdec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert cache_dir() == Path.home() / ".cache" / "specdec"
    assert config_dir() == Path.home() / ".config" / "specdec"
