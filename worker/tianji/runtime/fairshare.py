"""Fair share per sender at a buffer: a sender that floods drops only its own data.

Every fragment a buffer takes comes from an authenticated actor (roles/base.py), so the buffer can
divide what it holds among the senders active lately (seen within ACTIVE_S; at least one):

- `SenderQueues` (on-policy): each sender's fragments wait in a queue of their own, at most its
  share of the buffer's queue (queueFragments / active senders). A fragment beyond its sender's
  share pushes out that sender's *own* oldest (reason "over_share", counted per sender); batches
  take the newest fragment of each sender in turn, so a sender that sends more is not served
  more. Nothing is held back while there is room: a sender alone has the whole queue.
- `AdmissionShare` (off-policy): while the replay's rate limiter is turning inserts away (the
  insert budget is contested), a sender may hold at most its share, rounded up, plus one of the last WINDOW
  fragments admitted; beyond that its fragments are dropped before they can spend the budget
  ("over_share"). While the budget is not contested everything is admitted.

Torch-free (the buffer imports it).
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Optional

import numpy as np

from tianji.runtime.storage import Fragment, RolloutQueue, fragment_nbytes, fragment_samples

ACTIVE_S = 10.0  # a sender heard from within this long shares the buffer
WINDOW = 64  # AdmissionShare: fragments admitted that the shares are counted over


class Senders:
    """The senders heard from lately: the number a share divides by."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def touch(self, sender: str, now: float) -> None:
        self.seen[sender] = now
        if len(self.seen) > 64:  # only the job's actors can send here: keep the dict small anyway
            self.seen = {s: t for s, t in self.seen.items() if now - t <= ACTIVE_S}

    def active(self, now: float) -> int:
        return max(1, sum(1 for t in self.seen.values() if now - t <= ACTIVE_S))


class SenderQueues:
    """The on-policy queue, one queue per sender (see the module's docstring); bounded in fragments
    and (`max_bytes`) in bytes overall, as RolloutQueue is."""

    def __init__(self, max_fragments: int, max_bytes: Optional[int] = None):
        if max_fragments < 1:
            raise ValueError("max_fragments must be >= 1")
        self.max_fragments, self.max_bytes = max_fragments, max_bytes
        self.q: dict[str, deque] = {}
        self.nbytes = 0
        self.senders = Senders()
        self.turn = 0  # whose newest fragment a batch takes first
        self.over_share: Counter = Counter()  # samples dropped over share, per sender

    def __len__(self) -> int:
        return sum(len(d) for d in self.q.values())

    def samples(self) -> int:
        return sum(fragment_samples(f) for d in self.q.values() for f in d)

    def share(self, now: float) -> int:
        return max(1, self.max_fragments // self.senders.active(now))

    def _pop_oldest(self, d: deque) -> int:
        f = d.popleft()
        self.nbytes -= fragment_nbytes(f)
        return fragment_samples(f)

    def put(self, sender: str, frag: Fragment, now: float) -> tuple[int, int]:
        """Queue `frag` from `sender`: (samples it dropped of its own, over its share; samples dropped
        to keep the overall bound, from whoever holds the most)."""
        self.senders.touch(sender, now)
        d = self.q.setdefault(sender, deque())
        d.append(frag)
        self.nbytes += fragment_nbytes(frag)
        over = 0
        share = self.share(now)
        while len(d) > share:
            over += self._pop_oldest(d)
        if over:
            self.over_share[sender] += over
        overflow = 0
        while len(self) > self.max_fragments or (self.max_bytes is not None and self.nbytes > self.max_bytes
                                                 and len(self) > 1):
            overflow += self._pop_oldest(max(self.q.values(), key=len))  # a share that shrank as senders joined
        return over, overflow

    def drop_stale(self, learner_version: int, max_lag: Optional[int]) -> int:
        """Drop fragments whose lag exceeds max_lag; returns the samples dropped."""
        if max_lag is None:
            return 0
        dropped = 0
        for s, d in self.q.items():
            keep = deque(f for f in d if learner_version - f["version"] <= max_lag)
            dropped += sum(fragment_samples(f) for f in d) - sum(fragment_samples(f) for f in keep)
            self.q[s] = keep
        self.nbytes = sum(fragment_nbytes(f) for d in self.q.values() for f in d)
        return dropped

    def pop_batch(self, fragments: int) -> Optional[dict[str, np.ndarray]]:
        """`fragments` fragments, the newest of each sender in turn, concatenated on the env axis
        (as RolloutQueue.pop_batch), or None if too few are queued."""
        if fragments < 1 or len(self) < fragments:
            return None
        batch = RolloutQueue(fragments)
        order = sorted(self.q)
        while len(batch) < fragments:
            live = [s for s in order if self.q[s]]
            d = self.q[live[self.turn % len(live)]]
            self.turn += 1
            f = d.pop()
            self.nbytes -= fragment_nbytes(f)
            batch.put(f)
        self.q = {s: d for s, d in self.q.items() if d}
        return batch.pop_batch(fragments)


def share_limit(active: int) -> int:
    """AdmissionShare: the most of the last WINDOW fragments one of `active` senders may hold while
    the budget is contested, its share rounded up and one more. With WINDOW // active instead (21
    of 64 for 3 senders, 63 in all) some honest sender always held more than that, so equal actors
    were dropped "over_share" for ACTIVE_S after any refusal: CartPole DQN with 3 actors lost 3.7k
    samples so in its first 15 s, and pacing read the drops as waste and slowed every actor."""
    return -(-WINDOW // max(active, 1)) + 1


class AdmissionShare:
    """Off-policy admission while the insert budget is contested (see the module's docstring)."""

    def __init__(self) -> None:
        self.recent: deque = deque()
        self.counts: Counter = Counter()
        self.senders = Senders()
        self.contested_at = -float("inf")  # when the rate limiter last turned an insert away
        self.over_share: Counter = Counter()

    def refused(self, now: float) -> None:
        """The rate limiter turned an insert away: the budget is contested for a while."""
        self.contested_at = now

    def admit(self, sender: str, samples: int, now: float) -> bool:
        """May `sender`'s fragment try the rate limiter? False: it is over its share (counted)."""
        self.senders.touch(sender, now)
        if now - self.contested_at <= ACTIVE_S and self.counts[sender] > share_limit(self.senders.active(now)):
            self.over_share[sender] += samples
            return False
        return True

    def admitted(self, sender: str) -> None:
        """The fragment was inserted: it counts toward its sender's share."""
        self.recent.append(sender)
        self.counts[sender] += 1
        if len(self.recent) > WINDOW:
            old = self.recent.popleft()
            self.counts[old] -= 1
