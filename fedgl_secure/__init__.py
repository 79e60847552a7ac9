"""fedgl-secure: privacy-hardened federated graph learning (FedGL) between institutions."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written; the installed metadata carries it here.
    __version__ = version("fedgl-secure")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
