"""Where the tests find the project's shared files: ``../shared`` beside the checkout (real Caffe
models, reference facts), wherever the checkout is."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
SHARED_CAFFE_MODELS = SHARED / "models" / "caffe"

#: where .ci/run clones the peers' public repositories (bare, depth 1) whose own tests and
#: programs run against cgvm at test time: BVLC+caffe, lisa-lab+DeepLearningTutorials
PEERS = REPO_ROOT / ".peers"
