"""docs/reliability.md is what the fault suite measured, and every fault has a test.

The page is rendered from docs/reliability-results.jsonl (written by
``make faults``); these checks fail when someone edits one without the other,
adds a fault test without a row, or lists a fault whose test does not exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.harness import reliability

ROOT = Path(__file__).resolve().parents[2]


def test_page_is_the_rendering_of_the_recorded_results() -> None:
    results = reliability.load(reliability.RESULTS)
    assert reliability.DOC.read_text() == reliability.render(results), (
        "docs/reliability.md is stale: run `make faults` (or `python -m "
        "tests.harness.reliability docs/reliability-results.jsonl` after editing FAULTS)")


def test_every_suite_fault_was_tried_in_the_recorded_run() -> None:
    tried = {r.fault for r in reliability.load(reliability.RESULTS)}
    missing = [f.name for f in reliability.FAULTS if not f.elsewhere and f.name not in tried]
    assert not missing


#: The kill moments of the fault suite's full set (test_faults.py), by name.
KILL_MOMENTS = {
    "inside lvextend, before LVM ran, with its LVM command",
    "inside lvextend, before LVM ran, alone",
    "after lvextend, before the re-arm, with its LVM command",
    "after lvextend, before the re-arm, alone",
    "waiting for the storage lock, which another process holds",
    "the entry just queued",
    "re-armed, before the entry leaves the queue",
}


def test_every_kill_moment_is_recorded() -> None:
    kills = [r for r in reliability.load(reliability.RESULTS)
             if r.fault == "kill -9 pvestord during an extension"]
    assert {r.injection.partition(": ")[0] for r in kills} == KILL_MOMENTS


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_listed_test_exists() -> None:
    for fault in reliability.FAULTS:
        for ref in fault.test.split(", "):
            path, _, function = ref.partition("::")
            file = ROOT / path if "/" in path else ROOT / "tests" / "unit" / path
            assert file.exists(), f"{fault.name}: no {file}"
            if function:
                assert function in _functions(file), f"{fault.name}: no {function} in {path}"


def test_every_fault_the_suite_records_is_listed() -> None:
    source = (ROOT / reliability.SUITE).read_text()
    recorded = set(re.findall(r'FaultRecord\(\s*"([^"]+)"', source))
    assert recorded, "the suite records no fault?"
    assert recorded <= {f.name for f in reliability.FAULTS}
