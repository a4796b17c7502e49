"""`.cast` packages: export verified winners, load them, and dispatch to them behind exact guards.

    import engine.cast
    cast = engine.cast.load("sd35.cast")     # never raises for a bad file: warns and stays on PyTorch
    with cast.enabled():
        image = pipe(...)
    print(cast.stats())

Importing this package needs neither a GPU nor NVRTC.
"""

from engine.cast.format import FORMAT_VERSION, CastError
from engine.cast.loader import Cast, CastWarning, load

__all__ = ["FORMAT_VERSION", "Cast", "CastError", "CastWarning", "load"]
