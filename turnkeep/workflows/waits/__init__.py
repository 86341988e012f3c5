"""What a turn waits for besides its activities: a person's decision on a tool call, a server's
question, a client-side tool's result, a raise of the budget.

Each kind of wait is one module implementing ``base.Wait`` and listed in ``decisions.KINDS``;
``pending`` holds what every kind shares (the waiting calls, the decisions taken, the "always
allow" rules) and ``budget_ledger`` the budget's arithmetic. The state they work on is the
turn's ``TurnState``, so it is carried over and queried with the rest of the turn."""
