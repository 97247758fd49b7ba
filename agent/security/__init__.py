"""Trust: signed commands, attested results, signed upgrades; Ed25519 through libcrypto."""
