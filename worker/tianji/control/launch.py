"""Process-level tuning for role processes that move large messages.

libzmq mallocs every received message; a receiver that holds a multi-MB
message for a few microseconds makes glibc trim the heap and fault the pages
back in on the next one. Keeping large buffers on the heap and not trimming
it brought TianJi's wire from ~0.5 to 0.82-0.99 of raw pyzmq at >= 256 KB
(bench/transport.py --tuned-malloc). glibc reads GLIBC_TUNABLES at process
start, so the launcher (and the operator's pod spec) set it for workers.
"""
MALLOC_TUNABLES = ("glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432:"
                   "glibc.malloc.top_pad=67108864")


def worker_env(env: dict) -> dict:
    """`env` plus the malloc tunables, unless the user set GLIBC_TUNABLES already."""
    out = dict(env)
    out.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return out
