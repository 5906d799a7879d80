"""Where the verdict's history is kept and whether a container loses it: the mount
classification against crafted ``/proc/self/mountinfo`` text, and doctor's report of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_ttft.runtime import activation_history
from otel_ttft.runtime import history_storage as hs

# A Docker container: its writable layer at /, a named volume at /var/lib/otel-ttft (the host's
# ext4), a bind mount of the host's vLLM cache, a --tmpfs /tmp, and the usual /proc, /dev.
DOCKER = textwrap.dedent("""\
    1021 915 0:120 / / rw,relatime master:420 - overlay overlay rw,lowerdir=/l/A:/l/B,upperdir=/u
    1022 1021 0:123 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
    1023 1021 0:124 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
    1030 1021 259:2 /volumes/ttft-history/_data /var/lib/otel-ttft rw,relatime - ext4 /dev/sda2 rw
    1031 1021 259:2 /home/me/.cache/vllm /srv/vllm\\040cache rw,relatime - ext4 /dev/sda2 rw
    1032 1021 0:130 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
    1033 1021 259:2 /containers/c/hosts /etc/hosts rw,relatime - ext4 /dev/sda2 rw
""")
HOST = textwrap.dedent("""\
    27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
    40 27 0:40 / /tmp rw,nosuid,nodev shared:20 - tmpfs tmpfs rw
    41 27 254:1 / /home rw,relatime shared:21 - xfs /dev/vdb rw
