"""The exporters, one module each."""
