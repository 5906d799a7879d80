"""``python -m otel_ttft.tools.dashboards [--check] [DIR]``: write (or check) the dashboard JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otel_ttft.tools.dashboards import activations, admission, ttft
from otel_ttft.tools.dashboards.common import to_json

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "grafana" / "dashboards"
BUILDERS = {"otel-ttft-ttft.json": ttft.build, "otel-ttft-activations.json": activations.build,
            "otel-ttft-admission.json": admission.build}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: to_json(build()) for name, build in BUILDERS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_ttft.tools.dashboards")
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a committed file differs from what the code generates")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.dir / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    verb = "differ" if args.check else "written"
    print(f"{len(stale)} dashboard(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
