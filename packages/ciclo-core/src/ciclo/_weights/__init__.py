"""Fine-tuning: ``load_weights`` and ``weights_plan`` (parameters from another run's
checkpoint, an Orbax checkpoint, a safetensors or Flax msgpack file, or a pytree)."""
