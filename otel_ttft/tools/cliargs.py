"""One set of argument types for every command (``cli`` and ``replay``), and a parser whose
errors are one line.

A type function turns the text into the value or raises ``ArgumentTypeError`` with the reason;
argparse names the option (``otel-ttft replay: --repeat: must be >= 1, not 0``) and exits 2
before the command touches anything.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn
from urllib.parse import SplitResult, urlsplit

MAX_SECONDS = 1e6  # eleven days: anything longer is a typo, and float('inf') a hang


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ").replace("\n", " ")
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _fail(message: str) -> NoReturn:
    raise argparse.ArgumentTypeError(message)


def port(low: int = 0) -> Callable[[str], int]:
    """A TCP port, ``low``-65535 (0: pick a free one; -1: the protocol is off)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _fail(f"{text!r} is not a port number")
        if not low <= value <= 65535:
            _fail(f"{value} is not in {low}-65535")
        return value
    parse.__name__ = "port"
    return parse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        _fail(f"{text!r} is not a number")
    if value < 0:
        _fail(f"{value} is negative")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            _fail(f"must be an integer, not {text!r}")
        if value < low:
            _fail(f"must be >= {low}, not {value}")
        return value
    parse.__name__ = "integer"
    return parse


def positive(kind: type) -> Callable[[str], int | float]:
    """A finite number above zero, of ``kind`` (int or float)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            _fail(f"not a number: {text!r}")
        if not value > 0 or not math.isfinite(value):
            _fail(f"must be a positive number: {text!r}")
        return value
    parse.__name__ = "number"
    return parse


def seconds(text: str) -> float:
    """A duration in seconds: above zero, finite, below eleven days."""
    try:
        value = float(text)
    except ValueError:
        _fail(f"must be a number of seconds, not {text!r}")
    if not 0 < value < MAX_SECONDS:
        _fail(f"must be > 0 s and below {MAX_SECONDS:g} s, not {text!r}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        _fail(f"not a number: {text!r}")
    if not math.isfinite(value):
        _fail(f"must be a finite number: {text!r}")
    return value


def choice(options: Iterable[str], what: str) -> Callable[[str], str]:
    """One of ``options`` (``unknown driver 'x'; choose from ...``)."""
    options = tuple(options)

    def parse(text: str) -> str:
        if text not in options:
            _fail(f"unknown {what} {text!r}; choose from {', '.join(options)}")
        return text
    parse.__name__ = what
    return parse


def choices_csv(options: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A comma-separated list of ``options``, in the order given, at least one."""
    options = tuple(options)

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [s for s in names if s not in options]
        if unknown or not names:
            _fail(f"unknown {what} {unknown[0] if unknown else text!r}; choose from "
                  f"{', '.join(options)}")
        return names
    parse.__name__ = what
    return parse


def split_url(text: str) -> SplitResult:
    """An http(s) URL with a host and a valid port, split; ArgumentTypeError otherwise."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        _fail(f"not a valid URL: {text!r} ({exc})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"not an http(s) URL: {text!r}")
    return parts


def http_url(text: str) -> str:
    """An http(s) base URL (trailing slash dropped)."""
    split_url(text)
    return text.rstrip("/")


def existing_dir(text: str) -> str:
    path = Path(text)
    if not text.strip():
        _fail("is empty")
    if not path.exists():
        _fail(f"{text}: no such directory")
    if not path.is_dir():
        _fail(f"{text}: not a directory")
    return text


def work_dir(text: str) -> str:
    """A directory the command writes into: it may be created, but not where a file is."""
    if not text.strip():
        _fail("is empty")
    for parent in (Path(text), *Path(text).parents):
        if parent.exists():
            if not parent.is_dir():
                _fail(f"{text}: {parent} is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                _fail(f"{text}: cannot write in {parent}: permission denied")
            break
    return text


# Weight files vLLM's default loaders read (safetensors, PyTorch): a checkpoint has one.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def checkpoint(text: str) -> str:
    """A local model checkpoint: a directory with ``config.json`` and weight files."""
    path = Path(existing_dir(text))
    if not (path / "config.json").is_file():
        _fail(f"{text}: not a checkpoint (no config.json)")
    if not any(next(path.glob(p), None) for p in WEIGHT_PATTERNS):
        _fail(f"{text}: not a checkpoint (no weights: {', '.join(WEIGHT_PATTERNS)})")
    return text


def fail_usage(prog: str, message: str) -> int:
    """A usage error found after parsing, in the same one-line form; returns exit code 2."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2
