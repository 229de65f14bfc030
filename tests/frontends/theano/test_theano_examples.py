"""The tutorial-style scripts in examples/theano run to completion and learn."""
import os
import runpy

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "theano")


@pytest.mark.parametrize("script", ["logistic_regression.py", "mlp.py", "rnn_scan.py"])
def test_example_runs(script, capsys):
    pytest.importorskip("sklearn")
    runpy.run_path(os.path.join(EXAMPLES, script), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and lines[-1].startswith("epoch")
