"""`.cast` packages: load them and dispatch to their kernels behind exact guards (`engine.export` writes them).

    import engine.cast
    cast = engine.cast.load("sd35.cast")     # never raises for a bad file: warns and stays on PyTorch
    with cast.enabled():
        image = pipe(...)
    print(cast.stats())

Importing this package needs neither a GPU nor NVRTC.
"""

from engine.cast.format import FORMAT_VERSION, CastError, CastWarning
from engine.cast.loader import Cast, load

__all__ = ["FORMAT_VERSION", "Cast", "CastError", "CastWarning", "load"]
