"""One file per model family. `catalog.ARCHITECTURES` names each family's file; `Arch.load()`
imports it when a model of that family loads. A family's file defines `ARCH`, an
`archs.base.Architecture` (usually a `Transformer` subclass overriding a few hooks)."""
