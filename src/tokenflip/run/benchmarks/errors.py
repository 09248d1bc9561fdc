"""The error every benchmark module raises (its own module, so that the data sources and
the benchmark base class both use it without importing each other)."""


class BenchmarkError(ValueError):
    """A benchmark cannot be built or loaded from its spec."""
