"""Hand a notice to Proxmox's notification system (``PVE::Notify``).

``PVE::Notify`` is Perl only, so each notice runs the package's small Perl
program (:data:`SCRIPT`) with the notice as JSON on stdin. The run is a task
of its own: a pass never waits for mail or a webhook, and a failure is logged,
never raised into the engine. On a node without ``PVE::Notify`` (plain
Debian, a test host) the program exits with :data:`UNAVAILABLE`, said once;
no later notice is tried.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from pvestord.adapters import command
from pvestord.adapters.service import fields
from pvestord.errors import PvestordError
from pvestord.policy.notices import Notice

log = logging.getLogger(__name__)

#: Installed by the package (packaging/notify/notify.pl).
SCRIPT = Path("/usr/share/pvestord/notify.pl")
#: The program's exit status when ``PVE::Notify`` cannot be loaded.
UNAVAILABLE = 3
#: A notice is rendered and sent by the targets in that process (SMTP,
#: webhook): bounded so that a hung target does not pile up processes.
TIMEOUT = 60.0


class Notifier:
    """Sends notices without blocking the caller."""

    def __init__(self, script: Path = SCRIPT, *, perl: str = "perl",
                 timeout: float = TIMEOUT) -> None:
        self.script = script
        self.perl = perl
        self.timeout = timeout
        #: False once the node is known to have no ``PVE::Notify``.
        self.available = True
        #: Sends under way; kept so the tasks are not collected mid-flight.
        self._pending: set[asyncio.Task[None]] = set()

    def send(self, notice: Notice) -> None:
        """Start sending ``notice`` (needs a running event loop)."""
        if self.available and not self.script.is_file():
            # Run from a source tree, not the package: nothing to run it with.
            self._off(f"{self.script} is not installed", notice)
        if not self.available:
            log.debug("notification %s not sent: notifications are off", notice.template)
            return
        task = asyncio.get_running_loop().create_task(self._send(notice),
                                                      name=f"notify {notice.template}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self) -> None:
        """Wait for the sends under way (at shutdown, and in tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def _send(self, notice: Notice) -> None:
        payload = json.dumps({"severity": notice.severity.value, "template": notice.template,
                              "data": notice.data, "fields": notice.fields})
        extra = fields(NOTIFICATION=notice.template, SEVERITY=notice.severity.value)
        try:
            done = await command.run_async([self.perl, str(self.script)], input=payload,
                                           timeout=self.timeout, check=False)
        except PvestordError as err:
            log.warning("notification %s not sent: %s", notice.template, err, extra=extra)
            return
        if done.returncode == UNAVAILABLE and self.available:
            self._off(done.stderr.strip() or "PVE::Notify not found", notice)
        elif done.returncode != 0 and done.returncode != UNAVAILABLE:
            log.warning("notification %s not sent: %s exited %d: %s", notice.template,
                        self.script, done.returncode, done.stderr.strip(), extra=extra)
        elif done.returncode == 0:
            log.info("notification %s sent (%s)", notice.template, notice.severity.value,
                     extra=extra)

    def _off(self, why: str, notice: Notice) -> None:
        """Said once: every later notice would fail the same way."""
        self.available = False
        log.info("Proxmox notifications are off: %s (journal and metrics only)", why,
                 extra=fields(NOTIFICATION=notice.template, SEVERITY=notice.severity.value))
