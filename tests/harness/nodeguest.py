"""Boot a "node guest" and run a command inside it: the node-guest test tier.

This machine's kernel has no device-mapper, so LVM cannot activate an LV on
the host. The node guest is Debian's ``linux-image-amd64`` kernel booted by
virtme-ng with the host's root filesystem shared read-only (9p) and tmpfs
overlays: the host's LVM, QEMU and Python run inside unchanged, next to a real
dm-mod. One folder (``--out``) is shared writable; results (JUnit XML, logs,
reports) come back through it.

Facts this module relies on are in ``docs/testing.md`` ("The node guest"): TCG unless the
machine has real hardware KVM (this one has ``kvm_pvm``, which cannot boot a
stock kernel); vng's output piped (never a regular file: QEMU's file chardevs
garble it); ``--force-9p``; the guest's exit status is the command's.

Every guest run has a timeout. A guest that does not boot or hangs is killed
and reported with the last lines of its console, never waited on forever.

Two beds (``--bed``, or ``PVESTORD_NODE_BED``):

- ``host``: the host's kernel, root and ``.venv``, as above;
- ``trixie``: Debian 13's kernel and userland, Proxmox VE 9's (QEMU 10,
  lvm2 2.03.31, Python 3.13), from a root made and cached by
  :mod:`tests.harness.noderoot`, with the repository shared at its host path.

Usage (the Makefile's ``node``, ``demo`` and ``bench`` targets)::

    python -m tests.harness.nodeguest --out out/node -- tests/integration/node [pytest args]
    python -m tests.harness.nodeguest --bed trixie --out out/node -- tests/integration/node
    python -m tests.harness.nodeguest --out out/demo --demo
    python -m tests.harness.nodeguest --out out/bench --bench [--quick] [--only SCENARIO]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tests.harness import noderoot
from tests.harness.inguest import (
    CACHED_ROOT_TAG,
    GUEST_OUT_ENV,
    GUEST_OUT_MOUNT,
    GUEST_ROOT_ENV,
    STARTED_MARKER,
)

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
#: The host's Python 3.13 venv (scripts/install-deps), which compiles the
#: repository's bytecode for the trixie bed's Python 3.13.
VENV313_PYTHON = REPO / ".venv313" / "bin" / "python"

#: Modules the guest never needs; skipping them cut boot by a fifth (docs/testing.md).
BLACKLIST = (
    "kvm,kvm_intel,kvm_amd,ahci,libahci,libata,sr_mod,cdrom,"
    "aesni_intel,crc32_pclmul,ghash_clmulni_intel,sha256_ssse3,sha512_ssse3,"
    "input_leds,psmouse,serio_raw,evdev,i2c_piix4,floppy,pcspkr"
)

#: Whole-run budget for a node-guest pytest session (boot alone is ~15-30 s):
#: the quick set took 37 minutes on this project's slowest CI machine, and a
#: budget at its edge killed a run that was only slow; CI's whole `make
#: check` must stay under an hour.
DEFAULT_TIMEOUT = 48 * 60
CONSOLE_TAIL_LINES = 40
#: How often a guest that ends before it runs our command is booted. Such a
#: guest ran nothing, so a second boot repeats no test. CI once saw vng exit
#: 255 after 5.4 s with an empty console (QEMU gone without an error: the
#: kernel or vng's init died early, with its messages hidden); the same boot
#: from the same clone passed at once, so it was not the checkout.
BOOT_ATTEMPTS = 2


class GuestError(Exception):
    """The guest did not boot, or did not finish in time."""


@dataclass(frozen=True)
class GuestResult:
    returncode: int
    duration: float
    console_log: Path


def find_kernel() -> Path:
    """The newest Debian ``vmlinuz`` with matching modules (dm-mod, loop)."""
    candidates = sorted(Path("/boot").glob("vmlinuz-*-amd64"), key=lambda p: p.stat().st_mtime)
    for kernel in reversed(candidates):
        release = kernel.name.removeprefix("vmlinuz-")
        if (Path("/lib/modules") / release / "kernel/drivers/md/dm-mod.ko").exists():
            return kernel
    raise GuestError(
        "no Debian kernel with dm-mod under /boot: install linux-image-amd64 "
        "(scripts/install-deps does)")


def hardware_kvm_usable() -> bool:
    """True for a real KVM; False for none and for kvm_pvm, which cannot boot Debian's kernel."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK) or Path("/sys/module/kvm_pvm").exists():
        return False
    return Path("/sys/module/kvm_intel").exists() or Path("/sys/module/kvm_amd").exists()


