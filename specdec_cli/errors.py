"""Errors a user can cause. Each message says what is wrong and what to do next."""

from __future__ import annotations

# 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C (run, bench).
EXIT_INTERRUPTED = 130


class SpecdecError(Exception):
    """A problem with the user's input or environment, shown as one line."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}" if self.fix else self.message


class BadUsageError(SpecdecError):
    """Options that contradict each other or cannot be parsed."""

    exit_code = 2


class ModelFileError(SpecdecError):
    """A model file is missing, unreadable, or of a kind we cannot use."""


class IncompatibleModelsError(SpecdecError):
    """The drafter's vocabulary does not match the target's."""


class ContextOverflowError(SpecdecError):
    """The prompt does not fit in the context window."""


class ChatTemplateError(SpecdecError):
    """The model's own chat template refused the messages (roles that do not alternate...)."""


class DecodeError(SpecdecError):
    """llama.cpp could not evaluate a batch, for a reason other than a full context."""


class RegistryError(SpecdecError):
    """models.yaml is malformed or names something that does not exist."""


class FetchError(SpecdecError):
    """A model could not be downloaded or verified."""


class ChecksumError(FetchError):
    """A downloaded file's SHA-256 is not the expected one."""
