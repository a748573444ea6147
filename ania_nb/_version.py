"""The installed version of ania-nb, from the package metadata (``ania_nb.__version__``)."""

from importlib import metadata

try:
    VERSION = metadata.version("ania-nb")
except metadata.PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    VERSION = "0+unknown"