#: The repository's Python, compiled on the host before a guest boots.
COMPILED_PACKAGES = ("pvestord", "qmeventd_py", "tests", "bench")


@dataclass(frozen=True)
class Bed:
    """What the node guest boots: a kernel, a root (None: the host's own) and
    the Python that runs the tests in it."""

    name: str
    kernel: Path
    root: Path | None
    python: Path


def host_bed() -> Bed:
    return Bed("host", find_kernel(), None, VENV_BIN / "python")


def trixie_bed() -> Bed:
    """Debian 13's root, made the first time (minutes) and cached."""
    root, took = noderoot.node_root()
    if took is not None:
        print(f"nodeguest: made the Debian 13 node root {root} in {took:.0f} s", flush=True)
    noderoot.point_at(root, REPO)
    return Bed("trixie", noderoot.kernel(root), root, noderoot.VENV / "bin" / "python")


BEDS = {"host": host_bed, "trixie": trixie_bed}
DEFAULT_BED = os.environ.get("PVESTORD_NODE_BED", "host")


def compile_repository(bed: Bed | None = None) -> None:
    """Write the repository's bytecode caches before a guest boots.

    The guest sees the repository read-only, so without them every Python
    process in it (each daemon start, each CLI call) compiles the whole
    package from source again: about 8 s under nested TCG, most of a short
    test's time. The host does it in a second, and only for changed files;
    for the trixie bed with the host's Python 3.13, whose caches its 3.13 reads.
    """
    if bed is not None and bed.root is not None:
        if not VENV313_PYTHON.exists():
            print("nodeguest: no .venv313 on this host: the trixie guest compiles the "
                  "repository in each process", flush=True)
            return
        subprocess.run([str(VENV313_PYTHON), "-m", "compileall", "-q",  # noqa: S603
                        *(str(REPO / p) for p in COMPILED_PACKAGES)],
                       check=True, timeout=300, stdin=subprocess.DEVNULL)
        return
    for package in COMPILED_PACKAGES:
        if not compileall.compile_dir(REPO / package, quiet=1):
            raise GuestError(f"{package} does not compile; see the errors above")


def _vng_path() -> str:
    """PATH with the venv's tools first: where scripts/install-deps puts vng."""
    return f"{VENV_BIN}:{os.environ.get('PATH', '')}"


def vng_env() -> dict[str, str]:
    """vng's environment: ours, with :func:`_vng_path` (vng starts its own
    tools by name)."""
    return dict(os.environ, PATH=_vng_path())


def vng_argv(command: str, out: Path, *, memory: str, cpus: int, name: str = "node",
             bed: Bed | None = None, kernel_messages: bool = False) -> list[str]:
    """vng's argument list to boot ``bed`` and run the shell ``command``.

    ``kernel_messages``: show the kernel's boot messages on the console too
    (vng hides them), to see why a guest died before it ran ``command``."""
    vng = shutil.which("vng", path=_vng_path())
    if vng is None:
        raise GuestError("vng (virtme-ng) not found: run scripts/install-deps")
    bed = bed or host_bed()
    root_args: list[str] = []
    writable = str(out)
    if bed.root is not None:
        # Its own root: the repository (and ../shared beside it) is shared in
        # at the host's path (GUEST=HOST: vng takes a bare path as one inside
        # the root), where noderoot.point_at made the mount points.
        (bed.root / out.relative_to("/")).mkdir(parents=True, exist_ok=True)
        root_args = ["--root", str(bed.root), "--rodir", f"{REPO}={REPO}"]
        if (REPO.parent / "shared").is_dir():
            root_args += ["--rodir", f"{REPO.parent / 'shared'}={REPO.parent / 'shared'}"]
        # vng mounts --rwdir before --rodir, so the repository's share would
        # hide an out folder inside it: out goes to a folder of its own, which
        # inguest binds at out's path.
        writable = f"{GUEST_OUT_MOUNT}={out}"
        command = (f"export {GUEST_ROOT_ENV}={shlex.quote(str(bed.root))} "
                   f"{GUEST_OUT_ENV}={shlex.quote(str(out))} "
                   f"{noderoot.CHECKOUT_ENV}={shlex.quote(str(REPO))} && {command}")
    argv = [
        vng, "--run", str(bed.kernel), "--force-9p", "--name", name, *root_args,
        "-m", memory, "--cpus", str(cpus), "--rwdir", writable,
        "--append", f"modprobe.blacklist={BLACKLIST}",
        # The host's root a second time, for tests.harness.inguest to mount
        # with a page cache (see cache_host_trees there); "remap" keeps the
        # inode numbers of the host's several filesystems apart.
        f"--qemu-opts=-virtfs local,path=/,mount_tag={CACHED_ROOT_TAG},security_model=none,"
        "readonly=on,multidevs=remap",
        "--exec", command,
    ]
    if kernel_messages:
        argv.insert(-2, "--verbose")
    if not hardware_kvm_usable():
        argv.insert(3, "--disable-kvm")
    return argv


