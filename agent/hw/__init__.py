"""The thin layer over sysfs, ioctls and syscalls: block devices, NVMe, GPUs, kexec."""
