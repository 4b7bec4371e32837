"""The package version, part of every kernel cache key so an upgrade never reuses old binaries
(a module of its own so the build steps can read it without importing the package)."""
__version__ = "0.1.0"
