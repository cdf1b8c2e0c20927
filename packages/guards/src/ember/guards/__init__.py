"""ember.guards (being written for issue 3)."""

__version__ = "0.1.0"
__all__: list[str] = []
