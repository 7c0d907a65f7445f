"""Which devices pause on ENOSPC, as thin provisioning needs (pvestord.policy.devices)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import BlockDevice, hands_enospc_to_guest, qom_path


def test_werror_values() -> None:
    # QEMU's BlockdevOnError: auto is a device's default, enospc for writes.
    assert not any(hands_enospc_to_guest(v) for v in ("auto", "enospc", "stop", None))
    assert hands_enospc_to_guest("report") and hands_enospc_to_guest("ignore")


@given(st.text())
def test_only_known_pausing_values_are_safe(value: str) -> None:
    assert hands_enospc_to_guest(value) is (value not in ("auto", "enospc", "stop"))


def test_qom_path_of_query_block_devices() -> None:
    # virtio-blk's qdev is its backend's path; scsi-hd's is its id.
    backend = BlockDevice("/machine/peripheral/virtio0/virtio-backend", "fmt0", frozenset())
    assert qom_path(backend) == "/machine/peripheral/virtio0/virtio-backend"
    assert qom_path(BlockDevice("scsi0", "drive-scsi0", frozenset())) == \
        "/machine/peripheral/scsi0"
