"""The built-in CPU backend: the embedded default, registered like every other plugin."""
