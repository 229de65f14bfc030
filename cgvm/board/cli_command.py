"""``cgvm board LOGDIR``: TensorBoard on a log directory (the ``board`` extra: ``pip install 'cgvm[board]'``)."""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..commands import command
from ..errors import CgvmError
from ._deps import INSTALL_HINT


def _board_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdir", help="the directory the logs were written to (runs are its subdirectories)")
    p.add_argument("--port", type=int, default=6006, help="port to serve on (0: any free port)")
    p.add_argument("--host", default="localhost", help="address to serve on (0.0.0.0: every interface)")


@command("board", "start TensorBoard on a log directory written by cgvm", _board_args)
def _board(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.logdir):
        raise CgvmError(f"log directory {args.logdir!r} not found")
    try:
        from tensorboard import program
    except ImportError as exc:
        raise CgvmError(f"`cgvm board` runs TensorBoard, which is not installed ({exc}); {INSTALL_HINT}") from None
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", args.logdir, "--port", str(args.port), "--host", args.host])
    url = board.launch()
    from tensorboard import version

    print(f"TensorBoard {version.VERSION} serving {args.logdir} at {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
    return 0
