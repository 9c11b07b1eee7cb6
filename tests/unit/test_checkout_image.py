"""The checkout image's layers (cluster/localcluster/checkoutimage.py): what a tar of them holds,
and the key that decides whether a layer is sent again."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from localcluster.checkoutimage import Layer, _entry, _link_chain, _walk


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "opt" / "env"
    (root / "bin").mkdir(parents=True)
    (root / "skip").mkdir()
    (root / "skip" / "big.bin").write_bytes(b"x" * 10)
    tool = root / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o700)  # only its owner could run it here
    secret = root / "data.txt"
    secret.write_text("data")
    secret.chmod(0o600)
    os.symlink("tool", root / "bin" / "alias")
    return root


def _members(layer: Layer) -> dict[str, tarfile.TarInfo]:
    buf = io.BytesIO()
    layer.write(buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_a_layer_is_roots_readable_by_all_with_its_parents(tmp_path):
    root = _tree(tmp_path)
    paths = list(_walk(root, (root / "skip",)))
    extra = [(_entry("/tmp", tarfile.DIRTYPE, 0o1777), b""), (_entry("/etc/passwd", tarfile.REGTYPE, 0o644), b"u\n")]
    got = _members(Layer("t", paths, extra))
    rel = str(root).lstrip("/")
    assert f"{rel}/skip" not in got and f"{rel}/skip/big.bin" not in got
    for parent in Path(rel).parents[:-1]:  # every folder above, made 0755 before what it holds
        assert got[str(parent)].isdir() and got[str(parent)].mode == (0o1777 if str(parent) == "tmp" else 0o755)
    assert all(m.uid == 0 and m.gid == 0 and not m.uname for m in got.values())
    assert got[f"{rel}/bin/tool"].mode == 0o755  # its owner's x bit: everyone's
    assert got[f"{rel}/data.txt"].mode == 0o644  # readable by the pods' user, writable by root only
    assert got[f"{rel}/bin/alias"].issym() and got[f"{rel}/bin/alias"].linkname == "tool"
    assert got["tmp"].mode == 0o1777 and got["etc/passwd"].size == 2  # (the last entry of a name wins)
    names = list(got)
    assert names.index(str(Path(rel).parent)) < names.index(rel) < names.index(f"{rel}/bin/tool")


def test_the_key_changes_with_a_file_and_not_otherwise(tmp_path):
    root = _tree(tmp_path)
    key = Layer("t", list(_walk(root))).key()
    assert Layer("t", list(_walk(root))).key() == key
    (root / "data.txt").write_text("other data")
    assert Layer("t", list(_walk(root))).key() != key


def test_a_library_link_brings_its_target_with_folders_resolved(tmp_path):
    real = tmp_path / "usr" / "lib"
    real.mkdir(parents=True)
    (real / "libx.so.1.2").write_bytes(b"\x7fELF")
    os.symlink("libx.so.1.2", real / "libx.so.1")
    os.symlink("usr/lib", tmp_path / "lib")  # a merged-/usr link
    chain = _link_chain(tmp_path / "lib" / "libx.so.1")
    assert chain == [real.resolve() / "libx.so.1", real.resolve() / "libx.so.1.2"]


def test_a_checkout_under_the_pods_scratch_folder_is_refused(tmp_path):
    """Pods mount an emptyDir on /tmp: a venv there would be hidden in every worker."""
    import pytest

    from localcluster.checkoutimage import ImageError, check_paths

    with pytest.raises(ImageError, match="/tmp"):
        check_paths([Path("/tmp/x/.venv")])
    check_paths([Path("/work/main/.venv"), Path("/root/.pyenv/versions/3.11.7")])
