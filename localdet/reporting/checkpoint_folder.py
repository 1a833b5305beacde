"""The files of a checkpoint folder a trial uploads, named as the store names them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

from localdet.reporting.report_transport import ReportError


def files_under(base: Path) -> Dict[str, Path]:
    """The checkpoint folder's files by their relative POSIX names (file symlinks followed),
    as the store takes them."""
    found: Dict[str, Path] = {}
    for root, folders, files in os.walk(base, followlinks=False):
        for name in folders:
            if os.path.islink(os.path.join(root, name)):
                raise ReportError(f"cannot checkpoint '{os.path.join(root, name)}': folder "
                                  "symlinks cannot be checkpointed")
        for name in files:
            path = Path(root, name)
            if not path.is_file():
                raise ReportError(f"cannot checkpoint '{path}': only files and symlinks to "
                                  "files can be checkpointed")
            found[path.relative_to(base).as_posix()] = path
    return dict(sorted(found.items()))
