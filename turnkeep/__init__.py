"""turnkeep: durable agent turns on Temporal.

The public API is what these modules export, and nothing else: ``turnkeep`` itself (what an
application imports to run turns: the plugin, ``Agent``, a client's ``start_turn`` and
``open_session``; and what it extends: ``ModelProvider``, ``ToolSource``, hooks and approval
policies), ``turnkeep.in_workflow`` (for an application's own workflow code),
``turnkeep.testing`` (for its tests) and the few modules the documentation's *Using turnkeep
from your own Temporal app* lists. Every other module is internal: its names may move between
releases.

The names are listed once, in this package's stub (``__init__.pyi``), and imported on first
use (PEP 562): importing a submodule, as the workflow sandbox does with ``turnkeep.workflows``,
loads none of the SDKs or I/O code behind the others.
"""

from turnkeep.support.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(globals())
