"""Screenshots of cgvm logs in TensorBoard, taken by headless Chromium (Debian's ``chromium`` package).

    python scripts/board_screenshot.py docs/images/tensorboard_graph.png

trains LeNet for a few iterations on the digits with ``cgvm train --tensorboard``, serves the
logs with ``cgvm board``, opens TensorBoard's graph dashboard in headless Chromium and saves a
screenshot (the picture in the README). ``--page scalars`` shoots the scalars page instead.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON
messages separated by NUL bytes on file descriptors 3 and 4), so nothing beyond Chromium and
the standard library is needed. The browser test (tests/board/test_browser.py) uses the same
functions.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]

# every text node of the page, shadow roots included (TensorBoard's dashboards are web components)
DEEP_TEXT_JS = """(() => { const out = [];
  const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.childNodes) { if (c.nodeType === 3) out.push(c.textContent); else walk(c); } };
  walk(document); return out.join(' ').replace(/\\s+/g, ' '); })()"""


def find_chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """Headless Chromium with one page, driven over the DevTools protocol on a pipe."""

    def __init__(self, binary: str, width: int = 1400, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="cgvm-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child's ends above 9, so that putting them on 3 and 4 cannot clobber one another
        to_child_r, from_child_w = (_high_fd(fd) for fd in (to_child_r, from_child_w))
        flags = CHROMIUM_FLAGS + [f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                                  "--remote-debugging-pipe", "about:blank"]
        # the protocol's pipe is fds 3 (commands in) and 4 (replies out) of the browser
        self.pid = os.posix_spawn(binary, [binary] + flags, dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, to_child_r, 3), (os.POSIX_SPAWN_DUP2, from_child_w, 4)])
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: List[Dict[str, Any]] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.resize(width, height)

    def resize(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read(self, timeout: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe (did it start?)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, timeout: float = 30.0, **params: Any) -> Dict[str, Any]:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def text(self) -> str:
        result = self.call("Runtime.evaluate", session=True, expression=DEEP_TEXT_JS, returnByValue=True)
        return result.get("result", {}).get("value", "") or ""

    def wait_for_text(self, words: List[str], timeout: float = 30.0) -> str:
        """The page's text once it shows every one of ``words`` (TimeoutError with what it shows)."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(w in text for w in words):
                return text
            time.sleep(0.5)
        missing = [w for w in words if w not in text]
        raise TimeoutError(f"the page never showed {missing}; it shows: {text[:600]!r}")

    def center_of(self, selector: str) -> Optional[List[float]]:
        """The page coordinates of the centre of the first element matching ``selector`` (shadow roots
        included), or None."""
        js = ("(() => { const find = (root) => { const hit = root.querySelector(%s); if (hit) return hit;"
              " for (const el of root.querySelectorAll('*')) { if (el.shadowRoot) { const h = find(el.shadowRoot);"
              " if (h) return h; } } return null; }; const el = find(document); if (!el) return null;"
              " const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
              % json.dumps(selector))
        return self.call("Runtime.evaluate", session=True, expression=js, returnByValue=True)["result"].get("value")

    def center_of_text(self, text: str) -> Optional[List[float]]:
        """The centre of the innermost element whose text is ``text`` (shadow roots included), or None."""
        js = ("(() => { let best = null; const walk = (root) => { for (const el of root.querySelectorAll('*')) {"
              " if (el.shadowRoot) walk(el.shadowRoot); if (el.children.length === 0 && el.textContent.trim() === %s)"
              " best = el; } }; walk(document); if (!best) return null; const r = best.getBoundingClientRect();"
              " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % json.dumps(text))
        return self.call("Runtime.evaluate", session=True, expression=js, returnByValue=True)["result"].get("value")

    def select_graph_tag(self, tag: str) -> bool:
        """Pick ``tag`` in the graph dashboard's Tag menu (its controls' selected tag index)."""
        js = ("(() => { const find = (root) => { const hit = root.querySelector('tf-graph-controls'); if (hit) return hit;"
              " for (const el of root.querySelectorAll('*')) { if (el.shadowRoot) { const h = find(el.shadowRoot);"
              " if (h) return h; } } return null; }; const c = find(document); if (!c || !c.datasets) return false;"
              " const run = c.datasets[c._selectedRunIndex]; const k = run.tags.findIndex(t => t.tag === %s);"
              " if (k < 0) return false; c._selectedTagIndex = k; return true; })()" % json.dumps(tag))
        return bool(self.call("Runtime.evaluate", session=True, expression=js, returnByValue=True)["result"].get("value"))

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def double_click(self, x: float, y: float) -> None:
        for kind, count in (("mousePressed", 1), ("mouseReleased", 1), ("mousePressed", 2), ("mouseReleased", 2)):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=count)

    def screenshot(self, path: str, colors: int = 0) -> str:
        """Save the page as PNG; ``colors`` > 0 quantizes it to that many (a small file; needs Pillow)."""
        data = base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png")["data"])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if colors:
            from PIL import Image

            Image.open(path).convert("RGB").quantize(colors=colors).save(path, optimize=True)
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.1)
        for fd in (self._to_child, self._from_child):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


