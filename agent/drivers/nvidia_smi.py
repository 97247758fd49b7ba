"""nvidia-smi: GPU settings queries and the settings an operator sets per node."""

from __future__ import annotations

from agent.drivers.base import Arg, ArgType, Driver, Operation, Values, register

GPU = Arg("gpu", ArgType.INT, "GPU index; omitted: every GPU", required=False, minimum=0, maximum=63)

# What query_gpu may ask for: a closed set of --query-gpu fields.
QUERY_FIELDS = (
    "index", "uuid", "name", "serial", "pci.bus_id", "driver_version", "vbios_version",
    "persistence_mode", "compute_mode", "power.limit", "power.default_limit", "power.max_limit",
    "clocks.applications.graphics", "clocks.applications.memory", "clocks.max.sm", "clocks.max.memory",
    "ecc.mode.current", "ecc.mode.pending", "mig.mode.current", "mig.mode.pending",
    "temperature.gpu", "memory.total",
)  # fmt: skip
FIELDS_PATTERN = r"(?:" + "|".join(f.replace(".", r"\.") for f in QUERY_FIELDS) + r")(?:,(?:" + "|".join(
    f.replace(".", r"\.") for f in QUERY_FIELDS
) + r"))*"


def _gpu(v: Values) -> list[str]:
    return ["--id=" + str(v["gpu"])] if "gpu" in v else []


DRIVER = register(
    Driver(
        name="nvidia-smi",
        tool="nvidia-smi",
        description="NVIDIA GPU settings through nvidia-smi: queries, persistence mode, power limit, ECC",
        install_hint="install the NVIDIA driver, which ships nvidia-smi",
        operations={
            op.name: op
            for op in (
                Operation(
                    "query_gpu",
                    "selected settings of each GPU as CSV (nvidia-smi --query-gpu=...)",
                    build=lambda v: [
                        *_gpu(v), f"--query-gpu={v['fields']}", "--format=csv,noheader,nounits"
                    ],
                    args=(
                        GPU,
                        Arg("fields", ArgType.STRING, "comma-separated fields from the driver's list",
                            required=False, default=",".join(QUERY_FIELDS[:10]), pattern=FIELDS_PATTERN),
                    ),
                ),
                Operation("query_full", "everything nvidia-smi -q reports", build=lambda v: [*_gpu(v), "-q"],
                          args=(GPU,)),
                Operation(
                    "set_persistence_mode",
                    "keep the driver loaded with no client (nvidia-smi -pm 0|1)",
                    build=lambda v: [*_gpu(v), "--persistence-mode=" + ("1" if v["enabled"] else "0")],
                    args=(GPU, Arg("enabled", ArgType.BOOL)),
                    changes_state=True,
                ),
                Operation(
                    "set_compute_mode",
                    "compute mode: 0 default, 2 exclusive process, 3 prohibited (nvidia-smi -c N)",
                    build=lambda v: [*_gpu(v), f"--compute-mode={v['mode']}"],
                    args=(GPU, Arg("mode", ArgType.INT, "NVML_COMPUTEMODE_*", minimum=0, maximum=3)),
                    changes_state=True,
                ),
                Operation(
                    "set_power_limit",
                    "power limit in watts (nvidia-smi -pl W); the driver checks the GPU's range",
                    build=lambda v: [*_gpu(v), f"--power-limit={v['watts']}"],
                    args=(GPU, Arg("watts", ArgType.INT, minimum=50, maximum=2000)),
                    changes_state=True,
                ),
                Operation(
                    "set_ecc",
                    "ECC mode, effective after the next GPU reset (nvidia-smi -e 0|1)",
                    build=lambda v: [*_gpu(v), "--ecc-config=" + ("1" if v["enabled"] else "0")],
                    args=(GPU, Arg("enabled", ArgType.BOOL)),
                    changes_state=True,
                ),
                Operation(
                    "set_mig_mode",
                    "MIG mode, effective after the next GPU reset (nvidia-smi -mig 0|1)",
                    build=lambda v: [*_gpu(v), "--multi-instance-gpu=" + ("1" if v["enabled"] else "0")],
                    args=(GPU, Arg("enabled", ArgType.BOOL)),
                    changes_state=True,
                ),
                Operation(
                    "reset",
                    "reset one GPU (nvidia-smi -r): pending retirements and row remaps applied, "
                    "volatile ECC counters cleared, a pending MIG or ECC mode taken up",
                    build=lambda v: [*_gpu(v), "--gpu-reset"],
                    args=(Arg("gpu", ArgType.INT, "GPU index", minimum=0, maximum=63),),
                    changes_state=True,
                ),
                Operation(
                    "reset_application_clocks",
                    "application clocks back to their defaults (nvidia-smi -rac)",
                    build=lambda v: [*_gpu(v), "--reset-applications-clocks"],
                    args=(GPU,),
                    changes_state=True,
                ),
            )
        },
    )
)
