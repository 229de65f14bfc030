"""Kernel libraries that declare no op: the algorithms behind the convolution and pooling ops
(im2col, Winograd, batch-last, tiled and general windows) and kernel scratch (planned temporaries).

The op files (cgvm.ops.conv, cgvm.ops.pool, ...) declare ops and call into these; nothing here
registers an op.
"""
