"""The rule language's condition kinds, one module each.

Every module defines one kind: its model (a frozen dataclass), how it is read from YAML
(with errors naming file, line and field), how it is evaluated against the engine's
snapshot, and its piece of the JSON Schema. ``registry.KINDS`` lists them; the loader,
the engine, the canonical form and ``rules/schema.json`` all read that one list.
"""
