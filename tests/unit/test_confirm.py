"""The operator's confirming evaluation, worker side: a learner serves its checkpoints on its
metrics port (GET /checkpoint/<name>), and `tianji confirm` downloads one, checks its SHA-256 and
evaluates it as `tianji run`'s target check does."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from tianji.cli import build_parser
from tianji.control.contracts.launch import ENV_TERMINATION_LOG
from tianji.observability.metrics import serve_registry
from tianji.runtime import checkpoint
from tianji.runtime.roles.learner import Learner


@pytest.fixture
def ckpt(dqn_checkpoint):
    """tests/unit/conftest.py's checkpoint, where a learner keeps it (checkpoints/0-0)."""
    return dqn_checkpoint


@pytest.fixture
def learner_http(ckpt):
    """serve_registry as a learner's worker starts it: Learner.checkpoint_bytes over its ckpt_dir."""
    learner = SimpleNamespace(ckpt_dir=ckpt.parent)
    server = serve_registry(CollectorRegistry(), 0, "127.0.0.1", report=lambda: b"{}",
                            checkpoint=functools.partial(Learner.checkpoint_bytes, learner))
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        return e.code, b"", ""


def test_a_learner_serves_its_checkpoints_by_name_and_nothing_else(learner_http, ckpt, tmp_path):
    code, body, ctype = _get(f"{learner_http}/checkpoint/{ckpt.name}")
    assert (code, body, ctype) == (200, ckpt.read_bytes(), "application/octet-stream")
    (tmp_path / "checkpoints" / "x").write_bytes(b"secret")
    (ckpt.parent / "ckpt-000000000009.pt").symlink_to(tmp_path / "checkpoints" / "x")
    for name in ("../x", "..%2Fx", "ckpt-1.pt", "ckpt-000000000008.pt", "ckpt-000000000009.pt",
                 f"{ckpt.name}%0A", f"../0-0/{ckpt.name}", ""):
        assert _get(f"{learner_http}/checkpoint/{name}")[0] == 404, name
    assert _get(f"{learner_http}/report")[0] == 200 and _get(f"{learner_http}/metrics")[0] == 200
    assert _get(f"{learner_http}/fabric")[0] == 404
    # the function itself: the name is the whole check, and there is nothing without a directory
    assert checkpoint.read_named(ckpt.parent, ckpt.name + "\n") is None
    assert checkpoint.read_named(None, ckpt.name) is None
    assert Learner.checkpoint_bytes(SimpleNamespace(ckpt_dir=ckpt.parent), ckpt.name) == ckpt.read_bytes()
    # a role without `checkpoint` (every other role) has no such route
    server = serve_registry(CollectorRegistry(), 0, "127.0.0.1")
    try:
        assert _get(f"http://127.0.0.1:{server.server_address[1]}/checkpoint/{ckpt.name}")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_confirm_downloads_checks_and_evaluates_a_learners_checkpoint(learner_http, ckpt, tmp_path):
    log = tmp_path / "termination-log"
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    url = f"{learner_http}/checkpoint/{ckpt.name}"
    p = subprocess.run([sys.executable, "-m", "tianji.cli", "confirm", "--url", url, "--sha256", digest,
                        "--episodes", "4", "--seed", "3", "--step-cap", "1000",
                        "--epsilon", "0"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, ENV_TERMINATION_LOG: str(log)})
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip())
    assert p.stdout.count("\n") == 1
    assert (res["checkpoint"], res["sha256"], res["policy_version"], res["episodes"]) == (ckpt.name, digest, 7, 4)
    assert res["epsilon"] == 0 and 8 <= res["mean_return"] <= 12  # always left: the pole falls in ~10 steps
    assert json.loads(log.read_text()) == res and len(log.read_bytes()) < 4096


@pytest.fixture
def no_evaluation(monkeypatch):
    """In this process: no prctl on pytest, and a record of any evaluation (there must be none)."""
    from tianji.runtime import evaluation, security

    calls = []
    monkeypatch.setattr(security, "forbid_inspection", lambda: False)
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: calls.append(a) or {})
    return calls


def _confirm(url: str, digest: str, log, monkeypatch, *extra: str) -> int:
    monkeypatch.setenv(ENV_TERMINATION_LOG, str(log))
    a = build_parser().parse_args(["confirm", "--url", url, "--sha256", digest, "--episodes", "2", "--seed", "1",
                                   *extra])
    return a.fn(a)


def test_a_wrong_digest_is_not_evaluated(learner_http, ckpt, tmp_path, monkeypatch, capsys, no_evaluation):
    log = tmp_path / "termination-log"
    assert _confirm(f"{learner_http}/checkpoint/{ckpt.name}", "0" * 64, log, monkeypatch) == 1
    assert not no_evaluation and capsys.readouterr().out == ""
    assert "SHA-256" in json.loads(log.read_text())["error"]
    assert _confirm(f"{learner_http}/checkpoint/ckpt-000000000008.pt", "0" * 64, log, monkeypatch) == 1
    assert "HTTP 404" in json.loads(log.read_text())["error"] and not no_evaluation
    assert capsys.readouterr().err.startswith("tianji confirm: ")
    assert _confirm(f"file://{ckpt}", "0" * 64, log, monkeypatch) == 1
    assert "not an http:// URL" in json.loads(log.read_text())["error"] and not no_evaluation


class _Unannounced(BaseHTTPRequestHandler):
    """A body with no Content-Length (HTTP/1.0: it ends when the connection closes)."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"x" * 5000)

    def log_message(self, *args) -> None:
        pass


def _serve(handler) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_body_over_max_bytes_is_refused(ckpt, tmp_path, monkeypatch, no_evaluation):
    log = tmp_path / "termination-log"
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    size = ckpt.stat().st_size
    files = _serve(functools.partial(SimpleHTTPRequestHandler, directory=str(ckpt.parent)))
    unannounced = _serve(_Unannounced)
    try:
        url = f"http://127.0.0.1:{files.server_address[1]}/{ckpt.name}"
        assert _confirm(url, digest, log, monkeypatch, "--max-bytes", str(size - 1)) == 1
        assert "--max-bytes" in json.loads(log.read_text())["error"] and not no_evaluation
        url = f"http://127.0.0.1:{unannounced.server_address[1]}/ckpt-000000000001.pt"
        assert _confirm(url, "0" * 64, log, monkeypatch, "--max-bytes", "4096") == 1
        assert "more than --max-bytes 4096" in json.loads(log.read_text())["error"] and not no_evaluation
        # exactly the limit is not over it: then the digest decides
        assert _confirm(url, "0" * 64, log, monkeypatch, "--max-bytes", "5000") == 1
        assert "SHA-256" in json.loads(log.read_text())["error"]
    finally:
        for s in (files, unannounced):
            s.shutdown()
            s.server_close()
