"""TianJi's wire vs raw pyzmq, PUSH/PULL, ipc:// and tcp://127.0.0.1, 4 KB ... 2 MB.

    python -m bench.transport [--sizes 4096,65536,...] [--reps 3] [--seconds 0.3] [--encryption curve]
                              [--compare wire.py]
    python -m bench.transport --experiment collection [--png collection.png]   # the paper's Fig. 5

`--encryption curve` runs every transfer (raw and wire alike) over CurveZMQ with a key pair per
side and a ZAP handler mapping keys to identities, as a job with `spec.network.encryption: curve`
does; compare its MB/s and CPU µs per message with a run under `--encryption none` (the default).
The mode `wire` also pays what a role adds per message (docs/security.md): the sender numbers
each message (runtime/replayguard.next_seq), the receiver checks the sender against the key's
identity (ZAP's User-Id, with curve) and refuses replays (SeqGuard). `base` (--compare) does not:
with main's wire.py it is the before of the same run.

For every message size and transport, side by side in one run:

- raw : the sender sends one S-byte buffer per message (zero-copy), the
        receiver takes it (zero-copy): no encoding, the ceiling pyzmq itself allows;
- wire: the sender builds each message with `tianji.runtime.wire.encode` (msgpack header
        + one uint8 array of S bytes, as an actor does per fragment) and sends
        it zero-copy; the receiver runs `tianji.runtime.wire.decode` with validation
        (job, kind, dtype, shape x itemsize == frame length, size caps).

- base: with `--compare PATH`, the same as wire with another wire.py (e.g. main's, from
        `git show main:worker/tianji/runtime/wire.py`): before/after in one run. Given a copy
        of the wire under test, it measures the noise floor (an A/A test: ideally equal).

The sender is another process (fork). Throughput counts payload bytes only,
timed from the first message received to the last. Each pair is repeated
`--reps` times, interleaved (raw, wire, base, then base, wire, raw, ...) so that load
from other work on the machine hits all alike; the median is reported, with the
ratio wire/raw. On a shared machine throughput is noisy (+-30 % between
repetitions), so the CPU time per message of the sending and of the receiving
process (all threads, ZeroMQ's I/O thread included, via getrusage) is reported too:
`cpu_ratio` = max(raw send, raw recv) / max(wire send, wire recv) is the throughput ratio
to expect when the slower side is CPU-bound. Each of the four is the least over the reps
(as timeit takes the best time: load only adds CPU per message, through wake-ups and
cache misses); the median and range of the same ratio taken rep by rep are reported
beside it, and the Python thread's own CPU per message (time.thread_time, I/O threads
excluded) as `send_thread` / `recv_thread`. Also reported: the in-process CPU cost of
encode and decode per message.

Both sides run with the workers' malloc settings (GLIBC_TUNABLES from control/contracts/launch.py,
which every worker gets), unless `--malloc glibc`: with glibc's defaults a receiver of
multi-MB messages returns their pages to the OS and faults them back in, which shows as
`recv_page_faults_per_msg` and costs more than the wire itself (see --malloc glibc).

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import zmq

from bench.harness import emit, host, stamp

# Received zero-copy messages are malloc'ed per message by libzmq; with glibc's defaults a
# receiver that holds each one for a few µs makes the heap trim and re-fault MB-sized buffers.
from tianji.control.contracts.launch import MALLOC_TUNABLES as TUNED_MALLOC  # what the launcher gives workers
from tianji.runtime import wire as _wire

encode, decode, send_frames, recv_frames = _wire.encode, _wire.decode, _wire.send, _wire.recv


def _load_wire(path: str, name: str = "wire_under_test") -> tuple:
    """(encode, send, recv, decode) of another implementation of the wire (same API)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return (mod.encode, getattr(mod, "send", lambda s, frames: s.send_multipart(frames, copy=False)),
            getattr(mod, "recv", lambda s: s.recv_multipart(copy=False)), mod.decode)


def _use_wire_module(path: str) -> None:
    """Benchmark another implementation of the wire (same API), e.g. a proposed change."""
    global encode, decode, send_frames, recv_frames
    encode, send_frames, recv_frames, decode = _load_wire(path)


# mode -> (encode, send, recv, decode); "wire" is the wire under test, "base" the one of --compare
WIRES: dict = {}

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20]
COLLECTION_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20]
HWM = 64
JOB = "bench"


RECV_TIMEOUT_S = 10.0
PER_MESSAGE_GUESS_S = 50e-6  # Python + pyzmq cost per message, for sizing transfers only


