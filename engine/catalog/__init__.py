"""The catalog of base models, adapters and variants: records and lookups, imports,
resolution to a session spec, identity, validation, digests, health checks and the
read-only reports every front end shows."""
