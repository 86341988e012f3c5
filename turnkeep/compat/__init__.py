"""Coming from another framework, on top of everything else: ``turnkeep.compat.fastagent``
collects agents declared the fast-agent way (``fast = FastAgent(...)``, ``@fast.agent(...)``)."""
