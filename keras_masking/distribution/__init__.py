"""Data-parallel, model-parallel and multi-host training helpers.

Every model of this package trains unchanged under Keras' own engines:
`keras.distribution.DataParallel` / `ModelParallel` on JAX and
`tf.distribute` strategies on TensorFlow (see docs/distributed.md). This
module holds what makes that exact:

* `data_parallel_engine`, `engine_scope`, `engine_in_scope`, `replicas_in_sync`: the
  backend's own data-parallel engine, made once per process.
* `transformer_layout_map`: the `ModelParallel` layout of a
  `TransformerBackbone`.
* `batch_uniform`, `batch_randint`, `replica_dropout`, `ReplicaDropout`:
  random draws that differ across `tf.distribute` replicas and stay
  reproducible under a seed.
* `replica_position`, `replica_sum`, `replica_share`: how a replica's part
  of a hand-computed loss adds up to the global value; `gather_replicas`:
  the global batch, for a value that couples a batch's examples.
"""

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.distribution.engines import data_parallel_engine
from keras_masking.distribution.engines import engine_in_scope
from keras_masking.distribution.engines import engine_scope
from keras_masking.distribution.engines import replicas_in_sync
from keras_masking.distribution.layout import transformer_layout_map
from keras_masking.distribution.random import batch_randint
from keras_masking.distribution.random import batch_uniform
from keras_masking.distribution.random import replica_dropout
from keras_masking.distribution.replicas import gather_replicas
from keras_masking.distribution.replicas import replica_position
from keras_masking.distribution.replicas import replica_share
from keras_masking.distribution.replicas import replica_sum
