"""The release gate: what a tenant could change, against the baseline the node must be back to.

``ExpectedState.from_proto`` (state.py) checks the request's ``ExpectedState`` once, at the edge;
``check(expected, observed)`` (gate.py, over one module per area: uefi, gpus, nics, nvme, tpm,
wipes; at the site bmc_accounts and bios) returns every ``Mismatch``, each with the ``remedy`` (a
driver.invoke request, destructive and so signed by the control plane) that puts it back, or
none where the agent cannot: such a finding keeps the node out of the pool until a person acts.
The observed state is read by agent/commands/inventory/release.py. An unset or empty field is not
checked. Checks and their stable names (``where``: the entry, PCI address or controller):

  uefi.unreadable        no efivarfs (not a UEFI boot)                    -
  uefi.boot_entry        a Boot#### not in the baseline                   efivars.delete_boot_entry
                         one missing, or changed (its sha256)             -
  uefi.boot_order        BootOrder differs                                efivars.set_boot_order
  uefi.secure_boot       SecureBoot differs                               in setup mode: efivars.enroll_keys
  uefi.setup_mode        SetupMode differs                                 (the control plane adds the
  uefi.pk uefi.kek uefi.db uefi.dbx                                        fleet's signed writes); else -
                         the sha256 of the database differs                (firmware setup, owner's keys)
  uefi.memory_overwrite  MemoryOverwriteRequestControl differs            efivars.set_memory_overwrite
  gpu.unreadable         NVML cannot be read, or a GPU is lost            -
  gpu.mig_mode           MIG on, or pending on                            nvidia-smi.set_mig_mode, then .reset
  gpu.persistence_mode   differs from the baseline                        nvidia-smi.set_persistence_mode
  gpu.power_limit        the set limit is not the GPU's default           nvidia-smi.set_power_limit
  gpu.app_clocks         application clocks are not the defaults          nvidia-smi.reset_application_clocks
  gpu.retired_pending    a page retirement waits for a reset              nvidia-smi.reset
  gpu.remap_pending      a row remap waits for a reset                    nvidia-smi.reset
  gpu.remap_failure      a row remap failed (the GPU needs service)       -
  gpu.ecc_volatile       volatile ECC errors since the last reset         nvidia-smi.reset
  nic.unreadable         the configuration tool is missing or failed      -
  nic.config             a parameter's current or next-boot value         mlxconfig|mstconfig.set (next boot)
  nic.firmware_version   not the profile's firmware                       -  (a firmware flash)
  nvme.unreadable        nvme-cli is missing or failed                    -
  nvme.namespaces        the namespaces are not the factory's, or one     nvme.factory_layout (with the
                         is detached from this controller                  baseline's namespaces and LBA
  nvme.capacity          capacity left unallocated                        size both set, on a drive with
  nvme.lba_size          a namespace's LBA size differs                   namespace management; before
                                                                          disk.wipe)
  tpm.unreadable         the TPM answered with an error                   -
  tpm.nv_index           an NV index the owner defined, not the baseline's  tpm-ppi.clear (next boot)
  tpm.persistent_handle  a persistent object not the EK (0x81010001) nor  tpm-ppi.clear (next boot)
                         one the baseline names
  tpm.owner_auth tpm.endorsement_auth tpm.lockout_auth
                         that hierarchy's authorization is set            tpm-ppi.clear (next boot)
  tpm.lockout_counter    authorization failures counted (above zero)      tpm.reset_lockout (with the
                                                                          empty lockout auth; none
                                                                          while it is set: Clear first)
  wipe.certificate       a disk the baseline names without a verified     -  (disk.wipe, then check
                         erasure certificate of this boot                    again)

The BMC's half is checked at the site (``check_bmc``, bmc.query baseline, agent/commands/bmc.py);
its remedies are site commands (``Mismatch.bmc_remedy``), sent with the same BMC and credentials:

  bmc.unreadable         the accounts could not be read                   -
  bmc.account_extra      an enabled account not in the expected set       bmc.rotate disable_account
                         an enabled one without a name (IPMI anonymous)   -
  bmc.account_enabled    an expected-disabled account is enabled          bmc.rotate disable_account
                         an expected account is disabled                  -
  bmc.account_missing    an expected account is not on the BMC            -  (its password is not ours)
  bmc.account_role       an expected account has another role             -
  bios.unreadable        no BIOS attributes (IPMI, no registry, an error) -
  bios.unknown_attribute the BMC's AttributeRegistry has no such name     -  (a baseline for another BIOS)
  bios.invalid_value     the baseline's value is not of its registry type -
  bios.attribute         the current or pending value differs             bmc.firmware set_bios (next reset)

Round 2 at the site (bmc.query baseline with ``expect.golden``; golden.py diffs, the sources
are read by agent/site/bmc/golden.py): every change of the BMC's sources against the profile's
golden state, ``<source>.added|removed|changed`` with ``where`` the path:

  bmc.*                  AccountService (accounts by slot, roles, LDAP/AD), EventService subscriptions,
                         NetworkProtocol services, consoles, host interfaces, certificates,
                         virtual media, the boot override, SecureBoot (Redfish)
                         a subscription the golden has not   bmc.rotate delete_subscription
                         a service's ProtocolEnabled         bmc.firmware set_service
                         a slot's UserName/RoleId/Enabled    bmc.rotate reset_account
                         a medium in a slot golden empty     bmc.storage eject_media
                         a boot override golden has none     bmc.boot set_boot_device none
  bios.*                 every BIOS attribute, current and pending   bmc.firmware set_bios
  ipmi.*                 IPMI users by slot and channel access, the LAN channel (cipher suites)
                         a user slot's name or access        bmc.rotate reset_account
  firmware.*             every FirmwareInventory version (IPMI: mc info)   -
  <source>.unreadable    a source not read (or not read over this protocol)  -

The TPM's findings are put back by one thing: a Clear the firmware carries out at the next boot,
asked for through its Physical Presence Interface (agent/drivers/tpm_ppi.py). Where the firmware
offers no PPI, or refuses Clear from the OS, they have no remedy and say why. NV indices the
platform defined (TPMA_NV_PLATFORMCREATE: the firmware's, which a Clear keeps) and those in the
TCG's EK range (0x01C00000-0x01C07FFF: the EK certificates) are never findings. No TPM is stated
in the report (``tpm_absent``, "tpm" not checked), not a finding.

A NIC parameter set back, or the TPM's Clear, takes effect at the next firmware boot (a reboot):
the finding stays until then, with the same remedy, which is harmless to send again.

Round 2, the golden state (``ExpectedState.golden``): the checklist above checks what it names;
the golden diff finds what it does not. Each source is read whole (the node's: uefi, tpm, nic,
nvme, gpu by agent/commands/inventory/golden.py; the BMC's at the site) into ``path -> value``
items and diffed against the profile's capture of a clean node (golden.py); whatever is added,
removed or changed is a finding ``<source>.added|removed|changed`` at its path, except what the
profile's rules say varies; a source not read is ``<source>.unreadable``, never a pass.
golden_check.py gives each its remedy where one exists (a variable deleted, a load order written
back, a persistent handle evicted or the EK persisted again, an NV index undefined, the DA
parameters set back, a Clear or the PCR banks through the PPI, a NIC parameter set, an NVMe
controller's factory layout, a GPU's mode), else it is in cannot_restore. The report's
``compared`` counts per source what was compared, what the rules left alone, and why a source
could not be read. Both gates run when both are asked for; their findings share the report.
"""
