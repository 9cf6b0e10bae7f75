"""One exception class for everything a user can cause, carrying the CLI's kinds and exit codes."""
from __future__ import annotations

# The CLI's exit codes (README, "Exit codes"), by kind.
EXIT_CODES = {"bad_input": 1, "not_possible": 2, "run_failed": 3}


class ZeroplanError(Exception):
    """kind: "bad_input" | "not_possible" | "run_failed"; str(error) is the one line the CLI prints."""

    def __init__(self, kind: str, message: str):
        if kind not in EXIT_CODES:
            raise ValueError(f"ZeroplanError: unknown kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.exit_code = EXIT_CODES[kind]


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
