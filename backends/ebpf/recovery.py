"""How the programmer's mirror is recovered from the maps: here, or beside.

At a restart over a pinned datapath of 10 000 services, reading both maps
and deciding what each entry is (`Contents.recovered`) is about half a
second of Python, which the setup thread would spend while the main thread
receives the first Sync: both on one interpreter lock, so the restart waited
for the sum. `recovered_beside` has a forked child (`kpng_py/runtime/forked.py`) do
it on the other CPU and send the result as plain values; this process only
reads them back. `RecoveryAhead` forks that child as soon as the maps are
open, so that the rest of the setup goes on while it works. The child reads
the same maps through the same open fds, so the result is the same; it is
done here when the child cannot help.
"""

from __future__ import annotations

import logging
import marshal
from typing import Callable

from backends.ebpf.maps.contents import Recovered, read_contents
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.layout import BackendValue, ServiceKey, ServiceValue
from kpng_py.runtime.forked import ForkedWork, fork_work, spare_cpu
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

Recovery = Callable[[MapAccess[ServiceKey, ServiceValue], MapAccess[int, BackendValue]],
                    Recovered]


def recovered_here(services: MapAccess[ServiceKey, ServiceValue],
                   backends: MapAccess[int, BackendValue]) -> Recovered:
    return read_contents(services, backends).recovered()


def recovered_beside(services: MapAccess[ServiceKey, ServiceValue],
                     backends: MapAccess[int, BackendValue]) -> Recovered:
    """What `recovered_here` returns, made by a child on another CPU (this
    thread waits for it without the interpreter's lock); made here on one
    CPU, or when no child can be made or it fails."""
    child = _forked_recovery(services, backends)
    return recovered_here(services, backends) if child is None else _result_of(
        child, services, backends)


class RecoveryAhead:
    """`recovered_beside` whose first child is forked at once: the caller goes
    on with the rest of its setup while the child reads the maps, and its
    first recovery (of the same maps) takes what the child sent."""

    def __init__(self, services: MapAccess[ServiceKey, ServiceValue],
                 backends: MapAccess[int, BackendValue]) -> None:
        self._services, self._backends = services, backends
        self._first = _forked_recovery(services, backends)

    def __call__(self, services: MapAccess[ServiceKey, ServiceValue],
                 backends: MapAccess[int, BackendValue]) -> Recovered:
        first = self._first
        if first is None or services is not self._services or backends is not self._backends:
            return recovered_beside(services, backends)
        self._first = None
        return _result_of(first, services, backends)

    def close(self) -> None:
        """The first recovery will not be asked for (the setup failed)."""
        if self._first is not None:
            self._first.stop()
            self._first = None


def _forked_recovery(services: MapAccess[ServiceKey, ServiceValue],
                     backends: MapAccess[int, BackendValue]) -> ForkedWork | None:
    """The child recovering the maps; None on one CPU or when none can be made."""
    if not spare_cpu():
        return None
    try:
        return fork_work(lambda: marshal.dumps(recovered_here(services, backends).encode()))
    except OSError as err:
        log.info("recovering the maps in this process: no child", extra=fields(error=str(err)))
        return None


def _result_of(child: ForkedWork, services: MapAccess[ServiceKey, ServiceValue],
               backends: MapAccess[int, BackendValue]) -> Recovered:
    data = child.result()
    if data is None:
        log.info("recovering the maps in this process: the child failed",
                 extra=fields(wait_status=child.status))
        return recovered_here(services, backends)
    return Recovered.decode(marshal.loads(data))
