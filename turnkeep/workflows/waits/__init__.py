"""What a turn waits for besides its activities: a person's decision on a tool call, a server's
question, a client-side tool's result, a raise of the budget.

Each kind of wait is one module implementing ``base.Wait`` (which decisions it takes, what one
does, how long it waits, and the durable wait itself) and listed in ``kinds.KINDS``;
``updates`` is what ``TurnWorkflow``'s update and signal handlers hand over. What every kind
shares sits below, beside the loop: ``workflows.pending_calls`` (the waiting calls, the
decisions taken, the "always allow" rules) and ``workflows.budget_math`` (the budget's
arithmetic). The state they all work on is the turn's ``TurnState``, so it is carried over and
queried with the rest of the turn."""
