"""Run directories that nobody else can reach, and locks that keep one owner per directory.

A leaf module (the standard library only). A run directory holds what the workbench later
reports as "read back from the servers" (the knob control file, the state files, the logs),
so whoever can write it can forge a result or, through a planted symlink, make the workbench
delete or append to a file elsewhere. So: new directories are created 0700, an existing one
must be a real directory (not a symlink) owned by this user and not writable by group or
others, files are opened without following symlinks, and one process at a time owns a
directory (``DirLock``, ``fcntl.flock``: released by the kernel when the owner dies, so a
crashed sweep never leaves a stale lock behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".workbench.lock"


class RunDirError(ValueError):
    """A run directory or file the workbench must not use; the message names it and why."""


def check_private(path: str | os.PathLike) -> Path:
    """Raise unless ``path`` (which exists) is a directory of ours that only we can write."""
    p = Path(path)
    st = p.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise RunDirError(f"{str(p)!r} is a symlink (to {str(p.readlink())!r}); a run directory "
                          "must be a real directory: pass its target or another path")
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirError(f"{str(p)!r} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise RunDirError(f"{str(p)!r} is owned by uid {st.st_uid}, not by this user "
                          f"(uid {os.geteuid()}): its files could be forged; use a directory "
                          "of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RunDirError(f"{str(p)!r} is writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):o}): its files could be forged; "
                          f"`chmod go-w {p}` or use another directory")
    return p


def private_dir(path: str | os.PathLike) -> Path:
    """``path`` as a run directory: created 0700 (parents with the usual mode) when absent,
    else checked by :func:`check_private`."""
    p = Path(path).expanduser()
    if not os.path.lexists(p):
        p.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process made it: checked below
            p.mkdir(mode=0o700)
    return check_private(p)


def fresh_private_dir(prefix: str = "workbench-") -> Path:
    """A new directory only this user can enter (``tempfile.mkdtemp`` makes it 0700)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def open_append(path: str | os.PathLike, mode: int = 0o600) -> int:
    """A file descriptor for appending to ``path``, refusing a symlink at ``path``."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                       | os.O_CLOEXEC, mode)
    except OSError as e:
        if Path(path).is_symlink():
            raise RunDirError(f"{str(path)!r} is a symlink; refusing to write through it") from e
        raise


def check_out_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """An output directory the run can write: not a file, and it (or, when absent, the
    nearest existing parent) is a writable directory. Checked before any server starts."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise RunDirError(f"{flag} {str(p)!r} is a file, not a directory")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"{flag} {str(p)!r}: {str(probe)!r} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"{flag} {str(p)!r}: {str(probe)!r} is not writable by this user")
    # os.access answers yes to root everywhere, /proc and read-only mounts included: only
    # creating something there tells (and the results are written at the end of the run).
    try:
        Path(tempfile.mkdtemp(prefix=".workbench-probe-", dir=probe)).rmdir()
    except OSError as e:
        what = "written" if probe == p else "created"
        raise RunDirError(f"{flag} {str(p)!r} cannot be {what}: creating an entry in "
                          f"{str(probe)!r} fails ({e.strerror}); allowed: a directory this "
                          "user can create and write") from None
    return p


class DirLock:
    """An exclusive lock on a directory, held until ``release`` (or the process ends).

    The lock file records the holder's pid, so a second owner is refused with a message that
    names it."""

    def __init__(self, directory: str | os.PathLike, what: str = "workbench run") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"{str(self.directory)!r} is in use by another workbench process ({holder}); "
                "two owners would delete each other's state files and switch each other's "
                "servers' knobs: wait for it to finish, stop it, or use another directory "
                "(--out / --log-dir)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, {what}".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the sidecar ``<path>.lock`` (blocking) for a block: for
    writers of one shared file such as a results store."""
    lock = Path(f"{path}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
