"""No replay: per-sender sequence numbers, checked by every receiver.

A sender numbers its messages `next_seq(previous)` = max(previous + 1, its clock in µs): strictly
increasing, and across restarts too (a new incarnation starts at its clock, past every number the
old one used, as long as it sent fewer than a million messages a second). A receiver keeps the
last number it accepted from each (authenticated) sender and refuses, with reason "replay", a
duplicate or a regression (a message sent again, an old incarnation's message).

Who can move a sender's numbering? Only a holder of a key that covers it (runtime/security.py).
A sender with a key of its own (`exclusive`: every process of `tianji run`) can only lock
itself out, so its numbers are not bounded at all: no clock window exists that another
process could push it past. A name spoken with a shared role key (pods' "actor" key) could be
moved by any holder of that key; for those, a number more than MAX_AHEAD_S ahead of the
receiver's clock is refused too, so a forger blocks such a sender for at most that long.

Only messages that passed every other check advance a sender's number (`accept` is called last),
so a refused forgery never blocks the honest sender. Torch-free (the buffer imports it).
"""
from __future__ import annotations

import time

from tianji.runtime.wire import WireError

MAX_AHEAD_S = 60.0  # shared keys only: clock skew tolerated (and the longest a forger can block a sender)
MAX_SENDERS = 4096  # senders remembered (with CURVE, a job's own processes: far fewer)


def now_us() -> int:
    return time.time_ns() // 1000


def next_seq(previous: int) -> int:
    return max(previous + 1, now_us())


class SeqGuard:
    """The last accepted sequence number of each sender."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self._horizon = 0  # now + MAX_AHEAD_S when last read: the clock is read only past it

    def check(self, sender: str, seq: int) -> None:
        """Raises WireError("replay") if `seq` is not new from `sender`, remembering nothing: a
        receiver refuses a replay before it spends time validating it."""
        last = self.last.get(sender)
        if last is not None and seq <= last:
            raise WireError("replay", f"{sender}: seq {seq} <= {last} already accepted")

    def accept(self, sender: str, seq: int, exclusive: bool = False) -> None:
        """Raises WireError("replay") unless `seq` is new from `sender`; then remembers it.
        `exclusive`: the sender's key is its own (no bound ahead: see the module's docstring)."""
        last = self.last.get(sender)
        if last is not None and seq <= last:
            raise WireError("replay", f"{sender}: seq {seq} <= {last} already accepted")
        if not exclusive and seq > self._horizon:
            self._horizon = now_us() + int(MAX_AHEAD_S * 1e6)
            if seq > self._horizon:
                raise WireError("replay", f"{sender}: seq {seq} is ahead of this clock")
        if last is None and len(self.last) >= MAX_SENDERS:
            del self.last[next(iter(self.last))]
        self.last[sender] = seq
