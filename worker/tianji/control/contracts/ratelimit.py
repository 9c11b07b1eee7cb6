"""The replay buffer's sample-to-insert rate limiter (after Reverb's SampleToInsertRatio).

Reverb blocks the caller that would break the ratio. TianJi's roles never
wait on each other, so the two refusals become: a batch the buffer does not
send yet (the learner gets it later), and an insert the buffer refuses (its
samples are dropped and counted with reason "ratio"; actor pacing then slows
production, see runtime/pacing.py).

Torch-free and socket-free: the buffer owns one, the tests drive it directly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampleToInsertRatio:
    """Hold samples / inserts near `samples_per_insert`, counted from the learning start.

    Two stages. Stage 1 (fewer than `min_size_to_sample` inserts): every insert
    is taken, no sample is allowed. Stage 2: with I inserts and S samples so far,

        diff = I * samples_per_insert - S
        lo   = samples_per_insert * min_size_to_sample - error_buffer
        hi   = samples_per_insert * min_size_to_sample + error_buffer

    a request of s samples is allowed iff diff - s >= lo, and an insert of n
    samples iff diff + n * samples_per_insert <= hi. So lo <= diff <= hi
    throughout stage 2 (once the insert that crossed min_size_to_sample, at
    most insert_size samples, has been sampled down), and the realised replay ratio since the learning
    start,

        ratio = S / (I - min_size_to_sample),

    lies within samples_per_insert ± error_buffer / (I - min_size_to_sample):
    the allowance is bounded (a learner stall cannot bank more than
    2 * error_buffer samples for a later burst) and the band narrows as the run goes on.

    Deadlock: samples come in requests of `sample_size`, inserts in chunks of
    up to `insert_size`. If hi - lo < sample_size + insert_size * samples_per_insert,
    there is a diff at which neither a request nor an insert fits, and
    nothing could ever move it again; the constructor refuses such settings
    (Reverb's own check is the special case sample_size = insert_size = 1).
    """

    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float
    sample_size: int = 1
    insert_size: int = 1

    def __post_init__(self) -> None:
        if not self.samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {self.samples_per_insert!r}")
        if self.min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {self.min_size_to_sample}")
        if self.sample_size < 1 or self.insert_size < 1:
            raise ValueError("sample_size and insert_size must be >= 1")
        need = (self.sample_size + self.insert_size * self.samples_per_insert) / 2
        if not self.error_buffer >= need:
            raise ValueError(
                f"error_buffer {self.error_buffer:g} < (sample_size {self.sample_size} + insert_size "
                f"{self.insert_size} x samples_per_insert {self.samples_per_insert:g}) / 2 = {need:g}: "
                "the limiter could reach a state where neither a sample nor an insert is allowed"
            )
        offset = self.samples_per_insert * self.min_size_to_sample
        self.lo, self.hi = offset - self.error_buffer, offset + self.error_buffer
        self.inserts = 0  # every insert taken, stage 1 included
        self.samples = 0

    @classmethod
    def for_replay(
        cls,
        samples_per_insert: float,
        learning_starts: int,
        batch: int,
        fragment: int,
        error_buffer: float | None = None,
    ) -> SampleToInsertRatio:
        """The buffer's limiter: requests of `batch` samples, inserts of at most `fragment`
        samples; the default error buffer is twice the smallest deadlock-free one."""
        if error_buffer is None:
            error_buffer = batch + fragment * samples_per_insert
        return cls(samples_per_insert, max(1, learning_starts), error_buffer, batch, fragment)

    def preload(self, n: int) -> int:
        """Count transitions a buffer already holds at start (a resumed replay snapshot) toward
        `min_size_to_sample`, at most up to it: with learningStarts of them the learner may train
        at once, with fewer only the rest must come in first. The ratio is still counted from the
        learning start (inserts beyond it), so the snapshot adds no allowance beyond error_buffer.
        Returns the inserts counted."""
        if n < 0:
            raise ValueError("negative preload")
        if self.inserts or self.samples:
            raise ValueError("preload only before the first insert or sample")
        self.inserts = min(n, self.min_size_to_sample)
        return self.inserts

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    @property
    def sampling(self) -> bool:
        """Stage 2: enough inserts to sample."""
        return self.inserts >= self.min_size_to_sample

    def can_insert(self, n: int) -> bool:
        return not self.sampling or self.diff + n * self.samples_per_insert <= self.hi

    def insert(self, n: int) -> bool:
        """Count an insert of n samples if allowed; False: refused (the caller drops them)."""
        if n < 0:
            raise ValueError("negative insert")
        if not self.can_insert(n):
            return False
        self.inserts += n
        return True

    def can_sample(self, n: int) -> bool:
        return self.sampling and self.diff - n >= self.lo

    def sample(self, n: int) -> bool:
        """Count a request of n samples if allowed."""
        if not self.can_sample(n):
            return False
        self.samples += n
        return True

    def realised_ratio(self) -> float | None:
        """Samples per insert since the learning start (None before it has inserts to count)."""
        after = self.inserts - self.min_size_to_sample
        return self.samples / after if after > 0 else None
