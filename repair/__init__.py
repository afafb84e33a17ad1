"""REPAIR: iterative diagnosis -> expansion -> differentiation -> training for dense scientific retrievers.

The library holds every piece of logic two scripts share; the numbered scripts are thin CLIs over it. The
foundation sits at the top (the model door ``models`` / ``encoding``, file contracts ``data``, ``search``,
``metrics``, ``runtime``, ``cli``); each stage is a subpackage (``diagnosis``, ``expansion``, ``differentiation``,
``training``, ``evaluation``) that imports only the foundation, and ``driver`` runs them. ``.importlinter`` states
the contract and ``lint-imports`` checks it.
"""

__version__ = "0.1.0"
