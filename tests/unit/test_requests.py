"""Which node removes the queue entry of a VM that does not run on it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy.requests import drops_entry_of_absent_vm

nodes = st.sampled_from(["n1", "n2", "n3"])


@given(origin=nodes, node=nodes, config_node=st.none() | nodes)
def test_an_entry_with_an_origin_is_its_nodes_alone(origin: str, node: str,
                                                   config_node: str | None) -> None:
    assert drops_entry_of_absent_vm(origin, node, config_node) == (origin == node)


@given(node=nodes, config_node=st.none() | nodes)
def test_an_entry_without_origin_is_left_to_the_node_holding_the_vm(
        node: str, config_node: str | None) -> None:
    # Another node's VM may run there: its daemon takes the entry.
    assert drops_entry_of_absent_vm(None, node, config_node) == (config_node in (None, node))
