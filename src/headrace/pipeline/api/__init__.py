"""What a user writes: ``Pipeline`` (settings, ``run``/``start``), the builder and the fluent
``Frame`` API that add sources, steps, operators and sinks to the plan, the running query's
handle, and the planning of Spark aggregate, window and session expressions into plan nodes.
Imports driver and the layers below; nothing imports it but the package itself."""
