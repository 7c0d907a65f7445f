"""Clean Debian 12 and Debian 13 roots made with debootstrap, cached between runs.

The first run makes ``/var/cache/pvestord-test/<suite>-minbase`` from the
mirror this machine's apt uses (about half a minute each here); later runs
reuse it, and each test session works in a throw-away copy, so the cached
root stays clean. The cache is keyed by suite, variant, mirror and the tools
installed into it: change one and it is made again. Downloaded .debs are
kept in the cache too, one folder per suite, so a second install of our
package's dependencies does not download them again.

``python -m tests.harness.debroot`` makes the caches ahead of time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord.adapters.command import Completed, run


@dataclass(frozen=True)
class Release:
    suite: str
    version: int
    #: Installed into the cached root after debootstrap: tools the tests run
    #: there, none of them a dependency of ours.
    tools: tuple[str, ...] = ()


#: Debian 12, what this machine and CI run (lintian: the host's).
BOOKWORM = Release("bookworm", 12)
#: Debian 13, Proxmox VE 9's. Its own lintian checks the .deb as Debian 13
#: does; it pulls perl and binutils, none of our dependencies (no python3,
#: systemd, lvm2 or qemu-utils: checked in its apt log).
TRIXIE = Release("trixie", 13, tools=("lintian",))
RELEASES = {r.suite: r for r in (BOOKWORM, TRIXIE)}

VARIANT = "minbase"
CACHE = Path(os.environ.get("PVESTORD_TEST_CACHE", "/var/cache/pvestord-test"))
#: debootstrap downloads and unpacks about 90 packages: minutes, not hours.
DEBOOTSTRAP_TIMEOUT = 1800.0
#: apt-get update and an install: our package with its dependencies, lintian
#: (~200 .debs), or the systemd guest's packages (~150 .debs).
APT_TIMEOUT = 1800.0
#: Copying the cached root (~200-300 MB of small files).
COPY_TIMEOUT = 300.0
#: A command run in the root (``pvestord --help``).
CHROOT_TIMEOUT = 120.0

#: Environment for commands inside the root: nothing of the caller's venv.
CHROOT_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
              "DEBIAN_FRONTEND=noninteractive", "HOME=/root")

_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def _apt_sources(sources: Sequence[Path]) -> list[tuple[str, list[str]]]:
    """(first URI, suites) of every ``deb`` entry, in apt's reading order.

    Reads one-line (``deb URI SUITE ...``) and deb822 (``URIs:``/``Suites:``) files.
    """
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".list", ".sources"))
        elif src.is_file():
            files.append(src)
    entries: list[tuple[str, list[str]]] = []
    for path in files:
        text = path.read_text(errors="replace")
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m:
                entries.append((m.group(1), [m.group(2)]))
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
            if "deb" in fields.get("Types", "").split() and fields.get("URIs"):
                entries.append((fields["URIs"].split()[0], fields.get("Suites", "").split()))
    return entries


def debian_mirror(suite: str, sources: Sequence[Path] = _SOURCES) -> str:
    """The Debian mirror this machine's apt is configured with, to debootstrap ``suite``.

    The first entry whose suites include ``suite`` exactly wins; failing that,
    the first naming another release of RELEASES exactly: one Debian mirror
    serves every release, and a Debian 12 machine lists only bookworm. Exact
    names keep bookworm-security and third-party repositories out.
    """
    entries = _apt_sources(sources)
    for wanted in ({suite}, set(RELEASES)):
        for uri, suites in entries:
            if wanted & set(suites):
                return uri
    raise RuntimeError(f"no apt source for Debian {suite} (or {', '.join(RELEASES)}) "
                       f"in {', '.join(map(str, sources))}")


def stamp(release: Release) -> Path:
    """The file saying what the cached root of ``release`` was made from."""
    return CACHE / f"{release.suite}-{VARIANT}.stamp"


def base_root(release: Release = BOOKWORM) -> tuple[Path, float | None]:
    """The cached pristine root, made if missing; and how long making it took (None: cached)."""
    mirror = debian_mirror(release.suite)
    tools = f" +{','.join(release.tools)}" if release.tools else ""
    key = f"{release.suite} {VARIANT} {mirror}{tools}\n"
    root = CACHE / f"{release.suite}-{VARIANT}"
    if root.is_dir() and stamp(release).is_file() and stamp(release).read_text() == key:
        return root, None
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    stamp(release).unlink(missing_ok=True)
    partial = CACHE / f"{release.suite}-{VARIANT}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    start = time.monotonic()
    run(["debootstrap", f"--variant={VARIANT}", f"--cache-dir={archives(release)}",
         release.suite, str(partial), mirror], timeout=DEBOOTSTRAP_TIMEOUT)
    if release.tools:
        shutil.copyfile("/etc/resolv.conf", partial / "etc/resolv.conf")
        apt_install(partial, release, release.tools)
        # Every session copies the root: no .debs in it (they stay in archives()).
        chroot(partial, ["apt-get", "clean"])
    took = time.monotonic() - start
    # Only a finished root gets the name and the stamp: an interrupted run
    # leaves a .partial that the next run throws away.
    partial.rename(root)
    stamp(release).write_text(key)
    return root, took


def derived_root(release: Release, name: str, packages: Sequence[str],
                 details: dict[str, object] | None = None,
                 finish: Callable[[Path], None] | None = None) -> tuple[Path, float | None]:
    """A cached root of ``release``: its minbase with ``packages`` installed,
    then ``finish(root)``; and how long making it took (None: cached).

    Keyed by the base root's stamp, the packages and ``details`` (what else
    ``finish`` puts in): any change makes it again, and roots made for
    another key are removed, being of no further use.
    """
    base, _ = base_root(release)
    key = json.dumps({"base": stamp(release).read_text(), "packages": sorted(packages),
                      **(details or {})}, sort_keys=True) + "\n"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = CACHE / f"{release.suite}-{name}-{digest}"
    root_stamp = root.with_name(root.name + ".stamp")
    if root.is_dir() and root_stamp.is_file() and root_stamp.read_text() == key:
        return root, None
    for stale in CACHE.glob(f"{release.suite}-{name}-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    start = time.monotonic()
    copy_root(base, partial)
    apt_install(partial, release, packages)
    # Roots are copied or shared whole: no .debs in them (they stay in archives()).
    chroot(partial, ["apt-get", "clean"])
    if finish is not None:
        finish(partial)
    # Only a finished root gets the name and the stamp (as base_root).
    partial.rename(root)
    root_stamp.write_text(key)
    return root, time.monotonic() - start


def archives(release: Release) -> Path:
    """Where the .debs downloaded for ``release`` are kept between runs."""
    path = CACHE / f"archives-{release.suite}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def copy_root(base: Path, dest: Path) -> Path:
    """A throw-away copy of ``base`` at ``dest``, with the host's resolver."""
    run(["cp", "-a", "--reflink=auto", str(base), str(dest)], timeout=COPY_TIMEOUT)
    shutil.copyfile("/etc/resolv.conf", dest / "etc/resolv.conf")
    return dest


