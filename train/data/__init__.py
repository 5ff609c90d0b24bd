"""Input pipelines: image classification (TFDS) and language modelling text."""
