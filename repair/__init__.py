"""REPAIR: iterative diagnosis -> expansion -> differentiation -> training for dense scientific retrievers.

The library holds every piece of logic two scripts share; the numbered scripts are thin CLIs over it.
"""

__version__ = "0.1.0"
