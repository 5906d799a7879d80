"""The stuck-activation alert rule, checked and unit-tested by the real promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.prom_helpers import RULES_DIR as RULES
from tests.prom_helpers import STUCK_RULE_FILE as RULE_FILE

TEST_FILE = RULES / "tests" / "otel-ttft-stuck.test.yml"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (scripts/setup installs it)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


@needs_promtool
def test_stuck_rules_load():
    proc = promtool("check", "rules", str(RULE_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_stuck_rule_unit_tests_pass():
    proc = promtool("test", "rules", str(TEST_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_stuck_rule_unit_test_fails_when_the_rule_never_fires(tmp_path):
    """The unit test is not vacuous: with a factor no stage can reach, it fails."""
    rules = RULE_FILE.read_text().replace("expr: vector(3)", "expr: vector(1000000)")
    assert rules != RULE_FILE.read_text()
    (tmp_path / "otel-ttft-stuck.yml").write_text(rules)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / TEST_FILE.name).write_text(TEST_FILE.read_text())
    proc = promtool("test", "rules", str(tmp_path / "tests" / TEST_FILE.name))
    assert proc.returncode != 0
