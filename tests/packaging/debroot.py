"""A clean Debian 12 root made with debootstrap, cached between runs.

The first run makes ``/var/cache/pvestord-test/bookworm-minbase`` from the
mirror this machine's apt uses (a few minutes); later runs reuse it, and each
test session works in a throw-away copy, so the cached root stays clean. The
cache is keyed by suite, variant and mirror: change one and it is made again.
Downloaded .debs are kept in the cache too, so a second install of our
package's dependencies does not download them again.

``python -m tests.packaging.debroot`` makes the cache ahead of time.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pvestord.adapters.command import Completed, run

SUITE = "bookworm"
VARIANT = "minbase"
CACHE = Path(os.environ.get("PVESTORD_TEST_CACHE", "/var/cache/pvestord-test"))
#: debootstrap downloads and unpacks about 90 packages: minutes, not hours.
DEBOOTSTRAP_TIMEOUT = 1800.0
#: apt-get update and installing our package with its dependencies.
APT_TIMEOUT = 900.0
#: Copying the cached root (~200 MB of small files).
COPY_TIMEOUT = 300.0
#: A command run in the root (``pvestord --help``).
CHROOT_TIMEOUT = 120.0

#: Environment for commands inside the root: nothing of the caller's venv.
CHROOT_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
              "DEBIAN_FRONTEND=noninteractive", "HOME=/root")

_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def debian_mirror(sources: Sequence[Path] = _SOURCES) -> str:
    """The Debian mirror this machine's apt is configured with, for SUITE.

    Reads one-line (``deb URI SUITE ...``) and deb822 (``URIs:``/``Suites:``)
    sources; the first entry whose suites include SUITE exactly wins, so
    bookworm-security and third-party repositories are not picked.
    """
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".list", ".sources"))
        elif src.is_file():
            files.append(src)
    for path in files:
        text = path.read_text(errors="replace")
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and m.group(2) == SUITE:
                return m.group(1)
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
            if "deb" in fields.get("Types", "").split() and \
                    SUITE in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
    raise RuntimeError(f"no apt source for Debian {SUITE} in {', '.join(map(str, sources))}")


def base_root() -> tuple[Path, float | None]:
    """The cached pristine root, made if missing; and how long making it took (None: cached)."""
    mirror = debian_mirror()
    key = f"{SUITE} {VARIANT} {mirror}\n"
    root = CACHE / f"{SUITE}-{VARIANT}"
    stamp = CACHE / f"{SUITE}-{VARIANT}.stamp"
    if root.is_dir() and stamp.is_file() and stamp.read_text() == key:
        return root, None
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    partial = CACHE / f"{SUITE}-{VARIANT}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    start = time.monotonic()
    run(["debootstrap", f"--variant={VARIANT}", f"--cache-dir={archives()}", SUITE,
         str(partial), mirror], timeout=DEBOOTSTRAP_TIMEOUT)
    took = time.monotonic() - start
    # Only a finished root gets the name and the stamp: an interrupted run
    # leaves a .partial that the next run throws away.
    partial.rename(root)
    stamp.write_text(key)
    return root, took


def archives() -> Path:
    """Where downloaded .debs are kept between runs."""
    path = CACHE / "archives"
    path.mkdir(parents=True, exist_ok=True)
    return path


def copy_root(base: Path, dest: Path) -> Path:
    """A throw-away copy of ``base`` at ``dest``, with the host's resolver."""
    run(["cp", "-a", "--reflink=auto", str(base), str(dest)], timeout=COPY_TIMEOUT)
    shutil.copyfile("/etc/resolv.conf", dest / "etc/resolv.conf")
    return dest


def chroot(root: Path, argv: Sequence[str], *, timeout: float = CHROOT_TIMEOUT,
           check: bool = True) -> Completed:
    """Run ``argv`` inside ``root``, with a clean environment."""
    return run(["env", "-i", *CHROOT_ENV, "chroot", str(root), *argv],
               timeout=timeout, check=check)


def apt_install(root: Path, deb: Path, extra: Sequence[str] = ()) -> float:
    """Install ``deb`` with its dependencies (and ``extra`` packages) into ``root``; seconds.

    The .debs apt downloads are copied into the root's apt cache first and
    back to the cache after, so only the first run fetches them.
    """
    start = time.monotonic()
    cache = root / "var/cache/apt/archives"
    cache.mkdir(parents=True, exist_ok=True)
    for pkg in archives().glob("*.deb"):
        shutil.copy2(pkg, cache / pkg.name)
    shutil.copy2(deb, root / "tmp" / deb.name)
    chroot(root, ["apt-get", "update", "-q"], timeout=APT_TIMEOUT)
    chroot(root, ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                  f"/tmp/{deb.name}", *extra], timeout=APT_TIMEOUT)
    for pkg in cache.glob("*.deb"):
        if not (archives() / pkg.name).exists():
            shutil.copy2(pkg, archives() / pkg.name)
    return time.monotonic() - start


if __name__ == "__main__":
    path, seconds = base_root()
    print(f"{path}: " + ("cached" if seconds is None else f"made in {seconds:.0f} s"))
    sys.exit(0)
