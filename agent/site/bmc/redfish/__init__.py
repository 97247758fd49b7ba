"""The Redfish client: a session module and the resources over it."""
