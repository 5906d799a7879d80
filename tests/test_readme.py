"""The README is one screen, and everything it names exists: files and folders (backticked paths
and links), ``otel-ttft`` subcommands (against the CLI's parser), ``make`` targets (against the
Makefile), ``python -m`` modules, and every setting in ``environment_variables.py``. Its demo
section is one fenced block of real output, not a placeholder."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from otel_ttft.runtime import environment_variables
from otel_ttft.tools import reference

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# What the README names but a clone does not hold: what `make demo` and `make docs` write
# (`/out/` and `/site/` are ignored), the per-user model cache, a running server's state files.
GENERATED = ("out/", "site", "~/", "/dev/shm/")
_FILE_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".json", ".txt", ".cfg", ".html")


def _code_spans() -> list[str]:
    text = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)  # fenced blocks are output
    return re.findall(r"`([^`\n]+)`", text)


def _looks_like_path(span: str) -> bool:
    if " " in span or "=" in span or span.startswith(("http", "-", "$")):
        return False
    return "/" in span or span.endswith(_FILE_SUFFIXES) or span in ("Makefile", "LICENSE")


def test_readme_fits_one_screen():
    assert len(README.splitlines()) <= 250


def test_every_file_the_readme_names_exists():
    named = {s.rstrip("/") for s in _code_spans() if _looks_like_path(s)}
    named |= {link.split("#")[0] for link in re.findall(r"\]\(([^)#][^)]*)\)", README)
              if not link.startswith(("http://", "https://"))}
    assert len(named) >= 10  # the parse finds what the README names
    missing = [p for p in sorted(named) if not p.startswith(GENERATED)
               and not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert missing == []


def test_every_command_the_readme_names_exists():
    commands = set(re.findall(r"\botel-ttft ([a-z][a-z-]*)", README))
    assert {"demo", "doctor"} <= commands
    assert sorted(commands - set(reference.commands())) == []
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert sorted(set(re.findall(r"\bmake ([a-z][a-z-]*)", README)) - targets) == []
    modules = set(re.findall(r"python -m ([\w.]+)", README))
    assert modules, "the README shows how to start vLLM and how to build the tiny models"
    assert [m for m in sorted(modules) if not _module_exists(m)] == []


def _module_exists(name: str) -> bool:
    """Found on disk without importing it (or its packages: importing vLLM takes seconds)."""
    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    base = Path(next(iter(spec.submodule_search_locations or []), ""), *rest.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def test_readme_tables_every_setting():
    listed = [v for k, v in vars(environment_variables).items() if k.startswith("OTEL_")]
    assert [v for v in listed if f"| `{v}` |" not in README] == []


def test_demo_section_is_one_block_of_real_output():
    section = README.split("## What `make demo` prints", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.S | re.M)
    assert len(blocks) == 1
    assert "DEMO_OUTPUT" not in README
    for scenario in ("cold-switch", "switch-back", "short-prompt", "long-prompt"):
        assert scenario in blocks[0]
    assert "client TTFT" in blocks[0]


def test_compatibility_table_says_what_the_code_declares():
    try:
        import tomllib
    except ImportError:  # Python 3.10: the backport pyproject declares
        import tomli as tomllib

    from otel_ttft.runtime.vllm_version import SUPPORTED

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [d for d in project["dependencies"]
                if d.startswith(("opentelemetry-sdk", "opentelemetry-instrumentation"))]
    section = README.split("## Compatibility", 1)[1].split("\n## ", 1)[0]
    for text in (f"`{SUPPORTED}`", f"`{project['requires-python']}`",
                 *(f"`{d}`" for d in declared)):
        assert text in section, text
