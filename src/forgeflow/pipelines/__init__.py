"""The pipeline engine: DAGs of steps with triggers, branches, fan-out, approval gates
and a state bag, durable in the store (docs/pipelines.md describes the format).

- :mod:`definition`, :mod:`graph`, :mod:`inputs` — the YAML/JSON format and its checks;
- :mod:`planner` — which steps become runnable or skipped (pure);
- :mod:`state`, :mod:`render` — reducers of the state bag, the ``{{…}}`` renderer (pure);
- :mod:`registry`, :mod:`bodies`, :mod:`script`, :mod:`ports`, :mod:`adapters` — bodies;
- :mod:`runs`, :mod:`steps`, :mod:`nodes`, :mod:`recovery`, :mod:`templates` — units
  of work on the store; :mod:`snapshots` — a run's parsed definition;
- :mod:`execution` — one call of a step's body, outside any transaction;
- :mod:`engine`, :mod:`wiring` — the asyncio loop and how a process builds it.
"""
