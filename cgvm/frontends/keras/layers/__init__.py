"""Keras layers over cgvm ops (``keras.layers``)."""
from .base import Input, InputLayer, Layer, Node, OperationLayer, registry
from .conv import (Conv1D, Conv2D, Conv2DTranspose, Conv3D, DepthwiseConv2D, SeparableConv2D, ZeroPadding1D,
                   ZeroPadding2D)
from .core import (ELU, Activation, Dense, Dropout, Embedding, Flatten, Lambda, LeakyReLU, Masking, Permute, PReLU,
                   ReLU, RepeatVector, Rescaling, Reshape, Softmax)
from .merge import (Add, Average, Concatenate, Dot, Maximum, Minimum, Multiply, Subtract, add, average,
                    concatenate, multiply, subtract)
from .normalization import BatchNormalization, LayerNormalization
from .pooling import (AveragePooling1D, AveragePooling2D, AveragePooling3D, AvgPool2D, GlobalAveragePooling1D,
                      GlobalAveragePooling2D, GlobalAveragePooling3D, GlobalAvgPool2D, GlobalMaxPooling1D,
                      GlobalMaxPooling2D, GlobalMaxPooling3D, MaxPool2D, MaxPooling1D, MaxPooling2D, MaxPooling3D)
from .recurrent import GRU, LSTM, SimpleRNN
from .wrappers import Bidirectional, TimeDistributed
from .operations import KerasOperation
