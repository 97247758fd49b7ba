"""BMC control: the client protocol, IPMI, Redfish, the secret store of BMC credentials."""
