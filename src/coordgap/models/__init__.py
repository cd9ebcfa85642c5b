"""Model weights: turning a configured ``source`` into a local safetensors folder once."""
