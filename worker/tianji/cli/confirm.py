"""`tianji confirm`: the confirming evaluation of a learner's checkpoint, in a pod of its own.

The Kubernetes counterpart of local/targetcheck.py's evaluation process: the operator starts it
when the actors' returns meet stop.meanReturn, with the URL of the checkpoint the learner reported
(its metrics port serves them at /checkpoint/<name>) and the SHA-256 the learner reported with it.

    tianji confirm --url URL --sha256 HEX --episodes N --seed S [--step-cap C] [--epsilon E]
                   [--max-bytes B]

It makes itself non-inspectable first (targetcheck.isolate), downloads URL (http only, no
redirects, TIMEOUT_S per read, at most --max-bytes), refuses bytes whose SHA-256 is not HEX, and
evaluates them from a sealed in-memory copy (targetcheck.sealed_bytes) as targetcheck does
(runtime/evaluation.evaluate: the job manifest from the checkpoint, read by checkpoint.load with
torch.load(weights_only=True); the downloaded bytes are never unpickled otherwise). Its result,
one JSON line on stdout and, where TIANJI_TERMINATION_LOG names a file, that file (the pod's
termination message, which the operator reads): evaluate()'s dict with `checkpoint` (the URL's
last path component) and `sha256`. Exit 0; on any failure `tianji confirm: <why>` on stderr,
{"error": "<why>"} in the termination log, exit 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from tianji.control.contracts.confirm import MIN_STEP_CAP, SEED, STEP_CAP_FACTOR, parse_result
from tianji.control.contracts.launch import ENV_TERMINATION_LOG, TERMINATION_MESSAGE_MAX
from tianji.local.targetcheck import isolate, sealed_bytes

TIMEOUT_S = 60.0
DEFAULT_MAX_BYTES = 4 << 30
CHUNK = 1 << 20
THREADS = 1  # a pod of its own with a small CPU request; evaluate() plays on one thread too
RESULT_KEYS = ("checkpoint", "sha256", "job", "env", "policy_version", "episodes", "epsilon", "mean_return",
               "std_return", "min_return", "max_return", "mean_length")


class ConfirmError(Exception):
    """Why the checkpoint was not evaluated, or its evaluation failed (one line)."""


def _sha256_hex(text: str) -> str:
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 (64 hex digits)")
    return text.lower()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="http://HOST:PORT/checkpoint/ckpt-<version>.pt (a learner's "
                                                "metrics port)")
    p.add_argument("--sha256", required=True, type=_sha256_hex, help="the checkpoint's SHA-256 as the learner "
                                                                     "reported it: other bytes are not evaluated")
    p.add_argument("--episodes", type=int, required=True)
    p.add_argument("--seed", type=int, required=True, help=f"the local engine uses {SEED}: apart from every "
                                                           "actor's and the evaluator's seeds")
    p.add_argument("--step-cap", type=int, default=None,
                   help=f"cut an episode after this many steps (the local engine: {STEP_CAP_FACTOR} x the actors' "
                        f"mean episode length, at least {MIN_STEP_CAP})")
    p.add_argument("--epsilon", type=float, default=None, help="DQN's ε (default: evaluate()'s)")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                   help="refuse a checkpoint larger than this (default 4 GiB)")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


def download(url: str, max_bytes: int, timeout: float = TIMEOUT_S) -> bytes:
    """The body of `url` (http only, no proxy, no redirect); ConfirmError past `max_bytes`, by its
    Content-Length or while reading, or where fewer bytes come than it announced."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfirmError(f"{url!r} is not an http:// URL")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(url, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None:
                try:
                    length = int(length)
                except ValueError:
                    raise ConfirmError(f"{url}: Content-Length {length!r}") from None
                if length > max_bytes:
                    raise ConfirmError(f"{url}: {length} bytes, more than --max-bytes {max_bytes}")
            data = bytearray()
            while chunk := resp.read(min(CHUNK, max_bytes + 1 - len(data))):
                data += chunk
                if len(data) > max_bytes:
                    raise ConfirmError(f"{url}: more than --max-bytes {max_bytes} bytes")
    except urllib.error.HTTPError as e:
        raise ConfirmError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise ConfirmError(f"{url}: {e.reason}") from None
    except (OSError, ValueError) as e:  # timeouts, resets, http.client's IncompleteRead and friends
        raise ConfirmError(f"{url}: {type(e).__name__}: {e}") from None
    if length is not None and len(data) != length:
        raise ConfirmError(f"{url}: {len(data)} bytes, not the {length} announced")
    return bytes(data)


def confirm(a: argparse.Namespace) -> dict:
    """Download, check, evaluate: the result (ConfirmError on any failure)."""
    name = urllib.parse.urlsplit(a.url).path.rsplit("/", 1)[-1][:255]
    try:
        isolate()
    except Exception as e:  # a debugger attached before we could forbid it
        raise ConfirmError(str(e)) from None
    data = download(a.url, a.max_bytes)
    digest = hashlib.sha256(data).hexdigest()
    if digest != a.sha256:
        raise ConfirmError(f"{name}: its SHA-256 is {digest}, not {a.sha256}: not evaluated")
    fd = sealed_bytes(data)
    del data
    if fd is None:
        raise ConfirmError("no memfd here to hold a sealed copy of the checkpoint: not evaluated")
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    try:
        import torch

        torch.set_num_threads(THREADS)
        try:
            torch.set_num_interop_threads(THREADS)
        except RuntimeError:  # already set
            pass
        from tianji.runtime.evaluation import evaluate

        res = evaluate(Path(f"/dev/fd/{fd}"), a.episodes, a.seed, a.epsilon, step_cap=a.step_cap)
        parse_result(json.dumps(res))  # finite returns, whole counts: as every answer is checked
    except Exception as e:  # a bad checkpoint, manifest or env: the evaluation failed, whatever the error
        raise ConfirmError(f"the evaluation of {name} failed: {type(e).__name__}: {e}") from None
    finally:
        os.close(fd)
    return {**res, "checkpoint": name, "sha256": digest}


def _encode(doc: dict) -> bytes:
    """Compact JSON in at most TERMINATION_MESSAGE_MAX bytes (the kubelet keeps no more)."""
    out = json.dumps(doc, separators=(",", ":")).encode()
    if len(out) > TERMINATION_MESSAGE_MAX and "error" in doc:
        out = json.dumps({"error": doc["error"][:TERMINATION_MESSAGE_MAX // 2]}, separators=(",", ":")).encode()
    elif len(out) > TERMINATION_MESSAGE_MAX:
        out = json.dumps({k: doc[k] for k in RESULT_KEYS if k in doc}, separators=(",", ":")).encode()
    return out


def _termination_log(out: bytes) -> None:
    path = os.environ.get(ENV_TERMINATION_LOG)
    if not path:
        return
    try:
        with open(path, "wb") as f:
            f.write(out)
    except OSError as e:  # stdout still has the result (the pod's log)
        print(f"tianji confirm: cannot write {path}: {e}", file=sys.stderr)


def confirm_command(a: argparse.Namespace) -> int:
    why: Optional[str] = None
    try:
        res = confirm(a)
    except ConfirmError as e:
        why = str(e)
    if why is not None:
        print(f"tianji confirm: {why}", file=sys.stderr)
        _termination_log(_encode({"error": why}))
        return 1
    out = _encode(res)
    print(out.decode(), flush=True)
    _termination_log(out)
    return 0
