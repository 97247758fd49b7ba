"""The boot service: PXE boot entries, the supervised dnsmasq, virtual media sets."""
