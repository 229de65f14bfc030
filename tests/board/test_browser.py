"""TensorBoard in a browser: `cgvm board` serves a log a Keras-style fit wrote; headless Chromium loads the
scalars page, the graph page and the profiled graph, and they show the run's tags, the model's layers
and the profiled device. Screenshots are kept
in $CGVM_ARTIFACTS (default <repo>/.artifacts). Skips where Chromium is not installed (CI installs
Debian's chromium package)."""
from __future__ import annotations

import importlib.util
import os
import time

import numpy as np
import pytest

pytest.importorskip("tensorboard")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("board_screenshot", os.path.join(REPO, "scripts", "board_screenshot.py"))
shots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shots)

CHROMIUM = shots.find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    import cgvm.keras as keras

    root = tmp_path_factory.mktemp("browser")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(2, activation="softmax", name="scores")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=16, epochs=3, validation_split=0.25, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(root / "logs", histogram_freq=1, profile_batch=2)])
    return str(root / "logs")


@pytest.fixture(scope="module")
def browser_and_url(logdir):
    with shots.serve(logdir) as url:
        browser = shots.Chromium(CHROMIUM, 1200, 800)
        try:
            yield browser, url
        finally:
            browser.close()


def _artifact(name: str) -> str:
    return os.path.join(os.environ.get("CGVM_ARTIFACTS", os.path.join(REPO, ".artifacts")), name)


def test_scalars_page_shows_the_run_tags(browser_and_url):
    browser, url = browser_and_url
    browser.open(f"{url}/#scalars")
    text = browser.wait_for_text(["epoch_loss", "epoch_accuracy", "epoch_learning_rate",
                                  "evaluation_loss_vs_iterations", "train", "validation"], timeout=40)
    assert "epoch_loss" in text
    path = browser.screenshot(_artifact("board_scalars.png"))
    assert os.path.getsize(path) > 1000


def test_graph_page_shows_the_layers(browser_and_url):
    browser, url = browser_and_url
    browser.open(f"{url}/#graphs&run=train")
    browser.wait_for_text(["hidden", "scores", "gradients", "updates"], timeout=40)
    path = browser.screenshot(_artifact("board_graph.png"))
    assert os.path.getsize(path) > 1000


def test_profile_colours_the_graph_by_compute_time(browser_and_url):
    browser, url = browser_and_url
    browser.resize(1200, 1300)   # the colour options below the graph options
    browser.open(f"{url}/#graphs&run=train")
    browser.wait_for_text(["hidden", "scores", "Profile"], timeout=40)
    assert browser.select_graph_tag("batch_2")   # the profiled batch: graph and per-node times
    # once the tag's graph has loaded, "Profile" then "Compute time" colour it; the legend then lists
    # the devices the run metadata's step stats name
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline and not ("Devices included in stats" in text and "CPU:0" in text):
        time.sleep(1.0)
        for label in ("Profile", "Compute time"):
            at = browser.center_of_text(label)
            if at is not None:
                browser.click(*at)
        text = browser.text()
    assert "Devices included in stats" in text and "CPU:0" in text
    browser.screenshot(_artifact("board_profile.png"))
