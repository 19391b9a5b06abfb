"""Path safety for a local sandbox: what a play controls (its directory's contents) can
never redirect the provider, whether by `..`, absolute paths or symlinks, even racing."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from tasks.sandbox.base import FileRead, ProviderError, SandboxNotFoundError


def safe_parts(path: str) -> tuple[str, ...]:
    """Components of a sandbox-relative path; refuses absolute paths and any '..'."""
    if not path or "\0" in path:
        raise ProviderError(f"invalid sandbox path {path!r}")
    pure = PurePosixPath(path)
    parts = tuple(p for p in pure.parts if p != ".")
    if pure.is_absolute() or not parts or ".." in parts:
        raise ProviderError(f"path {path!r} escapes the sandbox")
    return parts


def read_under(
    base: Path, parts: tuple[str, ...], path: str, sandbox_id: str, offset: int,
    max_bytes: int,
) -> FileRead | None:
    """Up to max_bytes from offset of the regular file base/parts (None if it is missing).
    `path` and `sandbox_id` only name it in errors."""
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}") from exc
    try:
        # Walk component by component with O_NOFOLLOW: a play cannot redirect us
        # through a symlink (e.g. result.json -> a worker secret), even by racing.
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_NONBLOCK if last else os.O_DIRECTORY
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise ProviderError(f"cannot read {path!r}: {exc}") from exc
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise ProviderError(f"{path!r} goes through a symlink") from exc
                return None
            os.close(fd)
            fd = next_fd
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProviderError(f"{path!r} is not a regular file")
        chunks: list[bytes] = []
        want, pos = max_bytes, offset
        while want > 0:
            chunk = os.pread(fd, min(want, 1 << 20), pos)
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
            pos += len(chunk)
        data = b"".join(chunks)
        return FileRead(data, info.st_size, offset + len(data) < info.st_size)
    finally:
        os.close(fd)
