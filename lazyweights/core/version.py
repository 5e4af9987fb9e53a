"""The package's version, in one place below every layer (`lazyweights.__version__`, `lazyweights --version`)."""
__version__ = "0.1.0"
