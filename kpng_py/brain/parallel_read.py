"""The services items of a big state file read by two processes.

A 10 000-service file takes the brain about a second of CPU to read, most
of it in the items' own text, each item read alone. With a second CPU, a
forked child (`kpng_py/runtime/forked.py`) reads the second half of the items while
the brain reads the first, and sends its entries back as plain values
(`marshal`, a few MiB at 10 000 services, read back in a fraction of what
reading the text costs).

The child only saves time: what it sends is what the brain would have read,
the same functions on the same text. When the child declines an item (the
fast path does not vouch for it) the whole read declines, as it would have
in one process; when no child can be made, or it fails in any other way
(killed, out of memory), the brain reads the second half itself.
"""

from __future__ import annotations

import logging
import marshal
from typing import Callable, TypeVar

from kpng_py.runtime.forked import ForkedWork, fork_work, spare_cpu
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# Fewer items are read in one process: a fork and the entries' way back
# cost more than half of them would.
MIN_ITEMS = 2000

# What the child sends when an item of its half declined.
_DECLINED = b""

Entry = TypeVar("Entry")


def read_items(items: list[str], read: Callable[[list[str]], list[Entry] | None],
               encode: Callable[[Entry], tuple], decode: Callable[[tuple], Entry]
               ) -> list[Entry] | None:
    """`read(items)` (None: an item declined), its second half read in a
    child when the items are many and this process may run on more than
    one CPU; the child sends each entry as `encode` makes it (plain values)
    and `decode` makes it again."""
    if len(items) < MIN_ITEMS or not spare_cpu():
        return read(items)
    half = len(items) // 2
    child = _fork_reading(items[half:], read, encode)
    if child is None:
        return read(items)
    try:
        first = read(items[:half])
    except BaseException:
        child.stop()
        raise
    if first is None:
        child.stop()
        return None
    data = child.result()
    if data is None:
        log.info("the state file's second half is read again: its reader failed",
                 extra=fields(wait_status=child.status))
        second = read(items[half:])
        return None if second is None else first + second
    if data == _DECLINED:
        return None
    return first + [decode(values) for values in marshal.loads(data)]


def _fork_reading(items: list[str], read: Callable[[list[str]], list[Entry] | None],
                  encode: Callable[[Entry], tuple]) -> ForkedWork | None:
    """The child reading `items`; None if none could be made."""

    def work() -> bytes:
        entries = read(items)
        return _DECLINED if entries is None else marshal.dumps([encode(e) for e in entries])

    try:
        return fork_work(work)
    except OSError as err:
        _in_one_process(err)
        return None


def _in_one_process(err: OSError) -> None:
    log.info("reading the state file in one process", extra=fields(error=str(err)))