def _count(size: int, seconds: float, rate_guess: float) -> int:
    """Messages for about `seconds` at `rate_guess` B/s plus a per-message cost, at least 200."""
    return int(max(200, min(50_000, seconds / (size / rate_guess + PER_MESSAGE_GUESS_S))))


def _cpu() -> float:
    """CPU seconds of this process, all threads (ZeroMQ's I/O thread included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


CURVE_KEYS = None  # {"actor-0-0": Keyring, "buffer-0-0": Keyring}: set by --encryption curve (before the senders fork)


class _Trust:
    """What roles/base.py adds per message on the receiving side: sender identity, then replay."""

    def __init__(self) -> None:
        from tianji.runtime import security
        from tianji.runtime.replayguard import SeqGuard

        self.guard, self.covers, self.identity = SeqGuard(), security.covers, security.sender_identity

    def check(self, msg, head) -> None:
        if CURVE_KEYS is not None and not self.covers(self.identity(head), msg.sender):
            raise RuntimeError(f"{msg.sender} not covered by its key")
        self.guard.accept(msg.sender, msg.seq)


def _sender(addr: str, mode: str, size: int, n: int, done, cpu_q) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, HWM)
    if CURVE_KEYS is not None:
        from tianji.runtime.security import Curve

        Curve(ctx, CURVE_KEYS["actor-0-0"]).client(s, "buffer-0-0")
    s.connect(addr)
    arr = np.frombuffer(np.random.bytes(size), dtype=np.uint8)
    c0, t0 = _cpu(), time.thread_time()
    if mode == "raw":
        for _ in range(n):
            s.send(arr, copy=False)
    elif mode == "wire":  # numbered as a role numbers its messages
        from tianji.runtime.replayguard import next_seq

        encode, send_frames = WIRES[mode][:2]
        seq = 0
        for _ in range(n):
            seq = next_seq(seq)
            send_frames(s, encode("fragment", JOB, "actor-0-0", seq, 7, {"obs": arr}, {"frames": 256}))
    else:
        encode, send_frames = WIRES[mode][:2]
        for i in range(n):
            send_frames(s, encode("fragment", JOB, "actor-0-0", i, 7, {"obs": arr}, {"frames": 256}))
    # Close only after the receiver has everything: libzmq 4.3 can lose the last queued
    # messages of an ipc PUSH with a send HWM at close despite linger (cf. zeromq/libzmq#4660).
    py = time.thread_time() - t0
    done.wait(RECV_TIMEOUT_S)
    cpu_q.put((_cpu() - c0, py))
    s.close(linger=0)
    ctx.term()


class Stalled(RuntimeError):
    """A transfer stopped mid-stream (seen rarely on this loaded 2-core machine); it is retried."""


def _run_retry(addr_base: str, mode: str, size: int, n: int, stalls: list) -> tuple[float, ...]:
    for _ in range(3):
        try:
            return _run(addr_base, mode, size, n)
        except Stalled as e:
            stalls.append(str(e))
            print(f"  stalled, retrying: {e}", file=sys.stderr)
    raise RuntimeError(f"{mode} {size} B: stalled 3 times")


def _run(addr_base: str, mode: str, size: int, n: int) -> tuple[float, ...]:
    """Payload MB/s of one transfer of n messages (timed from the first one received), the
    CPU µs per message of the sending and of the receiving process (all threads), the
    receiver's minor page faults per message (glibc returning freed message buffers to the OS
    and faulting them back in shows here), and the CPU µs per message of the sending and of
    the receiving Python thread alone (ZeroMQ's I/O threads and pyzmq's gc thread excluded)."""
    ctx = zmq.Context()
    curve = None
    r = ctx.socket(zmq.PULL)
    r.setsockopt(zmq.RCVHWM, HWM)
    if CURVE_KEYS is not None:
        from tianji.runtime.security import Curve

        curve = Curve(ctx, CURVE_KEYS["buffer-0-0"])
        curve.server(r)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVTIMEO, int(RECV_TIMEOUT_S * 1000))
    r.bind(addr_base)
    addr = r.getsockopt(zmq.LAST_ENDPOINT).decode()
    mpc = mp.get_context("fork")
    done, cpu_q = mpc.Event(), mpc.Queue()
    p = mpc.Process(target=_sender, args=(addr, mode, size, n, done, cpu_q))
    p.start()
    got = 0
    c0, f0, th0 = _cpu(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
    try:
        if mode == "raw":
            r.recv(copy=False)
            got = 1
            t0 = time.perf_counter()
            while got < n:
                r.recv(copy=False)
                got += 1
        else:
            recv_frames, decode = WIRES[mode][2:]
            trust = _Trust().check if mode == "wire" else None
            decode(recv_frames(r), job=JOB)
            got = 1
            t0 = time.perf_counter()
            while got < n:
                frames = recv_frames(r)
                msg = decode(frames, job=JOB)
                if trust is not None:
                    trust(msg, frames[0])
                del frames
                if msg.arrays["obs"].nbytes != size:
                    raise RuntimeError("payload size mismatch")
                # Release before the next receive, as the raw loop does: holding two multi-MB
                # zero-copy buffers makes glibc unmap/trim and re-fault pages on every message,
                # a cost of keeping data (any receiver that stores it pays it), not of the wire.
                del msg
                got += 1
        dt = time.perf_counter() - t0
        recv_cpu, recv_py = _cpu() - c0, time.thread_time() - th0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        done.set()
        send_cpu, send_py = cpu_q.get(timeout=RECV_TIMEOUT_S)
    except zmq.Again:
        raise Stalled(f"{mode} {size} B: nothing received for {RECV_TIMEOUT_S:g}s after {got} of {n}") from None
    finally:
        done.set()
        p.join(timeout=RECV_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()
        r.close()
        if curve is not None:
            curve.close()
        ctx.term()
    return ((n - 1) * size / dt / 1e6, send_cpu / n * 1e6, recv_cpu / n * 1e6, faults / n,
            send_py / n * 1e6, recv_py / n * 1e6)


def _med(runs: list, i: int) -> float:
    return statistics.median(x[i] for x in runs)


def _cpu_us(runs: list) -> dict:
    return {"send": round(_med(runs, 1), 1), "recv": round(_med(runs, 2), 1),
            "send_best": round(min(x[1] for x in runs), 1), "recv_best": round(min(x[2] for x in runs), 1),
            "send_thread": round(_med(runs, 4), 1), "recv_thread": round(_med(runs, 5), 1),
            "all": [[round(x[1], 1), round(x[2], 1)] for x in runs]}


def _min_cpu_us(fn, reps: int, chunks: int = 10) -> float:
    """CPU µs per call of this thread (time.thread_time: time spent descheduled on a loaded
    machine is not counted), best of `chunks` chunks of reps // chunks calls."""
    k = max(1, reps // chunks)
    best = math.inf
    for _ in range(chunks):
        t0 = time.thread_time()
        for _ in range(k):
            fn()
        best = min(best, (time.thread_time() - t0) / k)
    return best * 1e6


def overhead_us(size: int = 4096, reps: int = 20_000, fns: tuple | None = None) -> dict:
    """CPU µs per message of encode and of decode (validation included), in process; decode of
    zmq.Frames received zero-copy, as a receiver gets them. `fns`: (encode, send, recv, decode)
    of another wire."""
    encode, send_frames, recv_frames, decode = fns or (globals()["encode"], globals()["send_frames"],
                                                        globals()["recv_frames"], globals()["decode"])
    arr = np.zeros(size, dtype=np.uint8)
    meta = {"frames": 256}
    # a realistic PPO CartPole fragment: 8 arrays
    T, n = 32, 4
    frag = {"obs": np.zeros((T, n, 4), np.float32), "actions": np.zeros((T, n), np.int64),
            "logp": np.zeros((T, n), np.float32), "rewards": np.zeros((T, n), np.float32),
            "dones": np.zeros((T, n), bool), "terminated": np.zeros((T, n), bool), "valid": np.ones((T, n), bool),
            "last_obs": np.zeros((n, 4), np.float32)}
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://overhead")
    b.connect("inproc://overhead")
    out = {}
    for label, arrays, r in (("1_array", {"obs": arr}, reps), ("8_arrays", frag, reps // 4)):
        out[f"encode_{label}_us"] = _min_cpu_us(
            lambda arrays=arrays: encode("fragment", JOB, "actor-0-0", 1, 7, arrays, meta), r)
        send_frames(a, encode("fragment", JOB, "actor-0-0", 1, 7, arrays, meta))
        frames = recv_frames(b)
        out[f"decode_{label}_us"] = _min_cpu_us(lambda frames=frames: decode(frames, job=JOB), r)
    a.close()
    b.close()
    ctx.term()
    return out


def _reexec(argv) -> None:
    """Start this benchmark again in a fresh interpreter with the same arguments (and the
    environment as changed), as `python -m bench.transport`."""
    os.execv(sys.executable, [sys.executable, "-m", "bench.transport", *(argv if argv is not None else sys.argv[1:])])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", choices=("transport", "collection"), default="transport",
                    help="transport: wire vs raw throughput and CPU (default); collection: the paper's Fig. 5, "
                         "time to receive --samples samples against message size and actor count "
                         "(bench.collection_time)")
    ap.add_argument("--sizes", help="message sizes in bytes (default: transport "
                    f"{','.join(str(s) for s in DEFAULT_SIZES)}; collection "
                    f"{','.join(str(s) for s in COLLECTION_SIZES)})")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions per pair (median reported)")
    ap.add_argument("--seconds", type=float, default=0.3, help="approximate seconds per transfer")
    ap.add_argument("--transports", default="ipc,tcp")
    ap.add_argument("--samples", type=int, default=10_000, help="collection: samples to receive per point")
    ap.add_argument("--budget-mb", type=float, default=1000.0,
                    help="collection (a): MB streamed per point at most; time to --samples is scaled from it")
    ap.add_argument("--actors", default="1,2,4,8,16", help="collection (b): actor counts")
    ap.add_argument("--sims", default="0.001,0.01", help="collection (b): simulated env seconds per sample")
    ap.add_argument("--collect-size", type=int, default=512 << 10, help="collection (b): bytes per sample")
    ap.add_argument("--samples-b", type=int, default=500,
                    help="collection (b): samples streamed per point (time to --samples is scaled from it)")
    ap.add_argument("--png", help="collection: write the figure here (default: no figure)")
    ap.add_argument("--compare", help="path of another wire.py (e.g. `git show main:worker/tianji/runtime/wire.py`) "
                    "to run as mode 'base' beside the wire under test, interleaved in the same run")
    ap.add_argument("--wire", help="path of an alternative wire.py to benchmark instead of tianji.runtime.wire")
    ap.add_argument("--malloc", choices=("worker", "glibc"), default="worker",
                    help=f"worker (default): GLIBC_TUNABLES={TUNED_MALLOC}, as the launcher and the operator "
                         "start every worker (control/contracts/launch.py); glibc: glibc's defaults")
    ap.add_argument("--tuned-malloc", action="store_true", help="same as --malloc worker (kept for old commands)")
    ap.add_argument("--encryption", choices=("none", "curve"), default="none",
                    help="curve: every transfer over CurveZMQ with a ZAP handler, as spec.network.encryption: curve")
    a = ap.parse_args(argv)
    if a.tuned_malloc:
        a.malloc = "worker"
    if a.malloc == "glibc" and os.environ.get("GLIBC_TUNABLES") == TUNED_MALLOC:
        os.environ.pop("GLIBC_TUNABLES")
        _reexec(argv)
    if a.malloc == "worker" and os.environ.get("GLIBC_TUNABLES") != TUNED_MALLOC:
        os.environ["GLIBC_TUNABLES"] = TUNED_MALLOC  # read by glibc at process start: re-exec
        _reexec(argv)
    if a.wire:
        _use_wire_module(a.wire)
    if a.encryption == "curve":
        global CURVE_KEYS
        from tianji.runtime.security import issue

        CURVE_KEYS = issue(["actor-0-0", "buffer-0-0"])
    if a.experiment == "collection":
        from bench import collection_time

        res = collection_time.run(
            sizes=[int(x) for x in (a.sizes or ",".join(map(str, COLLECTION_SIZES))).split(",") if x],
            actor_counts=[int(x) for x in a.actors.split(",") if x], sims=[float(x) for x in a.sims.split(",") if x],
            size_b=a.collect_size, transports=a.transports.split(","), samples=a.samples,
            budget_bytes=a.budget_mb * 1e6, samples_b=a.samples_b,
            wire_fns=(encode, send_frames, recv_frames, decode), reps=a.reps)
        res = {**stamp("transport", argv), **res}
        res["host"] = host(pyzmq=zmq.pyzmq_version(), libzmq=zmq.zmq_version(), malloc=a.malloc)
        if a.png:
            res["png"] = collection_time.plot(res, a.png)
        emit(res, indent=None)
        return 0
    sizes = [int(x) for x in (a.sizes or ",".join(map(str, DEFAULT_SIZES))).split(",") if x]
    tmp = tempfile.mkdtemp(prefix="tianji-bench-")
    bases = {"ipc": f"ipc://{tmp}/t", "tcp": "tcp://127.0.0.1:*"}
    guess = {"ipc": 3e9, "tcp": 1.2e9}
    WIRES["wire"] = (encode, send_frames, recv_frames, decode)
    if a.compare:
        WIRES["base"] = _load_wire(a.compare, "wire_base")
    modes = ["raw", *WIRES]
    t_start = time.perf_counter()
    rows, stalls = [], []
    for size in sizes:
        for tr in a.transports.split(","):
            n = _count(size, a.seconds, guess[tr])
            runs = {m: [] for m in modes}
            for rep in range(a.reps):
                # interleaved, order reversed every other rep: drift in the machine's load hits all alike
                for m in (modes if rep % 2 == 0 else modes[::-1]):
                    runs[m].append(_run_retry(bases[tr], m, size, n, stalls))
            raw = runs["raw"]
            row = {"bytes": size, "transport": tr, "messages": n, "raw_MBps": round(_med(raw, 0), 1),
                   "raw_cpu_us_per_msg": _cpu_us(raw), "raw_all": [round(x[0]) for x in raw]}
            for m in WIRES:
                w = runs[m]
                # CPU ratio: each side's least CPU per message over the reps, as timeit takes the best
                # time (load only adds CPU: wake-ups, cache misses), raw over wire; beside it the
                # median and range of the ratios per rep (a wire run against the raw run beside it)
                best = lambda xs: (min(x[1] for x in xs), min(x[2] for x in xs))  # noqa: E731
                (rs, rr), (ws, wr) = best(raw), best(w)
                cpu = [max(r[1], r[2]) / max(x[1], x[2]) for r, x in zip(raw, w)]
                mbs = [x[0] / r[0] for r, x in zip(raw, w)]
                p = "" if m == "wire" else f"{m}_"
                row.update({f"{p}wire_MBps": round(_med(w, 0), 1), f"{p}ratio": round(statistics.median(mbs), 3),
                            f"{p}wire_cpu_us_per_msg": _cpu_us(w),
                            f"{p}cpu_ratio": round(max(rs, rr) / max(ws, wr), 3),
                            f"{p}total_cpu_ratio": round((rs + rr) / (ws + wr), 3),
                            f"{p}cpu_ratio_per_rep_median": round(statistics.median(cpu), 3),
                            f"{p}cpu_ratio_per_rep_range": [round(min(cpu), 3), round(max(cpu), 3)],
                            f"{p}wire_all": [round(x[0]) for x in w],
                            f"{p}recv_page_faults_per_msg": round(_med(w, 3), 1)})
            row["raw_recv_page_faults_per_msg"] = round(_med(raw, 3), 1)
            rows.append(row)
            print(f"  {tr} {size:>8} B: raw {row['raw_MBps']:8.0f} MB/s  " + "  ".join(
                f"{m} {row[('' if m == 'wire' else m + '_') + 'wire_MBps']:8.0f} MB/s cpu ratio "
                f"{row[('' if m == 'wire' else m + '_') + 'cpu_ratio']:.3f} "
                f"(per rep {row[('' if m == 'wire' else m + '_') + 'cpu_ratio_per_rep_range']})" for m in WIRES),
                file=sys.stderr)
    try:
        os.rmdir(tmp)
    except OSError:
        pass
    big = [x["ratio"] for x in rows if x["bytes"] >= 64 << 10]
    big_cpu = [x["cpu_ratio"] for x in rows if x["bytes"] >= 64 << 10]
    big_base = [x["base_cpu_ratio"] for x in rows if x["bytes"] >= 64 << 10 and "base_cpu_ratio" in x]
    out = {
        "bench": "transport", **stamp("transport", argv), "wire": a.wire or "tianji.runtime.wire",
        "encryption": a.encryption, "unit": "MB/s of payload (1e6 B/s)", "reps": a.reps, "results": rows,
        "min_ratio_at_ge_64KB": min(big) if big else None,
        "target_ratio_at_ge_64KB": 0.9,
        "meets_target": (min(big) >= 0.9) if big else None,
        "min_cpu_ratio_at_ge_64KB": min(big_cpu) if big_cpu else None,
        "cpu_target_met": (min(big_cpu) >= 0.9) if big_cpu else None,
        **({"compare": a.compare, "base_min_cpu_ratio_at_ge_64KB": min(big_base)} if big_base else {}),
        "stalled_transfers_retried": stalls,
        "wire_overhead_cpu": {k: round(v, 2) for k, v in overhead_us().items()},
        **({"base_wire_overhead_cpu": {k: round(v, 2) for k, v in overhead_us(fns=WIRES["base"]).items()}}
           if "base" in WIRES else {}),
        "host": host(pyzmq=zmq.pyzmq_version(), libzmq=zmq.zmq_version(),
                     glibc_tunables=os.environ.get("GLIBC_TUNABLES")), "malloc": a.malloc,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    emit(out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
