"""`kpng-py replay`: serve a recording as a brain would.

Each WatchReq gets the next recorded change set; a recorded disconnect fails
the stream at the same point, and the client's next stream continues with what
was recorded after it. Progress is kept per node name, so one client replays
the whole recording once; when it is exhausted the stream stays open and
quiet, like a brain with nothing new to say. Each recorded change set is one
Reply, serialized once however many nodes are replayed it.
"""

from __future__ import annotations

import threading

from kpng_py.serve.recording import Segment
from kpng_py.serve.server import Reply, wait_until_cancelled


class ReplaySource:
    def __init__(self, segments: list[Segment]) -> None:
        self._replies = [Reply(segment.ops, segment.disconnect) for segment in segments]
        self._lock = threading.Lock()
        self._cursor: dict[str, int] = {}

    def open_stream(self) -> ReplaySession:
        return ReplaySession(self)

    def take(self, node_name: str) -> Reply | None:
        with self._lock:
            index = self._cursor.get(node_name, 0)
            if index >= len(self._replies):
                return None
            self._cursor[node_name] = index + 1
            return self._replies[index]


class ReplaySession:
    def __init__(self, source: ReplaySource) -> None:
        self._source = source

    async def next_reply(self, node_name: str) -> Reply:
        reply = self._source.take(node_name)
        if reply is None:
            await wait_until_cancelled()  # the recording is exhausted
        return reply

    def close(self) -> None:
        pass
