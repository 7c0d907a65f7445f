"""Proxmox's own storage code, unpacked for the tests that drive the plugin through it.

The sources are git archives of pve-storage, pve-common and pve-cluster (see
``../shared/upstream/README.md``): from ``$PVESTORD_UPSTREAM_DIR``, else
``../shared/upstream`` beside the repository. They are unpacked into a
temporary folder; ``PVE::Cluster::IPCConst`` is generated there by upstream's
own ``IPCConst.pm.awk``. The test stand-ins in ``tests/proxmox/standins``
(pmxcfs IPC, RPC environment, Ceph and API client, pmxcfs locks) come first
on ``PERL5LIB``, then the plugin from ``packaging/perl``, then upstream.

:func:`skip_reason` says what is missing (sources, Perl modules), for a
``pytest.skip`` naming it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import archives

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
PLUGIN_LIB = REPO / "packaging" / "perl"
#: Source archives needed, by the prefix of their file name.
ARCHIVES = ("pve-storage-", "pve-common-", "pve-cluster-")
#: CPAN modules the upstream code loads (Debian packages in scripts/install-deps).
PERL_MODULES = ("AnyEvent", "Clone", "Devel::Cycle", "Encode::Locale", "File::chdir",
                "Filesys::Df", "HTTP::Message", "JSON", "Linux::Inotify2", "Net::DBus",
                "Net::IP", "Net::SSLeay", "NetAddr::IP", "POSIX::strptime",
                "String::ShellQuote", "Date::Parse", "URI", "LWP::UserAgent", "XML::LibXML")
PERL_TIMEOUT = 300.0
#: The checkout's pvestord, as a shell command line.
PVESTORD = f"PYTHONPATH={REPO} {Path(sys.executable).parent / 'pvestord'}"
#: Perl that reads storage.cfg through PVE::Storage and prints it as Proxmox writes it.
READ_AND_WRITE = ('my $cfg = PVE::Storage::config();'
                  'print PVE::Storage::Plugin->write_config("storage.cfg", $cfg);')


def plugin_stand_in(path: Path, other_ops: str, health_dir: Path) -> Path:
    """A ``pvestord`` for the plugin (``$PVESTORD``) at ``path`` that answers
    ``locks`` as the checkout's does (the storage locks it takes before any
    other op; VG marks from ``health_dir``) and runs the shell ``other_ops``
    for every other op, with the request in ``$request`` and :data:`PVESTORD`
    to run the checkout's on ``$request``."""
    path.write_text(
        "#!/bin/sh\nrequest=$(cat)\n"
        "case \"$request\" in *'\"op\":\"locks\"'*)\n"
        f"    {PVESTORD} \"$@\" --vg-health-dir {health_dir} <<EOF\n$request\nEOF\n"
        "    exit $?;;\nesac\n"
        f"{other_ops}\n")
    path.chmod(0o755)
    return path


def sources_dir() -> Path:
    named = os.environ.get("PVESTORD_UPSTREAM_DIR")
    return Path(named) if named else REPO.parent / "shared" / "upstream"


def _archive(folder: Path, prefix: str) -> Path | None:
    found = sorted(folder.glob(f"{prefix}*.tar.gz"))
    return found[-1] if found else None


def skip_reason() -> str | None:
    """None when everything is there, else what is missing."""
    folder = sources_dir()
    missing = [p + "*.tar.gz" for p in ARCHIVES if _archive(folder, p) is None]
    if missing:
        return (f"Proxmox sources missing in {folder} ({', '.join(missing)}); set "
                "PVESTORD_UPSTREAM_DIR to a folder holding them")
    # One process for all (each Perl start is slow under the node guest's emulation).
    done = subprocess.run(  # noqa: S603 - argument list
        ["perl", "-e", 'for my $m (@ARGV) { (my $f = "$m.pm") =~ s{::}{/}g;'
         ' eval { require $f; 1 } or print "$m\n" }', *PERL_MODULES],
        capture_output=True, text=True, timeout=120, check=False)
    absent = done.stdout.split()
    if absent:
        return (f"Perl modules missing: {', '.join(absent)} (install the Debian packages "
                "listed in scripts/install-deps)")
    return None