#: The guest's memory; ``PVESTORD_GUEST_MEMORY`` lowers it where several guests
#: share one machine (a developer running two tiers side by side).
DEFAULT_MEMORY = os.environ.get("PVESTORD_GUEST_MEMORY", "6G")


def run_guest(command: list[str], out: Path, *, timeout: float = DEFAULT_TIMEOUT,
              memory: str = DEFAULT_MEMORY, cpus: int = 2, echo: bool = True,
              bed: Bed | None = None) -> GuestResult:
    """Boot the node guest, run ``command`` in it, and return its exit status.

    ``command`` runs as root in the repository folder through
    :mod:`tests.harness.inguest`, which loads dm-mod and loop first.
    The console goes to ``out/console.log`` (and to our stdout if ``echo``).

    A guest that ends before it starts ``command`` has run nothing, so it is
    booted once more (:data:`BOOT_ATTEMPTS`), that time with the kernel's
    messages on the console, so that a second failure says why.
    """
    out.mkdir(parents=True, exist_ok=True)
    bed = bed or host_bed()
    compile_repository(bed)
    inner = [str(bed.python), "-m", "tests.harness.inguest", "--out", str(out), *command]
    shell_command = f"cd {shlex.quote(str(REPO))} && " + shlex.join(inner)
    console_log = out / "console.log"
    deadline = time.monotonic() + timeout
    with console_log.open("w") as log:
        for attempt in range(1, BOOT_ATTEMPTS + 1):
            kernel_messages = attempt > 1
            argv = vng_argv(shell_command, out, memory=memory, cpus=cpus, bed=bed,
                            kernel_messages=kernel_messages)
            started_marker = out / STARTED_MARKER
            started_marker.unlink(missing_ok=True)
            boot = _boot_and_wait(argv, log, deadline, echo=echo)
            if boot.timed_out:
                raise GuestError(
                    f"node guest did not finish within {timeout:.0f} s; killed. Last console "
                    "lines:\n" + "\n".join(boot.tail)
                    + f"\n(full console: {console_log}; command: {shlex.join(argv)})")
            if started_marker.exists():
                return GuestResult(boot.returncode, boot.duration, console_log)
            failure = (f"node guest did not boot (vng exited {boot.returncode} after "
                       f"{boot.duration:.1f} s before running our command)")
            if attempt < BOOT_ATTEMPTS:
                note = (f"nodeguest: {failure}; it ran nothing, so it boots once more, "
                        "with the kernel's messages shown")
                print(note, file=sys.stderr, flush=True)
                log.write(f"--- {note}\n")
                continue
            raise GuestError(
                f"{failure}, {BOOT_ATTEMPTS} times. Last console lines:\n" + "\n".join(boot.tail)
                + f"\n(full console: {console_log}; command: {shlex.join(argv)})")
    raise AssertionError("unreachable: the last attempt returns or raises")


@dataclass(frozen=True)
class _Boot:
    """One vng run as the host saw it."""

    returncode: int
    duration: float
    timed_out: bool
    tail: list[str]


