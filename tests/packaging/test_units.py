"""The systemd units: `systemd-analyze verify` passes, and they say what we decided.

verify checks that every ExecStart= binary exists, and the units name
/usr/bin paths that only the installed package provides. Here each unit is
verified as a copy whose /usr/bin/ points at this checkout's own console
scripts (real programs, the same code); test_install verifies the units as
installed, against the package's /usr/bin, inside the Debian root. verify
exits 0 even for unknown keys or bad values ("ignoring"): passing means
exit 0 *and* nothing printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pvestord.adapters.command import Completed, run
from tests.packaging.conftest import SRC

UNITS = ("pvestord.service", "qmeventd-py.service")
VERIFY_TIMEOUT = 60.0
#: The console scripts of the environment running the tests (the venv).
SCRIPTS = Path(sys.executable).parent


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value given (repeated keys accumulate)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    return parse_unit((SRC / "systemd" / name).read_text())


def words(values: list[str]) -> set[str]:
    return {w for v in values for w in v.split()}


def verify(path: Path) -> Completed:
    return run(["systemd-analyze", "verify", "--man=no", str(path)],
               timeout=VERIFY_TIMEOUT, check=False)


def host_copy(name: str, dest: Path, *, edit: tuple[str, str] | None = None) -> Path:
    text = (SRC / "systemd" / name).read_text().replace("=/usr/bin/", f"={SCRIPTS}/")
    if edit:
        assert edit[0] in text
        text = text.replace(*edit)
    path = dest / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", UNITS)
def test_verify_passes(name: str, tmp_path: Path) -> None:
    copy = host_copy(name, tmp_path)
    binary = Path(parse_unit(copy.read_text())["Service"]["ExecStart"][0].split()[0])
    assert binary.is_file(), f"{binary} missing: is the package installed in the venv?"
    result = verify(copy)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        f"systemd-analyze verify {name}: exit {result.returncode}\n{result.stdout}{result.stderr}")


@pytest.mark.parametrize("broken", [("Type=notify", "Type=notifyy"),
                                    ("Restart=on-failure", "Restrat=on-failure"),
                                    ("ExecStart=", "ExecStart=/nonexistent/")])
def test_verify_catches_mistakes(broken: tuple[str, str], tmp_path: Path) -> None:
    """The check above can fail: a typo or a missing binary is reported."""
    result = verify(host_copy("pvestord.service", tmp_path, edit=broken))
    assert result.returncode != 0 or (result.stdout + result.stderr).strip()


@pytest.mark.parametrize("name", UNITS)
def test_notify_watchdog_restart(name: str) -> None:
    service = unit(name)["Service"]
    assert service["Type"] == ["notify"]
    assert service["WatchdogSec"] == ["30s"]
    assert service["Restart"] == ["on-failure"]
    assert unit(name)["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.parametrize("name", UNITS)
def test_started_before_guests_like_qmeventd(name: str) -> None:
    before = words(unit(name)["Unit"]["Before"])
    assert {"pve-ha-lrm.service", "pve-guests.service"} <= before
    assert "pve-cluster.service" in words(unit(name)["Unit"]["After"])


def test_command_lines() -> None:
    assert unit("pvestord.service")["Service"]["ExecStart"] == ["/usr/bin/pvestord run"]
    assert unit("qmeventd-py.service")["Service"]["ExecStart"] == ["/usr/bin/qmeventd-py -f"]


def test_qmeventd_py_replaces_qmeventd() -> None:
    section = unit("qmeventd-py.service")["Unit"]
    assert words(section["Conflicts"]) == {"qmeventd.service"}
    # Ordered after it, so qmeventd has released the socket before we bind it.
    assert "qmeventd.service" in words(section["After"])


def test_pvestord_after_lvm() -> None:
    after = words(unit("pvestord.service")["Unit"]["After"])
    assert {"lvm2-monitor.service", "blk-availability.service"} <= after


def test_pvestord_hardening_leaves_lvm_working() -> None:
    """The sandbox options that would break LVM or pmxcfs stay out."""
    service = unit("pvestord.service")["Service"]
    assert service["ProtectSystem"] == ["yes"]  # not full/strict: /etc/lvm, /etc/pve
    for forbidden in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock",
                      "PrivateIPC", "PrivateNetwork", "ProtectKernelTunables", "DynamicUser",
                      "User"):
        assert forbidden not in service, forbidden
    assert words(service["RestrictAddressFamilies"]) == {"AF_UNIX", "AF_NETLINK"}