def chroot(root: Path, argv: Sequence[str], *, timeout: float = CHROOT_TIMEOUT,
           check: bool = True, proc: bool = False) -> Completed:
    """Run ``argv`` inside ``root``, with a clean environment.

    ``proc``: with a /proc of its own (a private PID and mount namespace, so
    nothing stays mounted), for programs that read it (systemd-analyze).
    """
    namespace = ["unshare", "--fork", "--pid", f"--mount-proc={root}/proc"] if proc else []
    return run(["env", "-i", *CHROOT_ENV, *namespace, "chroot", str(root), *argv],
               timeout=timeout, check=check)


def apt_install(root: Path, release: Release, packages: Sequence[str]) -> float:
    """Install ``packages`` (names, or .deb paths inside ``root``) with their
    dependencies into ``root``, a root of ``release``; seconds.

    The .debs apt downloads are copied into the root's apt cache first and
    back to the cache after, so only the first run fetches them.
    """
    start = time.monotonic()
    cache = root / "var/cache/apt/archives"
    cache.mkdir(parents=True, exist_ok=True)
    kept = archives(release)
    for pkg in kept.glob("*.deb"):
        shutil.copy2(pkg, cache / pkg.name)
    chroot(root, ["apt-get", "update", "-q"], timeout=APT_TIMEOUT)
    chroot(root, ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
           timeout=APT_TIMEOUT)
    for pkg in cache.glob("*.deb"):
        if not (kept / pkg.name).exists():
            shutil.copy2(pkg, kept / pkg.name)
    return time.monotonic() - start


def install_deb(root: Path, release: Release, deb: Path, extra: Sequence[str] = ()) -> float:
    """Install ``deb`` with its dependencies (and ``extra`` packages) into ``root``; seconds."""
    shutil.copy2(deb, root / "tmp" / deb.name)
    return apt_install(root, release, [f"/tmp/{deb.name}", *extra])


if __name__ == "__main__":
    for rel in RELEASES.values():
        path, seconds = base_root(rel)
        print(f"{path}: " + ("cached" if seconds is None else f"made in {seconds:.0f} s"))
    sys.exit(0)
