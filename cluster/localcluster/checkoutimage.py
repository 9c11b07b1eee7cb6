"""The checkout's worker image, for real nodes: this machine's Python, the checkout's virtual
environment and TianJi's sources as OCI layers, pushed to the cluster's registry.

images/worker.Dockerfile installs torch into a fresh environment: gigabytes of downloads and a
builder (Docker or buildah) that this machine may lack. A local cluster's nodes are this machine,
so its image can be the environment the tests already run in, as `ko` makes images of Go
programs without a builder. Three uncompressed layers (no gzip pass over 5 GB; the registry and
the nodes share this disk):

    system   the shared libraries Python and the venv's extensions load (ldd), the interpreter's
             prefix, /etc/passwd with the pods' user (10001), /tmp
    venv     the virtual environment, less packages no worker imports (EXCLUDED)
    tianji   worker/tianji (the venv's editable install points there)

Paths stay as they are here (a venv's scripts name their interpreter by absolute path); every
entry is root's and readable by all, so the pods' non-root user runs it. Each layer's digest is
remembered under CACHE by a key of what it holds (paths, sizes, mtimes): a layer the registry
already has is neither rebuilt nor sent again (a cluster's registry lives as long as the
cluster, so each new cluster is sent the image once: 23 s, docs/local-cluster.md)."""
from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Optional

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TIANJI_CACHE", Path.home() / ".cache" / "tianji")) / "checkout-image"
NAME = "tianji/worker-checkout"
UID = 10001  # the pods' user (operator/tianji_operator/children/builders.py WORKER_UID)
SCRATCH = Path("/tmp")  # pods' scratch emptyDir (tianji.control.contracts.launch.SCRATCH_DIR)
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
# Packages of the venv that no worker imports: the test tier's and torch.compile's.
EXCLUDED = ("triton", "helm_python", "kubernetes_validate", "pip", "setuptools", "ruff", "mypy", "pytest")
# The interpreter's prefix, less what a worker never loads (its own site-packages: the venv has its own).
PREFIX_SKIPPED = ("lib/python{v}/test", "lib/python{v}/idlelib", "lib/python{v}/tkinter", "lib/python{v}/ensurepip",
                  "lib/python{v}/site-packages", "lib/python{v}/config-{v}-x86_64-linux-gnu", "include", "share")
MERGED_USR = ("/bin", "/sbin", "/lib", "/lib64")  # symlinks into /usr on a merged-/usr system
CHUNK = 8 << 20


def venv_dir() -> Path:
    return Path(sys.prefix)