""")
IN_DOCKER = ["/.dockerenv"]


def _assess(path, text=DOCKER, hints=IN_DOCKER):
    return hs.assess(path, hs.parse_mountinfo(text), hints)


def test_parse_reads_mount_point_type_and_source_with_escapes_and_optional_fields():
    mounts = hs.parse_mountinfo(DOCKER + "garbage line\n12 1 0:1 / /x rw\n")
    assert len(mounts) == 7  # the lines without a separator (or too short) are skipped
    assert mounts[0] == hs.Mount("/", "overlay", "overlay", "/")
    assert mounts[3].mount_point == "/var/lib/otel-ttft" and mounts[3].fs_type == "ext4"
    assert mounts[3].root == "/volumes/ttft-history/_data"
    assert mounts[4].mount_point == "/srv/vllm cache"  # \040 is a space


def test_the_container_root_loses_the_default_history():
    got = _assess("/root/.cache/vllm/otel-ttft/activations.json")
    assert got["kept"] is False and got["mount_point"] == "/" and got["fs_type"] == "overlay"
    assert "container's own file system" in got["why"] and "removed" in got["why"]


def test_a_volume_or_bind_mount_keeps_it():
    got = _assess("/var/lib/otel-ttft/activations.json")
    assert got["kept"] is True and got["mount_point"] == "/var/lib/otel-ttft"
    assert _assess("/srv/vllm cache/otel-ttft/activations.json")["kept"] is True
    assert _assess("/var/lib/otel-ttft")["kept"] is True  # the mount point itself


def test_a_mount_point_holds_only_paths_below_it_not_a_longer_name():
    got = _assess("/var/lib/otel-ttft-old/activations.json")
    assert got["mount_point"] == "/" and got["kept"] is False


def test_a_tmpfs_is_lost_in_a_container_and_at_reboot_on_a_host():
    assert "container stops" in _assess("/tmp/h.json")["why"]
    on_host = _assess("/tmp/h.json", HOST, [])
    assert on_host["kept"] is False and "reboot" in on_host["why"]
    assert _assess("/home/me/h.json", HOST, [])["kept"] is True
    assert _assess("/var/h.json", HOST, [])["fs_type"] == "ext4"


def test_overlay_outside_a_container_is_not_judged_lost():
    assert _assess("/root/h.json", DOCKER, [])["kept"] is True


def test_the_last_of_stacked_mounts_on_one_point_wins():
    stacked = DOCKER + "1040 1030 0:140 / /var/lib/otel-ttft rw - tmpfs tmpfs rw\n"
    assert _assess("/var/lib/otel-ttft/activations.json", stacked)["fs_type"] == "tmpfs"


def test_no_mountinfo_is_unknown_not_a_warning():
    got = hs.assess("/x/h.json", [], [])
    assert got["kept"] is None and got["mount_point"] is None


def test_container_hints():
    mounts = hs.parse_mountinfo(DOCKER)
    assert hs.container_hints(lambda p: False, {}, "0::/\n", hs.parse_mountinfo(HOST)) == []
    hints = hs.container_hints(lambda p: p == "/run/.containerenv", {"container": "podman"},
                               "0::/system.slice/libpod-abc.scope\n", mounts)
    assert hints == ["/run/.containerenv", "container=podman", "cgroup (libpod)",
                     "root file system is overlay"]
    k8s = hs.container_hints(lambda p: False, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"},
                             "12:pids:/kubepods/burstable/pod1/c\n", [])
    assert k8s == ["KUBERNETES_SERVICE_HOST", "cgroup (kubepods)"]


def test_resolved_follows_a_symlinked_parent_of_a_missing_file(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    got = hs.resolved(tmp_path / "link" / "otel-ttft" / "activations.json")
    assert got == str((tmp_path / "real").resolve() / "otel-ttft" / "activations.json")


def test_where_takes_the_setting_as_the_runtime_does(monkeypatch, tmp_path):
    path = tmp_path / "h" / "activations.json"
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(path))
    got = hs.where()
    assert got["source"] == "OTEL_TTFT_VERDICT_HISTORY"
    assert got["path"] == str(activation_history.default_path("/unused")) == str(path)


def test_where_defaults_under_the_cache_root_as_the_runtime_does(monkeypatch):
    monkeypatch.delenv("OTEL_TTFT_VERDICT_HISTORY", raising=False)
    env = {"VLLM_CACHE_ROOT": "/srv/cache"}
    root, _ = hs.vllm_cache_root(env)
    got = hs.where(env)
    assert got["path"] == str(activation_history.default_path(root))
    assert got["source"].startswith("default, under ")


def test_vllm_cache_root_rule_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails: vLLM's rule by hand
    assert hs.vllm_cache_root({"VLLM_CACHE_ROOT": "~/c"})[0] == os.path.expanduser("~/c")
    assert hs.vllm_cache_root({"XDG_CACHE_HOME": "/x"}) == ("/x/vllm",
                                                            "vLLM's default cache root")


def _report(path, **assessed):
    return {"path": path, "resolved": path, "source": "OTEL_TTFT_VERDICT_HISTORY", **assessed}


def test_doctor_warns_with_the_setting_and_the_fix():
    from otel_ttft.tools import doctor

    lost = _report("/root/.cache/vllm/otel-ttft/activations.json",
                   **_assess("/root/.cache/vllm/otel-ttft/activations.json"))
    lines = doctor._render_verdict_history(lost)
    assert lines[0].startswith("verdict history: /root/.cache/vllm/otel-ttft/activations.json")
    warning = lines[1]
    assert warning.strip().startswith("WARNING") and "no baseline" in warning
    assert ("-v ttft-history:/var/lib/otel-ttft "
            "-e OTEL_TTFT_VERDICT_HISTORY=/var/lib/otel-ttft/activations.json") in warning
    assert "VLLM_CACHE_ROOT" in warning and "In a container" in warning

    kept = doctor._render_verdict_history(
        _report("/var/lib/otel-ttft/activations.json",
                **_assess("/var/lib/otel-ttft/activations.json")))
    assert kept[1].strip().startswith("ok") and "ext4 mounted at /var/lib/otel-ttft" in kept[1]
    assert "in a container: /.dockerenv" in kept[1]
    assert doctor._render_verdict_history({"error": "OSError: x"}) == [
        "verdict history: not checked (OSError: x)"]


@pytest.fixture
def fake_vllm(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "v1" / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.99.0"\n')
    (pkg / "v1" / "__init__.py").write_text("")
    (pkg / "v1" / "engine" / "__init__.py").write_text("")
    (pkg / "v1" / "engine" / "core.py").write_text("X = 1\n")
    return tmp_path


def test_doctor_reports_the_history_path_text_and_json(fake_vllm, tmp_path):
    path = tmp_path / "kept" / "activations.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_vllm), os.getcwd()])}
    args = [sys.executable, "-m", "otel_ttft.tools.doctor",
            "--env", f"OTEL_TTFT_VERDICT_HISTORY={path}"]
    text = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    line = next(x for x in text.stdout.splitlines() if x.startswith("verdict history:"))
    assert str(path) in line and "(OTEL_TTFT_VERDICT_HISTORY)" in line, text.stdout
    report = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True,
                                       env=env, timeout=300).stdout)
    history = report["verdict_history"]
    assert history["path"] == str(path) and history["source"] == "OTEL_TTFT_VERDICT_HISTORY"
    assert history["kept"] in (True, False, None) and "why" in history


def test_lost_note_for_the_verdicts_log_line():
    mounts = hs.parse_mountinfo(DOCKER)
    path = "/root/.cache/vllm/otel-ttft/activations.json"
    assert hs.lost_note(path, mounts, IN_DOCKER) == (
        f"none at {path}, on the container's own file system (overlay): lost when the container "
        "is removed; keep it on a volume with OTEL_TTFT_VERDICT_HISTORY (otel-ttft doctor)")
    assert hs.lost_note("/var/lib/otel-ttft/activations.json", mounts, IN_DOCKER) is None
    assert hs.lost_note(path, [], []) is None  # no mount known: nothing said
    assert isinstance(hs.lost_note(path), (str, type(None)))  # this host's mounts: never raises
