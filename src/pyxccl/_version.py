"""The version of pyxccl (pyproject.toml says the same), below everything that records it."""
__version__ = "0.1.0"
