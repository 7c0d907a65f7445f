"""The qemu-server calls the storage plugin recognises are still there, as read.

Two plugin decisions rest on how qemu-server calls the storage, not on what
Proxmox hands the plugin:

- a new volume is a copy target when a sub of ``COPY_FLOWS`` is on the Perl
  call stack of its ``vdisk_alloc`` (``pvestord/features/plugin.py``);
- a running VM's snapshot delete is prepared (its job's target grown) when
  ``PVE::Storage::volume_snapshot_info`` is called by
  ``PVE::QemuServer::qemu_volume_snapshot_delete($vmid, $storecfg, $drive,
  $snap)`` before its ``blockdev_commit`` or ``blockdev_stream``
  (``snapshot_deleted_online`` in the Perl plugin).

Both were read in the qemu-server versions of :data:`CHECKED`; the package
``Breaks:`` older ones. A newer qemu-server in ``$PVESTORD_UPSTREAM_DIR``
(``qemu-server-*.tar.gz``, a ``git archive`` of proxmox/qemu-server) makes
these tests say what moved, so that the plugin and its node tests are looked
at again before :data:`CHECKED` grows. Where the shapes still match but the
flow moved anyway, the daemon warns at run time of a snapshot delete's job
the plugin did not prepare (``pvestord/engine/jobroom.py``).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from pvestord.features.plugin import COPY_FLOWS
from tests.proxmox import upstream

REPO = Path(__file__).resolve().parents[2]
#: The qemu-server versions whose calls the plugin was checked against.
CHECKED = frozenset({"9.2.6"})


@pytest.fixture(scope="module")
def qemu_server() -> dict[str, str]:
    """qemu-server's ``src/`` and ``debian/changelog`` texts, by path in the archive."""
    found = sorted(upstream.sources_dir().glob("qemu-server-*.tar.gz"))
    if not found:
        pytest.skip(f"no qemu-server-*.tar.gz in {upstream.sources_dir()} (a git archive of "
                    "proxmox/qemu-server; set PVESTORD_UPSTREAM_DIR)")
    texts = {}
    with tarfile.open(found[-1]) as tar:
        for member in tar.getmembers():
            path = member.name.partition("/")[2]
            if member.isfile() and (path.endswith(".pm") or path == "debian/changelog"):
                extracted = tar.extractfile(member)
                assert extracted is not None
                texts[path] = extracted.read().decode("utf-8", errors="replace")
    return texts


def sub_body(texts: dict[str, str], qualified: str) -> str:
    """The text of ``sub <name> {`` up to its closing brace at the line start."""
    package, _, name = qualified.rpartition("::")
    path = "src/" + package.replace("::", "/") + ".pm"
    assert path in texts, f"{qualified}: no {path} in qemu-server"
    found = re.search(rf"^sub {re.escape(name)} \{{\n(.*?)^\}}\n", texts[path], re.S | re.M)
    assert found, f"{qualified}: no 'sub {name}' in {path}"
    return found.group(1)


def test_the_archive_is_a_checked_qemu_server_version(qemu_server: dict[str, str]) -> None:
    first = qemu_server["debian/changelog"].splitlines()[0]
    version = re.match(r"qemu-server \(([^)]+)\)", first)
    assert version, first
    assert version.group(1) in CHECKED, (
        f"qemu-server {version.group(1)}: not among the versions the plugin was checked "
        f"against ({', '.join(sorted(CHECKED))}); run the node tests that need Proxmox's "
        "sources, then add it")


def test_the_package_breaks_what_is_older_than_the_checked_versions() -> None:
    control = (REPO / "packaging" / "debian" / "control").read_text()
    breaks = re.search(r"qemu-server \(<< ([^)]+)\)", control)
    assert breaks and breaks.group(1) == min(CHECKED)


@pytest.mark.parametrize("flow", sorted(COPY_FLOWS))
def test_each_copy_flow_allocates_its_target(qemu_server: dict[str, str], flow: str) -> None:
    body = sub_body(qemu_server, flow)
    # The restores allocate through a closure the sub calls, under its own
    # frame; restore_file_archive hands a vma archive to restore_vma_archive.
    others = [f.rpartition("::")[2] + "(" for f in COPY_FLOWS if f != flow]
    allocates = ("vdisk_alloc(" in body or "$restore_allocate_devices->(" in body
                 or any(other in body for other in others))
    assert allocates, f"{flow} no longer allocates its target, itself or through another flow"


def test_restores_allocate_in_their_closure(qemu_server: dict[str, str]) -> None:
    text = qemu_server["src/PVE/QemuServer.pm"]
    closure = re.search(r"^my \$restore_allocate_devices = sub \{\n(.*?)^\};\n", text,
                        re.S | re.M)
    assert closure and "PVE::Storage::vdisk_alloc(" in closure.group(1)


def test_an_online_snapshot_delete_reads_the_chain_right_before_its_job(
        qemu_server: dict[str, str]) -> None:
    body = sub_body(qemu_server, "PVE::QemuServer::qemu_volume_snapshot_delete")
    # The plugin reads the drive and the snapshot from these two arguments.
    assert body.startswith("    my ($vmid, $storecfg, $drive, $snap) = @_;\n")
    assert "my $volid = $drive->{file};" in body
    read = body.find("PVE::Storage::volume_snapshot_info($storecfg, $volid)")
    commit = body.find("blockdev_commit(")
    stream = body.find("blockdev_stream(")
    assert 0 <= read < commit and read < stream, (
        "qemu_volume_snapshot_delete no longer reads the chain before its jobs")
