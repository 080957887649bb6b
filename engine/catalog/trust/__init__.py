"""Adapter signatures with OpenSSF `model-signing`: one module per job, bottom up.

What is signed is an adapter's folder in the store, restricted to the files the app
reads: its weights (`adapter.gguf`, or `adapter_model.safetensors` with
`adapter_config.json`) and its provenance record (`provenance.json`) when it has
one. The signature (`signature.sig`, a Sigstore bundle whose DSSE envelope holds an
in-toto statement listing each signed file's sha256) sits beside them. Verification
needs every signed file present and unchanged, and refuses a signature that leaves out
a file the app reads (a `provenance.json` added after signing is not trusted). The
catalog's own copy of the provenance record must equal the signed file.

A signature arrives with an import as `signature.sig` in the adapter's own folder
(beside the GGUF file, or inside the PEFT folder), with the signed `provenance.json`
beside it: exactly the layout of a store folder, so a signed store folder can be
handed to someone else as it is. Keys are ECDSA P-256 (the library has no Ed25519);
a key is named, in the trust list, by its fingerprint: the sha256 of its PEM
SubjectPublicKeyInfo, which is also the key hint model-signing writes into a
signature. The shipped release key (resources/keys/release.pub) is always trusted,
and it is the only key a curated entry may be signed with.

- `files`: bounded reads and never-replacing writes of the room's small files.
- `verify`: the pure verifier (a folder, its signature and the allowed keys to a
  `Verdict`); it knows nothing of the catalog's records.
- `derived`: a converted file verified by converting its signed source again.
- `sign`: a folder signed with a private key.
- `trust_list`: the trusted public keys (the shipped release key and the user's).
- `keys`: the user's own key pairs.
- `policy`: what a verdict means for loading (the stored policy, the import gate,
  what the engine is told to check, the check rows).
- `records`: the catalog glue (an adapter record to what is verified or signed).
- `display`: the status shown to the user, from a verdict cache keyed by content.

The engine re-verifies at session open from what the SessionSpec carries
(`policy.AdapterSigning`, the trusted keys as PEM) with `verify` and `derived` only:
see `engine.runtime.signing`.
"""
