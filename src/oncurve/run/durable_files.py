"""Files that a crash cannot leave half-written under their final name: each written and
fsynced, then renamed into place with its directory fsynced; their sha256, so that damage done
later (flipped bits, a truncated copy) shows when they are read back."""

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# os.umask can only be read by setting it, so it is set back at once.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_file(path: Path, dump: Callable[[Path], Any]) -> None:
    """Create one file with `dump(path)`, with the umask's mode, and fsync it.

    torch.save reports a full disk or a file-size limit as a RuntimeError of its C++ writer:
    an OSError here, as the others report it."""
    try:
        dump(path)
    except RuntimeError as err:
        raise OSError(f"writing {path.name} failed: {' '.join(str(err).split())[:200]}") from None
    path.chmod(0o666 & ~_UMASK)  # safetensors writes 0600; a run's files follow the umask
    fsync(path)


def follow_umask(directory: Path) -> None:
    """Give every file below `directory` the umask's mode (safetensors and tempfile write 0600:
    a model another user or a server reads must follow the umask, as a run's files do)."""
    for path in Path(directory).rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~_UMASK)


def replace_file(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` and fsync their directory so that the rename itself is durable."""
    os.replace(src, dst)
    fsync(dst.parent)


def replace_text(path: Path, text: str) -> None:
    """`path` holding `text`, whole or not at all: written beside it (the umask's mode,
    fsynced), then renamed over it; a failed write leaves the old file and no other."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_file(tmp, functools.partial(write_text, text))
        replace_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(text: str, path: Path) -> None:
    """Write `text` as UTF-8; its argument order lets `partial(write_text, text)` be a dump."""
    path.write_text(text, encoding="utf-8")


def fsync(path: Path) -> None:
    """Flush a file's or a directory's data and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
