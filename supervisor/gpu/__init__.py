"""The GPUs as NVML and the kernel log report them."""
