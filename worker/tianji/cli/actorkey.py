"""`tianji actor-key`: an actor pod's init container writes the pod's own CurveZMQ keyring.

It reads the job's actor issuer (the actor seed and the roles' public keys: mounted into this
init container only), derives the key pair of "actor-G-I" for the pod's ordinal, and writes that
keyring, mode 0400, into the memory-backed volume the worker container mounts read-only. The
worker, where user env code runs, so holds its own secret key and no other actor's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tianji.control.contracts.addressing import auto_index


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", type=int, required=True)
    p.add_argument("--index", default="auto", help="the actor's index, or auto: the pod's StatefulSet ordinal")
    p.add_argument("--issuer", required=True, help="the job's actor issuer (the operator's Secret)")
    p.add_argument("--out", required=True, help="where this actor's keyring is written")


def actor_key_command(a: argparse.Namespace) -> int:
    from tianji.runtime import security

    try:
        index = auto_index() if a.index == "auto" else int(a.index)
        text = Path(a.issuer).read_text()
        ring = security.issue_actor_keyring(text, a.group, index, source=a.issuer)
        security.write_keyring(a.out, ring, mode=0o400)
    except (ValueError, OSError) as e:  # KeyError_ is a ValueError
        print(f"tianji actor-key: {e}", file=sys.stderr)
        return 1
    print(f"tianji actor-key: wrote {ring.identity}'s keyring (public key {ring.keys.public.decode()})")
    return 0
