# pvestord: `make demo` shows a thin disk growing live; `make check` runs every test.
# Both install what they need first (scripts/install-deps: apt + .venv), and a
# second run installs nothing new.

PY        := .venv/bin/python
PY313     := .venv313/bin/python
PYTEST    := $(PY) -m pytest
OUT       := out
QUICK     ?=

.PHONY: all deps check lint unit host packaging node cluster faults demo bench bench-placement clean

all: check

deps:
	@./scripts/install-deps

# One tier after another. Lint, unit and host were tried beside the node tier
# (they need no guest): the node guest lost more time (+380 s) than they took
# on their own (~330 s). Under TCG the guest needs both cores.
check: deps lint unit host packaging node cluster
	@echo "make check: all tiers passed"

# mypy's packages (pyproject.toml) are the product, tests and bench.
lint: deps
	$(PY) -m ruff check pvestord qmeventd_py ha_placement tests bench
	$(PY) -m mypy --strict

# Both Pythons at once (one core each) where Debian's python3 is older than 3.13
# (Debian 12); the 3.13 run's output follows the 3.11 one's.
unit: deps
	@mkdir -p $(OUT); \
	if [ -x $(PY313) ]; then \
	    $(PY313) -m pytest tests/unit -q -p no:cacheprovider --durations=10 >$(OUT)/unit-py313.log 2>&1 & \
	    p313=$$!; \
	else echo "unit: no second venv (.venv is Python 3.13, or this machine has none)"; p313=; fi; \
	$(PYTEST) tests/unit -q -p no:cacheprovider --durations=10; rc=$$?; \
	if [ -n "$$p313" ]; then \
	    wait $$p313 || rc=1; echo "unit, Python 3.13:"; tail -n 30 $(OUT)/unit-py313.log; \
	fi; \
	exit $$rc

# Host tier: real QEMU processes and files, no device-mapper (needs root);
# and Proxmox's own storage code ($PVESTORD_UPSTREAM_DIR, else ../shared/upstream;
# README, "Tests", says how to fill it; skipped without) parsing and
# writing storage.cfg with our plugin registered.
host: deps
	$(PYTEST) tests/integration/host tests/proxmox -q --durations=10

packaging: deps
	$(PYTEST) tests/packaging -q --durations=10

# Node-guest tier: boots a Debian kernel under QEMU with dm-mod and runs
# tests/integration/node inside it against real LVM on loop devices.
# NODE=full adds the long tests the quick set covers otherwise (node_full).
# The bed is Debian 13's kernel and userland, Proxmox VE 9's (QEMU 10, lvm2
# 2.03.31, Python 3.13; tests/harness/noderoot.py makes the root the first
# time and caches it), for demo, bench and faults too; BED=host boots the
# host's own root instead (Debian 12 here: what older nodes run).
NODE      ?= quick
BED       ?= trixie
node: deps
	$(PY) -m tests.harness.nodeguest --bed $(BED) --out $(OUT)/node -- tests/integration/node \
		--node-set=$(NODE) --durations=20

# The fault suite with every kill moment (the node tier runs its quick set),
# and the other faults docs/reliability.md lists (test_faults_*.py, which the node
# tier runs whole), then docs/reliability.md rendered from what it measured.
faults: deps
	rm -f $(OUT)/faults/faults.jsonl
	$(PY) -m tests.harness.nodeguest --bed $(BED) --out $(OUT)/faults -- \
		tests/integration/node/test_faults.py \
		$(wildcard tests/integration/node/test_faults_*.py) --faults=full
	$(PY) -m tests.harness.reliability $(OUT)/faults/faults.jsonl

# Two-node tier: two node guests sharing one SAN image, driven from the host
# (tests/harness/twonode.py); the pair boots once for the whole session.
# `make check` runs one variant of each scenario (CI runs on 2 cores and is killed
# at 90 minutes, and the two guest tiers cannot share the cores: run together, each
# took 2.4 times as long); CLUSTER=full adds the rest (both hint variants of every migration
# test, 20 concurrent rounds, a clean stop seen by rank-nodes).
# CLUSTER_BED: what both nodes boot, Debian 13 (Proxmox VE 9's QEMU 10, lvm2
# and kernel) as the node tier; CLUSTER_BED=host boots the host's root.
CLUSTER   ?= quick
CLUSTER_BED ?= trixie
cluster: deps
	PVESTORD_NODE_BED=$(CLUSTER_BED) $(PYTEST) tests/integration/cluster -q -p no:cacheprovider --durations=0 \
		--cluster=$(CLUSTER)

demo: deps
	$(PY) -m tests.harness.nodeguest --bed $(BED) --out $(OUT)/demo --demo

bench: deps
	$(PY) -m tests.harness.nodeguest --bed $(BED) --out $(OUT)/bench --bench $(if $(QUICK),--quick) \
		$(foreach s,$(ONLY),--only $(s))

# pvestord placement's speed: pure Python, on the host (no guest).
bench-placement: deps
	$(PY) -m bench.placement --out $(OUT)/bench-placement

clean:
	rm -rf $(OUT) build *.egg-info
