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


def output_file(path: str) -> str:
    """An argparse type for a file a command writes when its run ends (a result
    JSON, a plot): refused as the command starts where it could not be written
    (its folder missing or not writable, or the path a folder), not after the run."""
    import argparse

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a folder: name a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{path}: its folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{path}: its folder {folder} is not writable")
    return path


def write_result(path: str, res: Dict, script: str, machine: Optional[Dict] = None) -> None:
    """A diagnostic's figures ``res`` written to ``path`` as a result ``scripts/results.py add``
    stores: with the machine (``machine_info()`` unless given), the command as typed from the
    repository's root (``script``: its path there, with this process's arguments) and the commit;
    whole or not at all."""
    import json

    from ..native.machine import machine_info

    res["machine"] = machine if machine is not None else machine_info()
    res.update(provenance([os.path.basename(script)] + sys.argv[1:]))
    res["command"] = "python " + os.path.dirname(script) + "/" + res["command"]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)