def _high_fd(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


@contextmanager
def serve(logdir: str, timeout: float = 60.0) -> Iterator[str]:
    """``cgvm board LOGDIR --port 0`` in a child process; yields the URL it serves."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "cgvm.cli", "board", os.path.abspath(logdir), "--port", "0"],
                            cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + timeout
        url = None
        while url is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("cgvm board did not start serving")
            if select.select([proc.stdout], [], [], 1.0)[0]:
                m = re.search(r"(http://\S+)", proc.stdout.readline())
                url = m[1] if m else None
        yield url.rstrip("/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def train_lenet_logs(workdir: str, logdir: str, iterations: int = 6) -> None:
    """A few LeNet iterations on the digits, logged with ``cgvm train --tensorboard``."""
    from cgvm.cli import main

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        if not os.path.isdir("data/digits"):
            assert main(["data", "digits", "--out", "data/digits", "--limit", "100"]) == 0
        with open("solver.prototxt", "w") as f:
            f.write(f'net: "{REPO}/models/lenet/lenet_train_test.prototxt"\ntest_iter: 2\ntest_interval: 3\n'
                    f'base_lr: 0.01\nmomentum: 0.9\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 1\n'
                    f'max_iter: {iterations}\nsnapshot_prefix: "lenet"\nrandom_seed: 1\n')
        assert main(["train", "--solver", "solver.prototxt", "--no-progress", "--tensorboard", logdir]) == 0
    finally:
        os.chdir(cwd)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="PNG file to write")
    parser.add_argument("--page", default="graphs", choices=["graphs", "scalars"])
    parser.add_argument("--logdir", default="", help="logs to show (default: train LeNet a few iterations)")
    parser.add_argument("--expand", action="append", default=None,
                        help="graph groups to open (default: ip1+relu1, the fused inner product + ReLU)")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=760)
    args = parser.parse_args(argv)
    if args.expand is None:
        args.expand = ["ip1+relu1", "ip1+relu1/gemm_bias_act"]
    binary = find_chromium()
    if binary is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as work:
        logdir = args.logdir or os.path.join(work, "logs")
        if not args.logdir:
            train_lenet_logs(work, logdir)
        with serve(logdir) as url:
            browser = Chromium(binary, args.width, args.height)
            try:
                if args.page == "graphs":
                    browser.open(f"{url}/#graphs&run=train")
                    browser.wait_for_text(["conv1", "pool1", "gradients", "updates"], timeout=60)
                    time.sleep(1.0)
                    for group in args.expand:   # open groups, as a double click in the dashboard does
                        at = browser.center_of(f'g.node[data-name="{group}"]')
                        if at is not None:
                            browser.double_click(*at)
                            time.sleep(1.5)
                    fit = browser.center_of_text("Fit to screen")
                    if args.expand and fit is not None:
                        browser.click(*fit)
                        time.sleep(1.5)
                else:
                    browser.open(f"{url}/#scalars")
                    browser.wait_for_text(["learning_rate", "smoothed_loss", "accuracy"], timeout=60)
                time.sleep(2.0)   # let the layout settle
                browser.screenshot(args.output, colors=64)
            finally:
                browser.close()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
