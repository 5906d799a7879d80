"""``python -m otel_ttft.tools.dashboards [--check] [DIR]``: write (or check) the dashboard JSON
under DIR (default ``grafana/``): ``dashboards/`` for provisioning, ``import/`` for Grafana's
Import dashboard (with ``__inputs``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otel_ttft.tools.dashboards import activations, admission, ttft
from otel_ttft.tools.dashboards.common import dump, importable, to_model

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "grafana"
# Provisioned by grafana/provisioning/dashboards; imported by hand into any other Grafana.
PROVISIONED, IMPORT = "dashboards", "import"
BUILDERS = {"otel-ttft-ttft.json": ttft.build, "otel-ttft-activations.json": activations.build,
            "otel-ttft-admission.json": admission.build}


def render() -> dict[str, str]:
    """Path under DIR -> JSON text of every dashboard, in both forms."""
    out = {}
    for name, build in BUILDERS.items():
        model = to_model(build())
        out[f"{PROVISIONED}/{name}"] = dump(model)
        out[f"{IMPORT}/{name}"] = dump(importable(model))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_ttft.tools.dashboards")
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR,
                        help="the grafana/ directory (default: this checkout's)")
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
