"""Side-by-side benchmarks of cgvm against NumPy eager, PyTorch eager and PyTensor (where installed)."""
