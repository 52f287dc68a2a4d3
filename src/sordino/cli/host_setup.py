"""What ``sordino start`` asks of its host before it serves: its data dir, made (or a
clear error), and the open-file limit, raised."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

from sordino.errors import ConfigError

log = logging.getLogger("sordino")


def make_data_dir(path: Path) -> None:
    """Make the data dir, or say which it is and what to do."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"the data dir {path} cannot be made ({exc.strerror or exc}): give --data-dir "
            "(server.data_dir) a folder this user can write"
        ) from exc


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one; return the limit now in force.

    Each HTTP connection holds a descriptor, and a shell's usual soft limit (1,024)
    would let that many idle connections lock every other client out. Where the hard
    limit cannot be taken whole (macOS reports "unlimited" but caps it lower), the
    highest of a few smaller values that the system accepts is used.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, 1 << 20, 1 << 16, 10240):
        if target != resource.RLIM_INFINITY and hard != resource.RLIM_INFINITY:
            target = min(target, hard)
        if soft != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        log.debug("open-file limit raised from %s to %s", soft, target)
        return target
    return soft