@dataclass(frozen=True)
class Upstream:
    """Unpacked sources and the folders the stand-ins read."""

    root: Path
    pve_dir: Path
    lock_dir: Path

    def perl5lib(self, *, plugin: bool = True) -> str:
        """``plugin``: the plugin from the source tree (else from wherever Perl finds it)."""
        return ":".join(str(p) for p in (
            STANDINS, self.root / "generated", *([PLUGIN_LIB] if plugin else []),
            self.root / "pve-storage" / "src", self.root / "pve-common" / "src",
            self.root / "pve-cluster" / "src"))

    def env(self, extra: Mapping[str, str] | None = None, *, plugin: bool = True
            ) -> dict[str, str]:
        return {**os.environ, "PERL5LIB": self.perl5lib(plugin=plugin),
                "PVESTORD_TEST_PVE_DIR": str(self.pve_dir),
                "PVESTORD_TEST_LOCK_DIR": str(self.lock_dir), **(extra or {})}

    def write_storage_cfg(self, text: str) -> None:
        (self.pve_dir / "storage.cfg").write_text(text)

    def perl(self, code: str, *, preload: Sequence[str] = (), **extra: str
             ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` after the stand-ins loaded the real PVE::Storage; the
        ``preload`` modules are loaded before them (before PVE::Storage)."""
        return subprocess.run(  # noqa: S603 - argument list
            ["perl", *(f"-M{module}" for module in preload), "-MPvestordTest::StandIns",
             "-MJSON", "-e", code], env=self.env(extra),
            capture_output=True, text=True, timeout=PERL_TIMEOUT, check=False)

    def session(self, stderr: Path, **extra: str) -> PerlSession:
        """A Perl process serving many requests (see ``PvestordTest/Session.pm``)."""
        return PerlSession(self.env(extra), stderr)

    def perl_installed(self, code: str, installed_perl5: Path
                       ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with the plugin as a package installed it: ``installed_perl5``
        (a root's ``usr/share/perl5``) laid over ``/usr/share/perl5`` in a private
        mount namespace, registered by upstream's own loader, not by the stand-ins."""
        return subprocess.run(  # noqa: S603 - argument list
            ["unshare", "--mount", "--propagation", "private", "--", "perl",
             "-MPvestordTest::InstalledPlugin", "-MPvestordTest::StandIns", "-MJSON", "-e", code],
            env=self.env({"PVESTORD_TEST_NO_REGISTER": "1",
                          "PVESTORD_TEST_INSTALLED_PERL5": str(installed_perl5)}, plugin=False),
            capture_output=True, text=True, timeout=PERL_TIMEOUT, check=False)

    def perl_json(self, code: str, **extra: str) -> Any:
        """``code`` prints one JSON document; fail with Perl's stderr otherwise."""
        done = self.perl(code, **extra)
        assert done.returncode == 0, f"perl failed ({done.returncode}):\n{done.stderr}"
        return json.loads(done.stdout)


def unpack(dest: Path) -> Upstream:
    """Unpack the archives below ``dest`` and generate IPCConst.pm."""
    folder = sources_dir()
    for prefix in ARCHIVES:
        archive = _archive(folder, prefix)
        assert archive is not None, skip_reason()
        target = dest / prefix.rstrip("-")
        target.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            # git archives hold one top folder; strip it.
            for member in members:
                member.name = member.name.partition("/")[2]
            archives.extract(tar, target, [m for m in members if m.name])
    cluster = dest / "pve-cluster" / "src"
    generated = dest / "generated" / "PVE" / "Cluster"
    generated.mkdir(parents=True)
    done = subprocess.run(["awk", "-f",  # noqa: S603 - argument list
                           str(cluster / "PVE" / "Cluster" / "IPCConst.pm.awk"),
                           str(cluster / "pmxcfs" / "cfs-ipc-ops.h")],
                          capture_output=True, text=True, timeout=30, check=True)
    (generated / "IPCConst.pm").write_text(done.stdout)
    # The real (XS) IPCC must not shadow the stand-in, even by mistake.
    (cluster / "PVE" / "IPCC.pm").unlink()
    pve_dir, lock_dir = dest / "etc-pve", dest / "locks"
    pve_dir.mkdir()
    lock_dir.mkdir()
    return Upstream(dest, pve_dir, lock_dir)


class PerlSession:
    """Requests to one long-lived Perl process that loaded PVE::Storage once.

    ``call(code)`` runs ``code`` (Perl, with ``$cfg`` = PVE::Storage::config())
    and returns its result; a Perl error is an ``AssertionError`` with it.
    """

    def __init__(self, env: dict[str, str], stderr: Path) -> None:
        self._log = stderr.open("ab")
        self._proc = subprocess.Popen(
            ["perl", "-MPvestordTest::Session", "-e", "PvestordTest::Session::serve()"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._buffer = b""

    def call(self, code: str, *, timeout: float = PERL_TIMEOUT) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(code).encode() + b"\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"perl did not answer within {timeout:g} s: {code}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"perl exited ({self._proc.wait()}) running: {code}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer = json.loads(line)
        assert not answer["error"], f"perl failed: {answer['error']}\n(code: {code})"
        return answer["result"]

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=PERL_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
