"""What a turn waits for besides its activities: a person's decision on a tool call, a server's
question, a client-side tool's result, a raise of the budget.

Each kind of wait is one module implementing ``base.Wait`` (which decisions it takes, what one
does, how long it waits, and the durable wait itself) and listed in ``decisions.KINDS``.
``pending`` holds what every kind shares (the waiting calls, the decisions taken, the "always
allow" rules), ``budget_ledger`` the budget's arithmetic, and ``updates`` what
``TurnWorkflow``'s update and signal handlers hand over. The state they work on is the turn's
``TurnState``, so it is carried over and queried with the rest of the turn."""
