"""The distribution this library is installed as, and its version: one place for both."""

from importlib import metadata

DISTRIBUTION = "simnet-fleet"  # `simnet` on the package index is an unrelated project

try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
