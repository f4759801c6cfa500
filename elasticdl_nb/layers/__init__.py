"""Keras layers for models trained by elasticdl-nb jobs (issue 17).

`Embedding` is ElasticDL's embedding layer: no `input_dim`, ids of any int64 value or
strings, rows on the parameter servers only.
"""

from elasticdl_nb.layers.embedding import Embedding

__all__ = ["Embedding"]