def _boot_and_wait(argv: list[str], log: TextIO, deadline: float, *, echo: bool) -> _Boot:
    """Run vng until it exits or ``deadline`` passes (then kill it), copying its
    output to ``log`` (and our stdout if ``echo``)."""
    env = vng_env()
    tail: deque[str] = deque(maxlen=CONSOLE_TAIL_LINES)
    start = time.monotonic()
    timed_out = False
    # Popen with a pipe: docs/testing.md says vng's output must not go straight to a file.
    with subprocess.Popen(  # noqa: S603 - argument list
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=env, text=True, errors="replace", start_new_session=True,
    ) as proc:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        pending = ""
        while True:
            chunk = _read_available(proc.stdout, wait=0.2)
            if chunk:
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    log.write(line + "\n")
                    tail.append(line)
                    if echo:
                        print(line, flush=True)
                log.flush()
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                timed_out = True
                _kill(proc)
                break
        if pending:
            log.write(pending + "\n")
            tail.append(pending)
        log.flush()
    return _Boot(proc.returncode, time.monotonic() - start, timed_out, list(tail))


def _read_available(stream: object, wait: float) -> str:
    import select

    fileno = stream.fileno()  # type: ignore[attr-defined]
    ready, _, _ = select.select([fileno], [], [], wait)
    if not ready:
        return ""
    try:
        data = os.read(fileno, 65536)
    except BlockingIOError:
        return ""
    return data.decode(errors="replace")


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(timeout=30)


@dataclass(frozen=True)
class JUnitCounts:
    tests: int
    failures: int
    errors: int
    skipped: int

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


def junit_counts(path: Path) -> JUnitCounts:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = JUnitCounts(0, 0, 0, 0)
    for s in suites:
        total = JUnitCounts(
            total.tests + int(s.get("tests", 0)), total.failures + int(s.get("failures", 0)),
            total.errors + int(s.get("errors", 0)), total.skipped + int(s.get("skipped", 0)))
    return total


def run_pytest_in_guest(pytest_args: list[str], out: Path, timeout: float,
                        bed: Bed | None = None) -> int:
    """Run a pytest session in the guest; print the guest's counts on the host."""
    junit = out / "junit.xml"
    junit.unlink(missing_ok=True)
    result = run_guest(
        ["pytest", f"--junitxml={junit}", "-p", "no:cacheprovider", "-v", *pytest_args],
        out, timeout=timeout, bed=bed)
    if not junit.exists():
        print(f"node guest: pytest wrote no JUnit report (exit {result.returncode}); "
              f"console: {result.console_log}", file=sys.stderr)
        return result.returncode or 1
    counts = junit_counts(junit)
    # The host-side summary: the plain closing line CI reads, for the guest tier.
    print(f"node guest ({result.duration:.0f} s, report {junit}):")
    print(f"node-guest: {counts.passed} passed, {counts.failures + counts.errors} failed, "
          f"{counts.skipped} skipped")
    if counts.tests == 0:
        print("node guest: no test ran", file=sys.stderr)
        return 1
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nodeguest", description="Run the node-guest test tier, the demo or the benchmarks "
        "inside a Debian kernel booted under QEMU (real device-mapper and LVM).")
    parser.add_argument("--out", type=Path, required=True, help="writable folder for results")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--bed", choices=sorted(BEDS), default=DEFAULT_BED,
                        help="host: the host's kernel and root (default); trixie: Debian 13's, "
                        "Proxmox VE 9's userland (made and cached the first time)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true", help="run the live demo")
    mode.add_argument("--bench", action="store_true", help="run the benchmarks")
    mode.add_argument("--exec", dest="exec_argv", nargs=argparse.REMAINDER,
                      help="run this command in the guest")
    parser.add_argument("--quick", action="store_true", help="benchmarks: quick mode")
    parser.add_argument("--only", action="append", default=[], metavar="SCENARIO",
                        help="benchmarks: run only this scenario (repeatable; bench.run)")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (after --)")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    try:
        bed = BEDS[args.bed]()
        if args.demo:
            return run_guest(["demo"], out, timeout=args.timeout, bed=bed).returncode
        if args.bench:
            only = [arg for name in args.only for arg in ("--only", name)]
            return run_guest(["bench", *(["--quick"] if args.quick else []), *only], out,
                             timeout=args.timeout, bed=bed).returncode
        if args.exec_argv:
            return run_guest(["exec", *args.exec_argv], out, timeout=args.timeout,
                             bed=bed).returncode
        return run_pytest_in_guest(args.pytest_args or ["tests/integration/node"], out,
                                   args.timeout, bed)
    except GuestError as err:
        print(f"nodeguest: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