def _walk(root: Path, skip: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Every path under `root` (itself first), in a stable order; directories in `skip` left out."""
    yield root
    if root.is_symlink() or not root.is_dir():
        return
    for name in sorted(os.listdir(root)):
        p = root / name
        if p not in skip:
            yield from _walk(p, skip)


def _elf_files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        if p.is_file() and not p.is_symlink() and (".so" in p.name or os.access(p, os.X_OK)):
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def shared_libraries(elves: list[Path], inside: tuple[Path, ...]) -> list[Path]:
    """The libraries `elves` load that lie outside `inside` (the venv and prefix ship their own),
    as the dynamic loader resolves them here, with the loader itself."""
    found: set[Path] = set()
    for i in range(0, len(elves), 200):
        res = subprocess.run(["ldd", *map(str, elves[i:i + 200])], capture_output=True, text=True)
        for line in res.stdout.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                found.add(Path(m.group(1)))
    return sorted(p for p in found if not any(p.is_relative_to(d) for d in inside))


class Layer:
    """One layer: what goes in it (paths of this machine, in order) and entries made here."""

    def __init__(self, name: str, paths: list[Path], extra: Optional[list[tuple[tarfile.TarInfo, bytes]]] = None):
        self.name, self.paths, self.extra = name, paths, extra or []

    def key(self) -> str:
        h = hashlib.sha256(self.name.encode())
        for p in self.paths:
            st = p.lstat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
        for info, data in self.extra:
            h.update(f"{info.name}\0{info.type}\0{info.mode}\0{info.linkname}\0".encode())
            h.update(hashlib.sha256(data).digest())
        return h.hexdigest()[:32]

    def write(self, out: BinaryIO) -> None:
        """The layer's tar: parents first (0755), every entry root's and readable by all."""
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            dirs: set[Path] = set()
            for p in self.paths:
                for parent in reversed(p.parents[:-1]):
                    if parent not in dirs:
                        dirs.add(parent)
                        tar.addfile(_entry(str(parent), tarfile.DIRTYPE, 0o755))
                if p in dirs:
                    continue
                info = tar.gettarinfo(str(p), arcname=str(p).lstrip("/"))
                _own(info)
                if info.isreg():
                    with open(p, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    dirs.add(p) if info.isdir() else None
                    tar.addfile(info)
            for info, data in self.extra:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data) if data else None)


def _entry(path: str, kind: bytes, mode: int, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def _own(info: tarfile.TarInfo) -> None:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isdir() or info.mode & 0o111:
        info.mode |= 0o555
    info.mode = (info.mode | 0o444) & 0o7755  # readable by all, writable by root only


class ImageError(RuntimeError):
    pass


def check_paths(paths: list[Path]) -> None:
    """Refuses paths a worker pod would not see: the pods mount their scratch emptyDir on /tmp."""
    hidden = [str(p) for p in paths if Path(os.path.realpath(p)).is_relative_to(SCRATCH)]
    if hidden:
        raise ImageError(f"{', '.join(hidden)} under {SCRATCH}, where worker pods mount their scratch "
                         "volume: the image would hold it hidden; use a checkout outside /tmp")


def layers(venv: Optional[Path] = None) -> list[Layer]:
    """The three layers of this checkout's image (module docstring)."""
    venv = venv or venv_dir()
    prefix = Path(os.path.realpath(sys.base_prefix))
    check_paths([venv, prefix, REPO])
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / f"python{ver}" / "site-packages"
    excluded = tuple(p for p in site.iterdir() if re.split(r"[-.]", p.name)[0].lower() in EXCLUDED)
    venv_paths = list(_walk(venv, excluded))
    prefix_paths = list(_walk(prefix, tuple(prefix / s.format(v=ver) for s in PREFIX_SKIPPED)))
    libs = shared_libraries(_elf_files(venv_paths + prefix_paths), (venv, prefix))
    system = sorted({q for lib in libs for q in _link_chain(lib)})
    users = f"root:x:0:0:root:/root:/bin/false\ntianji:x:{UID}:{UID}::/tmp:/bin/false\n".encode()
    etc = [(_entry("/etc/passwd", tarfile.REGTYPE, 0o644), users),
           (_entry("/etc/group", tarfile.REGTYPE, 0o644), f"root:x:0:\ntianji:x:{UID}:\n".encode()),
           (_entry("/tmp", tarfile.DIRTYPE, 0o1777), b"")]
    etc += [(_entry(d, tarfile.SYMTYPE, 0o777, os.readlink(d)), b"") for d in MERGED_USR if os.path.islink(d)]
    sources = REPO / "worker" / "tianji"
    return [Layer("system", system + prefix_paths, etc), Layer("venv", venv_paths),
            Layer("tianji", list(_walk(sources)))]


def _link_chain(path: Path) -> list[Path]:
    """`path` and where its symlinks lead (libfoo.so.1 -> libfoo.so.1.2), each with its folder
    resolved (/lib64/x is /usr/lib64/x where /lib64 is a link): the image has the links too."""
    out = [_real_dir(path)]
    while out[-1].is_symlink() and len(out) < 8:
        out.append(_real_dir(out[-1].parent / os.readlink(out[-1])))
    return out


def _real_dir(path: Path) -> Path:
    return Path(os.path.realpath(path.parent)) / path.name


class Registry:
    """Just enough of the OCI distribution API over plain HTTP (the cluster's registry)."""

    def __init__(self, host: str, repo: str = NAME):
        self.host, self.repo = host, repo

    def _conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, timeout=600)

    def has(self, digest: str) -> bool:
        c = self._conn()
        c.request("HEAD", f"/v2/{self.repo}/blobs/{digest}")
        return c.getresponse().status == 200

    def _upload_url(self) -> str:
        c = self._conn()
        c.request("POST", f"/v2/{self.repo}/blobs/uploads/", headers={"Content-Length": "0"})
        r = c.getresponse()
        r.read()
        if r.status != 202:
            raise RuntimeError(f"registry {self.host}: starting an upload: HTTP {r.status}")
        return r.getheader("Location")

    def _path(self, location: str) -> str:
        """An upload's Location, absolute or not, as a path on this registry."""
        return location.split(self.host, 1)[1] if "://" in location else location

    def _with_digest(self, location: str, digest: str) -> str:
        """The PUT that completes an upload with `digest`."""
        path = self._path(location)
        return f"{path}{'&' if '?' in path else '?'}digest={digest}"

    def push_layer(self, layer: Layer) -> tuple[str, int]:
        """Streams `layer`'s tar (written by a thread into a pipe; its digest computed on the way)
        as one chunked upload; returns (digest, size)."""
        r, w = os.pipe()
        failed: list[BaseException] = []

        def produce() -> None:
            try:
                with os.fdopen(w, "wb", buffering=CHUNK) as out:
                    layer.write(out)
            except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
                failed.append(e)
        h, size = hashlib.sha256(), 0
        src = os.fdopen(r, "rb", buffering=0)

        def chunks() -> Iterator[bytes]:
            nonlocal size
            while b := src.read(CHUNK):
                h.update(b)
                size += len(b)
                yield b
        writer = threading.Thread(target=produce, name=f"layer-{layer.name}", daemon=True)
        writer.start()
        try:
            c = self._conn()
            c.request("PATCH", self._path(self._upload_url()), body=chunks(), encode_chunked=True,
                      headers={"Content-Type": "application/octet-stream", "Transfer-Encoding": "chunked"})
            resp = c.getresponse()
            resp.read()
        finally:
            src.close()  # a failed upload ends the writer (EPIPE)
            writer.join()
        if failed:
            raise RuntimeError(f"layer {layer.name}: {failed[0]}") from failed[0]
        if resp.status != 202:
            raise RuntimeError(f"registry {self.host}: uploading layer {layer.name}: HTTP {resp.status}")
        digest = "sha256:" + h.hexdigest()
        self._put(self._with_digest(resp.getheader("Location"), digest), b"", "application/octet-stream")
        return digest, size

    def push_bytes(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            self._put(self._with_digest(self._upload_url(), digest), data, "application/octet-stream")
        return digest

    def _put(self, url: str, data: bytes, ctype: str) -> None:
        c = self._conn()
        c.request("PUT", url, body=data, headers={"Content-Type": ctype, "Content-Length": str(len(data))})
        r = c.getresponse()
        body = r.read()
        if r.status not in (201, 202):
            raise RuntimeError(f"registry {self.host}: PUT {url.split('?')[0]}: HTTP {r.status} {body[:300]!r}")

    def put_manifest(self, tag: str, manifest: bytes) -> None:
        self._put(f"/v2/{self.repo}/manifests/{tag}", manifest, "application/vnd.oci.image.manifest.v1+json")


def push(registry_host: str, log=print) -> str:
    """Pushes the checkout's image (layers the registry lacks only); returns its reference."""
    reg = Registry(registry_host)
    CACHE.mkdir(parents=True, exist_ok=True)
    descs = []
    for layer in layers():
        key = layer.key()
        memo = CACHE / f"{layer.name}-{key}.json"
        known = json.loads(memo.read_text()) if memo.exists() else None
        if not (known and reg.has(known["digest"])):
            log(f"checkout image: sending layer {layer.name} ({len(layer.paths)} paths)")
            digest, size = reg.push_layer(layer)
            known = {"digest": digest, "size": size}
            memo.write_text(json.dumps(known))
        descs.append({"mediaType": LAYER_TYPE, **known})
    venv = venv_dir()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"User": f"{UID}:{UID}", "WorkingDir": "/tmp", "Entrypoint": [str(venv / "bin" / "tianji")],
                   "Env": [f"PATH={venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"]},
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}, sort_keys=True).encode()
    config_digest = reg.push_bytes(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config)},
        "layers": [{"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"]} for d in descs]},
        sort_keys=True).encode()
    tag = hashlib.sha256(manifest).hexdigest()[:16]
    reg.put_manifest(tag, manifest)
    return f"{registry_host}/{NAME}:{tag}"
