"""Agents served over A2A (the agent-to-agent protocol, ``a2a-sdk``): one JSON-RPC endpoint and
agent card per agent, thin over the session client API.

The mapping (the documentation's *Serving agents: A2A*):

- an A2A context is a turnkeep session (the conversation), and a task is one of its turns (one
  exchange): a message without a task id is the context's next turn (``SessionHandle.send``),
  and a task that has ended takes no more messages;
- ``input-required`` is a call waiting for approval; the client's next message in that task
  decides it;
- streaming carries the running turn's live text (artifact updates) and its messages (status
  updates);
- ``tasks/cancel`` cancels the running turn, which is repaired; the session goes on.

From the bottom up: ``callers`` (who a request is), ``messages`` (A2A's messages as turnkeep's
and back, and decisions), ``follow`` (a turn followed as A2A events), ``tasks`` (a task as its
turn), ``listing`` (``ListTasks`` from Temporal's visibility), ``handler`` (the requests,
answered from and by the sessions), ``card`` (an agent's card, with its caching headers),
``routes`` (the Starlette routes and app). What other code imports is named here.
"""

try:
    from a2a.server.context import ServerCallContext as _ServerCallContext  # noqa: F401
except ImportError as err:  # an optional dependency: say which
    raise ImportError("serving A2A needs a2a-sdk: pip install 'turnkeep[a2a]'") from err

from turnkeep.doors.a2a.callers import Caller, Refused
from turnkeep.doors.a2a.routes import a2a_app, a2a_routes
from turnkeep.doors.a2a.tasks import session_id_for, task_id_for

__all__ = ["Caller", "Refused", "a2a_app", "a2a_routes", "session_id_for", "task_id_for"]
