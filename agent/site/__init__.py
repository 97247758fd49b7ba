"""The site role's own machinery, split by noun like ``hw/``: the BMC clients (Redfish, IPMI),
the secret store, the PXE boot service and the proxy routes. The handlers of the site's kinds
live in ``agent/commands/`` like every other kind's.

Its floors, lowest first (tests/test_layers.py keeps them): the ground (metrics.py, ttltable.py,
chunkstore.py, the content store); bmc/ and boot/; serve/ and observe/; registries.py; services.py.
A module imports from the floors below its own and from its own wing, never sideways nor up."""
