"""The site role's own machinery, split by noun like ``hw/``: the BMC clients (Redfish, IPMI),
the secret store, the PXE boot service and the proxy routes. The handlers of the site's kinds
live in ``agent/commands/`` like every other kind's."""
