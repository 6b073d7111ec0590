"""Where a result came from: the command that made it and the commit of the
code that ran (stored beside every benchmark JSON, so that a table made from
it can say both)."""
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional


def commit() -> Optional[str]:
    """The checkout's commit (``+dirty`` with uncommitted changes to tracked files); None outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance(argv: Optional[List[str]] = None) -> Dict[str, Optional[str]]:
    """The command line (as typed: the program's name and its arguments) and the commit."""
    args = sys.argv if argv is None else argv
    return {"command": " ".join([os.path.basename(args[0])] + [shlex.quote(a) for a in args[1:]]), "commit": commit()}
