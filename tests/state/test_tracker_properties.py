"""Property: whatever the stream, applying each ServicePortChanges incrementally gives
the same programmed state as computing it from scratch from the objects the
brain has sent so far (reconnects and resyncs included), and no two published
service ports share a frontend.

Services draw their ClusterIPs from a small pool, in canonical and in refused
spellings (IPv4-mapped, scope ids, special addresses), so that they collide.
Which port owns a frontend depends on history (the first to claim it keeps
it), so the from-scratch side is a reference that replays the Syncs: at each
one it takes the ports as a fresh NodeState computes them from everything sent
so far, and gives each frontend to the port whose claim on it is the oldest
(ties in name order)."""

from __future__ import annotations

from tests.support.stream_machine import StreamMachine

TestStreams = StreamMachine.TestCase
